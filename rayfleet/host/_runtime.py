"""The host runtime: activates identities under fenced leases and runs their turns.

One ``HostRuntime`` lives in each host. It owns the agents it has activated, one
mailbox (turn lock) per identity, the host's lease renewals and its group committer.
It knows nothing about Ray: ``platform`` wraps it in an actor.

Decisions on the quirks of specs/identity-runtime.md section 10.3:

* Q1 (lifecycle operations emit no events): fixed. Retire, respawn, reset and delete
  emit ``STATE_CHANGED`` so subscribers see every transition.
* Q2 (new leases do not wake the renewal supervisor): moot here. One renewal loop
  renews every lease of the host in one batched call at TTL/3, and each turn checks
  its lease's health before running, renewing on the spot when it is unhealthy.
* Q3 (re-register cuts off subscribers): fixed. Subscriptions belong to the identity,
  not to an activation, and end only when the identity is deleted.
* Q4 (mint failure leaks the lease or leaves SUSPENDED): cannot happen. Identities
  are validated at the edge, and every failure path of activation releases the lease.
* Q5 (RG installs a lease on a BROKEN entry): not reproduced; a BROKEN identity is
  never hosted, and its lease is released.
* Q6 (double ``internal:`` prefixes): not reproduced; errors are typed, one message.
* Q7 (retire and delete grants never released): fixed; retire releases its grant,
  delete removes the lease row with the identity.
* Q8 (rebind without continuity): no session bridge here, so there is no rebind.
* Q9 (external binding deletes the original record): no external bindings here.
* Q10 (stale fence wrapped as ``Store``): fixed; a stale write is always
  ``StaleFencingTokenError`` wherever it happens.
* Q11 (unlocked mutators lost under a lifecycle operation): not reproduced; every
  mutation of an entry happens under that identity's turn lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

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
from ..identity._spec import AgentSpec
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
from ._delivery import DeliveryPipeline
from ._events import EventHub, EventSubscription
from ._hosted import HostDraining, HostedAgent, OwnedElsewhere, TurnResult
from ._messages import DedupWindow
from ._ports import Router

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

    __slots__ = ("_runtime", "_entry")

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


class HostRuntime(DeliveryPipeline):
    """Hosts many agents; one turn at a time per identity, concurrent across identities.

    Args:
        name: the host's name (``rayfleet-host-N``); part of its lease holder id.
        ledger: the authority for leases and commits.
        snapshots: where checkpoints are written.
        router: how agents reach other agents; ``None`` refuses ``self.send``.
        lease_ttl: seconds each lease lasts; renewed in one batch every TTL/3.
        idle_timeout: seconds without a turn before an agent is deactivated.
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
        self._parked_waiters: dict[str, asyncio.Future[TurnResult]] = {}
        self._refused_internal: set[str] = set()
        self._events = EventHub()
        self._committer = GroupCommitter(writer=self.holder.replace("@", "-"), ledger=ledger, snapshots=snapshots)
        self._tasks: list[asyncio.Task[None]] = []
        self._started = False
        self.draining = False
        self._renewal_failures = 0
        self._counters = dict.fromkeys(
            ("turns", "handler_errors", "activations", "deactivations", "lease_renewals", "leases_lost",
             "stale_refusals", "duplicates", "dead_letters", "parked"), 0
        )

    # -- lifecycle of the runtime itself -------------------------------------------

    async def start(self) -> None:
        if self._started:
            raise RuntimeError("HostRuntime already started")
        self._started = True
        loop = asyncio.get_running_loop()
        self._committer.start()
        self._tasks = [
            loop.create_task(self._renewal_loop(), name=f"{self.name}-renew"),
            loop.create_task(self._housekeeping_loop(), name=f"{self.name}-housekeeping"),
        ]

    async def shutdown(self, *, checkpoint: bool = True) -> None:
        """Deactivate every agent (checkpointing unsaved State), then stop background work."""
        self.draining = True
        if checkpoint:
            await self.deactivate_all()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._committer.stop()

    async def __aenter__(self) -> HostRuntime:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.shutdown()

    def statistics(self) -> HostStatistics:
        return HostStatistics(
            host=self.name,
            active_agents=len(self._entries),
            checkpoints=self._committer.checkpoints,
            commit_batches=self._committer.batches,
            draining=self.draining,
            **self._counters,
        )

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
            self._acquire_flush = asyncio.get_running_loop().create_task(self._flush_acquires())
        return await future

    async def _flush_acquires(self) -> None:
        # Loops until the queue is empty: activations that arrive while a batch is in
        # flight go out in the next batch instead of waiting for a flush nobody schedules.
        while self._acquire_queue:
            await asyncio.sleep(0)
            queue, self._acquire_queue = self._acquire_queue, {}
            try:
                results = await self._ledger.acquire(holder=self.holder, identities=list(queue), ttl=self.lease_ttl)
            except Exception as error:
                for futures in queue.values():
                    for future in futures:
                        if not future.done():
                            future.set_exception(error)
                continue
            for identity, futures in queue.items():
                for future in futures:
                    if not future.done():
                        future.set_result(results[identity])

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
            except Exception as error:
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
            except Exception as error:
                raise InvalidSpecError(
                    f"host {self.name} cannot load the agent class {view.agent_class!r} of {view.identity!r}: "
                    f"{type(error).__name__}: {error}. Install its package on every node, or ship it with "
                    f"ray job submit --working-dir / a runtime_env",
                    subject="agent",
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
        except Exception as error:  # the lease then lapses by TTL; nothing is unsafe
            log.warning("releasing leases %s failed: %s", sorted(tokens), error)

    # -- lifecycle operations (fence before effect) ---------------------------------

    async def _fence(self, identity: str, *, checkpoint: bool) -> LeaseGrant:
        """Take a new, larger token for ``identity``: every later write by an older owner is refused.

        An agent active here is taken out of service first: checkpointed and released
        when ``checkpoint`` (retire, respawn), dropped with its unsaved State otherwise
        (reset, delete).
        """
        entry = self._entries.get(identity)
        if entry is not None:
            async with entry.turn_lock:
                if not entry.dropped:
                    if checkpoint:
                        await self._retire_entry(entry, checkpoint=True)
                    else:
                        await self._drop(entry, reason="")
        result = await self._acquire(identity, create=False)
        if isinstance(result, LeaseDenied):
            raise OwnedElsewhere(identity, result.holder)
        if isinstance(result, RayfleetError):
            raise result
        return result.grant

    async def retire(self, identity: str) -> int:
        """Deactivate (checkpointing) and mark RETIRING; later calls fail until respawn."""
        grant = await self._fence(identity, checkpoint=True)
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
        grant = await self._fence(identity, checkpoint=True)
        await self._ledger.set_lifecycle(identity=identity, fencing_token=grant.fencing_token, lifecycle=PERSISTED_LIVE)
        return await self._rehost(identity, grant)

    async def reset(self, identity: str) -> ContinuityRecord:
        """Start over: generation + 1, new session, fresh State; unsaved State is discarded."""
        grant = await self._fence(identity, checkpoint=False)
        try:
            await self._ledger.reset(identity=identity, fencing_token=grant.fencing_token)
        except BaseException:
            await self._release({identity: grant.fencing_token})
            raise
        return await self._rehost(identity, grant)

    async def _rehost(self, identity: str, grant: LeaseGrant) -> ContinuityRecord:
        views = await self._ledger.resolve([identity])
        view = views.get(identity)
        if view is None:
            raise UnknownIdentityError(identity=identity)
        entry = await self._materialize(Activation(grant=grant, view=view))
        return entry.record

    async def delete(self, identity: str) -> None:
        """Remove the identity, its record and lease; its snapshot rows become garbage."""
        grant = await self._fence(identity, checkpoint=False)
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
            except Exception as error:
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
                    asyncio.get_running_loop().create_task(self._housekeep(entry, idle=idle))

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

