"""``topology export|reconcile``: the fleet's peer wiring."""

from __future__ import annotations

import click

from ._output import Column, emit_json, emit_table, json_option
from ._session import FleetOptions, open_fleet, open_records, pass_options


@click.group()
def topology() -> None:
    """Peer wiring: export it, reconcile it."""


@topology.command()
@click.option("--format", "fmt", type=click.Choice(["dot", "mermaid", "json"]), default="dot", show_default=True,
              help="DOT (Graphviz), Mermaid or JSON.")
@pass_options
def export(options: FleetOptions, fmt: str) -> None:
    """Print the live topology (edges, and which the platform manages), also of a stopped fleet."""
    with open_records(options) as fleet:
        text = fleet.topology.export(fmt)
    click.echo(text.rstrip("\n"))


@topology.command()
@json_option
@pass_options
def reconcile(options: FleetOptions, as_json: bool) -> None:
    """Wire and unwire edges so the live topology matches the specs."""
    with open_fleet(options) as fleet:
        report = fleet.topology.reconcile()
    if as_json:
        emit_json(report)
        return
    rows = [{"change": change, "edge": f"{edge.a} -- {edge.b}"}
            for change, edges in (("adopted", report.adopted), ("wired", report.wired), ("unwired", report.unwired),
                                  ("forgotten", report.forgotten), ("waiting", report.waiting))
            for edge in edges]
    rows += [{"change": "failed", "edge": failure} for failure in report.failures]
    emit_table(rows, (Column("change", "change"), Column("edge", "edge")), title="reconcile",
               empty="the topology already matches the specs")
