"""``python -m rayfleet.jobs.demo``: the demo as a Ray job, on the cluster of ``RAY_ADDRESS``.

Storage comes from ``--storage`` / ``RAYFLEET_STORAGE`` (a folder shared by the nodes, or
a ``s3://`` URI with ``RAYFLEET_LEDGER`` naming a local SQLite path or PostgreSQL);
without it a temporary folder. The demo runs in its own namespace, ``rayfleet-demo``,
and stops its actors at the end, so running it again starts afresh.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import click

from ..demo._script import run_demo
from ._connection import EXIT_NOT_COMPLETED, EXIT_OK, run_command


@click.command(name="rayfleet.jobs.demo", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--address", envvar="RAY_ADDRESS", default=None, help="Ray address [env RAY_ADDRESS]")
@click.option("--storage", envvar="RAYFLEET_STORAGE", default=None,
              help="storage folder or URI [env RAYFLEET_STORAGE; default: a temporary folder]")
def command(address: str | None, storage: str | None) -> int:
    """Run the rayfleet demo end to end; exit code 0 when every check held."""
    return EXIT_OK if run_demo(storage=storage, address=address) == 0 else EXIT_NOT_COMPLETED


def main(argv: Sequence[str] = ()) -> int:
    """Run the job with command-line arguments ``argv``; returns its exit code."""
    return run_command(command, argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
