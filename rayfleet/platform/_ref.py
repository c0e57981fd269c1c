"""``AgentRef``: a handle on one agent by name, and the one path a driver's message takes to it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ray

from ..errors import DeadlineExceededError
from ..host._messages import Envelope
from ..identity._handlers import handler_name
from ..identity._values import IdentityStatus
from ._routing import Courier, deliver_request, tell_request
from ._status import status_of


def send(courier: Courier, envelope: Envelope, *, timeout: float | None = None) -> Any:
    """Deliver ``envelope`` to its target's owner and wait for the handler's value.

    Raises:
        DeadlineExceededError: no reply within ``timeout`` seconds.
    """
    try:
        return courier.route_sync(envelope.target, deliver_request(envelope), method=envelope.method, timeout=timeout)
    except ray.exceptions.GetTimeoutError:
        raise DeadlineExceededError(identity=envelope.target, method=envelope.method, timeout=timeout or 0.0) from None


class AgentRef:
    """A handle on one agent by name; cheap to create, safe to share."""

    __slots__ = ("_courier", "identity")

    def __init__(self, courier: Courier, identity: str) -> None:
        self._courier = courier
        self.identity = identity

    def __repr__(self) -> str:
        return f"AgentRef({self.identity!r})"

    def envelope(
        self,
        method: str | Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        idempotency_key: str | None = None,
        deadline: float | None = None,
        conversation: str | None = None,
        sequence: int | None = None,
    ) -> Envelope:
        """The message a call sends (``sender`` is empty: the caller is outside the fleet)."""
        return Envelope(
            target=self.identity, method=handler_name(method), args=args, kwargs=kwargs,
            idempotency_key=idempotency_key, deadline=deadline, conversation=conversation, sequence=sequence,
        )

    def call(
        self,
        method: str | Callable[..., Any],
        /,
        *args: Any,
        timeout: float | None = None,
        idempotency_key: str | None = None,
        deadline: float | None = None,
        conversation: str | None = None,
        sequence: int | None = None,
        **kwargs: Any,
    ) -> Any:
        """Run handler ``method`` and return its value (blocking).

        Args:
            method: the handler's name (``"add"``) or the handler itself (``Counter.add``).
            timeout: seconds to wait for the reply (``DeadlineExceededError`` after).
            idempotency_key: calls with the same key (from the same sender) have their
                effect once; repeats get the original reply.
            deadline: wall-clock time (``time.time()``) after which the message is not
                run but dead-lettered.
            conversation, sequence: a message whose sequence is lower than one already
                seen in its conversation is refused (``StaleSequenceError``) and dead-lettered.

        Raises:
            HandlerError: the handler raised (remote type, message and traceback inside).
            DeadlineExceededError: no reply within ``timeout`` seconds, or the deadline passed.
            UnknownIdentityError, UnknownHandlerError, InvalidArgumentsError,
            InvalidStateError, NotAddressableError, StaleSequenceError,
            LeaseLostError, FleetUnavailableError.
        """
        envelope = self.envelope(method, args, kwargs, idempotency_key=idempotency_key, deadline=deadline,
                                 conversation=conversation, sequence=sequence)
        return send(self._courier, envelope, timeout=timeout)

    async def ask(
        self,
        method: str | Callable[..., Any],
        /,
        *args: Any,
        timeout: float | None = None,
        idempotency_key: str | None = None,
        deadline: float | None = None,
        conversation: str | None = None,
        sequence: int | None = None,
        **kwargs: Any,
    ) -> Any:
        """``call``, awaited."""
        envelope = self.envelope(method, args, kwargs, idempotency_key=idempotency_key, deadline=deadline,
                                 conversation=conversation, sequence=sequence)
        return await self._courier.route_async(self.identity, deliver_request(envelope), method=envelope.method,
                                               timeout=timeout)

    def tell(
        self,
        method: str | Callable[..., Any],
        /,
        *args: Any,
        idempotency_key: str | None = None,
        deadline: float | None = None,
        conversation: str | None = None,
        sequence: int | None = None,
        **kwargs: Any,
    ) -> None:
        """Send without waiting for the turn; returns once the ledger holds the message.

        A held message is delivered at least once and has its effect once: it carries an
        idempotency key (``idempotency_key``, else ``tell:<message id>``), and it stays
        held until its turn was committed or it was dead-lettered, so a host dying
        before or during the turn only delays it (by about one lease TTL). Failures,
        including refusals such as a retired identity, go to the dead-letter log.

        Raises:
            FleetUnavailableError, LedgerUnavailableError: the message was not accepted; send it again.
            InvalidSpecError: the message is malformed.
        """
        envelope = self.envelope(method, args, kwargs, idempotency_key=idempotency_key, deadline=deadline,
                                 conversation=conversation, sequence=sequence)
        self._courier.route_sync(self.identity, tell_request(envelope), method=envelope.method)

    def status(self) -> IdentityStatus:
        """Where this agent is in its life, who owns it, and its lease (as ``fleet.status``)."""
        return status_of(self._courier.ledger, self.identity)
