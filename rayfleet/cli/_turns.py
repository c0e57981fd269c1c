"""Commands about durable turns: ``turns``, ``signal``, ``approvals list|show|approve|reject``,
``timers list|fire-now|cancel``."""

from __future__ import annotations

import json
from typing import Any

import click

from ._output import Column, emit_fields, emit_json, emit_line, emit_table, json_option, jsonable, moment
from ._session import FleetOptions, open_fleet, pass_options

APPROVAL_COLUMNS = (
    Column("id", "id"),
    Column("identity", "identity"),
    Column("subject", "subject"),
    Column("status", "status"),
    Column("version", "version"),
    Column("decided by", "decided_by"),
    Column("created", "created", moment),
)


def parse_value(ctx: click.Context, param: click.Parameter, text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise click.BadParameter(f"not valid JSON ({error}); e.g. '{{\"eur\": 30}}', 42 or '\"text\"'") from None


TURN_COLUMNS = (
    Column("id", "id"),
    Column("method", "method"),
    Column("status", "status"),
    Column("waiting for", "waiting_for"),
    Column("started", "started", moment),
    Column("steps", "steps"),
)


@click.command()
@click.argument("identity")
@click.option("--follow", "follow", default=None, metavar="TURN_ID",
              help="Print the events of this turn as they come (persisted ones, then live ones with deltas) until "
                   "it ends.")
@click.option("--after", default=None, metavar="EVENT_ID", help="With --follow: resume after this event id.")
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True, help="At most this many turns.")
@json_option
@pass_options
def turns(options: FleetOptions, identity: str, follow: str | None, after: str | None, limit: int,
          as_json: bool) -> None:
    """List the turns of IDENTITY in progress (running or suspended), or follow one turn's stream.

    A turn is listed once it journaled something (a step, a wait, a steering read). With
    --follow, each event is one line: its id, kind and data (with --json, one JSON object a line).
    """
    if after is not None and follow is None:
        raise click.BadParameter("--after needs --follow TURN_ID", param_hint="--after")
    with open_fleet(options) as fleet:
        if follow is not None:
            for event in fleet.turn_events(identity, follow, after=after):
                if as_json:
                    click.echo(json.dumps(jsonable(event), separators=(",", ":")))
                else:
                    emit_line(f"{event.id} {event.kind} {json.dumps(event.data)}")
            return
        found = fleet.turns(identity, limit=limit)
    if as_json:
        emit_json(found)
        return
    rows = [{"id": item.id, "method": item.method, "status": item.status.value, "waiting_for": item.waiting_for,
             "started": item.started, "steps": item.steps} for item in found]
    emit_table(rows, TURN_COLUMNS, title=f"turns of {identity} in progress", empty="no turns in progress")


@click.command()
@click.argument("identity")
@click.argument("name")
@click.option("--value", "value", default=None, callback=parse_value, metavar="JSON",
              help="The signal's value as JSON (default: null).")
@click.option("--id", "signal_id", default=None, metavar="ID",
              help="Repeat-safe id: the signal is recorded once per id.")
@json_option
@pass_options
def signal(options: FleetOptions, identity: str, name: str, value: Any, signal_id: str | None,
           as_json: bool) -> None:
    """Send signal NAME to IDENTITY: it resumes the turn waiting for it, or is kept until one waits."""
    with open_fleet(options) as fleet:
        woken = fleet.signal(identity, name, value, signal_id=signal_id)
    if as_json:
        emit_json({"identity": identity, "name": name, "woken": woken})
    else:
        emit_line(f"signal {name!r} sent to {identity}: " + ("resumed its waiting turn" if woken else
                                                             "kept until a turn waits for it"))


@click.group()
def approvals() -> None:
    """The approvals registry: list, show, approve, reject."""


@approvals.command("list")
@click.option("--status", type=click.Choice(["pending", "approved", "rejected", "all"], case_sensitive=False),
              default="pending", show_default=True, help="Only approvals with this status.")
@click.option("--identity", default=None, metavar="GLOB", help="Only approvals of identities matching (support/*).")
@click.option("--run", "run_id", default=None, metavar="RUN_ID", help="Only approvals asked by this workflow run.")
@click.option("--limit", type=click.IntRange(min=1), default=1000, show_default=True, help="At most this many.")
@json_option
@pass_options
def list_approvals(options: FleetOptions, status: str, identity: str | None, run_id: str | None, limit: int,
                   as_json: bool) -> None:
    """List approvals, oldest first."""
    with open_fleet(options) as fleet:
        found = fleet.approvals.list(status=None if status.lower() == "all" else status, identity=identity,
                                     limit=limit, run_id=run_id)
    if as_json:
        emit_json(found)
        return
    rows = [{"id": item.id, "identity": item.identity, "subject": item.subject, "status": item.status,
             "version": item.version, "decided_by": item.decided_by, "created": item.created} for item in found]
    emit_table(rows, APPROVAL_COLUMNS, title="approvals", empty=f"no {status.lower()} approvals")


@approvals.command()
@click.argument("approval_id")
@json_option
@pass_options
def show(options: FleetOptions, approval_id: str, as_json: bool) -> None:
    """Show approval APPROVAL_ID with its data and audit trail."""
    with open_fleet(options) as fleet:
        item = fleet.approvals.get(approval_id)
    if as_json:
        emit_json(item)
        return
    emit_fields({"id": item.id, "identity": item.identity, "turn": item.turn_id, "subject": item.subject,
                 "data": item.data, "approvers": ", ".join(item.approvers) or "anyone", "status": item.status,
                 "version": item.version, "decided by": item.decided_by, "comment": item.comment,
                 "due": item.due, "on timeout": item.on_timeout,
                 "audit": "; ".join(f"{entry['action']} by {entry['by']}" for entry in item.audit)},
                title=f"approval {item.id}")


def _decide(options: FleetOptions, approval_id: str, *, approved: bool, by: str, comment: str, data: Any,
            expect_version: int | None, as_json: bool) -> None:
    with open_fleet(options) as fleet:
        item = fleet.approvals.resolve(approval_id, approved=approved, by=by, comment=comment, data=data,
                                       expect_version=expect_version)
    if as_json:
        emit_json(item)
    else:
        emit_line(f"approval {item.id} {item.status.lower()} by {item.decided_by} (version {item.version})")


_DECISION_OPTIONS = (
    click.option("--by", required=True, metavar="NAME", help="Who decides (must be one of its approvers, if any)."),
    click.option("--comment", default="", help="Why."),
    click.option("--data", "data", default=None, callback=parse_value, metavar="JSON",
                 help="Data attached to the decision, as JSON."),
    click.option("--expect-version", type=int, default=None, metavar="N",
                 help="Decide only if the approval is still at this version (from `approvals show`)."),
)


def _with_decision_options(command: Any) -> Any:
    for option in reversed(_DECISION_OPTIONS):
        command = option(command)
    return command


@approvals.command()
@click.argument("approval_id")
@_with_decision_options
@json_option
@pass_options
def approve(options: FleetOptions, approval_id: str, by: str, comment: str, data: Any, expect_version: int | None,
            as_json: bool) -> None:
    """Approve APPROVAL_ID (refused, exit 2, if someone decided first)."""
    _decide(options, approval_id, approved=True, by=by, comment=comment, data=data, expect_version=expect_version,
            as_json=as_json)


@approvals.command()
@click.argument("approval_id")
@_with_decision_options
@json_option
@pass_options
def reject(options: FleetOptions, approval_id: str, by: str, comment: str, data: Any, expect_version: int | None,
           as_json: bool) -> None:
    """Reject APPROVAL_ID (refused, exit 2, if someone decided first)."""
    _decide(options, approval_id, approved=False, by=by, comment=comment, data=data, expect_version=expect_version,
            as_json=as_json)


TIMER_COLUMNS = (
    Column("identity", "identity"),
    Column("name", "name"),
    Column("kind", "kind"),
    Column("method", "method"),
    Column("next due", "next_due", moment),
    Column("when", "when"),
    Column("fired", "fired"),
    Column("missed", "missed"),
    Column("late", "late"),
)


@click.group()
def timers() -> None:
    """Reminders and schedules: list, fire-now, cancel."""


@timers.command("list")
@click.option("--identity", default=None, help="Only this identity's timers.")
@click.option("--due-within", type=click.FloatRange(min=0), default=None, metavar="SECONDS",
              help="Only timers due within this many seconds.")
@click.option("--limit", type=click.IntRange(min=1), default=1000, show_default=True, help="At most this many.")
@json_option
@pass_options
def list_timers(options: FleetOptions, identity: str | None, due_within: float | None, limit: int,
                as_json: bool) -> None:
    """List reminders and schedules, soonest due first."""
    with open_fleet(options) as fleet:
        found = fleet.timers(identity, due_within=due_within, limit=limit)
    if as_json:
        emit_json([{**jsonable(item), "kind": item.kind} for item in found])
        return
    rows = [{"identity": item.identity, "name": item.name, "kind": item.kind, "method": item.method,
             "next_due": item.next_due, "when": f"{item.cron} {item.tz}" if item.cron else
             (f"every {item.every:g} s" if item.every is not None else "once"),
             "fired": item.fired, "missed": item.missed, "late": item.late} for item in found]
    emit_table(rows, TIMER_COLUMNS, title="timers", empty="no timers")


@timers.command("fire-now")
@click.argument("identity")
@click.argument("name")
@pass_options
def fire_now(options: FleetOptions, identity: str, name: str) -> None:
    """Make timer NAME of IDENTITY due now (a host fires it within about a second)."""
    with open_fleet(options) as fleet:
        fleet.fire_timer(identity, name)
    emit_line(f"timer {name!r} of {identity} is due now")


@timers.command()
@click.argument("identity")
@click.argument("name")
@json_option
@pass_options
def cancel(options: FleetOptions, identity: str, name: str, as_json: bool) -> None:
    """Remove timer NAME of IDENTITY."""
    with open_fleet(options) as fleet:
        removed = fleet.cancel_timer(identity, name)
    if as_json:
        emit_json({"identity": identity, "name": name, "cancelled": removed})
    else:
        emit_line(f"timer {name!r} of {identity} " + ("cancelled" if removed else "was not set"))
