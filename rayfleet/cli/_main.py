"""The ``rayfleet`` command: the root group, its global options, and ``main``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import click

from ..errors import RayfleetError
from ..platform._fleet import DEFAULT_NAMESPACE, DEFAULT_STORAGE
from . import _agents, _dead_letters, _gateway, _hosts, _roster, _runs, _standalone, _storage, _topology, _turns
from ._exit import EXIT_FAILED, EXIT_OK, CommandError
from ._session import FleetOptions

COMPLETE_VAR = "_RAYFLEET_COMPLETE"
"""Shell completion: ``eval "$(_RAYFLEET_COMPLETE=bash_source rayfleet)"`` (``zsh_source``, ``fish_source``)."""


class RayfleetGroup(click.Group):
    """The root group: a ``RayfleetError`` from any command ends as one line on stderr, never a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except RayfleetError as error:
            raise CommandError.from_error(error) from None


@click.group(cls=RayfleetGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--address", envvar="RAY_ADDRESS", show_envvar=True, default=None, metavar="ADDRESS",
              help="Ray cluster address (default: the cluster a `ray start` on this machine left running).")
@click.option("--storage", envvar="RAYFLEET_STORAGE", show_envvar=True, default=None, metavar="FOLDER|URI",
              help=f"Storage folder or pyarrow.fs URI of the fleet (default: {DEFAULT_STORAGE}).")
@click.option("--ledger", envvar="RAYFLEET_LEDGER", show_envvar=True, default=None, metavar="URL",
              help="Ledger URL, sqlite:///abs/path or postgresql://user:pw@host:5432/db "
                   "(default: SQLite in the storage folder).")
@click.option("--namespace", envvar="RAYFLEET_NAMESPACE", show_envvar=True, default=DEFAULT_NAMESPACE,
              show_default=True, help="Ray namespace of the fleet.")
@click.version_option(package_name="rayfleet")
@click.pass_context
def cli(ctx: click.Context, address: str | None, storage: str | None, ledger: str | None, namespace: str) -> None:
    """Durable, identity-first agents on Ray.

    Every command attaches to a running fleet and creates nothing, except `apply` and
    `gateway` (which may create the fleet) and `demo` and `bench` (which bring their
    own). No command stops a fleet it did not start. Exit codes: 0 done; 1 the
    operation failed (a handler raised, no reply in time); 2 usage error, bad input,
    or no cluster, storage, ledger or fleet to reach.
    """
    ctx.obj = FleetOptions(address=address, storage=storage, ledger=ledger, namespace=namespace)


for command in (
    _agents.status, _agents.list_identities, _agents.send, _agents.pause, _agents.resume, _agents.parked,
    _roster.apply, _roster.roster, _dead_letters.dead_letters, _runs.runs, _topology.topology,
    _hosts.hosts, _hosts.drain, _hosts.undrain, _storage.export, _storage.gc, _gateway.gateway,
    _standalone.demo, _standalone.bench, _turns.turns, _turns.signal, _turns.approvals, _turns.timers,
):
    cli.add_command(command)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line (``argv``: the arguments, default ``sys.argv[1:]``); returns the exit code."""
    try:
        cli.main(args=None if argv is None else list(argv), prog_name="rayfleet", complete_var=COMPLETE_VAR)
    except SystemExit as exit_:
        code = exit_.code
        return code if isinstance(code, int) else (EXIT_OK if code is None else EXIT_FAILED)
    return EXIT_OK
