"""What the host's parts need from one another and from their surroundings, as typed Protocols.

``Router`` is how an agent reaches its peers; the platform supplies one, and a host
without one refuses ``self.send``. ``ActivationPort`` is everything the delivery path
needs from the runtime that owns the agents, and nothing more: delivery runs turns
but never activates, renews, checkpoints or publishes events by itself, so each of
those stays in one place and a test can drive delivery with a small fake.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from ..identity._values import EventKind
    from ._hosted import HostedAgent

T = TypeVar("T")


class Router(Protocol):
    """How an agent reaches another agent (``await self.send(peer, ...)``)."""

    async def send(self, *, sender: str, target: str, method: str, kwargs: Mapping[str, Any]) -> Any: ...


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

    async def commit(self, entry: HostedAgent) -> int:
        """Checkpoint ``entry`` now (the caller holds its turn lock); returns the new version.

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
