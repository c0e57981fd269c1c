"""``runs list|show|cancel|pause|resume``: the workflow run registry."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import click

from ..workflow._definition import RunStatus
from ._output import Column, emit_fields, emit_json, emit_table, json_option, moment
from ._session import FleetOptions, open_fleet, open_records, pass_options

if TYPE_CHECKING:
    from ..platform._runs_client import RunInfo, RunsClient

RUN_COLUMNS = (
    Column("run_id", "run"),
    Column("workflow", "workflow"),
    Column("status", "status"),
    Column("submitted", "submitted"),
    Column("created_at", "created", moment),
    Column("updated_at", "updated", moment),
    Column("detail", "detail"),
)


@click.group()
def runs() -> None:
    """Workflow runs: list, show, cancel, pause, resume."""


def _show(info: RunInfo, as_json: bool) -> None:
    if as_json:
        emit_json(info)
        return
    emit_fields({
        "workflow": info.workflow, "status": info.status, "detail": info.detail, "submitted": info.submitted,
        "cancel requested": info.cancel_requested, "pause requested": info.pause_requested,
        "code version": info.code_version, "created": moment(info.created_at), "updated": moment(info.updated_at),
    }, title=f"run {info.run_id}")


@runs.command("list")
@click.option("--status", type=click.Choice([status.value for status in RunStatus], case_sensitive=False),
              default=None, help="Only runs with this status.")
@json_option
@pass_options
def list_runs(options: FleetOptions, status: str | None, as_json: bool) -> None:
    """List runs in creation order (also of a stopped fleet)."""
    with open_records(options) as fleet:
        found = fleet.runs.list_runs(None if status is None else status.upper())
    if as_json:
        emit_json(found)
    else:
        emit_table(found, RUN_COLUMNS, title="runs",
                   empty="no runs" + (f" with status {status.upper()}" if status else ""))


@runs.command()
@click.argument("run_id")
@json_option
@pass_options
def show(options: FleetOptions, run_id: str, as_json: bool) -> None:
    """Show one run (also of a stopped fleet)."""
    with open_records(options) as fleet:
        info = fleet.runs.get(run_id)
    _show(info, as_json)


@runs.command()
@click.argument("run_id")
@json_option
@pass_options
def cancel(options: FleetOptions, run_id: str, as_json: bool) -> None:
    """Ask RUN_ID to stop: it compensates what it completed and ends CANCELLED."""
    _act_and_show(options, run_id, as_json, lambda runs: runs.cancel(run_id))


@runs.command()
@click.argument("run_id")
@json_option
@pass_options
def pause(options: FleetOptions, run_id: str, as_json: bool) -> None:
    """Stop dispatching new steps of RUN_ID (steps in flight finish)."""
    _act_and_show(options, run_id, as_json, lambda runs: runs.pause(run_id))


@runs.command()
@click.argument("run_id")
@click.option("--force", is_flag=True, help="Resume even under a different code version.")
@json_option
@pass_options
def resume(options: FleetOptions, run_id: str, force: bool, as_json: bool) -> None:
    """Continue a paused run, or restart an unfinished submitted run from its journal."""
    _act_and_show(options, run_id, as_json, lambda runs: runs.resume(run_id, force=force))


def _act_and_show(options: FleetOptions, run_id: str, as_json: bool, act: Callable[[RunsClient], object]) -> None:
    """Apply ``act`` to the run registry, then show the run as it is afterwards."""
    with open_fleet(options) as fleet:
        act(fleet.runs)
        info = fleet.runs.get(run_id)
    _show(info, as_json)
