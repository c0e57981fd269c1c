"""The ``rayfleet`` command."""

from __future__ import annotations

from ._app import main as main

__all__ = ["main"]
