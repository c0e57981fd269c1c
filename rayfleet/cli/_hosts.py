"""Commands about host actors: ``hosts``, ``drain``, ``undrain``."""

from __future__ import annotations

import click

from ._exit import CommandError
from ._output import Column, counting, emit_fields, emit_json, emit_line, emit_table, json_option, moment
from ._session import FleetOptions, open_fleet, pass_options


@click.command()
@json_option
@pass_options
def hosts(options: FleetOptions, as_json: bool) -> None:
    """List the fleet's host actors."""
    with open_fleet(options) as fleet:
        found = fleet.hosts()
    if as_json:
        emit_json(found)
    else:
        emit_table(found, (Column("name", "host"), Column("draining", "draining"),
                           Column("started_at", "started", moment), Column("node", "node"), Column("pid", "pid"),
                           Column("holder", "lease holder")),
                   title="hosts", empty="no hosts")


def _known_host(names: list[str], host: str) -> None:
    if host not in names:
        raise CommandError(f"the fleet has no host {host!r}; its hosts are {', '.join(names) or 'none'} "
                           f"(see `rayfleet hosts`)")


@click.command()
@click.argument("host")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=25.0, show_default=True,
              metavar="SECONDS", help="Past this, busy agents are released without their unsaved State.")
@json_option
@pass_options
def drain(options: FleetOptions, host: str, timeout: float, as_json: bool) -> None:
    """Move every agent off HOST (checkpointed and released); it takes no new work until undrain."""
    with open_fleet(options) as fleet:
        _known_host([info.name for info in fleet.hosts()], host)
        with counting(f"draining {host}") as progress:
            report = fleet.drain(host, timeout=timeout, progress=progress)
    if as_json:
        emit_json(report)
    else:
        emit_fields({"checkpointed": report.checkpointed, "released unsaved": report.released_unsaved,
                     "timed out": report.timed_out, "seconds": report.seconds}, title=f"drained {report.host}")


@click.command()
@click.argument("host")
@pass_options
def undrain(options: FleetOptions, host: str) -> None:
    """Let a drained HOST take new work again."""
    with open_fleet(options) as fleet:
        _known_host([info.name for info in fleet.hosts()], host)
        fleet.undrain(host)
    emit_line(f"{host} takes new work again")
