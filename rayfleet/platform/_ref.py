"""``AgentRef``: a handle on one agent by name, and the one path a driver's message takes to it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import ray

from ..errors import DeadlineExceededError, InvalidSpecError
from ..host._messages import Envelope
from ..identity._handlers import handler_name
from ..identity._values import IdentityStatus
from ..turns._values import HandlingMode, TurnEvent
from ._replies import turn_value
from ._routing import Courier, deliver_request, tell_request
from ._status import status_of
from ._turn_handle import TurnHandle, start_turn


def send(courier: Courier, envelope: Envelope, *, timeout: float | None = None) -> Any:
    """Deliver ``envelope`` to its target's owner and wait for the handler's value.

    Raises:
        DeadlineExceededError: no reply within ``timeout`` seconds.
    """
    try:
        wire = courier.route_sync(envelope.target, deliver_request(envelope), method=envelope.method, timeout=timeout)
    except ray.exceptions.GetTimeoutError:
        raise DeadlineExceededError(identity=envelope.target, method=envelope.method, timeout=timeout or 0.0) from None
    return turn_value(wire)


@dataclass(frozen=True, slots=True, kw_only=True)
class CallOptions:
    """How one message is sent: what ``call``, ``ask`` and ``tell`` accept beside the handler's arguments.

    Pass them as keywords (``ref.call(Counter.add, 5, idempotency_key="k1")``) or as one value
    (``ref.call(Counter.add, 5, options=rf.CallOptions(idempotency_key="k1"))``); their names are
    therefore not available as handler keyword arguments (pass such an argument positionally).
    """

    timeout: float | None = None
    """Seconds to wait for the reply (``DeadlineExceededError`` after); ``call`` and ``ask`` only."""
    idempotency_key: str | None = None
    """Calls with the same key (from the same sender) have their effect once; repeats get the original reply."""
    deadline: float | None = None
    """Wall-clock time (``time.time()``) after which the message is not run but dead-lettered."""
    conversation: str | None = None
    """With ``sequence``: a message whose sequence is lower than one already seen in its conversation is
    refused (``StaleSequenceError``) and dead-lettered."""
    sequence: int | None = None
    mode: HandlingMode | str | None = None
    """What the message does if the agent has a turn in progress (``rf.HandlingMode``: ``"queue"``,
    ``"steer"``, ``"interrupt"``, ``"reject"``); ``None``: the agent's ``on_busy`` (queue by default)."""

    NAMES: ClassVar[frozenset[str]] = frozenset(("timeout", "idempotency_key", "deadline", "conversation", "sequence",
                                                 "mode"))

    @classmethod
    def take(cls, kwargs: dict[str, Any]) -> CallOptions:
        """The options among ``kwargs`` (removed from it; what is left are the handler's arguments).

        Raises:
            InvalidSpecError: ``options=`` is not a ``CallOptions``, or an option is given both ways.
        """
        given = kwargs.pop("options", None)
        named = {name: kwargs.pop(name) for name in cls.NAMES & kwargs.keys()}
        if given is None:
            return cls(**named)
        if not isinstance(given, CallOptions):
            raise InvalidSpecError(f"options must be an rf.CallOptions, got {type(given).__name__}", field="options")
        if named:
            raise InvalidSpecError(
                f"{', '.join(sorted(named))} given both as a keyword and in options=; give each once",
                field=sorted(named)[0],
            )
        return given

    def envelope(self, target: str, method: str | Callable[..., Any], args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> Envelope:
        """The message these options send from outside the fleet (no sender) to ``target``."""
        return Envelope(
            target=target, method=handler_name(method), args=args, kwargs=kwargs,
            idempotency_key=self.idempotency_key, deadline=self.deadline, conversation=self.conversation,
            sequence=self.sequence, mode=None if self.mode is None else HandlingMode.parse(self.mode).value,
        )


class AgentRef:
    """A handle on one agent by name; cheap to create, safe to share.

    ``call``, ``ask`` and ``tell`` take the handler's arguments and the :class:`CallOptions`
    (as keywords, or ``options=``).
    """

    __slots__ = ("_courier", "identity")

    def __init__(self, courier: Courier, identity: str) -> None:
        self._courier = courier
        self.identity = identity

    def __repr__(self) -> str:
        return f"AgentRef({self.identity!r})"

    def call(self, method: str | Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Run handler ``method`` and return its value (blocking).

        Args:
            method: the handler's name (``"add"``) or the handler itself (``Counter.add``).
            args, kwargs: the handler's arguments, and the :class:`CallOptions` (``timeout``,
                ``idempotency_key``, ``deadline``, ``conversation``, ``sequence``, or ``options=``).

        Raises:
            HandlerError: the handler raised (remote type, message and traceback inside).
            DeadlineExceededError: no reply within ``timeout`` seconds, or the deadline passed.
            UnknownIdentityError, UnknownHandlerError, InvalidArgumentsError,
            InvalidStateError, NotAddressableError, StaleSequenceError,
            LeaseLostError, FleetUnavailableError, InvalidSpecError (bad options).
        """
        options = CallOptions.take(kwargs)
        return send(self._courier, options.envelope(self.identity, method, args, kwargs), timeout=options.timeout)

    async def ask(self, method: str | Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """``call``, awaited."""
        options = CallOptions.take(kwargs)
        envelope = options.envelope(self.identity, method, args, kwargs)
        return turn_value(await self._courier.route_async(
            self.identity, deliver_request(envelope), method=envelope.method, timeout=options.timeout,
        ))

    def tell(self, method: str | Callable[..., Any], /, *args: Any, **kwargs: Any) -> None:
        """Send without waiting for the turn; returns once the ledger holds the message.

        A held message is delivered at least once and has its effect once: it carries an
        idempotency key (``idempotency_key``, else ``tell:<message id>``), and it stays
        held until its turn was committed or it was dead-lettered, so a host dying
        before or during the turn only delays it (by about one lease TTL). Failures,
        including refusals such as a retired identity, go to the dead-letter log.

        Raises:
            FleetUnavailableError, LedgerUnavailableError: the message was not accepted; send it again.
            InvalidSpecError: the message is malformed, or a ``timeout`` was given (a tell does not wait).
        """
        options = CallOptions.take(kwargs)
        if options.timeout is not None:
            raise InvalidSpecError(
                "tell does not wait for the turn, so a timeout means nothing there; use deadline= to bound when "
                "it may still run, or call/ask to wait for the reply",
                field="timeout",
            )
        envelope = options.envelope(self.identity, method, args, kwargs)
        self._courier.route_sync(self.identity, tell_request(envelope), method=envelope.method)

    def start(self, method: str | Callable[..., Any], /, *args: Any, **kwargs: Any) -> TurnHandle:
        """Start a turn of handler ``method`` and return its :class:`~rayfleet.TurnHandle` at once.

        The message is sent as ``call`` sends it (same options, retries and errors, which
        ``handle.result()`` raises), from a thread of its own; ``handle.id`` is the turn's id.
        Read its stream with ``handle.events()`` / ``handle.aevents()``; stop it with
        ``handle.cancel()``.

        Raises:
            InvalidSpecError: bad options (at once; everything else comes from ``result()``).
        """
        options = CallOptions.take(kwargs)
        envelope = options.envelope(self.identity, method, args, kwargs)
        return start_turn(self._courier, envelope, options.timeout, lambda courier, sent, timeout: send(
            courier, sent, timeout=timeout))

    def stream(self, method: str | Callable[..., Any], /, *args: Any, **kwargs: Any) -> AsyncIterator[TurnEvent]:
        """``start(...)`` then ``aevents()``: the new turn's stream, from its ``started`` event to its end.

        Use ``start`` instead to keep the handle (its reply, ``cancel``).
        """
        return self.start(method, *args, **kwargs).aevents()

    def status(self) -> IdentityStatus:
        """Where this agent is in its life, who owns it, and its lease (as ``fleet.status``)."""
        return status_of(self._courier.ledger, self.identity)
