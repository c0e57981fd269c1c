"""Shared by every test folder: puts tests/support on the import path (helpers importable from any test)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))
