"""``python -m rayfleet.jobs.demo``: the demo as a Ray job, on the cluster of ``RAY_ADDRESS``.

The demo is a fleet of its own (namespace ``rayfleet-demo``) that it stops at the end,
so it deliberately ignores ``RAYFLEET_STORAGE`` and ``RAYFLEET_LEDGER``: a cluster
started with those set for its real fleet would otherwise get the demo's agents in the
real fleet's ledger. Its storage is ``--storage`` / ``RAYFLEET_DEMO_STORAGE`` (a folder
every node shares, or ``s3://...``), by default a temporary folder (enough on one
node); its ledger ``--ledger`` / ``RAYFLEET_DEMO_LEDGER``, by default SQLite in the
demo's storage folder.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import click

from ..demo._script import run_demo
from ._connection import EXIT_NOT_COMPLETED, EXIT_OK, run_command


@click.command(name="rayfleet.jobs.demo", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--address", envvar="RAY_ADDRESS", default=None, help="Ray address [env RAY_ADDRESS]")
@click.option("--storage", envvar="RAYFLEET_DEMO_STORAGE", default=None,
              help="the demo's storage folder or URI [env RAYFLEET_DEMO_STORAGE; default: a temporary folder]")
@click.option("--ledger", envvar="RAYFLEET_DEMO_LEDGER", default=None,
              help="the demo's ledger URL [env RAYFLEET_DEMO_LEDGER; default: SQLite in the demo's storage]")
def command(address: str | None, storage: str | None, ledger: str | None) -> int:
    """Run the rayfleet demo end to end; exit code 0 when every check held."""
    storage = storage or tempfile.mkdtemp(prefix="rayfleet-demo-")
    if ledger is None:
        if "://" in storage:
            raise click.UsageError(
                f"the demo's storage {storage!r} is remote; name its ledger too with --ledger or "
                f"RAYFLEET_DEMO_LEDGER (postgresql://... on a cluster)"
            )
        ledger = f"sqlite:///{Path(storage).expanduser().resolve() / 'ledger.sqlite'}"
    return EXIT_OK if run_demo(storage=storage, address=address, ledger=ledger) == 0 else EXIT_NOT_COMPLETED


def main(argv: Sequence[str] = ()) -> int:
    """Run the job with command-line arguments ``argv``; returns its exit code."""
    return run_command(command, argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
