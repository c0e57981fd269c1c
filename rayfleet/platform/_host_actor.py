"""``AgentHost``: the Ray actor that hosts many agents (``rayfleet-host-N``)."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import functools
import logging
import os
import socket
import time
import uuid
import warnings
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import cloudpickle
import ray

from .._deadlines import within
from ..checkpoints._committer import INLINE_STATE_BYTES
from ..checkpoints._store import SnapshotStore
from ..errors import (
    DeadlineExceededError,
    FleetUnavailableError,
    HandlerError,
    InternalError,
    InvalidArgumentsError,
    InvalidSpecError,
    LeaseLostError,
    LedgerError,
    PeerCycleError,
    RayfleetError,
    StaleSequenceError,
    UnknownHandlerError,
    is_retryable,
)
from ..host._events import EventSubscription
from ..host._hosted import TurnResult
from ..host._messages import DeadLetterReason, Envelope, EnvelopeWire
from ..host._reports import DrainReport, HostStatistics
from ..host._runtime import STREAM_RETENTION, HostDraining, HostRuntime, OwnedElsewhere
from ..identity._values import IdentityEvent
from ..ledger._local import LocalLedgerClient
from ..ledger._location import LedgerLocation
from ..ledger._stall_watch import StallWatch
from ..ledger._stopped_writers import process_key
from ..ledger._values import holder_host
from ..retry import RetryPolicy
from ._batching import Answered, BatchServer
from ._ledger_client import connect_ledger_from
from ._metrics import HOST_EXPORT_INTERVAL, RayHostMetrics
from ._placement import (
    NODE_WATCH_INTERVAL,
    free_host_name,
    host_actor_names,
    host_scheduling,
    live_nodes,
    nodes_without_hosts,
)
from ._replies import ERROR, OK, REDIRECT, RETRY, Reply, turn_reply_wire, turn_value
from ._routing import Courier, HostDirectory, deliver_request
from ._shutdown_signals import DRAIN_ON_EXIT_TIMEOUT, NODE_DRAIN_POLL, drain_on_sigterm, node_drain_timeout

log = logging.getLogger("rayfleet.host")

SUBSCRIPTION_IDLE_TIMEOUT = 60.0
TELL_KEY_PREFIX = "tell:"
TELL_SWEEP_BATCH = 100
"""Held tells one sweep claims; a sweep runs every third of the redelivery age (the lease TTL)."""
START_RETRY = RetryPolicy(max_attempts=1, base_delay=0.1, max_delay=2.0, jitter=0.0)
"""After a failed start, the wait before a request may try again (doubling per failure, capped)."""
RESTART_START_PATIENCE = 300.0
"""Seconds a host that Ray restarted keeps trying to start by itself (later, its next request starts it)."""
NODE_ANSWER_TIMEOUT = 5.0
"""Seconds the watching host waits for another host to say which node it runs on."""
UNSURE_PASSES = 3
"""Node watches in a row that may be skipped because some host did not say where it runs."""


PEER_SEND_TIMEOUT = 300.0
"""Seconds a peer send waits for its reply when the calling turn has no deadline of its own."""

_CURRENT_TURN: contextvars.ContextVar[Envelope | None] = contextvars.ContextVar("rayfleet_current_turn", default=None)
"""The message whose turn runs in this task: a handler's peer sends extend its chain and keep its deadline."""


def _tell_outcome(error: BaseException) -> DeadLetterReason | None:
    """How a failed tell delivery ends: the dead-letter reason if it was handled for good, ``None`` if not.

    Not handled (the tell stays held): anything that may pass on another try, such as a
    dead host, a moved lease, an unreachable ledger or fleet, or an error that is not rayfleet's.
    """
    if isinstance(error, HandlerError):
        return DeadLetterReason.RETRIES_EXHAUSTED if error.raised_retryable else DeadLetterReason.REJECTED
    if isinstance(error, (InvalidArgumentsError, UnknownHandlerError)):
        return DeadLetterReason.DECODE_FAILED
    if isinstance(error, DeadlineExceededError):
        return DeadLetterReason.DEADLINE_EXCEEDED  # a tell has no timeout: only the host's deadline gate says this
    if isinstance(error, StaleSequenceError):
        return DeadLetterReason.STALE_SEQUENCE
    if not isinstance(error, RayfleetError) or isinstance(error, (LeaseLostError, FleetUnavailableError, LedgerError)):
        return None
    return None if is_retryable(error) else DeadLetterReason.REJECTED


def _received(identity: str, sent: object) -> Envelope | InvalidSpecError:
    """The envelope a request carried (itself or its wire form), or why it is not one addressed to ``identity``."""
    try:
        envelope = sent if isinstance(sent, Envelope) else Envelope.from_wire(sent)
    except InvalidSpecError as error:
        return error
    except TypeError as error:  # fields a foreign client named differently
        return InvalidSpecError(f"malformed message for {identity!r}: {error}", field="envelope")
    if envelope.target != identity:
        return InvalidSpecError(
            f"malformed request for {identity!r}: expected an rf.Envelope addressed to it, got one for "
            f"{envelope.target!r}. Send messages through fleet.agent(...).call()",
            field="envelope",
        )
    return envelope


async def _deliver_as_turn(runtime: HostRuntime, envelope: Envelope) -> TurnResult:
    """Deliver ``envelope`` here with it marked as this task's current turn (for the handler's sends)."""
    token = _CURRENT_TURN.set(envelope)
    try:
        return await runtime.delivery.deliver(envelope)
    finally:
        _CURRENT_TURN.reset(token)


class _HostRouter:
    """How agents on this host reach other agents: locally when possible, else via Ray.

    A send carries the chain of agents whose turns wait on it. One whose target is in
    that chain is refused with ``PeerCycleError`` before it is sent, since it could
    never be answered. A send waits at most until the calling turn's deadline (which
    the message carries on, so the target drops it if it comes too late), or
    :data:`PEER_SEND_TIMEOUT` without one, then raises ``DeadlineExceededError``.
    """

    def __init__(self, host: AgentHost) -> None:
        self._host = host

    async def send(self, *, sender: str, target: str, method: str, kwargs: Mapping[str, Any],
                   idempotency_key: str | None = None) -> Any:
        if target == sender:
            raise InvalidSpecError(
                f"{sender!r} sent {method!r} to itself; a handler cannot wait for its own turn. "
                f"Call the method directly on self instead",
                field="target",
            )
        calling = _CURRENT_TURN.get()
        if calling is not None and calling.target != sender:
            calling = None  # not this sender's turn (e.g. a task the handler started): no chain known
        chain = (*(calling.chain if calling else ()), sender)
        if target in chain:
            raise PeerCycleError(cycle=(*chain[chain.index(target):], target), method=method)
        deadline = calling.deadline if calling else None
        timeout = PEER_SEND_TIMEOUT if deadline is None else min(deadline - time.time(), PEER_SEND_TIMEOUT)
        if timeout <= 0:
            raise DeadlineExceededError(identity=target, method=method, timeout=0.0)
        envelope = Envelope(target=target, method=method, kwargs=dict(kwargs), sender=sender, deadline=deadline,
                            chain=chain, idempotency_key=idempotency_key)
        runtime = self._host.runtime
        if runtime.is_active(target):
            try:
                return (await within(_deliver_as_turn(runtime, envelope), timeout)).value
            except TimeoutError:
                raise DeadlineExceededError(identity=target, method=method, timeout=timeout) from None
        return turn_value(
            await self._host.courier.route_async(target, deliver_request(envelope), method=method, timeout=timeout)
        )

    async def deliver(self, envelope: Envelope) -> Any:
        runtime = self._host.runtime
        if runtime.is_active(envelope.target):
            return (await runtime.delivery.deliver(envelope)).value
        return turn_value(await self._host.courier.route_async(
            envelope.target, deliver_request(envelope), method=envelope.method, timeout=PEER_SEND_TIMEOUT))


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0)
class AgentHost:
    """Hosts many agents in one async actor; see :class:`HostRuntime` for the guarantees.

    Every request method answers with ``(kind, payload)``: ``ok`` with the value,
    ``redirect`` with the owning host's name, ``retry`` when this host cannot serve
    it now, or ``error`` with a pickle-safe ``RayfleetError`` (returned, not raised,
    so the caller gets the error itself rather than Ray's wrapper).
    """

    def __init__(self, name: str, namespace: str, storage: str, lease_ttl: float, idle_timeout: float,
                 ledger: str, inline_state_bytes: int = INLINE_STATE_BYTES) -> None:
        self.name = name
        self._inline_state_bytes = inline_state_bytes
        self._ledger_location = LedgerLocation.parse(ledger)
        self.namespace = namespace
        self._storage = storage
        self._lease_ttl = lease_ttl
        self._idle_timeout = idle_timeout
        self.runtime: HostRuntime
        self.courier: Courier
        self._running = False
        self._starting: asyncio.Task[None] | None = None
        self._start_failure: Exception | None = None
        self._start_failures = 0
        self._retry_start_at = 0.0
        self._tell_redelivery_after = lease_ttl
        self._forwarding: set[str] = set()
        self._tell_tasks: set[asyncio.Task[None]] = set()
        self._tell_sweeper: asyncio.Task[None] | None = None
        self._subscriptions: dict[str, tuple[str, EventSubscription, float]] = {}
        self._node_watch: asyncio.Task[None] | None = None
        self._metrics = RayHostMetrics(name)
        self._metrics_export: asyncio.Task[None] | None = None
        self._node_keeper: asyncio.Task[None] | None = None
        self._stall_watch: StallWatch | None = None
        self._unsure_passes = 0
        self._stopping = False
        self._batches = BatchServer()
        context = ray.get_runtime_context()
        self._node = context.get_node_id()
        with warnings.catch_warnings():
            # Ray's own property reads a deprecated one inside (actor_id); nothing to change on our side.
            warnings.simplefilter("ignore", DeprecationWarning)
            restarted = context.was_current_actor_reconstructed
        self._restart_start: asyncio.Task[None] | None = None
        if restarted:
            # Ray restarted this host (its process or node died). Starting now, not on the first
            # request, re-registers it at once, which frees the earlier incarnation's leases:
            # its identities are served again without waiting a lease TTL; and nothing routes
            # to a host the ledger does not list, so it would wait for good. A task on the
            # loop, which Ray runs __init__ on: an actor task sent to itself from here could
            # fail at once, Ray still seeing the actor restarting (it gets no retries).
            self._restart_start = asyncio.get_event_loop().create_task(self.start_after_restart())

    async def start(self) -> str:
        """Connect to the ledger, start the runtime and register; returns the lease holder id.

        Concurrent calls share one attempt. A failed start is not the host's fate: what
        the attempt started is stopped again, and a later call tries anew, though no
        sooner than :data:`START_RETRY` allows after the last failure (until then a
        call fails at once with that failure's error).

        Raises:
            FleetUnavailableError, LedgerUnavailableError, or whatever else the attempt
            raised (e.g. the fleet's ledger actor does not exist yet).
        """
        if self._running:
            return self.runtime.holder
        if self._starting is None:
            if self._start_failure is not None and time.monotonic() < self._retry_start_at:
                raise self._start_failure
            self._starting = asyncio.get_running_loop().create_task(self._start_once())
        starting = self._starting
        try:
            # Shielded: a caller that gives up does not cancel the attempt others wait on.
            await asyncio.shield(starting)
        finally:
            if starting.done() and self._starting is starting:
                self._starting = None
        return self.runtime.holder

    async def _start_once(self) -> None:
        try:
            ledger = await connect_ledger_from(self._ledger_location, namespace=self.namespace, node=self._node)
            courier = Courier(HostDirectory(self.namespace), ledger, lease_ttl=self._lease_ttl)
            self.courier = courier  # the runtime's router sends through it
            runtime = HostRuntime(
                name=self.name, ledger=ledger, snapshots=SnapshotStore(self._storage), router=_HostRouter(self),
                lease_ttl=self._lease_ttl, idle_timeout=self._idle_timeout, incarnation=uuid.uuid4().hex[:8],
                metrics=self._metrics, inline_limit=self._inline_state_bytes,
                stream_retention=float(os.environ.get("RAYFLEET_STREAM_RETENTION", STREAM_RETENTION)),
            )
            try:
                await runtime.start()
                await ledger.register_host(name=self.name, holder=runtime.holder, node=socket.gethostname(),
                                           pid=os.getpid(), process=process_key(os.getpid()))
                await courier.refresh_async()
            except BaseException:
                # Nothing of a failed attempt keeps running (renewal loop, committer, pool).
                with contextlib.suppress(Exception):
                    await runtime.shutdown(checkpoint=False)
                if isinstance(ledger, LocalLedgerClient):
                    ledger.close()
                raise
        except Exception as error:
            self._start_failures += 1
            self._start_failure = error
            self._retry_start_at = time.monotonic() + START_RETRY.delay_for(self._start_failures - 1)
            log.warning("%s could not start (attempt %d; a later request tries again): %s",
                        self.name, self._start_failures, error)
            raise
        self.runtime = runtime
        self._running = True
        # Installed once, by the attempt that succeeded: a failed attempt leaves none behind.
        loop = asyncio.get_running_loop()
        drain_on_sigterm(loop, self._drain_before_exit)
        self._node_watch = loop.create_task(self._watch_node_drain())
        self._tell_sweeper = loop.create_task(self._sweep_tells(), name=f"{self.name}-tells")
        self._metrics_export = loop.create_task(self._export_metrics(), name=f"{self.name}-metrics")
        self._node_keeper = loop.create_task(self._keep_nodes_covered(), name=f"{self.name}-nodes")
        if isinstance(ledger, LocalLedgerClient):
            # End what another (stopped) host holds that this one needs: its PostgreSQL sessions' row
            # locks, or the SQLite file's write lock (by ending the stopped process).
            self._stall_watch = StallWatch(ledger.ledger)
            self._stall_watch.start()
        self._start_failure = None
        self._start_failures = 0

    async def start_after_restart(self) -> None:
        """Start a host Ray restarted; retried for :data:`RESTART_START_PATIENCE` s (e.g. while the ledger restarts)."""
        deadline = time.monotonic() + RESTART_START_PATIENCE
        while not self._running and not self._stopping:
            try:
                await self.start()
                log.warning("%s was restarted by Ray on node %s and registered again", self.name, self._node)
                return
            except Exception:  # noqa: BLE001 - start() logged why; wait and try again
                if time.monotonic() > deadline:
                    return
                await asyncio.sleep(max(self._retry_start_at - time.monotonic(), 0.1))

    def node_id(self) -> str:
        """The Ray node this host runs on (answered without starting the host)."""
        return self._node

    async def _export_metrics(self) -> None:
        """Hand the host's metric tallies to Ray once per :data:`HOST_EXPORT_INTERVAL`, for the host's lifetime."""
        while True:
            await asyncio.sleep(HOST_EXPORT_INTERVAL)
            try:
                self._metrics.export()
            except Exception as error:  # noqa: BLE001 - metrics must never take a host down
                log.warning("%s could not export metrics: %s", self.name, error)

    def _start_error(self, error: Exception) -> FleetUnavailableError:
        return FleetUnavailableError(
            detail=f"host {self.name} could not start ({type(error).__name__}: {error}); it tries again on "
            f"the next request, so retry shortly"
        )

    async def _serve(self, work: Callable[[], Awaitable[Any]]) -> tuple[str, Any]:
        """Start if needed, then run ``work()`` and answer ``(kind, payload)``.

        While the host cannot start, the answer is a retryable ``FleetUnavailableError``
        naming the cause; ``work`` is made only once the runtime exists.
        """
        try:
            await self.start()
        except Exception as error:  # noqa: BLE001 - answered as a typed error; a later request starts again
            return ERROR, self._start_error(error)
        try:
            return OK, await work()
        except OwnedElsewhere as signal:
            return REDIRECT, holder_host(signal.holder)
        except HostDraining:
            return RETRY, None
        except RayfleetError as error:
            return ERROR, error
        except Exception as error:  # a bug, not the caller's fault: report it without crashing the host
            log.exception("unexpected error on %s", self.name)
            return ERROR, InternalError(detail=f"on {self.name}, {type(error).__name__}: {error}")

    async def deliver(self, identity: str, envelope: Envelope | EnvelopeWire) -> tuple[str, Any]:
        """Run one message through this host's front door (``runtime.delivery``); the reply is the turn's
        value, usage and what became of the workflow step it was asked to journal, as
        :func:`~rayfleet.platform._replies.turn_reply_wire` encodes them."""
        received = _received(identity, envelope)
        if isinstance(received, InvalidSpecError):
            return ERROR, received

        async def turn() -> Any:
            result = await _deliver_as_turn(self.runtime, received)
            return turn_reply_wire(result.value, result.usage, result.step)

        return await self._serve(turn)

    async def serve_batch(self, envelopes: list[EnvelopeWire]) -> Answered:
        """Serve several requests of one caller at once, each as :meth:`deliver` would, concurrently; the
        answer lists replies as ``_batching`` describes."""
        turns = [functools.partial(self.deliver, wire[0] if isinstance(wire, tuple) and wire else "", wire)
                 for wire in envelopes]
        return await self._batches.serve(turns)

    async def collect(self, token: str) -> Reply:
        """The reply of a batch's turn that was still running when the batch was answered."""
        return await self._batches.collect(token)

    async def tell(self, identity: str, envelope: Envelope | EnvelopeWire) -> tuple[str, Any]:
        """Fire-and-forget: hold the message durably, answer, then deliver it in the background.

        The sender's answer comes only once the ledger holds the message; if it cannot,
        the answer is that error and nothing was accepted. The held message is forgotten
        only when its turn was handled: committed, or dead-lettered (a letter is made
        sure of in the same ledger transaction). A refusal that will never pass (retired
        identity, unknown handler, ...) is dead-lettered too, since nobody waits to hear
        it. A delivery that ends any other way (this host dies, the lease moves, the
        ledger is unreachable, the dead letter cannot be written) leaves the message
        held, and a host's sweep delivers it again once nobody has attempted it for one
        lease TTL. The message carries an idempotency key (its own, else
        ``tell:<message id>``), so a second delivery of a handled tell has no second effect.
        """
        received = _received(identity, envelope)
        if isinstance(received, InvalidSpecError):
            return ERROR, received
        envelope = received
        try:
            await self.start()
        except Exception as error:  # noqa: BLE001 - the same typed answer as every other request
            return ERROR, self._start_error(error)
        if envelope.idempotency_key is None:
            envelope = dataclasses.replace(envelope, idempotency_key=f"{TELL_KEY_PREFIX}{envelope.message_id}")
        try:
            await self.courier.ledger.hold_tell(identity=identity, message_id=envelope.message_id,
                                                envelope=cloudpickle.dumps(envelope))
        except RayfleetError as error:
            return ERROR, error
        except Exception as error:  # noqa: BLE001 - e.g. the ledger actor restarting: not accepted, say so
            return ERROR, FleetUnavailableError(detail=f"the ledger could not hold the tell ({error}); send it again")
        self._forward_tell(envelope)
        return OK, None

    def _forward_tell(self, envelope: Envelope) -> None:
        if envelope.message_id in self._forwarding:
            return  # already on its way from this host
        self._forwarding.add(envelope.message_id)
        task = asyncio.get_running_loop().create_task(self._deliver_tell(envelope))
        self._tell_tasks.add(task)
        task.add_done_callback(self._tell_tasks.discard)

    async def _deliver_tell(self, envelope: Envelope) -> None:
        """Deliver one held tell to its owner and settle it if handled; otherwise it stays held."""
        identity, method = envelope.target, envelope.method
        try:
            try:
                await self.courier.route_async(identity, deliver_request(envelope), method=method)
                reason, text = None, ""
            except Exception as error:  # noqa: BLE001 - sorted below: handled (settle) or not (stay held)
                reason, text = _tell_outcome(error), str(error)
                if reason is None:
                    log.warning("tell %s.%s not delivered yet (held for redelivery): %s", identity, method, error)
                    return
            await self.courier.ledger.settle_tell(identity=identity, message_id=envelope.message_id,
                                                  reason=None if reason is None else reason.value, error=text)
        except Exception as error:  # noqa: BLE001 - the tell stays held; the sweep delivers it again
            log.warning("tell %s.%s could not be settled (held for redelivery): %s", identity, method, error)
        finally:
            self._forwarding.discard(envelope.message_id)

    async def _sweep_tells(self) -> None:
        """Deliver held tells nobody has attempted for a while (their accepting host died, say)."""
        while True:
            await asyncio.sleep(self._tell_redelivery_after / 3)
            try:
                claimed = await self.courier.ledger.claim_tells(min_age=self._tell_redelivery_after,
                                                                limit=TELL_SWEEP_BATCH)
            except Exception as error:  # noqa: BLE001 - try again next round
                log.warning("%s could not read held tells: %s", self.name, error)
                continue
            for stored in claimed:
                self._forward_tell(cloudpickle.loads(stored.envelope))

    async def activate(self, identity: str) -> tuple[str, Any]:
        return await self._serve(lambda: self.runtime.activate(identity))

    # -- lifecycle operations: each is fenced by the runtime before it has any effect

    async def retire(self, identity: str) -> tuple[str, Any]:
        """Reply: the fencing token the retirement was written with."""
        return await self._serve(lambda: self.runtime.retire(identity))

    async def respawn(self, identity: str) -> tuple[str, Any]:
        return await self._serve(lambda: self.runtime.respawn(identity))

    async def reset(self, identity: str) -> tuple[str, Any]:
        return await self._serve(lambda: self.runtime.reset(identity))

    async def delete(self, identity: str) -> tuple[str, Any]:
        return await self._serve(lambda: self.runtime.delete(identity))

    async def deactivate(self, identity: str) -> tuple[str, Any]:
        """Reply: whether the agent was active."""
        return await self._serve(lambda: self.runtime.deactivate(identity))

    async def pause(self, identity: str) -> tuple[str, Any]:
        return await self._serve(lambda: self.runtime.delivery.pause(identity))

    async def resume(self, identity: str) -> tuple[str, Any]:
        """Reply: how many parked messages were replayed."""
        return await self._serve(lambda: self.runtime.delivery.resume(identity))

    async def cancel_parked(self, identity: str) -> tuple[str, Any]:
        """Reply: how many parked messages were dead-lettered."""
        return await self._serve(lambda: self.runtime.delivery.cancel_parked(identity))

    async def turn_events(self, identity: str, turn_id: str, after: str | None, wait: float) -> tuple[str, Any]:
        """Reply: ``(events, state, gap)`` of a turn's stream after event id ``after`` (a long poll of ``wait`` s)."""
        return await self._serve(lambda: self.runtime.delivery.watch_turn(identity, turn_id, after, wait))

    async def running_turn(self, identity: str) -> tuple[str, str] | None:
        """``(turn id, method)`` of the turn of ``identity`` running here now, or ``None``; starts nothing."""
        if not self._running:
            return None
        return self.runtime.delivery.running_turn(identity)

    async def turn_here(self, identity: str, turn_id: str) -> tuple[str, str] | None:
        """``(state, method)`` of a turn of ``identity`` as this host knows it (running, or how it ended here),
        or ``None``; starts nothing."""
        if not self._running:
            return None
        return self.runtime.delivery.turn_here(identity, turn_id)

    async def cancel_turn(self, identity: str, turn_id: str) -> tuple[str, Any]:
        """Reply: whether the turn was in progress here and is now interrupted."""
        return await self._serve(lambda: self.runtime.delivery.cancel_turn(identity, turn_id))

    async def deactivate_all(self) -> int:
        """Checkpoint and release every agent hosted now (see :meth:`HostRuntime.deactivate_all`); returns how many."""
        await self.start()
        return await self.runtime.deactivate_all()

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
        if not self._running:
            return
        report = await self.drain(timeout)
        log.warning("%s drained before exit: %s", self.name, report)
        await self.courier.ledger.remove_host(name=self.name, holder=self.runtime.holder)

    async def _watch_node_drain(self) -> None:
        """Drain when the GCS starts draining this host's node (``ray drain-node``, autoscaler, KubeRay)."""
        node_id = self._node
        while not self.runtime.draining:
            await asyncio.sleep(NODE_DRAIN_POLL)
            timeout = await asyncio.to_thread(node_drain_timeout, node_id, DRAIN_ON_EXIT_TIMEOUT)
            if timeout is not None and not self.runtime.draining:
                log.warning("node %s of %s is being drained; draining within %.0f s", node_id, self.name, timeout)
                await self.drain(timeout)

    async def _keep_nodes_covered(self) -> None:
        """Keep the host list true to Ray, and a host on every eligible node (one that joined, or lost its hosts).

        Only the leader acts: the lowest-named host that is registered and not draining, as
        the ledger lists them, so one host watches however many there are; when it dies, the
        next one takes over at its next look. A look every :data:`NODE_WATCH_INTERVAL` seconds.
        Registered hosts whose actors Ray no longer has (they died with their node) leave the
        host list, which frees their leases, even when no request has run into them yet.
        """
        while not self._stopping:
            await asyncio.sleep(NODE_WATCH_INTERVAL)
            try:
                started = await self.cover_nodes()
            except Exception as error:  # noqa: BLE001 - the next look tries again
                log.warning("%s could not look for nodes without a host: %s", self.name, error)
                continue
            for name, node in started.items():
                log.warning("%s started %s on node %s, which had no host of this fleet", self.name, name, node)

    async def cover_nodes(self) -> dict[str, str]:
        """One look of :meth:`_keep_nodes_covered`; returns the hosts started, with their nodes."""
        await self.start()
        await self.courier.refresh_async()
        directory = self.courier.directory
        serving = [info for info in directory.hosts() if not info.draining]
        if self._stopping or self.runtime.draining or not serving or serving[0].name != self.name \
                or serving[0].holder != self.runtime.holder:
            return {}
        nodes = await asyncio.to_thread(live_nodes)
        # Read after the host list: a host registered in it existed before this listing.
        actors = await asyncio.to_thread(host_actor_names, self.namespace)
        for info in directory.hosts():
            if info.name not in actors:
                log.warning("%s forgets %s: Ray has no such actor any more", self.name, info.name)
                await self.courier.ledger.remove_host(name=info.name, holder=info.holder)
        names = set(actors) | set(directory.names)
        placed = await self._host_nodes(actors)
        if any(node is None for node in placed.values()) and self._unsure_passes < UNSURE_PASSES:
            # A host that does not say where it runs may be restarting onto one of these nodes.
            self._unsure_passes += 1
            return {}
        self._unsure_passes = 0
        started: dict[str, str] = {}
        for node in nodes_without_hosts(nodes, placed):
            if self._stopping:
                break
            name = free_host_name(names)
            names.add(name)
            handle = launch_host(name, namespace=self.namespace, storage=self._storage, lease_ttl=self._lease_ttl,
                                 idle_timeout=self._idle_timeout, ledger=self._ledger_location.url, node=node,
                                 inline_state_bytes=self._inline_state_bytes)
            await handle.start.remote()
            started[name] = node
        if started:
            await self.courier.refresh_async()
        return started

    async def _host_nodes(self, names: list[str]) -> dict[str, str | None]:
        """The node each named host runs on; ``None`` for one that does not answer in time."""

        async def node_of(name: str) -> str | None:
            if name == self.name:
                return self._node
            try:
                handle = await asyncio.to_thread(ray.get_actor, name, namespace=self.namespace)
                answer: str = await asyncio.wait_for(handle.node_id.remote(), NODE_ANSWER_TIMEOUT)
                return answer
            except Exception:  # noqa: BLE001 - gone, restarting or frozen: where it runs is unknown
                return None

        return dict(zip(names, await asyncio.gather(*(node_of(name) for name in names)), strict=True))

    async def undrain(self) -> None:
        await self.start()
        self.runtime.draining = False
        await self.courier.ledger.set_host_draining(name=self.name, draining=False)

    async def shutdown(self) -> int:
        """Checkpoint and release every agent, then leave the ledger's host list."""
        self._stopping = True
        if self._node_keeper is not None:
            self._node_keeper.cancel()
        await self.start()
        count = len(self.runtime.active_identities())
        await self.runtime.shutdown(checkpoint=True)
        await self.courier.ledger.remove_host(name=self.name, holder=self.runtime.holder)
        if self._stall_watch is not None:
            await asyncio.to_thread(self._stall_watch.stop)
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


def launch_host(
    name: str, *, namespace: str, storage: str, lease_ttl: float, idle_timeout: float, ledger: str,
    node: str | None, inline_state_bytes: int = INLINE_STATE_BYTES,
) -> ray.actor.ActorHandle:
    """The host actor ``name``, created pinned to ``node`` (see ``_placement``) if it does not exist yet.

    An existing actor of that name is returned as it is, wherever it runs, with the
    settings it was created with. The host is not started: call ``start`` on it.
    """
    handle: ray.actor.ActorHandle = AgentHost.options(  # type: ignore[attr-defined]
        name=name, namespace=namespace, lifetime="detached", get_if_exists=True,
        scheduling_strategy=host_scheduling(node),
    ).remote(name, namespace, storage, lease_ttl, idle_timeout, ledger, inline_state_bytes)
    return handle
