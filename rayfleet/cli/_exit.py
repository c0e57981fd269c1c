"""Exit codes, and the one line on stderr that says what went wrong.

0: done. 1: the fleet ran the operation and it failed (a handler raised, a reply did
not come in time). 2: the command cannot run as given: a usage error, bad input
(invalid JSON, an unknown identity, handler, run or host, a bad label), or no
cluster, storage, ledger or fleet to reach. A ``RayfleetError`` never prints a
traceback; anything else is a rayfleet bug and does.
"""

from __future__ import annotations

from typing import IO, Any

import click

from ..errors import DeadlineExceededError, HandlerError, RayfleetError

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

_OPERATION_FAILURES: tuple[type[RayfleetError], ...] = (HandlerError, DeadlineExceededError)


class CommandError(click.ClickException):
    """A command that cannot run as given: ``error: <message>`` on one line of stderr, exit code 2."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))  # one line, whatever the message held

    @classmethod
    def from_error(cls, error: RayfleetError) -> CommandError:
        if isinstance(error, _OPERATION_FAILURES):
            return OperationFailed(str(error))
        return cls(str(error))

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"error: {self.format_message()}", file=file, err=file is None)


class OperationFailed(CommandError):
    """The fleet ran the operation and it failed (a handler raised, no reply in time): exit code 1."""

    exit_code = EXIT_FAILED
