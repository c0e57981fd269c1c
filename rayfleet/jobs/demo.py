"""``python -m rayfleet.jobs.demo``: the demo as a Ray job, on the cluster of ``RAY_ADDRESS``.

Storage comes from ``RAYFLEET_STORAGE`` (a folder shared by the nodes, or a ``s3://``
URI with ``RAYFLEET_LEDGER`` naming a local SQLite path); without it a temporary folder.
"""

from __future__ import annotations

import os
import sys

from ..demo._script import run_demo


def main() -> int:
    return run_demo(storage=os.environ.get("RAYFLEET_STORAGE"), address=os.environ.get("RAY_ADDRESS"))


if __name__ == "__main__":
    sys.exit(main())
