"""The host runtime: activates identities under fenced leases and runs their turns.

One ``HostRuntime`` lives in each host. It owns the agents it has activated, one
mailbox (turn lock) per identity, its group committer and every background task it
starts. It knows nothing about Ray: ``platform`` wraps it in an actor. The message path
is :class:`~rayfleet.host._delivery.Delivery`, the host's front door (``runtime.delivery``),
and the host's leases are kept by :class:`~rayfleet.host._leases.LeaseKeeper`
(``runtime.leases``, which states the renewal guarantees): the runtime builds both and
is reached from them only as their ``ActivationPort`` and ``LeasePort``.

What the runtime guarantees, and why:

* A hosted agent's State and delivery bookkeeping (a turn, a commit, pause and
  resume, parking, deactivation, fencing for a lifecycle operation) change under
  that identity's turn lock, so a lifecycle operation never interleaves with a turn
  and loses its effect or the turn's. Two things touch an entry without the lock:
  the lease keeper's renewals, which replace its lease date or drop it when the
  lease is gone, and ``refresh_peers``, which replaces its peers.
  A turn running when its entry is dropped cannot commit: the commit is fenced,
  and a dropped entry commits nothing.
* Activation either hosts the agent or releases the lease it acquired: every
  failure path (unloadable class, corrupt snapshot, failing ``on_activate``, a
  retired or broken identity) releases it, so a failed activation never leaves a
  lease held or a half-built agent behind. Activations started in the same loop
  turn share one ledger call.
* A retired or broken identity is never hosted: activation refuses it with
  ``InvalidStateError``. A snapshot that cannot be read marks only its own identity
  broken; the rest of the host keeps serving.
* An agent whose lease is lost is dropped at once, and so is one whose lease has
  expired by this host's own clock (it was frozen, or could not reach the ledger),
  renewal or not: the housekeeping loop looks at every expiry to within
  :data:`HOUSEKEEPING_TICK`. How leases are renewed is the lease keeper's to guarantee.
* A dropped agent never replies. A handler running when its agent is dropped is
  cancelled at its next ``await`` (cooperative cancellation; a plain function runs
  to its end, a thread handler's thread cannot be stopped), its State change is
  discarded, and its caller gets ``LeaseLostError``; a retry reaches the new owner.
* A drain moves every agent off the host within its deadline: agents are
  checkpointed and released, and any still busy at the deadline are dropped
  (handlers stopped) and their leases released, so their next owner starts from
  the last committed State at once rather than one TTL later.
* A lifecycle operation takes a new, larger fencing token before it has any effect,
  so every later write by an older owner is refused. Retire releases the token it
  took; delete removes the lease together with the identity.
* The ledger refuses a write under a stale token with ``StaleFencingTokenError``
  (``LeaseLostError`` for a token it never issued, ``UnknownIdentityError`` once the
  identity is deleted), never with a storage error. Every fenced write of a hosted
  agent (checkpoints, and delivery's park, unpark, pause, resume and cancel) goes
  through one helper: a refusal drops the agent at once and the caller gets
  ``LeaseLostError`` chained to the refusal, never the refusal itself.
* A failed commit leaves nothing that looks acknowledged but is not durable. A
  commit whose reply was lost has an unknown outcome, not a lost lease: the
  ledger is read, and the commit counts as done if it landed under this owner's
  token. Otherwise the agent is dropped and its lease released, so the next
  message reloads the last committed State under a new token, and the caller gets
  the retryable ``LedgerUnavailableError`` (``committed_unknown`` when the write
  may have happened). Under ``EVERY_TURN`` an idempotency key is answered from
  memory only once its turn is committed. Under ``PERIODIC`` and
  ``ON_DEACTIVATE`` the reply comes before the commit, so the key is as durable as
  the State it guards: after a commit that did not land, both stay unsaved and
  go out with the next commit.
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
import itertools
import logging
import math
import pickle
import random
import time
import traceback
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Collection, Coroutine, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypeVar

import cloudpickle

from ..checkpoints._committer import INLINE_STATE_BYTES, Checkpoint, Committed, GroupCommitter, Outcome
from ..checkpoints._journal_files import JournalFileStore
from ..checkpoints._store import SnapshotStore
from ..errors import (
    DeadlineExceededError,
    HandlerError,
    InternalError,
    InvalidArgumentsError,
    InvalidSpecError,
    InvalidStateError,
    LeaseLostError,
    LedgerUnavailableError,
    NotAddressableError,
    NotWiredError,
    RayfleetError,
    SnapshotError,
    StaleCheckpointVersionError,
    StaleFencingTokenError,
    StaleSequenceError,
    UnknownHandlerError,
    UnknownIdentityError,
)
from ..identity._agent import AgentSpec
from ..identity._handlers import HandlerInfo
from ..identity._values import (
    DEFAULT_IDLE_TIMEOUT,
    PERSISTED_BROKEN,
    PERSISTED_LIVE,
    PERSISTED_RETIRED,
    Addressability,
    ContinuityRecord,
    Durability,
    EventKind,
    IdentityEvent,
    LeaseDenied,
    LifecycleState,
    TopologyPolicy,
)
from ..ledger._contract import LedgerClient
from ..ledger._turn_rows import TimerFired, TimerRow, TimerSpec
from ..ledger._values import DEFAULT_LEASE_TTL, Activation, IdentityView, StepJournaled, holder_id
from ..turns._timers import settlement
from ._delivery import Delivery
from ._events import EventHub, EventSubscription
from ._grouping import CallGroup
from ._hosted import HostDraining, HostedAgent, OwnedElsewhere
from ._leases import LeaseKeeper
from ._messages import DedupWindow, Envelope, wake_envelope
from ._ports import NO_METRICS, HostMetrics, Router
from ._reports import DrainReport, HostStatistics

if TYPE_CHECKING:
    from typing_extensions import Self

log = logging.getLogger("rayfleet.runtime")

T = TypeVar("T")

# Specs unpickled recently, by fingerprint: a re-activation skips the unpickling. Bounded,
# because the identity is part of the fingerprint and a host may see millions of identities
# pass through; an active agent holds its own spec, so eviction only costs a re-unpickle.
SPEC_CACHE_SIZE = 1024

HOUSEKEEPING_TICK = 0.05
"""Seconds between the housekeeping loop's looks at the clock (lease expiry by this host's clock)."""
HOUSEKEEPING_SHARE = 0.1
"""The most of the event loop's time scans of every hosted agent may take: a scan that took
``d`` seconds is followed by the next no sooner than ``d / HOUSEKEEPING_SHARE`` later, unless a
lease expires sooner. A scan's cost grows with the agents hosted (benchmark B4, density,
hosts tens of thousands per host): scanning at every tick took a large share of a busy
host's loop, and the thread committing the host's lease renewals got the GIL so rarely
that a renewal took seconds and every lease of the host could lapse."""


@dataclass(slots=True)
class _Tally:
    """How far a bulk deactivation got: how many were deactivated, and which leases it released."""

    done: int = 0
    released: set[str] = field(default_factory=set)


DEACTIVATE_BATCH = 1000
"""Agents deactivated together: their commits grouped, their leases released in one ledger call."""
ACQUIRE_BATCH = 100
"""Most identities one acquire call (one ledger transaction) carries; a larger queue goes in several."""

WAKE_INTERVAL = 1.0
"""Seconds between a host's sweeps for suspended turns whose wake came. A sleep within
``LOCAL_WAKE_HORIZON`` wakes on time by its host's own timer; the sweep is for the rest
(long waits, signals, and turns whose host went away)."""
STREAM_RETENTION = 24 * 3600.0
"""Default seconds a finished turn's stream is kept (``HostRuntime(stream_retention=)``,
``RAYFLEET_STREAM_RETENTION`` for a fleet's hosts)."""
STREAM_SWEEP_INTERVAL = 60.0
"""Seconds between a host's sweeps of finished streams past their retention."""
STREAM_SWEEP_BATCH = 1000
"""Streams forgotten per ledger transaction; a sweep takes at most ``STREAM_SWEEP_BATCHES`` of them."""
STREAM_SWEEP_BATCHES = 10
"""Batches of finished streams one sweep forgets at most (the rest wait for the next sweep)."""
ABANDONED_STREAM_AGE = 7 * 24 * 3600.0
"""Seconds a stream that never ended (its turn cut off and never sent again, nor running or
suspended in the journal) is kept after its last event, at least; then the sweep forgets it,
one batch of candidates per sweep."""
WAKE_BATCH = 200
"""Due turns claimed per ledger round trip of a sweep."""
WAKE_CLAIM_SECONDS = 30.0
"""How long a claimed wake is left to its sweeper before another host may deliver it again."""
FIRING_LIMIT = 1000
"""Wakes and timer firings one host delivers at once. A sweep claims no more than the room
left, so a burst of due turns and timers is claimed as fast as this host delivers them, not
all at once: a claim held past ``WAKE_CLAIM_SECONDS`` unworked would lapse and be delivered
again by another host. When a host that hit the limit is down to half, it sweeps again at once."""
TIMER_HOLDER_FIRST = 120.0
"""Seconds past its due time a timer is left to the host holding its identity's lease: each host
fires its own identities' timers, with no hop to the owner. Another host firing it would not add
capacity (the owner runs the turn either way), so this is long: it is the backstop for a host
that keeps its leases but whose sweep fails. A dead or frozen host's timers go to any host as
soon as its leases lapse, and a dormant identity's at once."""
SETTLE_BATCH = 500
"""Timer settlements per ledger transaction: firings that end while one is in flight share the next."""

_REFUSALS = (StaleFencingTokenError, LeaseLostError, UnknownIdentityError)
"""What the ledger answers a write whose token is no longer the identity's: another owner took over."""
_FIRED_FOR_GOOD = (HandlerError, UnknownHandlerError, InvalidArgumentsError, InvalidStateError, NotAddressableError,
                   DeadlineExceededError, StaleSequenceError)
"""What a timer's firing may end with and still count as fired: another try would end the same way."""


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
    def fencing_token(self) -> int:
        return self._entry.grant.fencing_token

    @property
    def peers(self) -> tuple[str, ...]:
        return self._entry.peers

    async def send(self, peer: str, method: str, /, **kwargs: Any) -> Any:
        return await self._runtime.send_from(self._entry.spec.identity, peer, method, kwargs)

    async def send_keyed(self, peer: str, method: str, idempotency_key: str, kwargs: Mapping[str, Any]) -> Any:
        return await self._runtime.send_from(self._entry.spec.identity, peer, method, kwargs,
                                             idempotency_key=idempotency_key)

    async def peer_handler(self, peer: str, method: str) -> HandlerInfo | None:
        view = (await self._runtime._ledger.resolve([peer])).get(peer)
        if view is None:
            raise UnknownIdentityError(identity=peer)
        return self._runtime._spec(view).agent_class.__rayfleet_handlers__.get(method)

    async def checkpoint(self) -> int:
        # Called from inside a turn, which already holds the turn lock.
        await self._runtime._commit(self._entry)
        return self._entry.checkpoint_version

    async def set_timer(self, timer: TimerSpec) -> None:
        entry, ledger = self._entry, self._runtime._ledger
        await self._runtime._fenced_write(entry, "set a timer", lambda token: ledger.set_timer(
            identity=entry.spec.identity, fencing_token=token, timer=timer))

    async def forget_timer(self, name: str) -> bool:
        entry, ledger = self._entry, self._runtime._ledger
        return await self._runtime._fenced_write(entry, "forget a timer", lambda token: ledger.forget_timer(
            identity=entry.spec.identity, name=name, fencing_token=token))


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
        await self._runtime.leases.ensure_healthy(entry)

    async def commit(self, entry: HostedAgent) -> StepJournaled | None:
        """The commit of a turn before its reply: if it fails, the turn must not have happened.

        The agent is taken out of service (lease released), so its next message activates
        it again from the last committed State, dedup window and conversation sequences; otherwise the
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

    async def fenced_write(self, entry: HostedAgent, what: str, write: Callable[[int], Awaitable[T]]) -> T:
        return await self._runtime._fenced_write(entry, what, write)

    def emit(self, identity: str, kind: EventKind, **details: Any) -> None:
        self._runtime._emit(identity, kind, **details)


class _RuntimeLeases:
    """The runtime as the ``LeasePort`` of its lease keeper, without making those methods public."""

    __slots__ = ("_runtime",)

    def __init__(self, runtime: HostRuntime) -> None:
        self._runtime = runtime

    async def drop(self, entry: HostedAgent, reason: str) -> None:
        await self._runtime._drop(entry, reason=reason)

    def emit(self, identity: str, kind: EventKind, **details: Any) -> None:
        self._runtime._emit(identity, kind, **details)

    def listened_among(self, identities: Collection[str]) -> list[str]:
        return self._runtime._events.listened_among(identities)


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
            sequences, which are compared with ``time.time()`` values from other processes.
        incarnation: the suffix of the lease holder id; random unless given, so a
            restarted host never passes for its previous incarnation.
        metrics: where the host's messages, leases and checkpoints are counted for
            dashboards; nothing is reported unless given.
        inline_limit: States whose Arrow encoding is at most this many bytes are
            checkpointed inline in the ledger's commit; larger ones (and large group
            commits) go to snapshot files. 0 writes every checkpoint to a file.
        wake_interval: seconds between sweeps for suspended turns whose wake came.
    """

    def __init__(
        self,
        *,
        name: str,
        ledger: LedgerClient,
        snapshots: SnapshotStore,
        router: Router | None = None,
        lease_ttl: float = DEFAULT_LEASE_TTL,
        idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        incarnation: str | None = None,
        metrics: HostMetrics = NO_METRICS,
        inline_limit: int = INLINE_STATE_BYTES,
        wake_interval: float = WAKE_INTERVAL,
        stream_retention: float = STREAM_RETENTION,
    ) -> None:
        self.name = name
        self.wake_interval = wake_interval
        self.stream_retention = stream_retention
        """Seconds a finished turn's stream is kept in the ledger (see :meth:`sweep_streams`)."""
        self.abandoned_stream_age = max(stream_retention, ABANDONED_STREAM_AGE)
        """Seconds an unended, idle stream of a turn not in progress is kept (see :meth:`sweep_streams`)."""
        self._abandoned_after = 0.0
        """Where the next batch of the abandoned-stream sweep starts (a start time)."""
        self._next_stream_sweep = 0.0
        self._wall_clock = wall_clock
        self._metrics = metrics
        self.holder = holder_id(name, incarnation or format(random.getrandbits(32), "08x"))
        self._ledger = ledger
        self._snapshots = snapshots
        self._router = router
        self.lease_ttl = lease_ttl
        self.idle_timeout = idle_timeout
        self._clock = clock
        self._earliest_expiry = math.inf
        """No hosted lease expires before this (monotonic seconds); see :meth:`_housekeeping_loop`."""
        self._entries: dict[str, HostedAgent] = {}
        self._activating: dict[str, asyncio.Future[HostedAgent]] = {}
        self._acquire_queue: dict[str, list[asyncio.Future[Activation | LeaseDenied | RayfleetError]]] = {}
        self._acquire_flush: asyncio.Task[None] | None = None
        self._spec_cache: OrderedDict[str, AgentSpec] = OrderedDict()
        # Identities refused at activation while INTERNAL_ONLY: delivery answers an outside
        # caller NOT ADDRESSABLE for them rather than revealing their lifecycle state.
        self._refused_internal: set[str] = set()
        self._events = EventHub()
        self._committer = GroupCommitter(writer=self.holder.replace("@", "-"), ledger=ledger, snapshots=snapshots,
                                         on_batch=metrics.commit_batch, inline_limit=inline_limit)
        # Strong references until done: the event loop keeps only weak ones, and a
        # collected task would silently stop mid-work.
        self._background: set[asyncio.Task[None]] = set()
        self._firing: set[asyncio.Task[None]] = set()
        """Wakes and timer firings being delivered (at most ``FIRING_LIMIT``)."""
        self._firing_saturated = False
        self._settlements: CallGroup[TimerFired, bool] = CallGroup(
            self._settle_timers, limit=SETTLE_BATCH, spawn=lambda work: self._spawn(work, name=f"{name}-settle"),
            stopped=lambda: HostDraining(name))
        self._sweep_now = asyncio.Event()
        self._started = False
        self.draining = False
        self._counters = dict.fromkeys(("activations", "deactivations", "leases_lost", "stale_refusals"), 0)
        self.leases = LeaseKeeper(
            name=name, holder=self.holder, ledger=ledger, entries=self._entries, port=_RuntimeLeases(self),
            ttl=lease_ttl, clock=clock, metrics=metrics,
        )
        self.delivery = Delivery(
            entries=self._entries, ledger=ledger, activations=_RuntimeActivations(self), clock=clock,
            wall_clock=wall_clock, metrics=metrics, journal_files=JournalFileStore.on(snapshots.storage),
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
        self._spawn(self.leases.run(), name=f"{self.name}-renew")
        self._spawn(self._housekeeping_loop(), name=f"{self.name}-housekeeping")
        self._spawn(self._wake_loop(), name=f"{self.name}-wakes")

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
        await self.delivery.streams.close()

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
        delivered = self.delivery.counters
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
            ledger_route=self._ledger.route,
            lease_renewals=self.leases.renewals,
            **self._counters,
        )

    def active_identities(self) -> list[str]:
        return sorted(self._entries)

    def is_active(self, identity: str) -> bool:
        return identity in self._entries

    async def send_from(self, sender: str, target: str, method: str, kwargs: Mapping[str, Any], *,
                        idempotency_key: str | None = None) -> Any:
        entry = self._entries.get(sender)
        if entry is not None and entry.spec.topology is TopologyPolicy.ENFORCED and target not in entry.peers:
            raise NotWiredError(sender=sender, target=target)
        if self._router is None:
            raise RuntimeError("this host has no router; agents cannot send to peers here")
        return await self._router.send(sender=sender, target=target, method=method, kwargs=kwargs,
                                       idempotency_key=idempotency_key)

    async def _fenced_write(self, entry: HostedAgent, what: str, write: Callable[[int], Awaitable[T]]) -> T:
        """Run one fenced ledger write for ``entry``; ``write`` gets the token to present.

        The one place a refused write is handled, for checkpoints and for the mailbox
        writes of delivery (park, unpark, pause, resume, cancelling parked work): a
        refusal means another owner took over (or the identity is gone), so the
        agent is dropped at once and never served from here again.

        Raises:
            LeaseLostError: the ledger refused the token; chained to its refusal
                (``StaleFencingTokenError``, ``LeaseLostError`` for a token it never
                issued, ``UnknownIdentityError`` for a deleted identity).
            Anything else ``write`` raises, unchanged; the entry is then left as it is.
        """
        try:
            return await write(entry.grant.fencing_token)
        except _REFUSALS as refusal:
            raise await self._refused(entry, what, refusal) from refusal

    async def _refused(self, entry: HostedAgent, what: str, refusal: RayfleetError) -> LeaseLostError:
        """Drop ``entry`` after the ledger refused its token; the error to raise (see :meth:`_fenced_write`)."""
        self._counters["stale_refusals"] += 1
        self._metrics.stale_refusal(type(refusal).__name__)
        if not entry.dropped:
            await self._drop(entry, reason=str(refusal))
        return LeaseLostError(identity=entry.spec.identity, detail=f"{what} refused: {refusal.message}")

    async def _commit(self, entry: HostedAgent) -> StepJournaled | None:
        """Checkpoint ``entry`` now (caller holds its turn lock); ``entry.checkpoint_version`` is the new version.

        A ``pending_step`` of the entry travels with the checkpoint (and is gone
        afterwards, whatever the outcome); the return says what became of it: ``None``
        when there was none, its run token was stale, or the commit's outcome was
        found only by reading the ledger (then the engine journals the step itself).

        The idempotency keys of the turns it covers are committed with it and are in
        the entry's dedup window once it succeeds. A failed commit leaves the entry
        consistent with what the ledger holds:

        * refused (stale token, deleted identity): the entry is dropped at once and
          the caller gets ``LeaseLostError`` (see :meth:`_fenced_write`);
        * outcome unknown (the ledger call failed in a way that may have followed
          the write): the ledger is read, and a continuity record at this version
          under this token means the commit landed, so this is a success. Otherwise
          (or when the read fails too) the entry is dropped and its lease released:
          the next activation reloads the last committed snapshot, and its new
          token fences a write that might still land. The caller gets
          ``LedgerUnavailableError`` with ``committed_unknown``;
        * refused as not newer (``StaleCheckpointVersionError``): the fence check
          passed, so the version is this owner's own; if the ledger holds this
          version under this token, this write reached it twice and this is a
          success, otherwise the entry is reloaded as below;
        * not committed (a storage error, or a ledger unreachable before the
          write): under ``EVERY_TURN`` the entry is dropped and released the same
          way, so the State goes back to the last committed one and nothing
          unsaved looks acknowledged; under ``PERIODIC`` / ``ON_DEACTIVATE`` the
          State stays unsaved and its keys pending, and the next commit carries
          both. The error is raised as it came.

        Raises:
            LeaseLostError, LedgerUnavailableError, or the storage error, as above.
            InternalError: the ledger holds another checkpoint of this version under
                this owner's own token, which the rules above rule out.
        """
        if entry.dropped:
            raise LeaseLostError(identity=entry.spec.identity,
                                 detail="the agent was taken out of service; nothing was committed")
        checkpoint = self._checkpoint_of(entry)
        try:
            (outcome,) = await self._committer.commit_many([checkpoint])
        except asyncio.CancelledError:
            # The commit may still land; dropping without an await (the lease lapses, or
            # the next activation here re-acquires it under a token that fences the write).
            self._discard(entry)
            raise
        return await self._settle_commit(entry, checkpoint, outcome)

    def _checkpoint_of(self, entry: HostedAgent) -> Checkpoint:
        """The next checkpoint of ``entry`` (turn lock held): its State and the keys of the turns it covers.

        The keys leave ``pending_dedup``; :meth:`_settle_commit` puts them in the dedup
        window, or back, by the outcome.
        """
        keys, entry.pending_dedup = entry.pending_dedup, []
        step, entry.pending_step = entry.pending_step, None
        turn_end, entry.pending_turn_end = entry.pending_turn_end, None
        return Checkpoint(
            identity=entry.spec.identity, fencing_token=entry.grant.fencing_token,
            version=entry.checkpoint_version + 1, state=entry.agent.state, extra=_encode_extra(entry),
            dedup=tuple(keys), dedup_capacity=entry.spec.dedup_capacity, step=step, turn_end=turn_end,
        )

    async def _settle_commit(
        self, entry: HostedAgent, checkpoint: Checkpoint, outcome: Outcome
    ) -> StepJournaled | None:
        """Bring ``entry`` in line with what its commit came to (see :meth:`_commit`); returns its step's outcome."""
        version, keys = checkpoint.version, list(checkpoint.dedup)
        if isinstance(outcome, _REFUSALS):
            raise await self._refused(entry, "checkpoint", outcome) from outcome
        if isinstance(outcome, StaleCheckpointVersionError):
            # The fence check passed, so the version was committed under this owner's own
            # token: by this very write if the call reached the ledger twice (a transport
            # retry after a lost reply). Never a sign that another owner took over.
            if not await self._landed(entry, version):
                await self._reload(entry, why=outcome.message)
                raise InternalError(
                    detail=f"checkpoint of {entry.spec.identity!r} met an earlier write of its own ({outcome.message})"
                ) from outcome
        elif isinstance(outcome, LedgerUnavailableError):
            if not outcome.committed_unknown:
                await self._discard_unsaved(entry, keys, why=outcome.message)
                raise outcome
            if not await self._landed(entry, version):
                await self._reload(entry, why=outcome.message)
                raise outcome
        elif isinstance(outcome, Exception):
            await self._discard_unsaved(entry, keys, why=f"{type(outcome).__name__}: {outcome}")
            raise outcome
        self._metrics.checkpoint(entry.agent_class)
        entry.checkpoint_version = version
        entry.dirty = False
        entry.last_commit = self._clock()
        for key, reply in keys:
            entry.dedup.insert(key, reply)
        self._emit(entry.spec.identity, EventKind.CHECKPOINT_COMPLETED, checkpoint_version=version)
        return outcome.step if isinstance(outcome, Committed) else None

    async def _landed(self, entry: HostedAgent, version: int) -> bool:
        """Whether the ledger holds checkpoint ``version`` of ``entry`` written under its token."""
        try:
            view = (await self._ledger.resolve([entry.spec.identity])).get(entry.spec.identity)
        except Exception as error:  # noqa: BLE001 - the outcome stays unknown; the caller reloads
            log.warning("reading the outcome of a checkpoint of %s failed: %s", entry.spec.identity, error)
            return False
        record = None if view is None else view.continuity
        return (record is not None and record.checkpoint_version == version
                and record.fencing_token == entry.grant.fencing_token)

    async def _discard_unsaved(self, entry: HostedAgent, keys: list[tuple[str, bytes]], *, why: str) -> None:
        """After a commit that did not land: reload (``EVERY_TURN``) or keep the keys pending with the State."""
        if entry.spec.durability is Durability.EVERY_TURN:
            await self._reload(entry, why=why)
        else:
            entry.pending_dedup[:0] = keys

    async def _reload(self, entry: HostedAgent, *, why: str) -> None:
        """Take ``entry`` out of service and release its lease: the next message reloads the last commit."""
        log.warning("checkpoint of %s on %s did not land (%s); it reloads from the last commit",
                    entry.spec.identity, self.name, why)
        self._discard(entry)
        # Released in the background: after a commit that did not land the ledger is often
        # unreachable too, and the caller's answer must not wait out a second timeout. An
        # activation here meanwhile takes a larger token, which this late release cannot free.
        self._spawn(self.leases.release({entry.spec.identity: entry.grant.fencing_token}),
                    name=f"{self.name}-release-{entry.spec.identity}")

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
            requested_at = self._clock()
            result = await self._acquire(identity)
            if isinstance(result, LeaseDenied):
                raise OwnedElsewhere(identity, result.holder)
            if isinstance(result, RayfleetError):
                raise result
            entry = await self._materialize(result, requested_at=requested_at)
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
                # At most ACQUIRE_BATCH identities per ledger call: one transaction of thousands
                # holds a SQLite file's write lock long enough to starve the lease renewals of
                # every host writing it (benchmark B4's many activations at once show it).
                names = list(itertools.islice(self._acquire_queue, ACQUIRE_BATCH))
                queue = {identity: self._acquire_queue.pop(identity) for identity in names}
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

    async def _materialize(self, activation: Activation, *, requested_at: float) -> HostedAgent:
        """Build the agent from an acquired lease; on any failure the lease is released.

        ``requested_at`` is when the acquire was sent (or earlier): the lease is dated
        from then, since the ledger started its TTL no earlier.
        """
        view, grant = activation.view, activation.grant
        identity = view.identity
        installed_at = requested_at
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
                    pointer = view.snapshot
                    if pointer.in_ledger:
                        if pointer.inline is None:  # pragma: no cover - an activation's view always carries it
                            raise InternalError(detail=f"the activation of {identity!r} came without its State")
                        state, extra = self._snapshots.read_inline(
                            pointer.inline, type(agent.state), identity=identity, version=pointer.version,
                        )
                    else:
                        state, extra = self._snapshots.read_row(
                            pointer.file, pointer.row, type(agent.state), identity=identity, version=pointer.version,
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
                dedup=DedupWindow(spec.dedup_capacity), peers=view.wired_peers, suspended_turn=view.suspended_turn,
                recovered_turn=view.running_turn, parked_left=view.parked,
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
            await self.leases.release({identity: grant.fencing_token})
            raise
        self._entries[identity] = entry
        self._earliest_expiry = min(self._earliest_expiry, entry.installed_at + entry.grant.ttl)
        self._metrics.activated(entry.agent_class)
        self._counters["activations"] += 1
        self._emit(identity, EventKind.STATE_CHANGED, state=LifecycleState.ACTIVE, fencing_token=grant.fencing_token)
        return entry

    def _spec(self, view: IdentityView) -> AgentSpec:
        spec = self._spec_cache.get(view.fingerprint)
        if spec is not None:
            self._spec_cache.move_to_end(view.fingerprint)
        else:
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
            while len(self._spec_cache) > SPEC_CACHE_SIZE:
                self._spec_cache.popitem(last=False)
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

    async def deactivate_all(self) -> int:
        """Checkpoint and release every agent hosted when this is called; returns how many were deactivated.

        Agents go in batches of :data:`DEACTIVATE_BATCH`: each batch's unsaved States are
        committed together (group commit) and its leases released in one ledger call,
        so a host with 100,000 agents deactivates in seconds rather than one ledger
        round trip per agent. An agent whose checkpoint fails stays hosted (logged).
        """
        tally = _Tally()
        await self._deactivate_in_batches(list(self._entries.values()), tally)
        return tally.done

    async def _deactivate_in_batches(self, entries: list[HostedAgent], tally: _Tally) -> None:
        # Agents in a turn now go one by one, so that a long turn holds up only its own
        # agent, never the release of a whole batch of idle ones.
        idle: list[HostedAgent] = []
        busy: list[HostedAgent] = []
        for entry in entries:
            (busy if entry.turn_lock.locked() else idle).append(entry)
        for start in range(0, len(idle), DEACTIVATE_BATCH):
            await self._deactivate_batch(idle[start:start + DEACTIVATE_BATCH], tally)
        await asyncio.gather(*(self._deactivate_batch([entry], tally) for entry in busy))

    async def _deactivate_batch(self, entries: list[HostedAgent], tally: _Tally) -> None:
        """Retire ``entries`` as :meth:`deactivate` does one: their checkpoints in one group commit, one release call.

        The turn locks of the idle ones are taken together (at once: nothing else runs in
        between) and held until each is retired; one found in a turn by now waits for it.
        """
        held = [entry for entry in entries if not entry.turn_lock.locked()]
        for entry in held:
            await entry.turn_lock.acquire()  # free, so taken without yielding to another task
        try:
            dirty = [entry for entry in held if entry.dirty and not entry.dropped]
            checkpoints = [self._checkpoint_of(entry) for entry in dirty]
            try:
                outcomes = await self._committer.commit_many(checkpoints)
            except asyncio.CancelledError:
                for entry in dirty:
                    self._discard(entry)  # as a single commit cancelled mid-way: the commits may still land
                raise
            committed = {id(entry): (checkpoint, outcome)
                         for entry, checkpoint, outcome in zip(dirty, checkpoints, outcomes, strict=True)}
            held_ids = set(map(id, held))

            async def retire(entry: HostedAgent) -> int | None:
                if entry.dropped:
                    return None
                if id(entry) in held_ids:
                    await self._retire_entry(entry, checkpoint=True, release=False, committed=committed.get(id(entry)))
                else:
                    async with entry.turn_lock:
                        if entry.dropped:
                            return None
                        await self._retire_entry(entry, checkpoint=True, release=False)
                return entry.grant.fencing_token

            outcomes_of = await asyncio.gather(*(retire(entry) for entry in entries), return_exceptions=True)
        finally:
            for entry in held:
                entry.turn_lock.release()
        tokens: dict[str, int] = {}
        for entry, outcome in zip(entries, outcomes_of, strict=True):
            if isinstance(outcome, int):
                tokens[entry.spec.identity] = outcome
            elif isinstance(outcome, asyncio.CancelledError):
                raise outcome
            elif isinstance(outcome, BaseException):
                log.warning("deactivating %s on %s failed: %s", entry.spec.identity, self.name, outcome)
        if tokens:
            await self.leases.release(tokens)
        tally.released.update(tokens)
        tally.done += len(tokens)
        self._counters["deactivations"] += len(tokens)
        for identity in tokens:
            self._emit(identity, EventKind.STATE_CHANGED, state=LifecycleState.DORMANT)

    async def drain(self, timeout: float) -> DrainReport:
        """Take no new activations and move every agent off this host within ``timeout`` seconds.

        Agents are checkpointed and released as in :meth:`deactivate_all`. Those still
        busy at the deadline (a long turn, a checkpoint that cannot be written) are
        dropped: a running handler is stopped at its next ``await``, its caller gets
        ``LeaseLostError``, and the lease is released so another host activates the
        identity from its last committed State at once. Never waits much past ``timeout``:
        releasing is one ledger call, bounded by the ledger's own timeouts.
        """
        started = self._clock()
        self.draining = True
        entries = list(self._entries.values())
        tally = _Tally()
        job = asyncio.ensure_future(self._deactivate_in_batches(entries, tally))
        done, _ = await asyncio.wait([job], timeout=timeout)
        if not done:
            job.cancel()
            await asyncio.gather(job, return_exceptions=True)
        elif job.exception() is not None:
            log.warning("drain of %s: %s", self.name, job.exception())
        stragglers = [entry for entry in entries if entry.spec.identity not in tally.released]
        tokens = {entry.spec.identity: entry.grant.fencing_token for entry in stragglers}
        for entry in stragglers:
            if not entry.dropped:
                await self._drop(entry, reason="")
        if tokens:
            log.warning("drain of %s released %d agents without checkpoint (busy at its %.1f s deadline, or their "
                        "checkpoint failed): %s", self.name, len(tokens), timeout, ", ".join(sorted(tokens)[:10]))
            await self.leases.release(tokens)
        return DrainReport(host=self.name, checkpointed=tally.done, released_unsaved=len(tokens),
                           timed_out=not done, seconds=round(self._clock() - started, 3))

    async def _retire_entry(
        self, entry: HostedAgent, *, checkpoint: bool, release: bool = True,
        committed: tuple[Checkpoint, Outcome] | None = None,
    ) -> None:
        """Take ``entry`` out of service (turn lock held); its lease is released unless the caller
        releases it with others (``release=False``). ``committed``: its checkpoint, already
        committed with others, and what that came to."""
        if checkpoint and entry.dirty:
            if committed is None:
                await self._commit(entry)
            else:
                await self._settle_commit(entry, *committed)
        if checkpoint:
            with contextlib.suppress(Exception):
                await entry.agent.on_deactivate()
        await self._drop(entry, reason="", release=release)

    def _discard(self, entry: HostedAgent) -> None:
        """Never serve ``entry`` again; a later message activates the identity anew."""
        entry.dropped = True
        if self._entries.get(entry.spec.identity) is entry:
            del self._entries[entry.spec.identity]
            self._metrics.deactivated(entry.agent_class)
        if entry.handler_task is not None and not entry.handler_task.done():
            # Cooperative cancellation: the handler stops at its next await, and its turn
            # answers LeaseLostError instead of a reply built on State this host no longer owns.
            entry.handler_task.cancel()

    async def _drop(self, entry: HostedAgent, *, reason: str, release: bool = False) -> None:
        identity = entry.spec.identity
        self._discard(entry)
        if release:
            await self.leases.release({identity: entry.grant.fencing_token})
        elif reason:
            self._counters["leases_lost"] += 1
            self._metrics.lease_lost()
            log.warning("dropped %s on %s: %s", identity, self.name, reason)
            self._emit(identity, EventKind.LEASE_LOST)

    # -- lifecycle operations (a new token before the effect) -------------------------

    async def _take_new_token(self, identity: str, *, checkpoint: bool, create: bool = False) -> Activation:
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
        grant = (await self._take_new_token(identity, checkpoint=True)).grant
        try:
            await self._ledger.set_lifecycle(
                identity=identity, fencing_token=grant.fencing_token, lifecycle=PERSISTED_RETIRED
            )
        finally:
            await self.leases.release({identity: grant.fencing_token})
        self._emit(identity, EventKind.STATE_CHANGED, state=LifecycleState.RETIRING, fencing_token=grant.fencing_token)
        return grant.fencing_token

    async def respawn(self, identity: str) -> ContinuityRecord:
        """Bring an identity back (same generation, last committed State) under a new lease."""
        requested_at = self._clock()
        fenced = await self._take_new_token(identity, checkpoint=True, create=True)
        await self._ledger.set_lifecycle(
            identity=identity, fencing_token=fenced.grant.fencing_token, lifecycle=PERSISTED_LIVE
        )
        # Same generation, so the keys it remembers still guard effects in its State.
        return await self._rehost(identity, fenced, requested_at=requested_at)

    async def reset(self, identity: str) -> ContinuityRecord:
        """Start over: generation + 1, new session, fresh State; unsaved State is discarded."""
        requested_at = self._clock()
        fenced = await self._take_new_token(identity, checkpoint=False)
        try:
            await self._ledger.reset(identity=identity, fencing_token=fenced.grant.fencing_token)
        except BaseException:
            await self.leases.release({identity: fenced.grant.fencing_token})
            raise
        # A new generation remembers no keys of the old one.
        return await self._rehost(identity, replace(fenced, dedup=()), requested_at=requested_at)

    async def _rehost(self, identity: str, fenced: Activation, *, requested_at: float) -> ContinuityRecord:
        """Host ``identity`` under the lease ``fenced`` holds, acquired no earlier than ``requested_at``.

        The view is read again (the caller changed the record since it fenced); a State
        kept in the ledger comes from the fencing acquire, which loaded it: under this
        lease nobody else can have committed another since.
        """
        views = await self._ledger.resolve([identity])
        view = views.get(identity)
        if view is None:
            raise UnknownIdentityError(identity=identity)
        if view.snapshot is not None and view.snapshot.in_ledger:
            loaded = fenced.view.snapshot
            if loaded is None or loaded.version != view.snapshot.version:  # pragma: no cover - ruled out by the lease
                raise InternalError(detail=f"the State of {identity!r} moved while its lease was held")
            view = replace(view, snapshot=loaded)
        activation = Activation(grant=fenced.grant, view=view, dedup=fenced.dedup)
        entry = await self._materialize(activation, requested_at=requested_at)
        return entry.record

    async def delete(self, identity: str) -> None:
        """Remove the identity, its record and lease; its snapshot rows become garbage."""
        grant = (await self._take_new_token(identity, checkpoint=False)).grant
        await self._ledger.delete(identity=identity, fencing_token=grant.fencing_token)
        self._emit(identity, EventKind.DELETED, fencing_token=grant.fencing_token)
        self._events.close(identity)

    # -- events ---------------------------------------------------------------------

    def subscribe(self, identity: str) -> EventSubscription:
        return self._events.subscribe(identity)

    def unsubscribe(self, identity: str, subscription: EventSubscription) -> None:
        self._events.unsubscribe(identity, subscription)

    def _emit(self, identity: str, kind: EventKind, **details: Any) -> None:
        # Built only for a listener: a renewal emits one per lease, tens of thousands at a time.
        if self._events.listened(identity):
            self._events.emit(IdentityEvent(identity=identity, kind=kind, host=self.name, **details))

    # -- background work ------------------------------------------------------------

    async def renew_once(self) -> int:
        """Renew every lease this host holds now and drop agents whose lease is lost; returns how many were renewed.

        The renewal loop does this on its own; see ``LeaseKeeper.renew_once`` for how.
        """
        return await self.leases.renew_once()

    async def _housekeeping_loop(self) -> None:
        """Drop agents whose lease expired by this host's clock; checkpoint due ``PERIODIC`` agents; retire idle ones.

        Every agent is looked at in one scan, whose cost grows with the agents hosted
        (benchmark B4 hosts tens of thousands): scans come every
        :data:`HOUSEKEEPING_TICK` only while they are cheap, and otherwise no more often
        than keeps them to :data:`HOUSEKEEPING_SHARE` of the event loop's time, so that
        turns, and the thread committing lease renewals, are not starved. Expiry stays
        exact to a tick: the earliest expiry found by the last scan (lowered by every
        activation since) brings the next scan forward, and renewals only move expiries later.
        """
        next_scan = 0.0
        while True:
            await asyncio.sleep(HOUSEKEEPING_TICK)
            now = self._clock()
            if now < next_scan and now < self._earliest_expiry:
                continue
            self._earliest_expiry = math.inf
            await self._scan_entries(now)
            next_scan = now + max(HOUSEKEEPING_TICK, (self._clock() - now) / HOUSEKEEPING_SHARE)

    async def _scan_entries(self, now: float) -> None:
        earliest = math.inf
        for entry in list(self._entries.values()):
            if entry.dropped:
                continue
            expires_at = self.leases.expiry(entry)
            if now >= expires_at:
                # Expired by this host's own clock (it was frozen, or the ledger is out of
                # reach): another host may own it now, so stop serving it, turn or no turn.
                await self._drop(entry, reason="the lease expired before it could be renewed")
                continue
            if expires_at < earliest:
                earliest = expires_at
            if entry.turn_lock.locked():
                continue
            due = (
                entry.dirty
                and entry.spec.durability is Durability.PERIODIC
                and now - entry.last_commit >= entry.spec.checkpoint_interval
            )
            idle = now - entry.last_used >= self.idle_timeout
            if due or idle:
                self._spawn(self._housekeep(entry, idle=idle), name=f"{self.name}-housekeep")
        self._earliest_expiry = min(self._earliest_expiry, earliest)

    async def _housekeep(self, entry: HostedAgent, *, idle: bool) -> None:
        try:
            if idle:
                await self.deactivate(entry.spec.identity)
                return
            async with entry.turn_lock:
                if not entry.dropped and entry.dirty:
                    await self._commit(entry)
        except Exception as error:  # noqa: BLE001 - a storage error too: the State stays unsaved, retried later
            log.warning("background checkpoint of %s failed: %s", entry.spec.identity, error)

    # -- suspended turns whose wake came ---------------------------------------------

    async def _wake_loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._sweep_now.wait(), self.wake_interval)
            self._sweep_now.clear()
            try:
                await self.wake_due()
            except Exception as error:  # noqa: BLE001 - the next sweep tries again
                log.warning("%s: the wake sweep failed: %s", self.name, error)

    async def wake_due(self) -> int:
        """Claim suspended turns whose wake time came and deliver each to its owner; returns how many.

        Every live host sweeps; the ledger's claim (through the index on the wake time,
        ``WAKE_BATCH`` at a time) gives each due turn to one of them for
        ``WAKE_CLAIM_SECONDS``. A wake that could not be delivered is claimed again when
        its claim lapses; a turn woken twice resumes once (the second wake finds it ended,
        or suspended again).
        """
        woken = 0
        if self._clock() >= self._next_stream_sweep:
            self._next_stream_sweep = self._clock() + STREAM_SWEEP_INTERVAL
            await self.sweep_streams()
        while (room := self._firing_room()) > 0:
            due = await self._ledger.claim_wakes(limit=room, claim_for=WAKE_CLAIM_SECONDS)
            for wake in due:
                envelope = wake_envelope(wake)
                self._start_firing(self._deliver_wake(envelope), name=f"{self.name}-wake-{wake.turn_id}")
            woken += len(due)
            if len(due) < room:
                break
        while (room := self._firing_room()) > 0:
            timers = await self._ledger.claim_timers(limit=room, claim_for=WAKE_CLAIM_SECONDS,
                                                     holder=self.holder, holder_first=TIMER_HOLDER_FIRST)
            for timer in timers:
                self._start_firing(self._fire_timer(timer), name=f"{self.name}-timer-{timer.identity}-{timer.name}")
            woken += len(timers)
            if len(timers) < room:
                break
        return woken

    def _firing_room(self) -> int:
        """How many more wakes or firings this sweep may claim in one round trip (0: stop sweeping)."""
        if self.draining:
            return 0
        room = min(WAKE_BATCH, FIRING_LIMIT - len(self._firing))
        if room <= 0:
            self._firing_saturated = True
        return max(room, 0)

    def _start_firing(self, work: Coroutine[Any, Any, None], *, name: str) -> None:
        task = self._spawn(work, name=name)
        self._firing.add(task)
        task.add_done_callback(self._fired)

    def _fired(self, task: asyncio.Task[None]) -> None:
        self._firing.discard(task)
        if self._firing_saturated and len(self._firing) <= FIRING_LIMIT // 2:
            self._firing_saturated = False
            self._sweep_now.set()

    async def sweep_streams(self) -> int:
        """Forget the streams of turns that ended more than ``stream_retention`` seconds ago,
        and abandoned ones; returns how many.

        Bounded: at most ``STREAM_SWEEP_BATCH x STREAM_SWEEP_BATCHES`` ended streams a sweep,
        found through the ledger's index on end events (the rest wait for the next sweep),
        and one batch of ``STREAM_SWEEP_BATCH`` candidates for abandoned streams (no end
        event, nothing written for ``abandoned_stream_age``, the turn neither running nor
        suspended in the journal), found through the index on start events, where the
        previous sweep's batch stopped. Never raises.
        """
        forgotten = 0
        try:
            for _ in range(STREAM_SWEEP_BATCHES):
                batch = await self._ledger.purge_turn_events(
                    ended_before=self._wall_clock() - self.stream_retention, limit=STREAM_SWEEP_BATCH)
                forgotten += batch
                if batch < STREAM_SWEEP_BATCH:
                    break
            abandoned = await self._ledger.purge_abandoned_turn_events(
                idle_before=self._wall_clock() - self.abandoned_stream_age, after=self._abandoned_after,
                limit=STREAM_SWEEP_BATCH)
            self._abandoned_after = abandoned.next_after or 0.0
            forgotten += abandoned.forgotten
        except Exception as error:  # noqa: BLE001 - the next sweep tries again
            log.warning("%s: the sweep of finished turn streams failed: %s", self.name, error)
        return forgotten

    async def _deliver(self, envelope: Envelope) -> Any:
        """Deliver a platform message (a wake, a timer's firing) to its identity's owner, here or elsewhere."""
        if self._router is None or self.is_active(envelope.target):
            return (await self.delivery.deliver(envelope)).value
        return await self._router.deliver(envelope)

    async def _deliver_wake(self, envelope: Envelope) -> None:
        try:
            await self._deliver(envelope)
        except Exception as error:  # noqa: BLE001 - its claim lapses and a later sweep delivers it again
            log.info("%s: could not deliver the wake of turn %s of %s: %s", self.name, envelope.message_id,
                     envelope.target, error)

    async def _fire_timer(self, timer: TimerRow) -> None:
        """Fire one claimed timer for its scheduled time, then move it to its next one.

        With ``overlap="skip"`` the timer moves on only once its firing's turn ended, so
        the next time cannot fire beside it; with ``"allow"`` it moves on first. A firing
        whose turn failed in the handler counts as fired (the message is dead-lettered);
        one that could not be delivered leaves the claim to lapse, and the same scheduled
        time is fired again, under the same idempotency key.
        """
        envelope = Envelope(target=timer.identity, method=timer.method, kwargs=pickle.loads(timer.payload),
                            idempotency_key=f"timer:{timer.name}:{timer.next_due!r}")
        settled = settlement(timer, now=self._wall_clock())
        if timer.overlap == "allow" and settled.next_due is not None and not await self._settle(settled):
            return  # not moved on: firing now could overlap a firing of the next time
        try:
            await self._deliver(envelope)
        except _FIRED_FOR_GOOD:
            pass  # the handler ran (or can never run): the time is spent; the dead letters say why
        except Exception as error:  # noqa: BLE001 - see the docstring
            log.info("%s: timer %r of %s not fired for %r, left to a later sweep: %s", self.name, timer.name,
                     timer.identity, timer.next_due, error)
            return
        if timer.overlap != "allow" or settled.next_due is None:
            await self._settle(settlement(timer, now=self._wall_clock()))

    async def _settle(self, fired: TimerFired) -> bool:
        """Settle one firing through the group of this host's settlements; whether it was written.

        A settlement that could not be written is left alone: the claim lapses and the same
        scheduled time fires again, under the same idempotency key (one effect).
        """
        try:
            await self._settlements.submit(fired)
        except Exception as error:  # noqa: BLE001 - see the docstring
            log.info("%s: timer %r of %s fired for %r but not settled, left to a later sweep: %s", self.name,
                     fired.name, fired.identity, fired.scheduled, error)
            return False
        return True

    async def _settle_timers(self, fired: list[TimerFired]) -> list[bool]:
        return await self._ledger.settle_timers(fired=fired)

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
    """Runtime metadata saved beside the State: the conversations' sequence high-water marks, and the
    replies of the last turns without an idempotency key by message key (``HostedAgent.recent_messages``)."""
    saved: dict[str, Any] = {}
    if sequences := entry.sequences.export():
        saved["sequences"] = sequences
    if messages := entry.recent_messages.items():
        saved["messages"] = messages
    return cloudpickle.dumps(saved) if saved else b""


def _decode_extra(entry: HostedAgent, extra: bytes) -> None:
    if extra:
        saved = cloudpickle.loads(extra)
        # Checkpoints written before the conversation sequence had its own word keep them under "fences".
        entry.sequences.restore(saved.get("sequences", saved.get("fences", {})))
        for key, reply in saved.get("messages", ()):
            entry.recent_messages.insert(key, reply)

