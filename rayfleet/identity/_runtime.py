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
import dataclasses
import logging
import random
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import cloudpickle

from ..errors import (
    DeadlineExceededError,
    HandlerError,
    InvalidArgumentsError,
    InvalidSpecError,
    InvalidStateError,
    LeaseLostError,
    NotAddressableError,
    RayfleetError,
    SnapshotError,
    StaleCheckpointVersionError,
    StaleFencingTokenError,
    UnknownHandlerError,
    UnknownIdentityError,
)
from ._agent import Agent, HandlerInfo, Reply, Usage, run_handler
from ._committer import GroupCommitter
from ._contracts import LedgerClient, Router
from ._delivery import DeadLetterReason, DedupWindow, Envelope, FenceMap, is_retryable
from ._events import EventHub, EventSubscription
from ._ledger import Activation, IdentityView
from ._snapshots import SnapshotStore
from ._spec import AgentSpec
from ._types import (
    PERSISTED_BROKEN,
    Addressability,
    PERSISTED_LIVE,
    PERSISTED_RETIRED,
    ContinuityRecord,
    Durability,
    EventKind,
    IdentityEvent,
    LeaseDenied,
    LeaseGrant,
    LifecycleState,
    lease_is_healthy,
)

log = logging.getLogger("rayfleet.runtime")

RENEWAL_BACKOFF_BASE = 1.0
RENEWAL_BACKOFF_CAP = 60.0


def renewal_backoff(failures: int, cap: float = RENEWAL_BACKOFF_CAP) -> float:
    """Seconds to wait after ``failures`` consecutive failed renewals: 1 s x 2^n, n <= 6, capped."""
    return min(RENEWAL_BACKOFF_BASE * 2 ** min(failures, 6), cap)


class OwnedElsewhere(Exception):
    """Internal signal: another live holder owns the identity; the caller should go there."""

    def __init__(self, identity: str, holder: str) -> None:
        super().__init__(identity, holder)
        self.identity = identity
        self.holder = holder


class HostDraining(Exception):
    """Internal signal: this host takes no new activations; route elsewhere."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnResult:
    """What one delivered turn produced."""

    value: Any
    usage: Usage
    checkpoint_version: int
    duplicate: bool = False
    """True when this is the remembered reply of an earlier turn with the same idempotency key."""


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


@dataclass(slots=True)
class _Entry:
    spec: AgentSpec
    agent: Agent
    record: ContinuityRecord
    grant: LeaseGrant
    installed_at: float
    checkpoint_version: int
    turn_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_used: float = 0.0
    dirty: bool = False
    last_commit: float = 0.0
    dropped: bool = False
    paused: bool = False
    dedup: DedupWindow = field(default_factory=DedupWindow)
    pending_dedup: list[tuple[str, bytes]] = field(default_factory=list)
    """Keys remembered since the last commit; they are committed with the next checkpoint."""
    fences: FenceMap = field(default_factory=FenceMap)


class _AgentContext:
    """The capabilities a hosted agent gets (``rf.Agent`` reads them through properties)."""

    __slots__ = ("_runtime", "_entry")

    def __init__(self, runtime: HostRuntime, entry: _Entry) -> None:
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
        return self._entry.spec.peers

    async def send(self, peer: str, method: str, /, **kwargs: Any) -> Any:
        return await self._runtime.send_from(self._entry.spec.identity, peer, method, kwargs)

    async def checkpoint(self) -> int:
        # Called from inside a turn, which already holds the turn lock.
        return await self._runtime._commit(self._entry)


class HostRuntime:
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
        self._entries: dict[str, _Entry] = {}
        self._activating: dict[str, asyncio.Future[_Entry]] = {}
        self._acquire_queue: dict[str, list[asyncio.Future[Activation | LeaseDenied | RayfleetError]]] = {}
        self._acquire_flush: asyncio.Task[None] | None = None
        self._spec_cache: dict[str, AgentSpec] = {}
        self._parked_waiters: dict[str, asyncio.Future[TurnResult]] = {}
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

    # -- turns ----------------------------------------------------------------------

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
        """Build an :class:`Envelope` and deliver it (see :meth:`deliver_envelope`)."""
        return await self.deliver_envelope(Envelope(
            target=identity, method=method, args=tuple(args), kwargs=dict(kwargs or {}), sender=sender,
            idempotency_key=idempotency_key, deadline=deadline, conversation=conversation, fence=fence,
        ))

    async def deliver_envelope(self, envelope: Envelope) -> TurnResult:
        """Run one message through the gates and, if it passes, one turn of its handler.

        Gates, in order (DESIGN.md section 7): addressability, lifecycle state, pause
        (park durably and wait for the resume), conversation fence, dedup (a duplicate
        gets the original reply), deadline, then the handler with retries, the commit
        per durability, and the reply. Refused and failed messages go to the dead-letter
        log with the original envelope, except addressability and lifecycle refusals,
        which the caller can act on directly.

        Raises:
            NotAddressableError: an outside caller tried an ``INTERNAL_ONLY`` agent.
            OwnedElsewhere: another live host holds the lease (internal; the caller re-routes).
            StaleFencingTokenError: the conversation fence is below one already seen.
            DeadlineExceededError: the deadline passed before the turn ran.
            UnknownIdentityError, InvalidStateError, UnknownHandlerError,
            InvalidArgumentsError, HandlerError, LeaseLostError, SnapshotError.
        """
        identity = envelope.target
        entry = self._entries.get(identity)
        if entry is None:
            entry = await self._activate(identity)
        if envelope.sender is None and entry.spec.addressability is Addressability.INTERNAL_ONLY:
            raise NotAddressableError(identity=identity)
        info = entry.agent.__rayfleet_handlers__.get(envelope.method)
        if info is None:
            raise UnknownHandlerError(
                identity=identity, method=envelope.method, available=type(entry.agent).handler_names()
            )
        try:
            bound = info.bind(identity, envelope.args, envelope.kwargs)
        except InvalidArgumentsError as error:
            await self._dead_letter(envelope, DeadLetterReason.DECODE_FAILED, error.message, attempts=0)
            raise
        waiter: asyncio.Future[TurnResult] | None = None
        async with entry.turn_lock:
            if entry.dropped:
                # Deactivated or fenced while this message waited: activate again and retry.
                return await self.deliver_envelope(envelope)
            if entry.paused:
                waiter = await self._park(entry, envelope)
            else:
                return await self._turn(entry, envelope, info, bound)
        # Parked: wait, outside the turn lock, until a resume replays the message.
        return await waiter

    async def _turn(self, entry: _Entry, envelope: Envelope, info: HandlerInfo, bound: dict[str, Any]) -> TurnResult:
        """The gates after pause, then the handler (caller holds the turn lock)."""
        identity = envelope.target
        if envelope.fence is not None and envelope.conversation is not None:
            previous = entry.fences.high_water(envelope.conversation)
            if not entry.fences.accept(envelope.conversation, envelope.fence, time.time()):
                current = entry.fences.high_water(envelope.conversation) or 0
                error = StaleFencingTokenError(identity=identity, presented=envelope.fence, current=current)
                await self._dead_letter(envelope, DeadLetterReason.STALE_FENCE, error.message, attempts=0)
                raise error
            if previous != envelope.fence:
                # A raised high-water mark must outlive this owner even when the turn changes no State.
                entry.dirty = True
        key = envelope.dedup_key()
        if key is not None:
            original = entry.dedup.get(key)
            if original is not None:
                self._counters["duplicates"] += 1
                value, usage = cloudpickle.loads(original)
                return TurnResult(value=value, usage=usage, checkpoint_version=entry.checkpoint_version, duplicate=True)
        if envelope.deadline is not None and time.time() > envelope.deadline:
            error = DeadlineExceededError(identity=identity, method=envelope.method,
                                          timeout=max(envelope.deadline - envelope.sent_at, 0.0))
            await self._dead_letter(envelope, DeadLetterReason.DEADLINE_EXCEEDED, error.message, attempts=0)
            raise error
        await self._ensure_healthy_lease(entry)
        value, usage = await self._run_with_retries(entry, envelope, info, bound)
        if key is not None:
            reply = cloudpickle.dumps((value, usage))
            entry.dedup.insert(key, reply)
            entry.pending_dedup.append((key, reply))
            entry.dirty = True
        if entry.dirty and entry.spec.durability is Durability.EVERY_TURN:
            await self._commit(entry)
        return TurnResult(value=value, usage=usage, checkpoint_version=entry.checkpoint_version)

    async def _run_with_retries(
        self, entry: _Entry, envelope: Envelope, info: HandlerInfo, bound: dict[str, Any]
    ) -> tuple[Any, Usage]:
        policy = entry.spec.retry
        for attempt in range(policy.max_attempts):
            before = entry.agent.state.model_copy(deep=True)
            self._counters["turns"] += 1
            entry.last_used = self._clock()
            try:
                outcome = await run_handler(info, entry.agent, bound)
            except Exception as error:
                # A failed attempt leaves State as it was: the next one starts from the same place.
                entry.agent.state = before
                self._counters["handler_errors"] += 1
                retry = is_retryable(error) and attempt + 1 < policy.max_attempts
                if retry:
                    await asyncio.sleep(policy.delay_for(attempt))
                    continue
                failure = HandlerError(
                    identity=envelope.target,
                    method=envelope.method,
                    remote_type=f"{type(error).__module__}.{type(error).__qualname__}",
                    remote_message=str(error),
                    remote_traceback=traceback.format_exc(),
                )
                reason = DeadLetterReason.RETRIES_EXHAUSTED if is_retryable(error) else DeadLetterReason.REJECTED
                await self._dead_letter(envelope, reason, failure.message, attempts=attempt + 1)
                raise failure from None
            # A turn that changed nothing (a read) needs no checkpoint.
            if entry.agent.state != before:
                entry.dirty = True
            if isinstance(outcome, Reply):
                return outcome.value, outcome.usage
            return outcome, Usage()
        raise AssertionError("unreachable: the last attempt either returns or raises")

    async def _dead_letter(self, envelope: Envelope, reason: DeadLetterReason, error: str, *, attempts: int) -> None:
        self._counters["dead_letters"] += 1
        try:
            payload = cloudpickle.dumps(envelope)
        except Exception as problem:  # unpicklable arguments: keep what can be kept, readably
            payload = cloudpickle.dumps(dataclasses.replace(
                envelope, args=(), kwargs={"unpicklable_arguments": repr((envelope.args, envelope.kwargs))[:2000]}
            ))
            error = f"{error} (arguments could not be stored: {problem})"
        try:
            await self._ledger.add_dead_letter(
                identity=envelope.target, message_id=envelope.message_id, envelope=payload, reason=reason.value,
                error=error, attempts=attempts,
            )
        except Exception as problem:
            log.error("could not record dead letter for %s.%s: %s", envelope.target, envelope.method, problem)

    # -- pause and resume -----------------------------------------------------------

    async def _park(self, entry: _Entry, envelope: Envelope) -> asyncio.Future[TurnResult]:
        """Hold ``envelope`` durably (caller holds the turn lock); returns what its caller awaits."""
        waiter = self._parked_waiters.get(envelope.message_id)
        if waiter is None:
            waiter = asyncio.get_running_loop().create_future()
            self._parked_waiters[envelope.message_id] = waiter
        await self._ledger.park(
            identity=envelope.target, fencing_token=entry.grant.fencing_token, message_id=envelope.message_id,
            envelope=cloudpickle.dumps(envelope),
        )
        self._counters["parked"] += 1
        return waiter

    async def pause(self, identity: str) -> bool:
        """Park every later message of ``identity`` durably until :meth:`resume`."""
        entry = self._entries.get(identity) or await self._activate(identity)
        async with entry.turn_lock:
            await self._ledger.set_paused(identity=identity, fencing_token=entry.grant.fencing_token, paused=True)
            entry.paused = True
        self._emit(identity, EventKind.PAUSED)
        return True

    async def resume(self, identity: str) -> int:
        """Replay parked messages oldest first through the same gates, then accept new work.

        Messages that arrive during the replay are parked behind the older ones, so the
        order holds. A replayed message whose handler fails is dead-lettered like any
        other; it is never silently dropped. Returns how many messages were replayed.
        """
        entry = self._entries.get(identity) or await self._activate(identity)
        replayed = 0
        while True:
            batch = await self._ledger.parked(identity, limit=100)
            async with entry.turn_lock:
                if entry.dropped:
                    raise LeaseLostError(identity=identity, detail="the agent was dropped while resuming")
                if not batch:
                    # Nothing is parked and we hold the turn lock, so no message can park now.
                    await self._ledger.set_paused(
                        identity=identity, fencing_token=entry.grant.fencing_token, paused=False
                    )
                    entry.paused = False
                    break
                for stored in batch:
                    await self._replay(entry, stored.id, cloudpickle.loads(stored.envelope))
                    replayed += 1
        self._emit(identity, EventKind.RESUMED)
        return replayed

    async def _replay(self, entry: _Entry, seq: int, envelope: Envelope) -> None:
        waiter = self._parked_waiters.pop(envelope.message_id, None)
        info = entry.agent.__rayfleet_handlers__.get(envelope.method)
        try:
            if info is None:
                raise UnknownHandlerError(
                    identity=envelope.target, method=envelope.method, available=type(entry.agent).handler_names()
                )
            result = await self._turn(entry, envelope, info, info.bind(envelope.target, envelope.args, envelope.kwargs))
        except (LeaseLostError, StaleCheckpointVersionError) as error:
            # Ownership is gone: leave the message parked for the next owner.
            if waiter is not None:
                self._parked_waiters[envelope.message_id] = waiter
            raise LeaseLostError(identity=envelope.target, detail=str(error)) from error
        except RayfleetError as error:
            if isinstance(error, (UnknownHandlerError, InvalidArgumentsError)):
                await self._dead_letter(envelope, DeadLetterReason.DECODE_FAILED, error.message, attempts=0)
            if waiter is not None and not waiter.done():
                waiter.set_exception(error)
        else:
            if waiter is not None and not waiter.done():
                waiter.set_result(result)
        # Handled (or dead-lettered): only now is the parked copy forgotten.
        await self._ledger.unpark(identity=envelope.target, fencing_token=entry.grant.fencing_token, seq=seq)

    async def cancel_parked(self, identity: str) -> int:
        """Move every parked message of ``identity`` to the dead letters (reason CANCELLED)."""
        entry = self._entries.get(identity) or await self._activate(identity)
        async with entry.turn_lock:
            parked = await self._ledger.parked(identity, limit=1_000_000)
            count = await self._ledger.cancel_parked(identity=identity, fencing_token=entry.grant.fencing_token)
        for stored in parked:
            waiter = self._parked_waiters.pop(stored.message_id, None)
            if waiter is not None and not waiter.done():
                waiter.set_exception(InvalidStateError(
                    identity=identity, state="PAUSED", operation="deliver",
                    hint="The message was parked and then cancelled; it is in the dead-letter log.",
                ))
        return count

    async def send_from(self, sender: str, target: str, method: str, kwargs: Mapping[str, Any]) -> Any:
        if self._router is None:
            raise RuntimeError("this host has no router; agents cannot send to peers here")
        return await self._router.send(sender=sender, target=target, method=method, kwargs=kwargs)

    async def _ensure_healthy_lease(self, entry: _Entry) -> None:
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

    async def _commit(self, entry: _Entry) -> int:
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

    async def _activate(self, identity: str) -> _Entry:
        pending = self._activating.get(identity)
        if pending is not None:
            return await asyncio.shield(pending)
        if self.draining:
            raise HostDraining(identity)
        future: asyncio.Future[_Entry] = asyncio.get_running_loop().create_future()
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

    async def _materialize(self, activation: Activation) -> _Entry:
        """Build the agent from an acquired lease; on any failure the lease is released."""
        view, grant = activation.view, activation.grant
        identity = view.identity
        installed_at = self._clock()
        try:
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
            entry = _Entry(
                spec=spec, agent=agent, record=view.continuity, grant=grant, installed_at=installed_at,
                checkpoint_version=version, last_used=installed_at, last_commit=installed_at, paused=view.paused,
                dedup=DedupWindow(spec.dedup_capacity),
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

    async def _retire_entry(self, entry: _Entry, *, checkpoint: bool) -> None:
        """Take ``entry`` out of service (turn lock held); its lease is released."""
        if checkpoint and entry.dirty:
            await self._commit(entry)
        if checkpoint:
            with contextlib.suppress(Exception):
                await entry.agent.on_deactivate()
        await self._drop(entry, reason="", release=True)

    async def _drop(self, entry: _Entry, *, reason: str, release: bool = False) -> None:
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

    async def _housekeep(self, entry: _Entry, *, idle: bool) -> None:
        try:
            if idle:
                await self.deactivate(entry.spec.identity)
                return
            async with entry.turn_lock:
                if not entry.dropped and entry.dirty:
                    await self._commit(entry)
        except RayfleetError as error:
            log.warning("background checkpoint of %s failed: %s", entry.spec.identity, error)

    async def flush(self) -> int:
        """Commit every agent with unsaved State now; returns how many were committed."""
        count = 0
        for entry in list(self._entries.values()):
            async with entry.turn_lock:
                if not entry.dropped and entry.dirty:
                    await self._commit(entry)
                    count += 1
        return count


def _encode_extra(entry: _Entry) -> bytes:
    """Runtime metadata saved beside the State: the conversation fence high-water marks."""
    fences = entry.fences.export()
    return cloudpickle.dumps({"fences": fences}) if fences else b""


def _decode_extra(entry: _Entry, extra: bytes) -> None:
    if extra:
        entry.fences.restore(cloudpickle.loads(extra).get("fences", {}))


def holder_host(holder: str) -> str:
    """The host name part of a lease holder id (``rayfleet-host-0@1a2b`` → ``rayfleet-host-0``)."""
    return holder.split("@", 1)[0]

