"""The turn a handler runs in, as the agent's methods (``self.step``, ``self.sleep``, ...) find it.

Kept free of the rest of the package so that ``identity`` (which defines ``rf.Agent``)
can import it without a circle: the host sets the current turn, the agent reads it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from contextvars import ContextVar
from typing import Any, Protocol

from ..errors import UsageError


class TurnScope(Protocol):
    """What an agent's durable calls need from the turn they run in."""

    def step(self, name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
             policy: str) -> Awaitable[Any]: ...

    def sleep(self, seconds: float) -> Awaitable[None]: ...

    def wait_signal(self, name: str, timeout: float | None) -> Awaitable[Any]: ...

    def approval(self, subject: str, data: Any, approvers: Iterable[str], timeout: float | None,
                 on_timeout: str) -> Awaitable[Any]: ...

    def steering(self) -> list[Any]: ...

    def emit(self, kind: str, data: Any) -> None: ...

    def emit_delta(self, text: str) -> None: ...

    def watched_event(self, kind: str, data: Any) -> None:
        """A platform event recorded only when the turn has a stream (see ``TurnContext.watched_event``)."""
        ...


CURRENT_TURN: ContextVar[TurnScope | None] = ContextVar("rayfleet_current_turn", default=None)
"""Set by the host around each handler attempt; a task the handler starts inherits it."""

CURRENT_STEP_KEY: ContextVar[str | None] = ContextVar("rayfleet_current_step_key", default=None)
"""Set while a step's function runs: its stable key ``identity:turn:position``."""


def current_turn(api: str) -> TurnScope:
    """The turn the calling handler runs in.

    Raises:
        UsageError: called outside a handler's turn (in ``on_activate``, a thread, a test
            calling the method directly).
    """
    scope = CURRENT_TURN.get()
    if scope is None:
        raise UsageError(
            f"self.{api} works only inside a handler running on a fleet host (a turn). Call the handler through "
            f"a ref (ref.call(...)), not directly, and not from on_activate or a thread.", api=f"self.{api}",
        )
    return scope


def current_step_key() -> str:
    """The key of the step whose function is running.

    Raises:
        UsageError: read outside a step's function.
    """
    key = CURRENT_STEP_KEY.get()
    if key is None:
        raise UsageError(
            "self.step_key is the key of the running step: read it inside the function passed to "
            "self.step(...), where it is stable across replays (identity:turn:position).", api="self.step_key",
        )
    return key
