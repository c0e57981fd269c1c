"""``python -m rayfleet.cli``: the ``rayfleet`` command, for where the console script is not on PATH."""

from __future__ import annotations

from ._main import main

if __name__ == "__main__":
    raise SystemExit(main())
