"""How a ledger operation crosses Ray: the actor's answer (a reply, or a refusal as a value) and the call in flight.

The generated ``_generated_actor.py`` writes one method per contract operation with
these; ``_ledger_actor.py`` adds the actor's and the client's own parts.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator
from typing import Any, Generic, ParamSpec, TypeVar, Union

import ray

from ..errors import LedgerUnavailableError, RayfleetError
from ._metrics import RayLedgerMetrics

LEDGER_ACTOR_NAME = "rayfleet-ledger"

T = TypeVar("T")
P = ParamSpec("P")


class Refusal:
    """A ledger error carried as a return value (Ray would wrap a raised one)."""

    __slots__ = ("error",)

    def __init__(self, error: RayfleetError) -> None:
        self.error = error

    def __reduce__(self) -> tuple[type[Refusal], tuple[RayfleetError]]:
        return (Refusal, (self.error,))


Answer = Union[T, Refusal]  # noqa: UP007 - a generic alias needs Union on Python 3.10
"""What an actor method returns: the operation's reply, or the ledger's refusal."""

_METRICS = RayLedgerMetrics()


def answer(refusal: RayfleetError | None, operation: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Answer[T]:
    """``operation`` (a bound ``Ledger`` method) run and counted; a refusal it raises, or ``refusal``, as a value."""
    if refusal is not None:
        return Refusal(refusal)
    started = time.perf_counter()
    outcome = "OK"
    try:
        return operation(*args, **kwargs)
    except RayfleetError as error:
        outcome = type(error).__name__
        return Refusal(error)
    finally:
        _METRICS.operation(operation.__name__, outcome, time.perf_counter() - started)


def _unwrap(reply: Any) -> Any:
    if isinstance(reply, Refusal):
        raise reply.error
    return reply


def _unreachable(error: ray.exceptions.RayActorError) -> LedgerUnavailableError:
    """The ledger actor died or is restarting: the typed, retryable error, never Ray's own.

    The call may have run before the actor died, so a write's outcome is unknown.
    """
    return LedgerUnavailableError(
        location=f"the ledger actor {LEDGER_ACTOR_NAME!r}", detail=f"{type(error).__name__} (it restarts by itself)",
        committed_unknown=True,
    )


class RayCall(Generic[T]):
    """A :class:`~rayfleet.ledger._contract.LedgerCall` in flight on the ledger actor.

    A ledger actor that dies or restarts under the call raises ``LedgerUnavailableError``
    (retryable, ``committed_unknown``), so hosts, the runner and the driver see the
    ledger's typed error, not a Ray exception or an "internal error".
    """

    __slots__ = ("_ref",)

    def __init__(self, ref: ray.ObjectRef) -> None:
        self._ref = ref

    def __await__(self) -> Generator[Any, None, T]:
        try:
            reply = yield from self._ref.__await__()
        except ray.exceptions.RayActorError as error:
            raise _unreachable(error) from error
        return _unwrap(reply)  # type: ignore[no-any-return]

    def result(self, timeout: float | None = None) -> T:
        try:
            reply = ray.get(self._ref, timeout=timeout)
        except ray.exceptions.RayActorError as error:
            raise _unreachable(error) from error
        return _unwrap(reply)  # type: ignore[no-any-return]


class RayTransport:
    """A client whose calls are tasks on the ledger actor ``actor``."""

    route = "ledger actor"

    def __init__(self, actor: ray.actor.ActorHandle) -> None:
        self.actor = actor
