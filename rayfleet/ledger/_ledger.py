"""``Ledger``: the one authority for leases, fencing tokens, continuity records, runs and durable queues.

Every public method is one transaction on the store; the rules live in the table-group
modules beside this one (``_leases`` holds the fencing rules) and are written once for
every store. Callers never reach a ``Ledger`` directly across processes: they use a
:class:`~rayfleet.ledger._contract.LedgerClient` (the Ray actor in ``rayfleet.platform``,
or :class:`~rayfleet.ledger._local.LocalLedgerClient` in one process).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

from ..errors import InternalError, InvalidSpecError, RayfleetError, UnknownIdentityError
from ..identity._values import (
    PERSISTED_LIVE,
    ContinuityRecord,
    LeaseDenied,
    SnapshotPointer,
)
from . import (
    _approvals,
    _checkpoints,
    _edges,
    _hosts,
    _identities,
    _leases,
    _mailbox,
    _meta,
    _runs,
    _signals,
    _timers,
    _turn_events,
    _turns,
    _views,
)
from ._sqlite import SqliteDatabase
from ._stopped_writers import StoppedWriters
from ._store import (
    AwaitedWrites,
    Database,
    ImmediateDatabase,
    ImmediateWrites,
    Row,
    StalledSessions,
    Statement,
    StoreClock,
    Transaction,
    WouldWait,
    WriteLockHolders,
)
from ._turn_rows import (
    AbandonedSweep,
    ApprovalRequest,
    ApprovalResolved,
    ApprovalRow,
    TimerFired,
    TimerRow,
    TimerSpec,
    TurnEnd,
    TurnEventRow,
    TurnRecord,
    TurnWake,
    TurnWrite,
)
from ._values import (
    DEFAULT_LEASE_TTL,
    Activation,
    CheckpointCommit,
    CheckpointRow,
    CommitOutcome,
    HostInfo,
    IdentityView,
    JournalRecord,
    LeaseView,
    RegisterOutcome,
    RunLease,
    RunRecord,
    RunRequests,
    RunStart,
    SpecRecord,
    StoredMessage,
    TopologyChange,
    TopologySnapshot,
)

T = TypeVar("T")


class Ledger:
    """Leases, fencing and continuity over one database.

    Args:
        database: a store, or a path to a SQLite file (created if missing).
        clock: wall-clock seconds; lease expiry and lock-delay are measured with it.
        authority: whether this process serves the database (the default). A process
            that opens a database another one serves (a host beside the SQLite ledger
            actor, on its node) passes ``False``: its opening is not a restart of the
            authority, so it applies no lock-delay.

    Thread-safe as far as its store is (the SQLite store is). Opening as the authority
    applies lock-delay when the store's incarnation changed: leases found live are not
    granted to another holder for one TTL.
    """

    def __init__(
        self, database: Database | str | Path, *, clock: Callable[[], float] | None = None, authority: bool = True,
    ) -> None:
        self._db: Database = SqliteDatabase(database) if isinstance(database, (str, Path)) else database
        self._awaited = self._db if isinstance(self._db, AwaitedWrites) else None
        self._writes_now = isinstance(self._db, ImmediateWrites)
        self._clock = clock
        self._stopped_writers = StoppedWriters()
        self._incarnation = uuid.uuid4().hex[:8]
        self._immediate: Ledger | None = None
        if authority:
            self._db.write(self._on_open)

    def _now(self, tx: Transaction) -> float:
        return self._clock() if self._clock is not None else self._db.now(tx)

    def _stamp(self) -> float | StoreClock:
        """What stamps a checkpoint's ``committed_at``: the given clock, else the store's, read by the update."""
        return self._clock() if self._clock is not None else StoreClock(self._db.clock_sql)

    def _on_open(self, tx: Transaction) -> None:
        # Lock-delay once per restart of the authority: leases it finds were held by
        # owners that could not renew while it was down; they get one TTL to do so.
        current = self._db.incarnation(tx)
        if _meta.get(tx, _meta.INCARNATION) != current:
            _leases.apply_lock_delay(tx, self._now(tx))
            _runs.apply_lock_delay(tx, self._now(tx))
            _meta.put(tx, _meta.INCARNATION, current)

    def close(self) -> None:
        self._db.close()

    def incarnation(self) -> str:
        """An id that changes every time a ledger opens, so clients can tell a restart."""
        return self._incarnation

    @property
    def sessions_can_stall(self) -> bool:
        """Whether a stopped client can leave the store's locks held: a PostgreSQL session, a SQLite file's
        write lock (see below)."""
        return isinstance(self._db, (StalledSessions, WriteLockHolders))

    def end_stalled_sessions(self, older_than: float) -> dict[int, float]:
        """End what a client stopped mid-transaction for over ``older_than`` seconds holds that other writers need.

        On PostgreSQL, the sessions others wait on (``PostgresDatabase.end_stalled_sessions``;
        the keys are the server's process ids). On SQLite, the process holding the file's
        write lock if it is a host of this node, stopped all that time
        (:mod:`~rayfleet.ledger._stopped_writers`; the key is its process id). Returns each
        ended one with the seconds it had stalled (on SQLite, since first seen so).
        """
        if isinstance(self._db, StalledSessions):
            return self._db.end_stalled_sessions(older_than)
        if isinstance(self._db, WriteLockHolders):
            # Read aside: this process's own writers may hold its connection, waiting on the very lock.
            database = self._db
            return self._stopped_writers.end(database.write_lock_holder, older_than=older_than,
                                             hosts=lambda: database.read_aside(_hosts.hosts))
        return {}

    @property
    def kind(self) -> str:
        """The store's kind: ``"sqlite"`` or ``"postgresql"``."""
        return self._db.kind

    @property
    def location(self) -> str:
        """Where the ledger's data lives (no passwords)."""
        return self._db.describe()

    def fleet_identity(self, claim: str | None = None) -> str | None:
        """The id of the fleet this ledger belongs to; with ``claim``, record it if none is recorded yet.

        Returns the recorded id (the claimed one if this call recorded it), or ``None``.
        """

        def run(tx: Transaction) -> str | None:
            current = _meta.get(tx, _meta.FLEET_ID)
            if current is None and claim is not None:
                _meta.put(tx, _meta.FLEET_ID, claim)
                return claim
            return current

        return self._db.write(run) if claim is not None else self._db.read(lambda tx: _meta.get(tx, _meta.FLEET_ID))

    # -- identities -------------------------------------------------------------------

    def register(self, record: SpecRecord) -> RegisterOutcome:
        """Record a spawned identity; idempotent for an identical spec.

        Raises:
            InvalidSpecError: if the identity exists with a different spec.
        """
        return self._db.write(lambda tx: _identities.register(tx, record, self._now(tx)))

    def register_many(self, records: Sequence[SpecRecord]) -> list[RegisterOutcome]:
        """Register many identities in one transaction, each idempotent for an identical spec.

        All or nothing: one identity that exists with a different spec refuses the batch.

        Raises:
            InvalidSpecError: an identity exists with a different spec.
        """
        batch = list(records)
        return self._db.write(lambda tx: _identities.register_many(tx, batch, self._now(tx)))

    def apply_specs(self, *, creates: Sequence[SpecRecord], updates: Sequence[SpecRecord]) -> None:
        """Create and update many identities in one transaction (a roster applies whole or not at all).

        Raises:
            InvalidSpecError: a created identity exists already.
            UnknownIdentityError: an updated identity does not exist.
        """
        self._db.write(lambda tx: _identities.apply_specs(tx, creates, updates, self._now(tx)))

    def resolve(self, identities: Iterable[str]) -> dict[str, IdentityView]:
        """Views of the given identities; unknown ones are absent from the result."""
        wanted = list(identities)

        def run(tx: Transaction) -> dict[str, IdentityView]:
            now = self._now(tx)
            return _views.views(tx, wanted, now)

        return self._db.read(run)

    def leases(self, identities: Iterable[str]) -> dict[str, LeaseView | None]:
        """The live lease of each identity as of the ledger's clock; a lapsed lease reads as ``None``.

        Cheaper than :meth:`resolve` (no spec, no snapshot pointer): routers ask it to
        tell a slow owner, which keeps renewing, from a frozen or dead one, whose lease lapses.
        """
        wanted = list(identities)
        return self._db.read(lambda tx: _views.leases(tx, wanted, self._now(tx)))

    def list_identities(self, *, labels: Mapping[str, str] | None = None) -> list[IdentityView]:
        """All identities, sorted, optionally only those whose labels include ``labels``."""
        return self._db.read(lambda tx: _identities.list_views(tx, labels, self._now(tx)))

    def select_identities(self, *, labels: Mapping[str, str]) -> list[str]:
        """The names of the live identities (spawned, neither retired nor broken) whose labels include ``labels``.

        What a scatter step or label selection addresses, read in one query: no views.
        """
        return self._db.read(lambda tx: _identities.select(tx, labels, PERSISTED_LIVE))

    def set_lifecycle(self, *, identity: str, fencing_token: int, lifecycle: str, reason: str = "") -> None:
        """Persist retired / broken / live for an identity, fenced."""
        if lifecycle not in _identities.LIFECYCLE_MARKERS:
            raise InvalidSpecError(f"unknown lifecycle marker {lifecycle!r}", field="lifecycle")
        self._db.write(
            lambda tx: _identities.set_lifecycle(
                tx, identity=identity, fencing_token=fencing_token, lifecycle=lifecycle, reason=reason
            )
        )

    def reset(self, *, identity: str, fencing_token: int) -> ContinuityRecord:
        """Start a new generation: new runtime id and session, version 0, no snapshot, no remembered keys."""
        return self._db.write(lambda tx: _identities.reset(tx, identity=identity, fencing_token=fencing_token))

    def delete(self, *, identity: str, fencing_token: int) -> SnapshotPointer | None:
        """Remove an identity, its continuity record, lease, keys, edges and pause; return its last snapshot.

        Parked messages become dead letters (reason ``DELETED``). The fence high-water
        mark is kept forever, so a token issued before the delete can never write to
        an identity re-created under the same name.
        """
        return self._db.write(
            lambda tx: _identities.delete(tx, identity=identity, fencing_token=fencing_token, now=self._now(tx))
        )

    # -- leases and fencing -------------------------------------------------------------

    def acquire(
        self, *, holder: str, identities: Iterable[str], ttl: float = DEFAULT_LEASE_TTL, create_continuity: bool = True
    ) -> dict[str, Activation | LeaseDenied | RayfleetError]:
        """Acquire leases on many identities in one commit.

        Each granted identity gets a token one above its high-water mark (a holder that
        re-acquires its own lease gets a new, larger token too: lifecycle operations
        use that to fence themselves). The continuity record is stamped with the new
        token, and created at generation 0 when ``create_continuity`` and none exists.

        Returns, per identity: an :class:`Activation`, a ``LeaseDenied`` naming the
        current holder, or an ``UnknownIdentityError``.
        """
        if ttl <= 0:
            raise InvalidSpecError(f"lease ttl must be positive, got {ttl!r}", field="ttl")
        wanted = list(identities)
        return self._db.write(
            lambda tx: _leases.acquire(
                tx, holder=holder, identities=wanted, ttl=ttl, create_continuity=create_continuity, now=self._now(tx)
            )
        )

    def renew(self, *, holder: str, tokens: Mapping[str, int]) -> frozenset[str]:
        """Extend many leases by their TTL in one commit; returns the presented identities whose lease is lost.

        A lease is renewed only if ``holder`` still holds it with the same token (an
        expired lease that nobody else took is renewed too: fencing, not the clock,
        decides who may write). A renewed lease keeps its grant (holder, token, TTL)
        and lasts one TTL from the commit. The cost does not grow per lease in Python:
        see :func:`rayfleet.ledger._leases.renew`.
        """
        return self._db.write(lambda tx: _leases.renew(tx, holder=holder, tokens=tokens, now=self._now(tx)))

    def renew_holder(self, *, holder: str, ttl: float) -> bool:
        """Keep every lease ``holder`` holds live for ``ttl`` more seconds, in one row write, if the holder is live.

        ``False`` (nothing changed) when the holder's liveness lapsed or was never
        armed: renew each lease still hosted with :meth:`renew`, then :meth:`arm_holder`.
        See :func:`rayfleet.ledger._leases.renew_holder`.
        """
        return self._db.write(lambda tx: _leases.renew_holder(tx, holder=holder, ttl=ttl, now=self._now(tx)))

    def arm_holder(self, *, holder: str, ttl: float) -> int:
        """Make ``holder`` live for ``ttl`` seconds, first dropping its lapsed leases; returns how many it dropped.

        Call it right after renewing every lease the holder still hosts. See
        :func:`rayfleet.ledger._leases.arm_holder`.
        """
        return self._db.write(lambda tx: _leases.arm_holder(tx, holder=holder, ttl=ttl, now=self._now(tx)))

    def release(self, *, holder: str, tokens: Mapping[str, int]) -> int:
        """Give up leases (only those still held with the given token); returns how many."""
        return self._db.write(lambda tx: _leases.release(tx, holder=holder, tokens=tokens))

    def revoke_holder(self, holder: str) -> list[str]:
        """Drop every lease of a holder known to be dead; returns the freed identities.

        Safe without waiting for the TTL because fencing, not timing, protects state:
        should the holder still be alive, its next write presents a superseded token.
        """
        return self._db.write(lambda tx: _leases.free_holder(tx, holder))

    def check_fence(self, identity: str, token: int) -> None:
        """Raise unless ``token`` is the identity's current high-water mark."""
        self._db.read(lambda tx: _leases.check_fence(tx, identity, token))

    def high_water(self, identity: str) -> int:
        """The highest token ever issued for ``identity`` (0 if none)."""
        return self._db.read(lambda tx: _leases.high_water(tx, identity))

    # -- checkpoints --------------------------------------------------------------------

    def commit_checkpoints(self, commits: Iterable[CheckpointCommit]) -> list[CommitOutcome]:
        """Move many snapshot pointers in one transaction; each is checked on its own.

        Returns one entry per commit, ``None`` when accepted, else the refusal
        (``StaleFencingTokenError``, ``StaleCheckpointVersionError``, ...). Refused
        entries change nothing; accepted ones are durable when this returns.

        How the call travels is the client's choice, not another operation: a client
        on an event loop may await :meth:`commit_alone`'s statement with
        :meth:`write_awaited`, or try the whole call with :meth:`immediately`.
        """
        batch = list(commits)
        statement = self.commit_alone(batch)
        if statement is not None:
            # The commonest commit, a host's one turn, in one statement (on PostgreSQL one
            # round trip instead of three); only a refusal takes the transaction below.
            outcomes = statement.answer(self._db.write_alone(statement.sql, statement.parameters))
            if outcomes is not None:
                return outcomes
        return self._db.write(lambda tx: _checkpoints.commit(tx, batch, self._stamp()))

    def commit_alone(self, commits: Sequence[CheckpointCommit]) -> Statement[list[CommitOutcome]] | None:
        """The one statement that is :meth:`commit_checkpoints` when ``commits`` pass, else ``None``.

        There is one for a host's one turn (one checkpoint with at most one key) on a store
        whose ``WITH`` may write (``_checkpoints.alone``). Its answer is ``None`` when the
        commit did not pass (nothing was written): :meth:`commit_checkpoints` then judges
        it and names the refusal.
        """
        if not (len(commits) == 1 and self._db.dialect.writes_in_with and _checkpoints.fits_alone(commits[0])):
            return None
        (item,) = commits
        sql, parameters = _checkpoints.alone(item, self._stamp())

        def answer(rows: list[Row]) -> list[CommitOutcome] | None:
            moved, outcome = _checkpoints.alone_outcome(item, rows)
            return [outcome] if moved else None

        return Statement(sql, parameters, answer)

    @property
    def writes_awaited(self) -> bool:
        """Whether :meth:`write_awaited` can run a statement on the caller's event loop (PostgreSQL)."""
        return self._awaited is not None

    async def write_awaited(self, statement: Statement[T]) -> T | None:
        """``statement`` as a write of its own, awaited on the caller's event loop: its answer.

        Same guarantees and failures as the operation it stands for.

        Raises:
            InternalError: the store has no awaited writes (see :attr:`writes_awaited`).
        """
        if self._awaited is None:
            raise InternalError(detail=f"write_awaited on a {self.kind} store, which has no awaited writes")
        return statement.answer(await self._awaited.write_alone_async(statement.sql, statement.parameters))

    def immediately(self, operation: Callable[[Ledger], T]) -> tuple[bool, T | None]:
        """``operation(ledger)`` on this ledger's store, only if no write in it has to wait.

        Returns ``(True, its result)``, or ``(False, None)`` when a write would have waited
        for the store's write lock (held right now by this process or another) or the store
        cannot tell at once (only a SQLite file can); then nothing was written. For callers
        on an event loop, which must not sleep in SQLite's busy handler. Raises what
        ``operation`` raises.
        """
        if not self._writes_now:
            return False, None
        if self._immediate is None:
            self._immediate = Ledger(ImmediateDatabase(self._db), clock=self._clock, authority=False)
        try:
            return True, operation(self._immediate)
        except WouldWait:
            return False, None

    def latest_checkpoints(
        self, *, after: str = "", limit: int = 1000, agent_class: str | None = None
    ) -> list[CheckpointRow]:
        """One page of identities (names after ``after``, sorted, at most ``limit``) with their latest checkpoint.

        Every identity is listed, with ``snapshot=None`` when it never committed one;
        ``agent_class`` keeps only identities of that class. Walk the fleet by passing
        the last identity of a page as the next ``after``.

        Raises:
            InvalidSpecError: ``limit`` is not a positive integer.
        """
        if not isinstance(limit, int) or limit < 1:
            raise InvalidSpecError(f"limit must be a positive integer, got {limit!r}", field="limit")
        return self._db.read(
            lambda tx: _checkpoints.latest(tx, after=after, limit=limit, agent_class=agent_class)
        )

    def dedup_window(self, identity: str) -> list[tuple[str, bytes]]:
        """The remembered idempotency keys of an identity, oldest first, with their replies."""
        return self._db.read(lambda tx: _views.dedup_rows_of(tx, [identity]).get(identity, []))

    def referenced_snapshot_files(self) -> set[str]:
        """Every file some continuity record points at (the GC keeps these)."""
        return self._db.read(lambda tx: _checkpoints.referenced_files(tx))

    # -- topology -----------------------------------------------------------------------

    def wired_peers(self, identities: Iterable[str]) -> dict[str, tuple[str, ...]]:
        """The live peers of each identity."""
        wanted = list(identities)
        return self._db.read(lambda tx: _edges.wired_peers(tx, wanted))

    def set_desired_edge(self, *, a: str, b: str, desired: bool) -> None:
        """Add or remove an explicit desired edge (``a < b``, canonical); both identities must exist."""
        self._db.write(lambda tx: _edges.set_desired(tx, a=a, b=b, desired=desired))

    def topology(self) -> TopologySnapshot:
        """Everything reconciliation needs, read in one consistent view."""
        return self._db.read(lambda tx: _edges.snapshot(tx))

    def apply_topology(self, change: TopologyChange) -> None:
        """Change live edges in one transaction."""
        self._db.write(lambda tx: _edges.apply(tx, change))

    # -- workflow runs and their journal ------------------------------------------------

    def create_run(
        self, *, run_id: str, workflow: str, code_version: str, definition: bytes | None, force: bool = False
    ) -> str:
        """Register a run, or find it again to resume it; returns its status.

        Raises:
            InvalidSpecError: the run already ended, or exists under a different code
                version (pass ``force=True`` to resume it anyway, e.g. after a compatible fix).
        """
        return self._db.write(
            lambda tx: _runs.create(
                tx,
                run_id=run_id,
                workflow=workflow,
                code_version=code_version,
                definition=definition,
                force=force,
                now=self._now(tx),
            )
        )

    def run(self, run_id: str) -> RunRecord | None:
        """The registry record of a run, or ``None`` for an unknown run."""
        return self._db.read(lambda tx: _runs.get(tx, run_id))

    def list_runs(self, *, statuses: Sequence[str] | None = None) -> list[RunRecord]:
        """Runs in creation order, optionally only those in ``statuses``."""
        return self._db.read(lambda tx: _runs.list_runs(tx, statuses))

    def run_definition(self, run_id: str) -> bytes | None:
        """The pickled workflow of a submitted run, or ``None``."""
        return self._db.read(lambda tx: _runs.definition(tx, run_id))

    def set_run_status(
        self, *, run_id: str, fencing_token: int, status: str, detail: str | None = "", outcome: bytes | None = None,
        release_holder: str | None = None,
    ) -> RunRequests:
        """Record a run's status (fenced by the run's token); ``detail=None`` keeps the detail already recorded.

        With ``release_holder``, the run's lease is given up in the same transaction if
        that holder still holds it under ``fencing_token`` (an engine's last write).
        Returns what is asked of the run as of this write, so its engine needs no read of
        its own before starting a step.

        Raises:
            StaleRunTokenError: ``fencing_token`` is not the run's current token; nothing is written.
        """
        return self._db.write(
            lambda tx: _runs.set_status(
                tx,
                run_id=run_id,
                fencing_token=fencing_token,
                status=status,
                detail=detail,
                outcome=outcome,
                release_holder=release_holder,
                now=self._now(tx),
            )
        )

    def request_run(self, *, run_id: str, cancel: bool | None = None, pause: bool | None = None) -> bool:
        """Ask a run to cancel or to pause/resume dispatching; returns False for an unknown run."""
        return self._db.write(lambda tx: _runs.request(tx, run_id=run_id, cancel=cancel, pause=pause))

    def journal(self, run_id: str) -> JournalRecord:
        """A run's journaled step outputs (in completion order) and its successful compensations."""
        return self._db.read(lambda tx: _runs.journal(tx, run_id))

    def journal_step(
        self, *, run_id: str, fencing_token: int, label: str, output: bytes, tokens: int
    ) -> RunRequests:
        """Journal one step's output (fenced); a step is journaled once (a repeat keeps the first).

        Returns what is asked of the run as of this write, so its engine needs no read of
        its own before starting the next step.

        Raises:
            StaleRunTokenError: ``fencing_token`` is not the run's current token; nothing is written.
        """
        return self._db.write(
            lambda tx: _runs.journal_step(
                tx, run_id=run_id, fencing_token=fencing_token, label=label, output=output, tokens=tokens
            )
        )

    def journal_compensation(self, *, run_id: str, fencing_token: int, label: str, ok: bool, error: str) -> None:
        """Record that a step's compensation ran, and whether it succeeded (fenced).

        Raises:
            StaleRunTokenError: ``fencing_token`` is not the run's current token; nothing is written.
        """
        self._db.write(
            lambda tx: _runs.journal_compensation(
                tx, run_id=run_id, fencing_token=fencing_token, label=label, ok=ok, error=error
            )
        )

    def acquire_run_lease(
        self, *, run_id: str, holder: str, ttl: float = DEFAULT_LEASE_TTL, takeover_from: str | None = None
    ) -> RunLease:
        """Make ``holder`` the engine of a run, under a token larger than any issued before for it.

        Granted when the run's lease is free, released, lapsed, already ``holder``'s (a
        new, larger token), or held by ``takeover_from`` (a holder the caller knows is
        dead; its step leases are freed too). The token is persisted before the reply.

        Raises:
            RunOwnedElsewhereError: another holder's lease is live; it names the holder.
            InvalidSpecError: ``ttl`` is not positive.
        """
        return self._granting_run_lease(_runs.acquire_lease, run_id=run_id, holder=holder, ttl=ttl,
                                        takeover_from=takeover_from)

    def start_run(
        self, *, run_id: str, holder: str, ttl: float = DEFAULT_LEASE_TTL, takeover_from: str | None = None
    ) -> RunStart:
        """:meth:`acquire_run_lease`, and the run's :meth:`journal` as of the grant, in one transaction.

        What an engine does first: once it holds the lease, no other engine can journal
        a step, so the journal it reads is the one it resumes from. Refused as
        :meth:`acquire_run_lease` is, and then nothing is read.
        """
        return self._granting_run_lease(_runs.start, run_id=run_id, holder=holder, ttl=ttl,
                                        takeover_from=takeover_from)

    def _granting_run_lease(
        self, grant: Callable[..., T], *, run_id: str, holder: str, ttl: float, takeover_from: str | None
    ) -> T:
        """``grant`` (a ``_runs`` function that grants the run's lease first) in one write transaction."""
        if ttl <= 0:
            raise InvalidSpecError(f"run lease ttl must be positive, got {ttl!r}", field="ttl")
        return self._db.write(
            lambda tx: grant(tx, run_id=run_id, holder=holder, ttl=ttl, takeover_from=takeover_from, now=self._now(tx))
        )

    def renew_run_lease(self, *, run_id: str, holder: str, token: int) -> RunLease:
        """Extend the run lease by its TTL if ``holder`` still holds it under ``token``.

        Raises:
            StaleRunTokenError: the token was superseded, or the lease was released.
        """
        return self._db.write(
            lambda tx: _runs.renew_lease(tx, run_id=run_id, holder=holder, token=token, now=self._now(tx))
        )

    def release_run_lease(self, *, run_id: str, holder: str, token: int) -> bool:
        """Give up the run lease if ``holder`` still holds it under ``token``; the token stays the high-water."""
        return self._db.write(lambda tx: _runs.release_lease(tx, run_id=run_id, holder=holder, token=token))

    def acquire_step_lease(self, *, run_id: str, label: str, holder: str, fencing_token: int, ttl: float) -> int:
        """Lease exclusive step ``label`` of a run for ``ttl`` seconds; returns its conversation fence.

        The fence is strictly larger than any step token issued before for the run.
        ``fencing_token`` is the run's token: only the run's current engine gets a step lease.

        Raises:
            StaleRunTokenError: ``fencing_token`` is not the run's current token.
            RunOwnedElsewhereError: the step's lease is held and has not lapsed (``step`` names it).
            InvalidSpecError: ``ttl`` is not positive.
        """
        if ttl <= 0:
            raise InvalidSpecError(f"step lease ttl must be positive, got {ttl!r}", field="ttl")
        return self._db.write(
            lambda tx: _runs.acquire_step_lease(
                tx, run_id=run_id, label=label, holder=holder, fencing_token=fencing_token, ttl=ttl, now=self._now(tx)
            )
        )

    def release_step_lease(self, *, run_id: str, label: str, holder: str, token: int) -> bool:
        """Give up a step lease if ``holder`` still holds it under ``token``."""
        return self._db.write(
            lambda tx: _runs.release_step_lease(tx, run_id=run_id, label=label, holder=holder, token=token)
        )

    # -- pause, parking and dead letters ------------------------------------------------

    def set_paused(self, *, identity: str, fencing_token: int, paused: bool) -> None:
        """Persist the pause flag of an identity (fenced); it survives host failover."""
        self._db.write(
            lambda tx: _mailbox.set_paused(
                tx, identity=identity, fencing_token=fencing_token, paused=paused, now=self._now(tx)
            )
        )

    def is_paused(self, identity: str) -> bool:
        return self._db.read(lambda tx: _mailbox.is_paused(tx, identity))

    def park(self, *, identity: str, fencing_token: int, message_id: str, envelope: bytes) -> int:
        """Hold a message durably, in arrival order (fenced); parking the same message twice is a no-op.

        Returns the parked message's sequence number.
        """
        return self._db.write(
            lambda tx: _mailbox.park(
                tx,
                identity=identity,
                fencing_token=fencing_token,
                message_id=message_id,
                envelope=envelope,
                now=self._now(tx),
            )
        )

    def parked(self, identity: str, *, limit: int = 1000) -> list[StoredMessage]:
        """Parked messages of an identity, oldest first."""
        return self._db.read(lambda tx: _mailbox.parked(tx, identity, limit))

    def unpark(self, *, identity: str, fencing_token: int, seq: int) -> None:
        """Forget a parked message once its replay has been handled (fenced)."""
        self._db.write(lambda tx: _mailbox.unpark(tx, identity=identity, fencing_token=fencing_token, seq=seq))

    def cancel_parked(self, *, identity: str, fencing_token: int) -> int:
        """Move every parked message of an identity to the dead letters (reason ``CANCELLED``); fenced."""
        return self._db.write(
            lambda tx: _mailbox.cancel_parked(tx, identity=identity, fencing_token=fencing_token, now=self._now(tx))
        )

    # -- durable turns

    def write_turn(self, *, identity: str, fencing_token: int, turn: TurnWrite) -> None:
        """Journal a durable turn (fenced): create its row on the first write, set its status and wait, upsert entries.

        A completed entry is never changed by a later write.
        """
        statement = self.write_turn_alone(identity=identity, fencing_token=fencing_token, turn=turn)
        if statement is not None and statement.answer(self._db.write_alone(statement.sql, statement.parameters)):
            return
        self._db.write(
            lambda tx: _turns.write(tx, identity=identity, fencing_token=fencing_token, turn=turn, now=self._now(tx))
        )

    def write_turn_alone(self, *, identity: str, fencing_token: int, turn: TurnWrite) -> Statement[bool] | None:
        """The one statement that is :meth:`write_turn` when its fence passes, on a store whose ``WITH`` may write.

        Its answer is ``True`` when it wrote, ``None`` when the fence did not pass (nothing
        written: :meth:`write_turn` then names the refusal). ``None`` on other stores.
        """
        if not self._db.dialect.writes_in_with:
            return None
        sql, parameters = _turns.alone(identity, fencing_token, turn, self._stamp())
        return Statement(sql, parameters, lambda rows: True if rows and rows[0][0] else None)

    def end_turn(self, *, identity: str, fencing_token: int, ended: TurnEnd) -> None:
        """End a durable turn without a commit of State (fenced): a failed or interrupted turn. Drops its journal."""
        self._db.write(
            lambda tx: _turns.end_fenced(tx, identity=identity, fencing_token=fencing_token, ended=ended,
                                         now=self._now(tx))
        )

    def turn(self, *, identity: str, turn_id: str) -> TurnRecord | None:
        """A turn's row and journal, or ``None`` if it never journaled anything (or was purged)."""
        return self._db.read(lambda tx: _turns.record(tx, identity, turn_id))

    def turns(
        self, *, identity: str | None = None, statuses: Sequence[str] = _turns.IN_PROGRESS, limit: int = 1000,
    ) -> list[TurnRecord]:
        """Turns with one of ``statuses`` (default: in progress), newest first; journals left out (``steps`` counts)."""
        if limit <= 0:
            raise InvalidSpecError(f"limit must be positive, got {limit!r}", field="limit")
        return self._db.read(lambda tx: _turns.listing(tx, identity=identity, statuses=tuple(statuses), limit=limit))

    def claim_wakes(self, *, limit: int = 500, claim_for: float = 30.0) -> list[TurnWake]:
        """Suspended turns whose wake time has come, oldest first, claimed for ``claim_for`` seconds.

        A claim is no lock: a claimed turn not resumed (its row not written again) within
        ``claim_for`` is claimable again.
        """
        return self._db.write(
            lambda tx: _turns.claim_wakes(tx, now=self._now(tx), limit=limit, claim_for=claim_for)
        )

    def wake_turns(self, *, identity: str, waiting_for: str) -> list[str]:
        """Make the suspended turns of ``identity`` waiting for ``waiting_for`` due now; returns their ids."""
        def run(tx: Transaction) -> list[str]:
            woken = _turns.waiting_for(tx, identity=identity, waiting_for=waiting_for)
            now = self._now(tx)
            return [turn_id for turn_id in woken if _turns.wake(tx, identity=identity, turn_id=turn_id, now=now)]
        return self._db.write(run)

    def send_signal(self, *, identity: str, name: str, signal_id: str, value: bytes) -> list[TurnWake]:
        """Record signal ``name`` for ``identity`` once per ``signal_id``; make the turns waiting for it due now.

        Returns the woken turns (their envelopes, for an immediate redelivery).

        Raises:
            UnknownIdentityError: no identity has that name.
        """
        def run(tx: Transaction) -> list[TurnWake]:
            known = _views.lookup(tx, identity)
            now = self._now(tx)  # on PostgreSQL, read in the round trip of the lookup
            if known.fetchone() is None:
                raise UnknownIdentityError(identity=identity)
            return _signals.send(tx, identity=identity, name=name, signal_id=signal_id, value=value, now=now)
        return self._db.write(run)

    def wait_signal(self, *, identity: str, fencing_token: int, name: str, turn: TurnWrite) -> bytes | None:
        """Take the oldest pending signal ``name`` as the outcome of ``turn``'s one entry (fenced), or suspend.

        With a signal pending, the entry is journaled completed with its value (returned)
        and the signal is taken by this turn; without, ``turn`` is written as given (the
        suspension, or the entry completed by its timeout) and ``None`` returned. An entry
        a signal completed already returns that signal's value.
        """
        return self._db.write(lambda tx: _signals.wait(
            tx, identity=identity, fencing_token=fencing_token, name=name, turn=turn, now=self._now(tx)))

    def pending_signals(self, *, identity: str) -> list[tuple[str, str, float]]:
        """Signals of ``identity`` no turn has taken: ``(name, signal id, sent at)``, oldest first."""
        return self._db.read(lambda tx: _signals.pending(tx, identity=identity))

    def request_approval(
        self, *, identity: str, fencing_token: int, request: ApprovalRequest, turn: TurnWrite,
    ) -> ApprovalRow:
        """Keep a turn's approval request (once per id, fenced) and, while it is pending, suspend the turn.

        Returns the approval as it is: pending (the turn is now suspended on it) or
        already decided (nothing else written: the turn journals the decision).
        """
        return self._db.write(lambda tx: _approvals.request(
            tx, identity=identity, fencing_token=fencing_token, asked=request, turn=turn, now=self._now(tx)))

    def resolve_approval(
        self, *, approval_id: str, approved: bool, by: str, comment: str = "", data: bytes | None = None,
        expect_version: int | None = None,
    ) -> ApprovalResolved:
        """Decide a pending approval once (compare-and-set; not fenced) and make its turn due now.

        Raises:
            UnknownApprovalError: no approval has that id.
            ApprovalConflictError: decided already (naming who decided), or not at ``expect_version``.
            InvalidSpecError: ``by`` is not among its approvers.
        """
        return self._db.write(lambda tx: _approvals.resolve(
            tx, approval_id=approval_id, approved=approved, by=by, comment=comment, data=data,
            expect_version=expect_version, now=self._now(tx)))

    def approval(self, *, approval_id: str) -> ApprovalRow | None:
        """One approval, or ``None``."""
        return self._db.read(lambda tx: _approvals.get(tx, approval_id))

    def approvals(
        self, *, status: str | None = "PENDING", identity: str | None = None, limit: int = 1000,
        run_id: str | None = None,
    ) -> list[ApprovalRow]:
        """Approvals with ``status`` (``None``: any) of identities matching the glob ``identity``, asked in
        workflow run ``run_id`` (``None``: any), oldest first."""
        if limit <= 0:
            raise InvalidSpecError(f"limit must be positive, got {limit!r}", field="limit")
        return self._db.read(lambda tx: _approvals.listing(tx, status=status, identity=identity, limit=limit,
                                                           run_id=run_id))

    def set_timer(self, *, identity: str, fencing_token: int, timer: TimerSpec) -> None:
        """Register a reminder or schedule (fenced), replacing one of the same name."""
        self._db.write(lambda tx: _timers.set_timer(tx, identity=identity, fencing_token=fencing_token, timer=timer,
                                                    now=self._now(tx)))

    def forget_timer(self, *, identity: str, name: str, fencing_token: int | None = None) -> bool:
        """Remove a timer (fenced when a token is given: an agent's own; not, an operator's); whether there was one."""
        return self._db.write(lambda tx: _timers.forget(tx, identity=identity, name=name,
                                                        fencing_token=fencing_token))

    def claim_timers(self, *, limit: int = 500, claim_for: float = 30.0, holder: str | None = None,
                     holder_first: float = 0.0) -> list[TimerRow]:
        """Timers due now, soonest first, claimed for ``claim_for`` seconds (a claim is no lock: it lapses).

        With ``holder``, timers of identities another holder's live lease covers are left
        to it for ``holder_first`` seconds past due (see :func:`_timers.claim`).
        """
        return self._db.write(lambda tx: _timers.claim(tx, now=self._now(tx), limit=limit, claim_for=claim_for,
                                                       holder=holder, holder_first=holder_first))

    def settle_timers(self, *, fired: list[TimerFired]) -> list[bool]:
        """Move fired timers to their next times (one-offs are removed), in one transaction.

        Answers, per firing, whether its timer was still at the fired time (a settlement
        for a time the timer moved past, a re-registration or a duplicate, changes nothing).
        """
        return self._db.write(lambda tx: _timers.settle(tx, fired=fired, now=self._now(tx)))

    def release_timer(self, *, identity: str, name: str, scheduled: float, next_due: float) -> bool:
        """Move a timer whose firings may overlap to its next time while this firing runs (claimable again)."""
        return self._db.write(lambda tx: _timers.release(tx, identity=identity, name=name, scheduled=scheduled,
                                                         next_due=next_due))

    def fire_timer_now(self, *, identity: str, name: str) -> bool:
        """Make a timer due now; whether there is one."""
        return self._db.write(lambda tx: _timers.due_now(tx, identity=identity, name=name, now=self._now(tx)))

    def timers(self, *, identity: str | None = None, due_before: float | None = None,
               limit: int = 1000) -> list[TimerRow]:
        """Timers of ``identity`` (or all) due before ``due_before`` (or any time), soonest first."""
        if limit <= 0:
            raise InvalidSpecError(f"limit must be positive, got {limit!r}", field="limit")
        return self._db.read(lambda tx: _timers.listing(tx, identity=identity, due_before=due_before, limit=limit))

    def purge_turns(self, *, ended_before: float, limit: int = 10_000) -> int:
        """Forget at most ``limit`` ended turns last changed before ``ended_before``; returns how many."""
        return self._db.write(lambda tx: _turns.purge(tx, ended_before=ended_before, limit=limit))

    # -- turn streams

    def append_turn_events(self, *, events: Sequence[TurnEventRow]) -> list[str]:
        """Persist stream events of any identities in one transaction; returns the identities refused.

        An event is written only if its ``epoch`` is its identity's current fencing token
        (a zombie cannot append); the refused identities' events are not written, the
        others' are. Writing an event that is already there changes nothing.
        """
        if not events:
            return []
        return self._db.write(lambda tx: _turn_events.append(tx, events))

    def turn_events(self, *, identity: str, turn_id: str, after_epoch: int = 0, after_seq: int = 0,
                    limit: int = 1000) -> list[TurnEventRow]:
        """The persisted events of a turn after ``(after_epoch, after_seq)``, oldest first, at most ``limit``."""
        if limit <= 0:
            raise InvalidSpecError(f"limit must be positive, got {limit!r}", field="limit")
        return self._db.read(lambda tx: _turn_events.after(tx, identity=identity, turn_id=turn_id, epoch=after_epoch,
                                                           seq=after_seq, limit=limit))

    def last_turn_event(self, *, identity: str, turn_id: str) -> TurnEventRow | None:
        """The latest persisted event of a turn, or ``None``."""
        return self._db.read(lambda tx: _turn_events.last(tx, identity=identity, turn_id=turn_id))

    def turn_event_owner(self, *, identity: str, epoch: int, seq: int) -> str | None:
        """The turn whose persisted event is ``epoch.seq``, or ``None`` if none is kept."""
        return self._db.read(lambda tx: _turn_events.owner_of(tx, identity=identity, epoch=epoch, seq=seq))

    def purge_turn_events(self, *, ended_before: float, limit: int = 1000) -> int:
        """Forget the streams of at most ``limit`` turns that ended before ``ended_before``; returns how many."""
        return self._db.write(lambda tx: _turn_events.purge(tx, ended_before=ended_before, limit=limit))

    def purge_abandoned_turn_events(self, *, idle_before: float, after: float = 0.0,
                                    limit: int = 1000) -> AbandonedSweep:
        """Forget streams that never ended, idle since ``idle_before``, whose turns are not in progress.

        At most ``limit`` candidates (by start time, after ``after``) are looked at; pass
        the answer's ``next_after`` to the next call.
        """
        if limit <= 0:
            raise InvalidSpecError(f"limit must be positive, got {limit!r}", field="limit")
        return self._db.write(lambda tx: _turn_events.purge_abandoned(tx, idle_before=idle_before, after=after,
                                                                      limit=limit))

    def add_dead_letter(
        self, *, identity: str, message_id: str, envelope: bytes, reason: str, error: str, attempts: int
    ) -> int:
        """Record a message that could not be handled, with why; returns its letter id (not fenced)."""
        return self._db.write(
            lambda tx: _mailbox.add_dead_letter(
                tx,
                identity=identity,
                message_id=message_id,
                envelope=envelope,
                reason=reason,
                error=error,
                attempts=attempts,
                now=self._now(tx),
            )
        )

    def hold_tell(self, *, identity: str, message_id: str, envelope: bytes) -> int:
        """Hold a tell durably until :meth:`settle_tell` (not fenced); the same message twice is a no-op.

        Returns its sequence number.
        """
        return self._db.write(
            lambda tx: _mailbox.hold_tell(tx, identity=identity, message_id=message_id, envelope=envelope,
                                          now=self._now(tx))
        )

    def claim_tells(self, *, min_age: float, limit: int = 100) -> list[StoredMessage]:
        """Held tells not attempted for ``min_age`` seconds, oldest first, claimed for another ``min_age``.

        A claim is no lock: a claimed tell not settled within ``min_age`` is claimable again.
        """
        return self._db.write(
            lambda tx: _mailbox.claim_tells(tx, attempted_before=self._now(tx) - min_age, limit=limit,
                                            now=self._now(tx))
        )

    def settle_tell(self, *, identity: str, message_id: str, reason: str | None = None, error: str = "") -> bool:
        """Forget a handled tell; with ``reason``, record its dead letter first unless one exists.

        Both happen in one transaction. Returns whether the tell was still held.
        """
        return self._db.write(
            lambda tx: _mailbox.settle_tell(tx, identity=identity, message_id=message_id, reason=reason, error=error,
                                            now=self._now(tx))
        )

    def dead_letters(self, *, identity: str | None = None, limit: int = 1000) -> list[StoredMessage]:
        """Dead letters, oldest first, optionally of one identity."""
        return self._db.read(lambda tx: _mailbox.dead_letters(tx, identity=identity, limit=limit))

    def dead_letter(self, letter_id: int) -> StoredMessage | None:
        """One dead letter by id, or ``None``."""
        return self._db.read(lambda tx: _mailbox.dead_letter(tx, letter_id))

    def purge_dead_letters(
        self, *, identity: str | None = None, ids: Sequence[int] | None = None, before: float | None = None
    ) -> int:
        """Delete dead letters matching every given filter (all of them when none is given)."""
        return self._db.write(lambda tx: _mailbox.purge_dead_letters(tx, identity=identity, ids=ids, before=before))

    # -- hosts --------------------------------------------------------------------------

    def register_host(
        self, *, name: str, holder: str, node: str | None = None, pid: int | None = None, process: str | None = None,
    ) -> list[str]:
        """Record a host incarnation, with where its process runs when given (see ``HostInfo``); leases of an
        earlier incarnation of the same name are freed."""
        return self._db.write(lambda tx: _hosts.register(tx, name=name, holder=holder, now=self._now(tx), node=node,
                                                         pid=pid, process=process))

    def remove_host(self, *, name: str, holder: str | None = None) -> list[str]:
        """Forget a host (dead or scaled in) and free its leases; with ``holder``, only that incarnation."""
        return self._db.write(lambda tx: _hosts.remove(tx, name=name, holder=holder))

    def set_host_draining(self, *, name: str, draining: bool) -> None:
        self._db.write(lambda tx: _hosts.set_draining(tx, name=name, draining=draining))

    def hosts(self) -> list[HostInfo]:
        """Registered hosts, by name."""
        return self._db.read(lambda tx: _hosts.hosts(tx))
