"""The host runtime: activates identities under fenced leases and runs their turns.

One ``HostRuntime`` lives in each host. It owns the agents it has activated, one
mailbox (turn lock) per identity, the host's lease renewals, its group committer
and every background task it starts. It knows nothing about Ray: ``platform`` wraps
it in an actor. The message path itself is :class:`~rayfleet.host._delivery.Delivery`,
which the runtime builds and delegates to; the runtime is its ``ActivationPort``.

What the runtime guarantees, and why:

* Everything that changes a hosted agent's State or delivery bookkeeping (a turn,
  a commit, pause and resume, deactivation, fencing for a lifecycle operation) runs
  under that identity's turn lock, so a lifecycle operation never interleaves with
  a turn and loses its effect or the turn's. Only the renewal loop (which replaces
  the grant, or drops an entry whose lease is gone) and a peer refresh touch an
  entry without the lock; a turn running then cannot commit under a lost lease.
* Activation either hosts the agent or releases the lease it acquired: every
  failure path (unloadable class, corrupt snapshot, failing ``on_activate``, a
  retired or broken identity) releases it, so a failed activation never leaves a
  lease held or a half-built agent behind. Activations started in the same loop
  turn share one ledger call.
* A retired or broken identity is never hosted: activation refuses it with
  ``InvalidStateError``. A snapshot that cannot be read marks only its own identity
  broken; the rest of the host keeps serving.
* One renewal loop renews every lease of the host in one batched ledger call every
  TTL/3, so a new lease needs no wake-up of its own. Each turn also checks its own
  lease before it runs and renews on the spot when less than a fifth of the TTL is
  left, so no turn starts on a lease that is nearly gone. An agent whose lease is
  lost is dropped at once.
* A lifecycle operation takes a new, larger fencing token before it has any effect,
  so every later write by an older owner is refused. Retire releases the token it
  took; delete removes the lease together with the identity.
* The ledger refuses a write under a stale token with ``StaleFencingTokenError``,
  never with a storage error. When a checkpoint is refused, the agent is dropped at
  once and the caller gets ``LeaseLostError`` chained to the refusal.
* Respawn keeps the generation and the last committed State; reset starts a new
  generation and session with fresh State. There is no session bridge and there
  are no external bindings, so nothing is rebound and only the ledger's own
  operations remove a continuity record.
* Every lifecycle transition is published: activation, deactivation, retire,
  respawn, reset and a snapshot found corrupt emit ``STATE_CHANGED``, and delete
  emits ``DELETED``. Subscriptions belong to the identity, not to an activation:
  they survive deactivation, respawn and reset, and only delete ends them.
* Errors are typed and carry one message each, so callers match on the type and
  never parse a prefixed string.
* Background work (renewal, housekeeping, the activation batcher, background
  checkpoints and idle deactivations) is owned by the runtime: each task is kept
  until it finishes, and ``shutdown`` cancels whatever is still running, so no task
  outlives the host or is collected while it runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
import traceback
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import cloudpickle

from ..checkpoints._committer import GroupCommitter
from ..checkpoints._store import SnapshotStore
from ..errors import (
    HandlerError,
    InvalidSpecError,
    InvalidStateError,
    LeaseLostError,
    NotWiredError,
    RayfleetError,
    SnapshotError,
    StaleCheckpointVersionError,
    StaleFencingTokenError,
    UnknownIdentityError,
)
from ..identity._agent import AgentSpec
from ..identity._values import (
    PERSISTED_BROKEN,
    PERSISTED_LIVE,
    PERSISTED_RETIRED,
    Addressability,
    ContinuityRecord,
    Durability,
    EventKind,
    IdentityEvent,
    LeaseDenied,
    LeaseGrant,
    LifecycleState,
    TopologyPolicy,
    lease_is_healthy,
)
from ..ledger._contract import LedgerClient
from ..ledger._ledger import Activation, IdentityView
from ..retry import RetryPolicy
from ._delivery import Delivery
from ._events import EventHub, EventSubscription
from ._hosted import HostDraining, HostedAgent, OwnedElsewhere, TurnResult
from ._messages import DedupWindow, Envelope
from ._ports import Router

if TYPE_CHECKING:
    from typing_extensions import Self

log = logging.getLogger("rayfleet.runtime")

RENEWAL_RETRY = RetryPolicy(base_delay=1.0, max_delay=64.0, jitter=0.0)
"""Waits after failed lease renewals, 1 s doubling up to 64 s; renewals never stop retrying."""
RENEWAL_BACKOFF_CAP = 60.0


def renewal_backoff(failures: int, cap: float = RENEWAL_BACKOFF_CAP) -> float:
    """Seconds to wait after ``failures`` consecutive failed renewals: 1 s x 2^n, n <= 6, capped."""
    return min(RENEWAL_RETRY.delay_for(failures), cap)


@dataclass(frozen=True, slots=True, kw_only=True)
class HostStatistics:
    """A snapshot of one host's counters."""

    host: str
    active_agents: int
    turns: int
    handler_errors: int
    activations: int
    deactivations: int
    checkpoints: int
    commit_batches: int
    lease_renewals: int
    leases_lost: int
    stale_refusals: int
    duplicates: int
    """Messages answered from the dedup window without running the handler."""
    dead_letters: int
    parked: int
    draining: bool


class _AgentContext:
    """The capabilities a hosted agent gets (``rf.Agent`` reads them through properties)."""

    __slots__ = ("_entry", "_runtime")

    def __init__(self, runtime: HostRuntime, entry: HostedAgent) -> None:
        self._runtime = runtime
        self._entry = entry

    @property
    def identity(self) -> str:
        return self._entry.spec.identity

    @property
    def spec(self) -> AgentSpec:
        return self._entry.spec

    @property
    def generation(self) -> int:
        return self._entry.record.generation

    @property
    def fence(self) -> int:
        return self._entry.grant.fencing_token

    @property
    def peers(self) -> tuple[str, ...]:
        return self._entry.peers

    async def send(self, peer: str, method: str, /, **kwargs: Any) -> Any:
        return await self._runtime.send_from(self._entry.spec.identity, peer, method, kwargs)

    async def checkpoint(self) -> int:
        # Called from inside a turn, which already holds the turn lock.
        return await self._runtime._commit(self._entry)


class _RuntimeActivations:
    """The runtime as the ``ActivationPort`` of its delivery, without making those methods public."""

    __slots__ = ("_runtime",)

    def __init__(self, runtime: HostRuntime) -> None:
        self._runtime = runtime

    async def activate(self, identity: str) -> HostedAgent:
        return await self._runtime._activate(identity)

    def is_internal_only(self, identity: str) -> bool:
        return identity in self._runtime._refused_internal

    async def ensure_healthy_lease(self, entry: HostedAgent) -> None:
        await self._runtime._ensure_healthy_lease(entry)

    async def commit(self, entry: HostedAgent) -> int:
        """The commit of a turn before its reply: if it fails, the turn must not have happened.

        The agent is taken out of service (lease released), so its next message activates
        it again from the last committed State, dedup window and fences; otherwise the
        refused turn's effect would ride along with the next commit and a retry under the
        same idempotency key would be answered from memory as if it had been committed.
        """
        try:
            return await self._runtime._commit(entry)
        except BaseException as error:
            if not entry.dropped:
                log.warning("commit of %s failed, back to its last checkpoint: %s", entry.spec.identity, error)
                await self._runtime._drop(entry, reason="", release=True)
            raise

    def emit(self, identity: str, kind: EventKind, **details: Any) -> None:
        self._runtime._emit(identity, kind, **details)


class HostRuntime:
    """Hosts many agents; one turn at a time per identity, concurrent across identities.

    Args:
        name: the host's name (``rayfleet-host-N``); part of its lease holder id.
        ledger: the authority for leases and commits.
        snapshots: where checkpoints are written.
        router: how agents reach other agents; ``None`` refuses ``self.send``.
        lease_ttl: seconds each lease lasts; renewed in one batch every TTL/3.
        idle_timeout: seconds without a turn before an agent is deactivated.
        clock: monotonic seconds for lease ages, idle and checkpoint intervals.
        wall_clock: wall-clock seconds for message deadlines and conversation
            fences, which are compared with ``time.time()`` values from other processes.
        incarnation: the suffix of the lease holder id; random unless given, so a
            restarted host never passes for its previous incarnation.
    """

    def __init__(
        self,
        *,
        name: str,
        ledger: LedgerClient,
        snapshots: SnapshotStore,
        router: Router | None = None,
        lease_ttl: float = 10.0,
        idle_timeout: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        incarnation: str | None = None,
    ) -> None:
        self.name = name
        self.holder = f"{name}@{incarnation or format(random.getrandbits(32), '08x')}"
        self._ledger = ledger
        self._snapshots = snapshots
        self._router = router
        self.lease_ttl = lease_ttl
        self.idle_timeout = idle_timeout
        self._clock = clock
        self._entries: dict[str, HostedAgent] = {}
        self._activating: dict[str, asyncio.Future[HostedAgent]] = {}
        self._acquire_queue: dict[str, list[asyncio.Future[Activation | LeaseDenied | RayfleetError]]] = {}
        self._acquire_flush: asyncio.Task[None] | None = None
        self._spec_cache: dict[str, AgentSpec] = {}
        # Identities refused at activation while INTERNAL_ONLY: delivery answers an outside
        # caller NOT ADDRESSABLE for them rather than revealing their lifecycle state.
        self._refused_internal: set[str] = set()
        self._events = EventHub()
        self._committer = GroupCommitter(writer=self.holder.replace("@", "-"), ledger=ledger, snapshots=snapshots)
        # Strong references until done: the event loop keeps only weak ones, and a
        # collected task would silently stop mid-work.
        self._background: set[asyncio.Task[None]] = set()
        self._started = False
        self.draining = False
        self._renewal_failures = 0
        self._counters = dict.fromkeys(
            ("activations", "deactivations", "lease_renewals", "leases_lost", "stale_refusals"), 0
        )
        self._delivery = Delivery(
            entries=self._entries, ledger=ledger, activations=_RuntimeActivations(self), clock=clock,
            wall_clock=wall_clock,
        )

    # -- lifecycle of the runtime itself -------------------------------------------

    async def start(self) -> None:
        """Start the group committer, the lease renewal loop and housekeeping.

        Raises:
            RuntimeError: the runtime was started before.
        """
        if self._started:
            raise RuntimeError("HostRuntime already started")
        self._started = True
        self._committer.start()
        self._spawn(self._renewal_loop(), name=f"{self.name}-renew")
        self._spawn(self._housekeeping_loop(), name=f"{self.name}-housekeeping")

    async def shutdown(self, *, checkpoint: bool = True) -> None:
        """Stop taking activations, deactivate every agent, then stop all background work.

        With ``checkpoint`` every agent's unsaved State is committed and its lease
        released first; without, agents are left as they are and their leases lapse.
        Every background task still running is cancelled and awaited; an activation
        still waiting for the ledger then fails with ``HostDraining``, so its caller
        goes to another host.
        """
        self.draining = True
        if checkpoint:
            await self.deactivate_all()
        # Draining refuses new activations, so no new task should start while these are
        # cancelled; checking again keeps the guarantee even if one does.
        while tasks := [task for task in self._background if not task.done()]:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        await self._committer.stop()

    def _spawn(self, work: Coroutine[Any, Any, None], *, name: str) -> asyncio.Task[None]:
        """Run ``work`` in the background, owned by this runtime until it finishes or shutdown."""
        task = asyncio.get_running_loop().create_task(work, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.shutdown()

    def statistics(self) -> HostStatistics:
        """A snapshot of this host's counters since it started."""
        delivered = self._delivery.counters
        return HostStatistics(
            host=self.name,
            active_agents=len(self._entries),
            turns=delivered.turns,
            handler_errors=delivered.handler_errors,
            duplicates=delivered.duplicates,
            dead_letters=delivered.dead_letters,
            parked=delivered.parked,
            checkpoints=self._committer.checkpoints,
            commit_batches=self._committer.batches,
            draining=self.draining,
            **self._counters,
        )

    # -- delivery (the message path is Delivery's; these keep the runtime's API) ------

    async def deliver(
        self,
        identity: str,
        method: str,
        args: tuple[Any, ...] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        sender: str | None = None,
        idempotency_key: str | None = None,
        deadline: float | None = None,
        conversation: str | None = None,
        fence: int | None = None,
    ) -> TurnResult:
        """Build an :class:`Envelope` and deliver it; see :meth:`Delivery.deliver_envelope`."""
        return await self._delivery.deliver(
            identity, method, args, kwargs, sender=sender, idempotency_key=idempotency_key, deadline=deadline,
            conversation=conversation, fence=fence,
        )

    async def deliver_envelope(self, envelope: Envelope) -> TurnResult:
        """Run one message through the gates and its handler; see :meth:`Delivery.deliver_envelope`."""
        return await self._delivery.deliver_envelope(envelope)

    async def pause(self, identity: str) -> bool:
        """Park every later message of ``identity`` durably until :meth:`resume`; see :meth:`Delivery.pause`."""
        return await self._delivery.pause(identity)

    async def resume(self, identity: str) -> int:
        """Replay parked messages oldest first, then accept new work; see :meth:`Delivery.resume`."""
        return await self._delivery.resume(identity)

    async def cancel_parked(self, identity: str) -> int:
        """Dead-letter every parked message of ``identity``; see :meth:`Delivery.cancel_parked`."""
        return await self._delivery.cancel_parked(identity)

    def active_identities(self) -> list[str]:
        return sorted(self._entries)

    def is_active(self, identity: str) -> bool:
        return identity in self._entries

    async def send_from(self, sender: str, target: str, method: str, kwargs: Mapping[str, Any]) -> Any:
        entry = self._entries.get(sender)
        if entry is not None and entry.spec.topology is TopologyPolicy.ENFORCED and target not in entry.peers:
            raise NotWiredError(sender=sender, target=target)
        if self._router is None:
            raise RuntimeError("this host has no router; agents cannot send to peers here")
        return await self._router.send(sender=sender, target=target, method=method, kwargs=kwargs)

    async def _ensure_healthy_lease(self, entry: HostedAgent) -> None:
        remaining = entry.grant.ttl - (self._clock() - entry.installed_at)
        if lease_is_healthy(entry.grant.ttl, remaining):
            return
        renewed = await self._ledger.renew(holder=self.holder, tokens={entry.spec.identity: entry.grant.fencing_token})
        grant = renewed.get(entry.spec.identity)
        if grant is None:
            await self._drop(entry, reason="lease lost at renewal")
            raise LeaseLostError(identity=entry.spec.identity, detail="the lease could not be renewed")
        self._counters["lease_renewals"] += 1
        entry.grant, entry.installed_at = grant, self._clock()

    async def _commit(self, entry: HostedAgent) -> int:
        """Checkpoint ``entry`` now (caller holds its turn lock); returns the new version."""
        version = entry.checkpoint_version + 1
        keys, entry.pending_dedup = entry.pending_dedup, []
        try:
            await self._committer.commit(
                identity=entry.spec.identity, fencing_token=entry.grant.fencing_token, version=version,
                state=entry.agent.state, extra=_encode_extra(entry), dedup=tuple(keys),
                dedup_capacity=entry.spec.dedup_capacity,
            )
        except (StaleFencingTokenError, StaleCheckpointVersionError, LeaseLostError, UnknownIdentityError) as error:
            # A refused write means ownership is lost: drop the agent at once.
            self._counters["stale_refusals"] += 1
            await self._drop(entry, reason=str(error))
            raise LeaseLostError(identity=entry.spec.identity, detail=f"checkpoint refused: {error.message}") from error
        except BaseException:
            # Not committed (storage or ledger outage): the next checkpoint must carry these keys,
            # or a keyed call acknowledged before it would run again after a failover.
            entry.pending_dedup[:0] = keys
            raise
        entry.checkpoint_version = version
        entry.dirty = False
        entry.last_commit = self._clock()
        self._emit(entry.spec.identity, EventKind.CHECKPOINT_COMPLETED, checkpoint_version=version)
        return version

    # -- activation -----------------------------------------------------------------

    async def activate(self, identity: str) -> ContinuityRecord:
        """Host ``identity`` here now (``spawn(..., eager=True)``); returns its record."""
        entry = self._entries.get(identity) or await self._activate(identity)
        return entry.record

    async def _activate(self, identity: str) -> HostedAgent:
        pending = self._activating.get(identity)
        if pending is not None:
            return await asyncio.shield(pending)
        if self.draining:
            raise HostDraining(identity)
        future: asyncio.Future[HostedAgent] = asyncio.get_running_loop().create_future()
        self._activating[identity] = future
        try:
            result = await self._acquire(identity)
            if isinstance(result, LeaseDenied):
                raise OwnedElsewhere(identity, result.holder)
            if isinstance(result, RayfleetError):
                raise result
            entry = await self._materialize(result)
            future.set_result(entry)
            return entry
        except BaseException as error:
            future.set_exception(error)
            future.exception()  # mark retrieved: waiters (if any) re-raise it themselves
            raise
        finally:
            self._activating.pop(identity, None)

    async def _acquire(self, identity: str, *, create: bool = True) -> Activation | LeaseDenied | RayfleetError:
        """Acquire through the batcher: activations started in the same loop turn share one call."""
        if not create:
            results = await self._ledger.acquire(
                holder=self.holder, identities=[identity], ttl=self.lease_ttl, create_continuity=False
            )
            return results[identity]
        future: asyncio.Future[Activation | LeaseDenied | RayfleetError] = asyncio.get_running_loop().create_future()
        self._acquire_queue.setdefault(identity, []).append(future)
        if self._acquire_flush is None or self._acquire_flush.done():
            self._acquire_flush = self._spawn(self._flush_acquires(), name=f"{self.name}-acquire")
        return await future

    async def _flush_acquires(self) -> None:
        # Loops until the queue is empty: activations that arrive while a batch is in
        # flight go out in the next batch instead of waiting for a flush nobody schedules.
        queue: dict[str, list[asyncio.Future[Activation | LeaseDenied | RayfleetError]]] = {}
        try:
            while self._acquire_queue:
                await asyncio.sleep(0)
                queue, self._acquire_queue = self._acquire_queue, {}
                try:
                    results = await self._ledger.acquire(
                        holder=self.holder, identities=list(queue), ttl=self.lease_ttl
                    )
                except Exception as error:  # noqa: BLE001 - whatever the ledger raised, every waiter gets it
                    for futures in queue.values():
                        for future in futures:
                            if not future.done():
                                future.set_exception(error)
                    continue
                for identity, futures in queue.items():
                    for future in futures:
                        if not future.done():
                            future.set_result(results[identity])
        except asyncio.CancelledError:
            # Shutdown: no activation may wait forever, so each goes to another host. A lease
            # the ledger granted for a batch cut short here lapses by its TTL.
            pending, self._acquire_queue = [*queue.items(), *self._acquire_queue.items()], {}
            for identity, futures in pending:
                for future in futures:
                    if not future.done():
                        future.set_exception(HostDraining(identity))
            raise

    async def _materialize(self, activation: Activation) -> HostedAgent:
        """Build the agent from an acquired lease; on any failure the lease is released."""
        view, grant = activation.view, activation.grant
        identity = view.identity
        installed_at = self._clock()
        try:
            if view.addressability == Addressability.INTERNAL_ONLY.value and view.lifecycle != PERSISTED_LIVE:
                # Remember it so an outside caller is refused as NOT ADDRESSABLE before it
                # learns anything about the lifecycle of an internal agent.
                self._refused_internal.add(identity)
            if view.lifecycle == PERSISTED_RETIRED:
                raise InvalidStateError(identity=identity, state=LifecycleState.RETIRING.value, operation="call")
            if view.lifecycle == PERSISTED_BROKEN:
                raise InvalidStateError(
                    identity=identity, state=LifecycleState.BROKEN.value, operation="call",
                    hint=f"Reason: {view.reason.rstrip('.')}. Repair storage and fleet.respawn(), "
                    f"or fleet.reset() to start fresh.",
                )
            assert view.continuity is not None  # acquire creates the record when it is missing
            spec = self._spec(view)
            agent = spec.agent_class()
            version = 0
            extra = b""
            if view.snapshot is not None:
                try:
                    state, extra = self._snapshots.read_row(
                        view.snapshot.file, view.snapshot.row, type(agent.state),
                        identity=identity, version=view.snapshot.version,
                    )
                except SnapshotError as error:
                    await self._ledger.set_lifecycle(
                        identity=identity, fencing_token=grant.fencing_token, lifecycle=PERSISTED_BROKEN,
                        reason=error.message,
                    )
                    self._emit(identity, EventKind.STATE_CHANGED, state=LifecycleState.BROKEN)
                    raise
                agent.state = state
                version = view.snapshot.version
            entry = HostedAgent(
                spec=spec, agent=agent, record=view.continuity, grant=grant, installed_at=installed_at,
                checkpoint_version=version, last_used=installed_at, last_commit=installed_at, paused=view.paused,
                dedup=DedupWindow(spec.dedup_capacity), peers=view.wired_peers,
            )
            for key, reply in activation.dedup:
                entry.dedup.insert(key, reply)
            _decode_extra(entry, extra)
            agent._rf_context = _AgentContext(self, entry)
            try:
                await agent.on_activate()
            except Exception as error:  # noqa: BLE001 - user code may raise anything; it becomes a HandlerError
                raise HandlerError(
                    identity=identity, method="on_activate",
                    remote_type=f"{type(error).__module__}.{type(error).__qualname__}",
                    remote_message=str(error), remote_traceback=traceback.format_exc(),
                ) from None
        except BaseException:
            await self._release({identity: grant.fencing_token})
            raise
        self._entries[identity] = entry
        self._counters["activations"] += 1
        self._emit(identity, EventKind.STATE_CHANGED, state=LifecycleState.ACTIVE, fencing_token=grant.fencing_token)
        return entry

    def _spec(self, view: IdentityView) -> AgentSpec:
        spec = self._spec_cache.get(view.fingerprint)
        if spec is None:
            try:
                spec = cloudpickle.loads(view.spec)
            except Exception as error:  # noqa: BLE001 - unpickling a class can raise anything; it is a spec problem
                raise InvalidSpecError(
                    f"host {self.name} cannot load the agent class {view.agent_class!r} of {view.identity!r}: "
                    f"{type(error).__name__}: {error}. Install its package on every node, or ship it with "
                    f"ray job submit --working-dir / a runtime_env",
                    field="agent",
                ) from None
            self._spec_cache[view.fingerprint] = spec
        return spec

    # -- deactivation -------------------------------------------------------------

    async def deactivate(self, identity: str) -> bool:
        """Checkpoint unsaved State, run ``on_deactivate`` and release the lease."""
        entry = self._entries.get(identity)
        if entry is None:
            view = (await self._ledger.resolve([identity])).get(identity)
            if view is None:
                raise UnknownIdentityError(identity=identity)
            if view.lease is not None and view.lease.holder != self.holder:
                raise OwnedElsewhere(identity, view.lease.holder)
            return False
        async with entry.turn_lock:
            if entry.dropped:
                return False
            await self._retire_entry(entry, checkpoint=True)
        self._counters["deactivations"] += 1
        self._emit(identity, EventKind.STATE_CHANGED, state=LifecycleState.DORMANT)
        return True

    async def deactivate_all(self, *, concurrency: int = 64) -> int:
        gate = asyncio.Semaphore(concurrency)

        async def one(identity: str) -> bool:
            async with gate:
                try:
                    return await self.deactivate(identity)
                except RayfleetError as error:
                    log.warning("deactivating %s failed: %s", identity, error)
                    return False

        results = await asyncio.gather(*(one(identity) for identity in list(self._entries)))
        return sum(results)

    async def _retire_entry(self, entry: HostedAgent, *, checkpoint: bool) -> None:
        """Take ``entry`` out of service (turn lock held); its lease is released."""
        if checkpoint and entry.dirty:
            await self._commit(entry)
        if checkpoint:
            with contextlib.suppress(Exception):
                await entry.agent.on_deactivate()
        await self._drop(entry, reason="", release=True)

    async def _drop(self, entry: HostedAgent, *, reason: str, release: bool = False) -> None:
        identity = entry.spec.identity
        entry.dropped = True
        if self._entries.get(identity) is entry:
            del self._entries[identity]
        if release:
            await self._release({identity: entry.grant.fencing_token})
        elif reason:
            self._counters["leases_lost"] += 1
            log.warning("dropped %s on %s: %s", identity, self.name, reason)
            self._emit(identity, EventKind.LEASE_LOST)

    async def _release(self, tokens: dict[str, int]) -> None:
        try:
            await self._ledger.release(holder=self.holder, tokens=tokens)
        except Exception as error:  # noqa: BLE001 - the lease then lapses by TTL; nothing is unsafe
            log.warning("releasing leases %s failed: %s", sorted(tokens), error)

    # -- lifecycle operations (fence before effect) ---------------------------------

    async def _fence(self, identity: str, *, checkpoint: bool, create: bool = False) -> Activation:
        """Take a new, larger token for ``identity``: every later write by an older owner is refused.

        An agent active here is taken out of service first: checkpointed and released
        when ``checkpoint`` (retire, respawn), dropped with its unsaved State otherwise
        (reset, delete). ``create`` makes the continuity record of an identity that was
        never activated (respawn brings such an identity up at generation 0). The
        activation carries the identity's remembered idempotency keys.
        """
        entry = self._entries.get(identity)
        if entry is not None:
            async with entry.turn_lock:
                if not entry.dropped:
                    if checkpoint:
                        await self._retire_entry(entry, checkpoint=True)
                    else:
                        await self._drop(entry, reason="")
        result = await self._acquire(identity, create=create)
        if isinstance(result, LeaseDenied):
            raise OwnedElsewhere(identity, result.holder)
        if isinstance(result, RayfleetError):
            raise result
        return result

    async def retire(self, identity: str) -> int:
        """Deactivate (checkpointing) and mark RETIRING; later calls fail until respawn."""
        grant = (await self._fence(identity, checkpoint=True)).grant
        try:
            await self._ledger.set_lifecycle(
                identity=identity, fencing_token=grant.fencing_token, lifecycle=PERSISTED_RETIRED
            )
        finally:
            await self._release({identity: grant.fencing_token})
        self._emit(identity, EventKind.STATE_CHANGED, state=LifecycleState.RETIRING, fencing_token=grant.fencing_token)
        return grant.fencing_token

    async def respawn(self, identity: str) -> ContinuityRecord:
        """Bring an identity back (same generation, last committed State) under a new lease."""
        fenced = await self._fence(identity, checkpoint=True, create=True)
        await self._ledger.set_lifecycle(
            identity=identity, fencing_token=fenced.grant.fencing_token, lifecycle=PERSISTED_LIVE
        )
        # Same generation, so the keys it remembers still guard effects in its State.
        return await self._rehost(identity, fenced.grant, dedup=fenced.dedup)

    async def reset(self, identity: str) -> ContinuityRecord:
        """Start over: generation + 1, new session, fresh State; unsaved State is discarded."""
        grant = (await self._fence(identity, checkpoint=False)).grant
        try:
            await self._ledger.reset(identity=identity, fencing_token=grant.fencing_token)
        except BaseException:
            await self._release({identity: grant.fencing_token})
            raise
        return await self._rehost(identity, grant)

    async def _rehost(
        self, identity: str, grant: LeaseGrant, *, dedup: tuple[tuple[str, bytes], ...] = ()
    ) -> ContinuityRecord:
        views = await self._ledger.resolve([identity])
        view = views.get(identity)
        if view is None:
            raise UnknownIdentityError(identity=identity)
        entry = await self._materialize(Activation(grant=grant, view=view, dedup=dedup))
        return entry.record

    async def delete(self, identity: str) -> None:
        """Remove the identity, its record and lease; its snapshot rows become garbage."""
        grant = (await self._fence(identity, checkpoint=False)).grant
        await self._ledger.delete(identity=identity, fencing_token=grant.fencing_token)
        self._emit(identity, EventKind.DELETED, fencing_token=grant.fencing_token)
        self._events.close(identity)

    # -- events ---------------------------------------------------------------------

    def subscribe(self, identity: str) -> EventSubscription:
        return self._events.subscribe(identity)

    def unsubscribe(self, identity: str, subscription: EventSubscription) -> None:
        self._events.unsubscribe(identity, subscription)

    def _emit(self, identity: str, kind: EventKind, **details: Any) -> None:
        self._events.emit(IdentityEvent(identity=identity, kind=kind, host=self.name, **details))

    # -- background work ------------------------------------------------------------

    async def renew_once(self) -> int:
        """Renew every lease this host holds in one ledger call; drop agents whose lease is lost."""
        held = {identity: entry.grant.fencing_token for identity, entry in self._entries.items()}
        if not held:
            return 0
        sent_at = self._clock()
        renewed = await self._ledger.renew(holder=self.holder, tokens=held)
        count = 0
        for identity, grant in renewed.items():
            entry = self._entries.get(identity)
            if entry is None or entry.grant.fencing_token != held[identity]:
                continue  # replaced or dropped while the renewal was in flight
            if grant is None:
                await self._drop(entry, reason="lease lost at renewal")
                continue
            entry.grant, entry.installed_at = grant, sent_at
            self._emit(identity, EventKind.LEASE_UPDATED, fencing_token=grant.fencing_token)
            count += 1
        self._counters["lease_renewals"] += count
        return count

    async def _renewal_loop(self) -> None:
        while True:
            delay = self.lease_ttl / 3
            if self._renewal_failures:
                delay = max(delay, renewal_backoff(self._renewal_failures, cap=self.lease_ttl))
            await asyncio.sleep(delay)
            try:
                await self.renew_once()
                self._renewal_failures = 0
            except Exception as error:  # noqa: BLE001 - the loop must outlive any failure; it backs off
                self._renewal_failures += 1
                log.log(logging.WARNING if self._renewal_failures == 1 else logging.DEBUG,
                        "lease renewal on %s failed (%d in a row): %s", self.name, self._renewal_failures, error)

    async def _housekeeping_loop(self) -> None:
        tick = 0.05
        while True:
            await asyncio.sleep(tick)
            now = self._clock()
            for entry in list(self._entries.values()):
                if entry.dropped or entry.turn_lock.locked():
                    continue
                due = (
                    entry.dirty
                    and entry.spec.durability is Durability.PERIODIC
                    and now - entry.last_commit >= entry.spec.checkpoint_interval
                )
                idle = now - entry.last_used >= self.idle_timeout
                if due or idle:
                    self._spawn(self._housekeep(entry, idle=idle), name=f"{self.name}-housekeep")

    async def _housekeep(self, entry: HostedAgent, *, idle: bool) -> None:
        try:
            if idle:
                await self.deactivate(entry.spec.identity)
                return
            async with entry.turn_lock:
                if not entry.dropped and entry.dirty:
                    await self._commit(entry)
        except RayfleetError as error:
            log.warning("background checkpoint of %s failed: %s", entry.spec.identity, error)

    async def refresh_peers(self) -> int:
        """Reload the wired peers of every agent hosted here (after the topology changed)."""
        identities = list(self._entries)
        if not identities:
            return 0
        wired = await self._ledger.wired_peers(identities)
        for identity, peers in wired.items():
            entry = self._entries.get(identity)
            if entry is not None:
                entry.peers = tuple(peers)
        return len(wired)

    async def flush(self) -> int:
        """Commit every agent with unsaved State now; returns how many were committed."""
        count = 0
        for entry in list(self._entries.values()):
            async with entry.turn_lock:
                if not entry.dropped and entry.dirty:
                    await self._commit(entry)
                    count += 1
        return count


def _encode_extra(entry: HostedAgent) -> bytes:
    """Runtime metadata saved beside the State: the conversation fence high-water marks."""
    fences = entry.fences.export()
    return cloudpickle.dumps({"fences": fences}) if fences else b""


def _decode_extra(entry: HostedAgent, extra: bytes) -> None:
    if extra:
        entry.fences.restore(cloudpickle.loads(extra).get("fences", {}))


def holder_host(holder: str) -> str:
    """The host name part of a lease holder id (``rayfleet-host-0@1a2b`` → ``rayfleet-host-0``)."""
    return holder.split("@", 1)[0]

