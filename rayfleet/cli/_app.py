"""The ``rayfleet`` command line."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from ..errors import RayfleetError
from ..roster import roster_json_schema


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rayfleet", description="Durable, identity-first agents on Ray.")
    parser.add_argument("--address", default=None, help="Ray address (default: RAY_ADDRESS, else a local Ray)")
    parser.add_argument("--storage", default=None,
                        help="storage folder or URI (default: RAYFLEET_STORAGE or ./.rayfleet)")
    parser.add_argument("--ledger", default=None,
                        help="ledger URL, sqlite:///abs/path or postgresql://user:pw@host:5432/db "
                             "(default: RAYFLEET_LEDGER, else a SQLite file in the storage folder)")
    parser.add_argument("--namespace", default="rayfleet", help="Ray namespace of the fleet (default: rayfleet)")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("demo", help="run the end-to-end demo on a local, embedded fleet")
    status = commands.add_parser("status", help="show one identity, or all of them")
    status.add_argument("identity", nargs="?")
    send = commands.add_parser("send", help="call a handler and print its reply as JSON")
    send.add_argument("identity")
    send.add_argument("method")
    send.add_argument("--json", default="{}", dest="arguments", help="handler keyword arguments as a JSON object")
    send.add_argument("--timeout", type=float, default=None)
    send.add_argument("--idempotency-key", default=None, help="repeat-safe key: the effect happens once")
    for verb, text in (("pause", "park new messages durably until resume"),
                       ("resume", "replay parked messages oldest first, then take new work"),
                       ("parked", "list parked messages, oldest first")):
        commands.add_parser(verb, help=text).add_argument("identity")
    letters = commands.add_parser("dead-letters", help="list or replay messages that could not be handled")
    letter_commands = letters.add_subparsers(dest="letters_command", required=True)
    listing = letter_commands.add_parser("list")
    listing.add_argument("--identity", default=None)
    replay = letter_commands.add_parser("replay")
    replay.add_argument("letter_id", type=int)
    apply = commands.add_parser("apply", help="make the fleet match a roster YAML file (idempotent)")
    apply.add_argument("roster")
    apply.add_argument("--dry-run", action="store_true", help="report what would change, change nothing")
    apply.add_argument("--prune", action="store_true", help="retire identities the roster does not list")
    roster = commands.add_parser("roster", help="roster files")
    roster_commands = roster.add_subparsers(dest="roster_command", required=True)
    roster_commands.add_parser("schema", help="print the JSON Schema of a roster file (for editors and CI)")
    topology = commands.add_parser("topology", help="peer wiring")
    topology_commands = topology.add_subparsers(dest="topology_command", required=True)
    export = topology_commands.add_parser("export", help="print the topology as dot, mermaid or json")
    export.add_argument("--format", default="dot", choices=("dot", "mermaid", "json"))
    topology_commands.add_parser("reconcile", help="wire and unwire edges to match the specs")
    runs = commands.add_parser("runs", help="workflow runs: list, show, cancel, pause, resume")
    run_commands = runs.add_subparsers(dest="runs_command", required=True)
    run_commands.add_parser("list")
    for verb in ("show", "cancel", "pause", "resume"):
        run_command = run_commands.add_parser(verb)
        run_command.add_argument("run_id")
        if verb == "resume":
            run_command.add_argument("--force", action="store_true", help="resume under a different code version")
    commands.add_parser("hosts", help="list host actors")
    gc = commands.add_parser("gc", help="delete snapshot files no identity references")
    gc.add_argument("--min-age", type=float, default=60.0)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    arguments = _parser().parse_args(argv)
    try:
        return _run(arguments)
    except RayfleetError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


def _run(arguments: argparse.Namespace) -> int:
    if arguments.command == "demo":
        from ..demo._script import run_demo

        return run_demo(storage=arguments.storage, address=arguments.address)
    if arguments.command == "roster":
        # Offline: the schema describes files, so there is no fleet to connect to.
        _print(roster_json_schema())
        return 0
    from ..platform._fleet import connect

    fleet = connect(address=arguments.address, storage=arguments.storage, namespace=arguments.namespace,
                    ledger=arguments.ledger)
    try:
        if arguments.command == "status":
            statuses = [fleet.status(arguments.identity)] if arguments.identity else fleet.list_agents()
            _print([asdict(status) for status in statuses])
        elif arguments.command == "send":
            try:
                kwargs = json.loads(arguments.arguments)
            except json.JSONDecodeError as error:
                print(f"error: --json is not valid JSON ({error}); pass an object such as '{{\"n\": 2}}'",
                      file=sys.stderr)
                return 2
            if not isinstance(kwargs, dict):
                print("error: --json must be a JSON object of keyword arguments, e.g. '{\"n\": 2}'", file=sys.stderr)
                return 2
            _print(fleet.agent(arguments.identity).call(
                arguments.method, timeout=arguments.timeout, idempotency_key=arguments.idempotency_key, **kwargs
            ))
        elif arguments.command == "pause":
            fleet.pause(arguments.identity)
            _print({"paused": arguments.identity})
        elif arguments.command == "resume":
            _print({"resumed": arguments.identity, "replayed": fleet.resume(arguments.identity)})
        elif arguments.command == "parked":
            _print([asdict(message) for message in fleet.parked(arguments.identity)])
        elif arguments.command == "dead-letters" and arguments.letters_command == "list":
            _print([asdict(letter) for letter in fleet.dead_letters(arguments.identity)])
        elif arguments.command == "dead-letters":
            _print(fleet.replay_dead_letter(arguments.letter_id))
        elif arguments.command == "apply":
            report = fleet.apply(arguments.roster, dry_run=arguments.dry_run, prune=arguments.prune)
            _print(asdict(report))
        elif arguments.command == "topology" and arguments.topology_command == "export":
            print(fleet.topology.export(arguments.format))
        elif arguments.command == "topology":
            _print(asdict(fleet.topology.reconcile()))
        elif arguments.command == "runs":
            _runs(fleet, arguments)
        elif arguments.command == "hosts":
            _print([asdict(host) for host in fleet.hosts()])
        elif arguments.command == "gc":
            _print(fleet.collect_garbage(min_age=arguments.min_age))
        return 0
    finally:
        # A command never stops a fleet it attached to. Only when this command started the
        # Ray under it (no cluster was running) are its actors checkpointed and stopped:
        # they end with that Ray anyway, and checkpointing first keeps their State.
        fleet.shutdown(stop_actors=fleet.started_ray)


def _runs(fleet: Any, arguments: argparse.Namespace) -> None:
    verb = arguments.runs_command
    if verb == "list":
        _print([asdict(info) for info in fleet.runs.list_runs()])
        return
    if verb == "cancel":
        fleet.runs.cancel(arguments.run_id)
    elif verb == "pause":
        fleet.runs.pause(arguments.run_id)
    elif verb == "resume":
        fleet.runs.resume(arguments.run_id, force=arguments.force)
    _print(asdict(fleet.runs.get(arguments.run_id)))


def _print(value: Any) -> None:
    print(json.dumps(value, indent=2, default=str))


if __name__ == "__main__":
    raise SystemExit(main())
