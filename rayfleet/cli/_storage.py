"""Commands over the fleet's storage: ``export`` (Parquet) and ``gc`` (unreferenced snapshot files)."""

from __future__ import annotations

import dataclasses

import click

from ._output import counting, emit_fields, emit_json, emit_line, json_option, working
from ._session import FleetOptions, open_fleet, open_records, pass_options


@click.command()
@click.argument("path")
@json_option
@pass_options
def export(options: FleetOptions, path: str, as_json: bool) -> None:
    """Write the latest committed State of every identity as a Parquet dataset at PATH (folder or URI).

    Works on a stopped embedded fleet too: with no cluster running it, the ledger file and
    the storage are read directly.
    """
    with open_records(options) as fleet, counting(f"exporting to {path}") as progress:
        report = fleet.export(path, progress=progress)
    fields = dataclasses.asdict(report)
    if as_json:
        emit_json(fields)
    else:
        emit_fields(fields, title=f"exported to {path}")


@click.command()
@click.option("--min-age", type=click.FloatRange(min=0), default=60.0, show_default=True, metavar="SECONDS",
              help="Keep files younger than this (they may be written but not yet committed).")
@json_option
@pass_options
def gc(options: FleetOptions, min_age: float, as_json: bool) -> None:
    """Delete snapshot files no identity references any more."""
    with working("collecting unreferenced snapshot files"), open_fleet(options) as fleet:
        deleted = fleet.collect_garbage(min_age=min_age)
    if as_json:
        emit_json({"deleted": deleted})
        return
    emit_line(f"deleted {len(deleted)} unreferenced snapshot file{'s' * (len(deleted) != 1)}")
    for name in deleted:
        emit_line(f"  {name}")
