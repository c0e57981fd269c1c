"""What the host's parts need from one another and from their surroundings, as typed Protocols.

``Router`` is how an agent reaches its peers; the platform supplies one, and a host
without one refuses ``self.send``. ``ActivationPort`` is everything the delivery path
needs from the runtime that owns the agents, and nothing more: delivery runs turns
but never activates, renews, checkpoints or publishes events by itself, so each of
those stays in one place and a test can drive delivery with a small fake.
``LeasePort`` is what the lease keeper needs from the runtime: the keeper renews and
releases leases, but only the runtime takes an agent out of service or publishes its
events. ``HostMetrics`` is what the runtime, delivery and the lease keeper report for
dashboards; the platform exports it through Ray, and :data:`NO_METRICS` (the default) drops it.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from ..identity._values import EventKind
    from ..ledger._values import StepJournaled
    from ._hosted import HostedAgent
    from ._messages import Envelope

T = TypeVar("T")


class MessageOutcome(str, enum.Enum):
    """How one delivered message ended, as counted by ``rayfleet_messages``."""

    OK = "OK"
    """The handler ran and its turn was committed per the agent's durability."""
    DUPLICATE = "DUPLICATE"
    """Answered from the dedup window without running the handler."""
    HANDLER_ERROR = "HANDLER_ERROR"
    """The handler failed for good (the message was dead-lettered)."""
    REFUSED = "REFUSED"
    """A gate refused it before or instead of the handler (addressability, lifecycle, arguments, sequence,
    deadline, unknown handler, ...)."""
    LEASE_LOST = "LEASE_LOST"
    """Ownership moved during the turn; the caller retries with the new owner."""
    REDIRECTED = "REDIRECTED"
    """Another host owns the identity, or this one drains; the caller goes elsewhere."""
    ERROR = "ERROR"
    """Anything else (the ledger or storage failed, a bug)."""


TURN_EVENTS = ("step", "suspended", "resumed", "completed", "failed", "interrupted", "emitted", "delta")
"""What ``rayfleet_turn_events`` counts of durable turns (its ``event`` tag): ``emitted`` and ``delta`` count
``self.emit`` and ``self.emit_delta`` (turn streams)."""


class HostMetrics(Protocol):
    """What a host reports for dashboards. Every method is called on the host's event loop and must not block.

    Implementations must be cheap: :meth:`message` runs once per delivered message. The
    platform's implementation tallies in memory and exports to Ray's metrics once a
    second; :data:`NO_METRICS` drops everything.
    """

    def message(self, agent_class: str, outcome: MessageOutcome, seconds: float) -> None:
        """One message delivered to an agent of ``agent_class`` ended with ``outcome`` after ``seconds``."""
        ...

    def dead_letter(self, agent_class: str, reason: str) -> None:
        """One message went to the dead-letter log (``reason`` is a ``DeadLetterReason`` value)."""
        ...

    def parked(self, agent_class: str) -> None:
        """One message was parked because its agent is paused."""
        ...

    def activated(self, agent_class: str) -> None:
        """An agent of ``agent_class`` is hosted here now (it holds a lease)."""
        ...

    def deactivated(self, agent_class: str) -> None:
        """An agent of ``agent_class`` left this host (deactivated, dropped or retired); its lease is gone."""
        ...

    def lease_renewals(self, count: int) -> None:
        """``count`` leases were renewed."""
        ...

    def lease_lost(self) -> None:
        """An agent was dropped because its lease was lost or expired."""
        ...

    def stale_refusal(self, reason: str) -> None:
        """The ledger refused a fenced write of this host (``reason``: the refusal's error class name)."""
        ...

    def checkpoint(self, agent_class: str) -> None:
        """One checkpoint of an agent of ``agent_class`` was committed."""
        ...

    def commit_batch(self, size: int) -> None:
        """One group commit moved ``size`` snapshot pointers in one ledger call."""
        ...

    def turn_event(self, agent_class: str, event: str, count: int = 1) -> None:
        """Durable turns of an agent of ``agent_class``: ``count`` steps run, or a turn ``suspended``,
        ``resumed``, ``completed``, ``failed`` or ``interrupted`` (``event``: one of :data:`TURN_EVENTS`)."""
        ...


class _NoMetrics:
    """A :class:`HostMetrics` that drops everything (hosts outside Ray, tests)."""

    __slots__ = ()

    def message(self, agent_class: str, outcome: MessageOutcome, seconds: float) -> None:
        pass

    def dead_letter(self, agent_class: str, reason: str) -> None:
        pass

    def parked(self, agent_class: str) -> None:
        pass

    def activated(self, agent_class: str) -> None:
        pass

    def deactivated(self, agent_class: str) -> None:
        pass

    def lease_renewals(self, count: int) -> None:
        pass

    def lease_lost(self) -> None:
        pass

    def stale_refusal(self, reason: str) -> None:
        pass

    def checkpoint(self, agent_class: str) -> None:
        pass

    def commit_batch(self, size: int) -> None:
        pass

    def turn_event(self, agent_class: str, event: str, count: int = 1) -> None:
        pass


NO_METRICS: HostMetrics = _NoMetrics()
"""The default :class:`HostMetrics`: reports nothing."""


class Router(Protocol):
    """How an agent reaches another agent (``await self.send(peer, ...)``), and the platform an identity's owner."""

    async def send(self, *, sender: str, target: str, method: str, kwargs: Mapping[str, Any],
                   idempotency_key: str | None = None) -> Any:
        """A turn of ``target``'s handler ``method`` for ``sender``; under ``idempotency_key``, at most once."""
        ...

    async def deliver(self, envelope: Envelope) -> Any:
        """Deliver ``envelope`` from the platform (a wake, a timer's firing) to its identity's owner.

        The owner is activated anywhere if the identity is dormant. Returns the turn's
        value; a wake (``envelope.wake``) is answered as soon as the owner took it.
        """
        ...


class ActivationPort(Protocol):
    """The runtime's side of delivery: activation, lease health, checkpoints and events."""

    async def activate(self, identity: str) -> HostedAgent:
        """Host ``identity`` here under a fresh lease and return its entry.

        Concurrent calls for one identity share one activation. Raises
        ``InvalidStateError`` for a retired or broken identity, ``OwnedElsewhere``
        when another live host holds the lease, ``HostDraining`` when this host
        takes no new work, and the ledger's or the agent's own errors otherwise.
        """
        ...

    def is_internal_only(self, identity: str) -> bool:
        """Whether an activation of ``identity`` was refused while it is ``INTERNAL_ONLY``.

        Delivery then answers an outside caller NOT ADDRESSABLE instead of revealing
        the lifecycle state of an agent it may not reach at all.
        """
        ...

    async def ensure_healthy_lease(self, entry: HostedAgent) -> None:
        """Return once ``entry``'s lease has enough time left for a turn, renewing it if needed.

        Raises ``LeaseLostError`` (and the entry is dropped) when the lease is gone.
        """
        ...

    async def commit(self, entry: HostedAgent) -> StepJournaled | None:
        """Checkpoint ``entry`` now (the caller holds its turn lock), with its ``pending_step`` if any.

        Returns what became of that step (``None``: none was carried, or its run token was stale).

        Raises ``LeaseLostError`` (and the entry is dropped) when the ledger refuses the
        write, and ``LedgerUnavailableError`` or a storage error when it did not land;
        the runtime then leaves the entry consistent with the last commit.
        """
        ...

    async def fenced_write(self, entry: HostedAgent, what: str, write: Callable[[int], Awaitable[T]]) -> T:
        """Run ``write`` with ``entry``'s fencing token and return its result.

        Raises ``LeaseLostError``, chained to the ledger's refusal, when the token is
        refused; the entry is then dropped at once. ``what`` names the write in that
        error. Anything else ``write`` raises passes through unchanged.
        """
        ...

    def emit(self, identity: str, kind: EventKind, **details: Any) -> None:
        """Publish an event of ``identity`` to its subscribers.

        Never blocks: a subscriber that falls behind loses its oldest events instead.
        """
        ...


class LeasePort(Protocol):
    """The runtime's side of the lease keeper: taking an agent whose lease is gone out of service, and events."""

    async def drop(self, entry: HostedAgent, reason: str) -> None:
        """Take ``entry`` out of service at once: its lease is lost, so another host may own it now.

        ``entry`` is never served from this host again, a handler it is running is
        cancelled, and the loss is counted, logged with ``reason`` and published as
        ``LEASE_LOST``. Nothing is released: the lease is no longer this host's.
        """
        ...

    def emit(self, identity: str, kind: EventKind, **details: Any) -> None:
        """Publish an event of ``identity`` to its subscribers; never blocks (see ``ActivationPort.emit``)."""
        ...

    def listened_among(self, identities: Collection[str]) -> list[str]:
        """Those of ``identities`` someone subscribes to, so that a renewal of every lease builds no unheard event."""
        ...
