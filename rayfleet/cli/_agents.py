"""Commands about agents: ``status``, ``list``, ``send``, ``pause``, ``resume``, ``parked``."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import click

from ._output import Column, emit_fields, emit_json, emit_line, emit_table, json_option, moment
from ._session import FleetOptions, open_fleet, open_records, pass_options

RESERVED_CALL_OPTIONS = ("timeout", "idempotency_key", "deadline", "conversation", "sequence", "mode")
"""Keyword names ``AgentRef.call`` keeps for itself, so they cannot be handler arguments from the CLI."""

LIST_COLUMNS = (
    Column("identity", "identity"),
    Column("state", "state"),
    Column("host", "host"),
    Column("token", "token"),
    Column("checkpoint", "checkpoint"),
    Column("labels", "labels"),
)


def parse_labels(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict[str, str]:
    labels: dict[str, str] = {}
    for text in values:
        key, equals, value = text.partition("=")
        if not equals or not key.strip():
            raise click.BadParameter(f"{text!r} is not KEY=VALUE; write --label team=a (repeat for more labels)")
        labels[key.strip()] = value.strip()
    return labels


def parse_arguments(ctx: click.Context, param: click.Parameter, text: str) -> dict[str, Any]:
    try:
        arguments = json.loads(text)
    except json.JSONDecodeError as error:
        raise click.BadParameter(
            f"not valid JSON ({error}); pass an object of keyword arguments, e.g. --json '{{\"n\": 2}}'"
        ) from None
    if not isinstance(arguments, dict):
        raise click.BadParameter(
            f"must be a JSON object of keyword arguments, e.g. --json '{{\"n\": 2}}', not {type(arguments).__name__}"
        )
    reserved = sorted(set(arguments) & set(RESERVED_CALL_OPTIONS))
    if reserved:
        raise click.BadParameter(
            f"{', '.join(reserved)} cannot be handler arguments here: ref.call keeps those names for its own options "
            f"(use --timeout and --idempotency-key, or call the handler from Python with positional arguments)"
        )
    return arguments


@click.command()
@click.argument("identity", required=False)
@json_option
@pass_options
def status(options: FleetOptions, identity: str | None, as_json: bool) -> None:
    """Show one identity (state, owner, lease, checkpoint), or a summary of the fleet (also of a stopped one)."""
    with open_records(options) as fleet:
        if identity is not None:
            found = fleet.status(identity)
            if as_json:
                emit_json(found)
                return
            lease = found.lease
            emit_fields({
                "identity": found.identity, "state": found.state, "agent class": found.agent_class,
                "labels": found.labels, "host": found.host, "generation": found.generation,
                "checkpoint version": found.checkpoint_version,
                "fencing token": lease.fencing_token if lease else None,
                "lease remaining": f"{lease.ttl_remaining:.1f}s" if lease else None,
                "lease healthy": lease.healthy if lease else None, "paused": found.paused,
                "addressability": found.addressability, "runtime": found.runtime_id, "session": found.session_id,
                "broken reason": found.broken_reason,
            }, title=identity)
            return
        agents = fleet.list_agents()
        hosts = fleet.hosts()
        summary = {
            "namespace": options.namespace,
            "storage": fleet.storage,
            "ledger": fleet.ledger_location.shown,
            "hosts": len(hosts),
            "draining_hosts": sum(host.draining for host in hosts),
            "identities": len(agents),
            "states": dict(sorted(Counter(agent.state.value for agent in agents).items())),
            "paused": sum(agent.paused for agent in agents),
            "runs": dict(sorted(Counter(run.status.value for run in fleet.runs.list_runs()).items())),
        }
        if as_json:
            emit_json(summary)
        else:
            emit_fields({name.replace("_", " "): value for name, value in summary.items()}, title="fleet")


@click.command("list")
@click.option("--label", "labels", multiple=True, callback=parse_labels, metavar="KEY=VALUE",
              help="Only identities with this label (repeat: all must match).")
@json_option
@pass_options
def list_identities(options: FleetOptions, labels: dict[str, str], as_json: bool) -> None:
    """List identities, sorted, optionally filtered by labels (also of a stopped fleet)."""
    with open_records(options) as fleet:
        agents = fleet.list_agents(labels=labels or None)
    if as_json:
        emit_json(agents)
    else:
        rows = [{"identity": agent.identity, "state": agent.state.value + (" (paused)" if agent.paused else ""),
                 "host": agent.host, "token": agent.lease.fencing_token if agent.lease else None,
                 "checkpoint": agent.checkpoint_version, "labels": agent.labels} for agent in agents]
        emit_table(rows, LIST_COLUMNS, title="identities",
                   empty="no identities" + (" with those labels" if labels else ""))


@click.command()
@click.argument("identity")
@click.argument("method")
@click.option("--json", "arguments", default="{}", show_default=True, callback=parse_arguments, metavar="OBJECT",
              help="Handler keyword arguments as a JSON object.")
@click.option("--idempotency-key", default=None, metavar="KEY",
              help="Repeat-safe key: a repeated send has its effect once and gets the original reply.")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=None, metavar="SECONDS",
              help="Give up waiting for the reply after this long (exit 1).")
@pass_options
def send(options: FleetOptions, identity: str, method: str, arguments: dict[str, Any], idempotency_key: str | None,
         timeout: float | None) -> None:
    """Call handler METHOD of IDENTITY and print its reply as JSON."""
    with open_fleet(options) as fleet:
        reply = fleet.agent(identity).call(method, timeout=timeout, idempotency_key=idempotency_key, **arguments)
    emit_json(reply)


@click.command()
@click.argument("identity")
@json_option
@pass_options
def pause(options: FleetOptions, identity: str, as_json: bool) -> None:
    """Park every new message of IDENTITY durably, in order, until resume."""
    with open_fleet(options) as fleet:
        fleet.pause(identity)
    if as_json:
        emit_json({"paused": identity})
    else:
        emit_line(f"paused {identity}: new messages are parked until `rayfleet resume {identity}`")


@click.command()
@click.argument("identity")
@json_option
@pass_options
def resume(options: FleetOptions, identity: str, as_json: bool) -> None:
    """Replay the parked messages of IDENTITY oldest first, then take new work."""
    with open_fleet(options) as fleet:
        replayed = fleet.resume(identity)
    if as_json:
        emit_json({"resumed": identity, "replayed": replayed})
    else:
        emit_line(f"resumed {identity}: replayed {replayed} parked message{'s' * (replayed != 1)}")


@click.command()
@click.argument("identity")
@json_option
@pass_options
def parked(options: FleetOptions, identity: str, as_json: bool) -> None:
    """List the messages parked for a paused IDENTITY, oldest first."""
    with open_fleet(options) as fleet:
        messages = fleet.parked(identity)
    if as_json:
        emit_json(messages)
        return
    rows = [{"seq": m.seq, "method": m.envelope.method, "sender": m.envelope.sender,
             "key": m.envelope.idempotency_key, "parked_at": m.parked_at} for m in messages]
    emit_table(rows, (Column("seq", "seq"), Column("method", "method"), Column("sender", "sender"),
                      Column("key", "idempotency key"), Column("parked_at", "parked at", moment)),
               title=f"parked for {identity}", empty=f"nothing parked for {identity}")
