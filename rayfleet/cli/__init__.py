"""The ``rayfleet`` command (click): one module per command group, rendering in ``_output``."""

from __future__ import annotations

from ._main import main as main

__all__ = ["main"]
