"""``python -m rayfleet.jobs.apply ROSTER``: make a fleet match a roster, as a Ray job.

Restart-safe by construction: applying is idempotent (``kubectl apply`` semantics), so
a job that runs again after a failure or a ``ray job stop`` re-attaches to the same
detached actors and changes only what is still missing. A roster may name agent
classes in modules beside it (``agent: my_agents:Echo``); ``ray job submit
--working-dir .`` uploads them, and the fleet ships them to the hosts by value.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import click

from ._connection import EXIT_OK, attach, emit_result, fleet_options, run_command


@click.command(name="rayfleet.jobs.apply", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("roster", type=click.Path(exists=True, dir_okay=False))
@click.option("--dry-run", is_flag=True, help="report what would change, change nothing")
@click.option("--prune", is_flag=True, help="retire identities the roster does not list")
@fleet_options
def command(roster: str, dry_run: bool, prune: bool, address: str | None, storage: str | None,
            ledger: str | None, namespace: str, hosts: int | None) -> int:
    """Apply ROSTER (a YAML file) to the fleet and print what changed as JSON."""
    fleet = attach(address=address, storage=storage, ledger=ledger, namespace=namespace, hosts=hosts)
    try:
        report = fleet.apply(roster, dry_run=dry_run, prune=prune)
        click.echo(f"{'would apply' if dry_run else 'applied'} {roster} to namespace {namespace!r}: "
                   f"{len(report.created)} created, {len(report.updated)} updated, "
                   f"{len(report.unchanged)} unchanged, {len(report.retired)} retired")
        emit_result({
            "job": "apply", "roster": roster, "namespace": namespace, "dry_run": dry_run,
            "created": list(report.created), "updated": report.updated, "unchanged": list(report.unchanged),
            "retired": list(report.retired), "topology_changed": bool(report.topology and report.topology.changed),
        })
    finally:
        fleet.shutdown()  # a job attached to a running fleet leaves it running
    return EXIT_OK


def main(argv: Sequence[str] = ()) -> int:
    """Run the job with command-line arguments ``argv``; returns its exit code."""
    return run_command(command, argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
