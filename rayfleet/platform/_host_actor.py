"""``AgentHost``: the Ray actor that hosts many agents (``rayfleet-host-N``)."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Mapping
from typing import Any

import ray

from ..checkpoints._store import SnapshotStore
from ..errors import InvalidSpecError, RayfleetError
from ..host._events import EventSubscription
from ..host._messages import Envelope
from ..host._runtime import (
    DrainReport,
    HostDraining,
    HostRuntime,
    HostStatistics,
    OwnedElsewhere,
    holder_host,
)
from ..identity._values import IdentityEvent
from ..ledger._location import LedgerLocation
from ._ledger_client import connect_ledger
from ._routing import (
    ERROR,
    OK,
    REDIRECT,
    RETRY,
    Courier,
    HostDirectory,
    deliver_request,
    probe_interval_for,
)
from ._shutdown_signals import DRAIN_ON_EXIT_TIMEOUT, NODE_DRAIN_POLL, drain_on_sigterm, node_drain_timeout

log = logging.getLogger("rayfleet.host")

SUBSCRIPTION_IDLE_TIMEOUT = 60.0


class _HostRouter:
    """How agents on this host reach other agents: locally when possible, else via Ray."""

    def __init__(self, host: AgentHost) -> None:
        self._host = host

    async def send(self, *, sender: str, target: str, method: str, kwargs: Mapping[str, Any]) -> Any:
        if target == sender:
            raise InvalidSpecError(
                f"{sender!r} sent {method!r} to itself; a handler cannot wait for its own turn. "
                f"Call the method directly on self instead",
                field="target",
            )
        envelope = Envelope(target=target, method=method, kwargs=dict(kwargs), sender=sender)
        runtime = self._host.runtime
        if runtime.is_active(target):
            return (await runtime.deliver_envelope(envelope)).value
        return await self._host.courier.route_async(target, deliver_request(envelope), method=method)


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0)
class AgentHost:
    """Hosts many agents in one async actor; see :class:`HostRuntime` for the guarantees.

    Every request method answers with ``(kind, payload)``: ``ok`` with the value,
    ``redirect`` with the owning host's name, ``retry`` when this host cannot serve
    it now, or ``error`` with a pickle-safe ``RayfleetError`` (returned, not raised,
    so the caller gets the error itself rather than Ray's wrapper).
    """

    def __init__(self, name: str, namespace: str, storage: str, lease_ttl: float, idle_timeout: float,
                 ledger: str) -> None:
        self.name = name
        self._ledger_location = LedgerLocation.parse(ledger)
        self.namespace = namespace
        self._storage = storage
        self._lease_ttl = lease_ttl
        self._idle_timeout = idle_timeout
        self.runtime: HostRuntime
        self.courier: Courier
        self._started: asyncio.Future[None] | None = None
        self._subscriptions: dict[str, tuple[str, EventSubscription, float]] = {}
        self._node_watch: asyncio.Task[None] | None = None

    async def start(self) -> str:
        """Connect to the ledger, start the runtime and register; returns the lease holder id."""
        if self._started is None:
            self._started = asyncio.get_running_loop().create_future()
            try:
                ledger = connect_ledger(self._ledger_location, namespace=self.namespace)
                self.courier = Courier(
                    HostDirectory(self.namespace), ledger, probe_interval=probe_interval_for(self._lease_ttl)
                )
                self.runtime = HostRuntime(
                    name=self.name, ledger=ledger, snapshots=SnapshotStore(self._storage), router=_HostRouter(self),
                    lease_ttl=self._lease_ttl, idle_timeout=self._idle_timeout, incarnation=uuid.uuid4().hex[:8],
                )
                await self.runtime.start()
                await ledger.register_host(name=self.name, holder=self.runtime.holder)
                drain_on_sigterm(asyncio.get_running_loop(), self._drain_before_exit)
                self._node_watch = asyncio.get_running_loop().create_task(self._watch_node_drain())
                await self.courier.refresh_async()
                self._started.set_result(None)
            except BaseException as error:
                self._started.set_exception(error)
                raise
        await self._started
        return self.runtime.holder

    async def _serve(self, work: Awaitable[Any]) -> tuple[str, Any]:
        if self._started is None:
            await self.start()
        else:
            await self._started
        try:
            return OK, await work
        except OwnedElsewhere as signal:
            return REDIRECT, holder_host(signal.holder)
        except HostDraining:
            return RETRY, None
        except RayfleetError as error:
            return ERROR, error
        except Exception as error:  # a bug, not the caller's fault: report it without crashing the host
            log.exception("unexpected error on %s", self.name)
            return ERROR, RayfleetError(
                f"internal error on {self.name}: {type(error).__name__}: {error}. This is a rayfleet bug; "
                f"please report it with the host log"
            )

    async def deliver(self, identity: str, envelope: Envelope) -> tuple[str, Any]:
        if not isinstance(envelope, Envelope) or envelope.target != identity:
            return ERROR, InvalidSpecError(
                f"malformed request for {identity!r}: expected an rf.Envelope addressed to it, got "
                f"{type(envelope).__name__}. Send messages through fleet.agent(...).call()",
                field="envelope",
            )

        async def turn() -> Any:
            return (await self.runtime.deliver_envelope(envelope)).value

        return await self._serve(turn())

    async def dispatch(self, identity: str, envelope: Envelope) -> tuple[str, Any]:
        """Like :meth:`deliver`, but the reply carries the turn's usage: ``(value, Usage)``."""
        if not isinstance(envelope, Envelope) or envelope.target != identity:
            return await self.deliver(identity, envelope)

        async def turn() -> Any:
            result = await self.runtime.deliver_envelope(envelope)
            return result.value, result.usage

        return await self._serve(turn())

    async def tell(self, identity: str, envelope: Envelope) -> tuple[str, Any]:
        """Fire-and-forget: accept at once, deliver in the background (forwarding if owned elsewhere).

        Failures are dead-lettered by the host that runs the turn, so nothing is lost silently.
        """

        async def forward() -> None:
            try:
                await self.courier.route_async(identity, deliver_request(envelope), method=envelope.method)
            except Exception as error:  # noqa: BLE001 - nobody waits for a tell; the owner dead-letters real failures
                log.warning("tell %s.%s failed: %s", identity, envelope.method, error)

        asyncio.get_running_loop().create_task(forward())
        return OK, None

    async def activate(self, identity: str) -> tuple[str, Any]:
        return await self._serve(self.runtime.activate(identity))

    # -- lifecycle operations: each is fenced by the runtime before it has any effect

    async def retire(self, identity: str) -> tuple[str, Any]:
        """Reply: the fencing token the retirement was written with."""
        return await self._serve(self.runtime.retire(identity))

    async def respawn(self, identity: str) -> tuple[str, Any]:
        return await self._serve(self.runtime.respawn(identity))

    async def reset(self, identity: str) -> tuple[str, Any]:
        return await self._serve(self.runtime.reset(identity))

    async def delete(self, identity: str) -> tuple[str, Any]:
        return await self._serve(self.runtime.delete(identity))

    async def deactivate(self, identity: str) -> tuple[str, Any]:
        """Reply: whether the agent was active."""
        return await self._serve(self.runtime.deactivate(identity))

    async def pause(self, identity: str) -> tuple[str, Any]:
        return await self._serve(self.runtime.pause(identity))

    async def resume(self, identity: str) -> tuple[str, Any]:
        """Reply: how many parked messages were replayed."""
        return await self._serve(self.runtime.resume(identity))

    async def cancel_parked(self, identity: str) -> tuple[str, Any]:
        """Reply: how many parked messages were dead-lettered."""
        return await self._serve(self.runtime.cancel_parked(identity))

    async def drain(self, timeout: float) -> DrainReport:
        """Stop new activations, then move every agent off this host within ``timeout`` seconds.

        See :meth:`HostRuntime.drain`. The ledger's host list marks it draining first,
        so routers stop placing identities here; when the ledger is out of reach the
        drain goes on (placement then learns from redirects).
        """
        await self.start()
        self.runtime.draining = True
        try:
            await self.courier.ledger.set_host_draining(name=self.name, draining=True)
        except Exception as error:  # noqa: BLE001 - draining must not depend on the ledger being up
            log.warning("could not mark %s draining in the ledger: %s", self.name, error)
        return await self.runtime.drain(timeout)

    async def _drain_before_exit(self, timeout: float) -> None:
        """SIGTERM: drain, then leave the host list so nobody routes here while the process exits."""
        if self._started is None or not self._started.done() or self._started.exception() is not None:
            return
        report = await self.drain(timeout)
        log.warning("%s drained before exit: %s", self.name, report)
        await self.courier.ledger.remove_host(name=self.name, holder=self.runtime.holder)

    async def _watch_node_drain(self) -> None:
        """Drain when the GCS starts draining this host's node (``ray drain-node``, autoscaler, KubeRay)."""
        node_id = ray.get_runtime_context().get_node_id()
        while not self.runtime.draining:
            await asyncio.sleep(NODE_DRAIN_POLL)
            timeout = await asyncio.to_thread(node_drain_timeout, node_id, DRAIN_ON_EXIT_TIMEOUT)
            if timeout is not None and not self.runtime.draining:
                log.warning("node %s of %s is being drained; draining within %.0f s", node_id, self.name, timeout)
                await self.drain(timeout)

    async def undrain(self) -> None:
        await self.start()
        self.runtime.draining = False
        await self.courier.ledger.set_host_draining(name=self.name, draining=False)

    async def shutdown(self) -> int:
        """Checkpoint and release every agent, then leave the ledger's host list."""
        await self.start()
        count = len(self.runtime.active_identities())
        await self.runtime.shutdown(checkpoint=True)
        await self.courier.ledger.remove_host(name=self.name, holder=self.runtime.holder)
        return count

    async def refresh_peers(self) -> int:
        await self.start()
        return await self.runtime.refresh_peers()

    async def flush(self) -> int:
        await self.start()
        return await self.runtime.flush()

    async def statistics(self) -> HostStatistics:
        await self.start()
        return self.runtime.statistics()

    async def active_identities(self) -> list[str]:
        await self.start()
        return self.runtime.active_identities()

    async def open_subscription(self, identity: str, subscriber: str) -> None:
        await self.start()
        if subscriber not in self._subscriptions:
            self._subscriptions[subscriber] = (identity, self.runtime.subscribe(identity), time.monotonic())

    async def poll_events(self, subscriber: str, timeout: float) -> tuple[list[IdentityEvent], bool]:
        """Events for one subscriber, waiting up to ``timeout``; the flag says the stream ended."""
        await self.start()
        self._sweep_subscriptions()
        entry = self._subscriptions.get(subscriber)
        if entry is None:
            return [], True
        identity, subscription, _ = entry
        events = await subscription.next_batch(timeout)
        self._subscriptions[subscriber] = (identity, subscription, time.monotonic())
        return events, subscription.closed

    async def close_subscription(self, subscriber: str) -> None:
        entry = self._subscriptions.pop(subscriber, None)
        if entry is not None:
            self.runtime.unsubscribe(entry[0], entry[1])

    def _sweep_subscriptions(self) -> None:
        cutoff = time.monotonic() - SUBSCRIPTION_IDLE_TIMEOUT
        for subscriber, (identity, subscription, last) in list(self._subscriptions.items()):
            if last < cutoff:
                del self._subscriptions[subscriber]
                self.runtime.unsubscribe(identity, subscription)
