"""What every job entrypoint shares: the fleet options, attaching to the fleet, exit codes.

A job re-attaches by identity: ``connect`` finds the fleet's detached ledger, host and
runner actors by name in the namespace and reuses them, so a job that is submitted
again (after a failure, a ``ray job stop``, a KubeRay retry) works on the same fleet
instead of starting a second one. The storage must therefore be named: a job's working
directory is a fresh folder for each upload, so the default ``./.rayfleet`` would be a
new, empty fleet every time.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click

from ..errors import RayfleetError
from ..platform._fleet import DEFAULT_NAMESPACE, Fleet, connect

EXIT_OK = 0
"""The job did what it was asked (for a workflow: the run COMPLETED)."""
EXIT_NOT_COMPLETED = 1
"""A workflow run ended COMPENSATED, FAILED or CANCELLED; a demo check did not hold."""
EXIT_UNUSABLE = 2
"""Bad arguments, or no cluster, storage or ledger to work with: the message says what to do."""
EXIT_STOPPED = 143
"""Stopped by SIGTERM (``ray job stop``) after handing its work back (128 + SIGTERM)."""

Command = TypeVar("Command", bound=Callable[..., Any])


def fleet_options(command: Command) -> Command:
    """The options naming the fleet a job works on, each with its environment variable."""
    decorators = (
        click.option("--address", envvar="RAY_ADDRESS", default=None,
                     help="Ray address [env RAY_ADDRESS, which ray job submit sets for the job]"),
        click.option("--storage", envvar="RAYFLEET_STORAGE", default=None,
                     help="the fleet's storage: a folder every node shares, or s3://... [env RAYFLEET_STORAGE]"),
        click.option("--ledger", envvar="RAYFLEET_LEDGER", default=None,
                     help="ledger URL, sqlite:///abs/path or postgresql://... [env RAYFLEET_LEDGER; "
                          "default: SQLite in the storage folder]"),
        click.option("--namespace", envvar="RAYFLEET_NAMESPACE", default=DEFAULT_NAMESPACE, show_default=True,
                     help="Ray namespace of the fleet [env RAYFLEET_NAMESPACE]"),
        click.option("--hosts", envvar="RAYFLEET_HOSTS", type=click.IntRange(min=1), default=None,
                     help="host actors the fleet keeps; missing ones are created (default: one per CPU of the "
                          "cluster) [env RAYFLEET_HOSTS]"),
    )
    for decorate in reversed(decorators):
        command = decorate(command)
    return command


def attach(*, address: str | None, storage: str | None, ledger: str | None, namespace: str,
           hosts: int | None) -> Fleet:
    """Connect to the fleet the options name, reusing its detached actors.

    Raises:
        click.UsageError: no storage was named (exit code 2, with what to set).
        RayfleetError: from :func:`rayfleet.connect` (reported by :func:`run_command`).
    """
    if not storage:
        raise click.UsageError(
            "name the fleet's storage with --storage or RAYFLEET_STORAGE: a folder every node shares (or "
            "s3://bucket/prefix with --ledger postgresql://...). A job's working directory is new for each "
            "submission, so a default folder there would start an empty fleet each time. For example: "
            "ray job submit --runtime-env-json '{\"env_vars\": {\"RAYFLEET_STORAGE\": \"/mnt/shared/rayfleet\"}}' "
            "-- python -m rayfleet.jobs.apply team.yaml"
        )
    return connect(address=address, storage=storage, ledger=ledger, namespace=namespace, hosts=hosts)


def run_command(command: click.Command, argv: Sequence[str]) -> int:
    """Run a job's click command on ``argv`` and return its exit code, never a traceback for known failures.

    A rayfleet error becomes its message on stderr and exit code 2: a job's log is read
    by people deciding what to fix, the messages say what to do, and a traceback would
    bury them. Bad arguments are click's usage errors, also exit code 2.
    """
    try:
        code = command.main(args=list(argv), prog_name=command.name, standalone_mode=False)
    except click.ClickException as error:
        error.show()
        return error.exit_code
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return EXIT_NOT_COMPLETED
    except RayfleetError as error:
        click.echo(f"error: {type(error).__name__}: {error}", err=True)
        return EXIT_UNUSABLE
    return code if isinstance(code, int) else EXIT_OK


def emit_result(result: dict[str, Any]) -> None:
    """Print the job's result as one JSON line, the last line of its log (for scripts and tests)."""
    click.echo(json.dumps(result, default=repr, sort_keys=True))
