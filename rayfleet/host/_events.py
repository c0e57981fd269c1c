"""Per-identity event fan-out: bounded, drop-oldest queues, one per subscriber.

Emitting never blocks and never waits for a reader: each subscriber has its own
bounded buffer, and a slow one loses its oldest events (counted in ``skipped``)
instead of stalling the host's turns.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Collection

from ..identity._values import IdentityEvent

EVENT_BUFFER = 64


class EventSubscription:
    """One subscriber's view of an identity's events.

    Holds at most 64 undelivered events; when full, the oldest is dropped and
    ``skipped`` counts it, so a slow reader never stalls the host.
    """

    def __init__(self) -> None:
        self._buffer: deque[IdentityEvent] = deque(maxlen=EVENT_BUFFER)
        self._ready = asyncio.Event()
        self.closed = False
        self.skipped = 0

    def push(self, event: IdentityEvent) -> None:
        if len(self._buffer) == self._buffer.maxlen:
            self.skipped += 1
        self._buffer.append(event)
        self._ready.set()

    def close(self) -> None:
        self.closed = True
        self._ready.set()

    def drain(self) -> list[IdentityEvent]:
        """Take every buffered event without waiting."""
        events = list(self._buffer)
        self._buffer.clear()
        if not self.closed:
            self._ready.clear()
        return events

    async def next_batch(self, timeout: float | None = None) -> list[IdentityEvent]:
        """Wait up to ``timeout`` for events; an empty list means none arrived (or closed)."""
        if not self._buffer and not self.closed:
            try:
                await asyncio.wait_for(self._ready.wait(), timeout)
            except asyncio.TimeoutError:
                return []
        return self.drain()

    async def __aiter__(self) -> AsyncIterator[IdentityEvent]:
        while True:
            batch = await self.next_batch()
            for event in batch:
                yield event
            if self.closed and not self._buffer:
                return


class EventHub:
    """Subscribers per identity. Emitting with nobody listening costs one dict lookup."""

    def __init__(self) -> None:
        self._subscribers: dict[str, list[EventSubscription]] = {}

    def subscribe(self, identity: str) -> EventSubscription:
        subscription = EventSubscription()
        self._subscribers.setdefault(identity, []).append(subscription)
        return subscription

    def unsubscribe(self, identity: str, subscription: EventSubscription) -> None:
        listeners = self._subscribers.get(identity, [])
        if subscription in listeners:
            listeners.remove(subscription)
        if not listeners:
            self._subscribers.pop(identity, None)

    def listened(self, identity: str) -> bool:
        """Whether anyone subscribes to ``identity``: emitters with many events to build ask first."""
        return identity in self._subscribers

    def listened_among(self, identities: Collection[str]) -> list[str]:
        """Those of ``identities`` someone subscribes to, found in time proportional to the subscribed ones."""
        return [identity for identity in self._subscribers if identity in identities]

    def emit(self, event: IdentityEvent) -> None:
        for subscription in self._subscribers.get(event.identity, ()):
            subscription.push(event)

    def close(self, identity: str) -> None:
        """End every subscription of an identity (it was deleted)."""
        for subscription in self._subscribers.pop(identity, ()):
            subscription.close()
