"""The installed rayfleet's version, read once from its package metadata: the one source of ``rf.__version__``."""

from __future__ import annotations

from importlib import metadata

try:
    VERSION = metadata.version("rayfleet")
except metadata.PackageNotFoundError:  # imported from a source tree that was never installed
    VERSION = "0"
