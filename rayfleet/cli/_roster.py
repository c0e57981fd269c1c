"""Commands about rosters: ``apply`` a roster file, print the roster's JSON Schema."""

from __future__ import annotations

import contextlib
from pathlib import Path

import click

from ..roster import roster_json_schema
from ._output import Column, counting, emit_json, emit_table, json_option, working
from ._session import FleetOptions, open_fleet, pass_options


@click.command()
@click.argument("roster", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--dry-run", is_flag=True, help="Report what would change, change nothing.")
@click.option("--prune", is_flag=True, help="Retire identities the roster does not list.")
@click.option("--hosts", type=click.IntRange(min=1), default=None, metavar="N",
              help="Host actors to start if this creates the fleet (default: one per CPU); a running fleet keeps "
                   "its own.")
@json_option
@pass_options
def apply(options: FleetOptions, roster: Path, dry_run: bool, prune: bool, hosts: int | None, as_json: bool) -> None:
    """Make the fleet match ROSTER (a YAML file), idempotently; creates the fleet if there is none."""
    # The one command (with `gateway`) that may create a fleet: applying a roster is how one starts.
    with contextlib.ExitStack() as stack:
        with working("connecting to the fleet"):
            fleet = stack.enter_context(open_fleet(options, create=True, hosts=hosts))
        with counting(f"applying {roster.name}") as progress:
            report = fleet.apply(roster, dry_run=dry_run, prune=prune, progress=progress)
    if as_json:
        emit_json(report)
        return
    rows = [{"change": "create", "identity": identity} for identity in report.created]
    rows += [{"change": "update", "identity": identity, "detail": ", ".join(fields)}
             for identity, fields in report.updated.items()]
    rows += [{"change": "retire", "identity": identity} for identity in report.retired]
    rows += [{"change": "unchanged", "identity": identity} for identity in report.unchanged]
    if report.topology is not None:
        rows += [{"change": "wire", "identity": f"{edge.a} -- {edge.b}"} for edge in report.topology.wired]
        rows += [{"change": "unwire", "identity": f"{edge.a} -- {edge.b}"} for edge in report.topology.unwired]
        rows += [{"change": "failed", "detail": failure} for failure in report.topology.failures]
    title = f"{roster.name}: {'would change (dry run)' if dry_run else 'applied'}"
    emit_table(rows, (Column("change", "change"), Column("identity", "identity or edge"), Column("detail", "detail")),
               title=title, empty="the roster lists no identities")


@click.group()
def roster() -> None:
    """Roster files."""


@roster.command()
def schema() -> None:
    """Print the JSON Schema of a roster file (for editors and CI); needs no fleet."""
    emit_json(roster_json_schema())
