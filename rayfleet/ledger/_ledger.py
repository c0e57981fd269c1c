"""``Ledger``: the one authority for leases, fencing tokens, continuity records, runs and durable queues.

Every public method is one transaction on the store; the rules live in the table-group
modules beside this one (``_leases`` holds the fencing rules) and are written once for
every store. Callers never reach a ``Ledger`` directly across processes: they use a
:class:`~rayfleet.ledger._contract.LedgerClient` (the Ray actor in ``rayfleet.platform``,
or :class:`~rayfleet.ledger._local.LocalLedgerClient` in one process).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from ..errors import InvalidSpecError, RayfleetError
from ..identity._values import (
    ContinuityRecord,
    LeaseDenied,
    LeaseGrant,
    SnapshotPointer,
)
from . import (
    _checkpoints,
    _edges,
    _hosts,
    _identities,
    _leases,
    _mailbox,
    _runs,
    _views,
)
from ._sqlite import SqliteDatabase
from ._store import Database
from ._values import (
    DEFAULT_LEASE_TTL,
    Activation,
    CheckpointCommit,
    HostInfo,
    IdentityView,
    JournalRecord,
    RegisterOutcome,
    RunLease,
    RunRecord,
    SpecRecord,
    StoredMessage,
    TopologyChange,
    TopologySnapshot,
)


class Ledger:
    """Leases, fencing and continuity over one database.

    Args:
        database: a store, or a path to a SQLite file (created if missing).
        clock: wall-clock seconds; lease expiry and lock-delay are measured with it.

    Thread-safe as far as its store is (the SQLite store is). Opening applies
    lock-delay: leases found live are not granted to another holder for one TTL.
    """

    def __init__(self, database: Database | str | Path, *, clock: Callable[[], float] = time.time) -> None:
        self._db: Database = SqliteDatabase(database) if isinstance(database, (str, Path)) else database
        self._clock = clock
        self.incarnation = uuid.uuid4().hex[:8]
        """Changes every time a ledger opens, so clients can tell a restart."""
        with self._db.transaction() as tx:
            _leases.apply_lock_delay(tx, self._clock())
            _runs.apply_lock_delay(tx, self._clock())

    def close(self) -> None:
        self._db.close()

    # -- identities -------------------------------------------------------------------

    def register(self, record: SpecRecord) -> RegisterOutcome:
        """Record a spawned identity; idempotent for an identical spec.

        Raises:
            InvalidSpecError: if the identity exists with a different spec.
        """
        with self._db.transaction() as tx:
            return _identities.register(tx, record, self._clock())

    def apply_specs(self, *, creates: Sequence[SpecRecord], updates: Sequence[SpecRecord]) -> None:
        """Create and update many identities in one transaction (a roster applies whole or not at all).

        Raises:
            InvalidSpecError: a created identity exists already.
            UnknownIdentityError: an updated identity does not exist.
        """
        with self._db.transaction() as tx:
            _identities.apply_specs(tx, creates, updates, self._clock())

    def resolve(self, identities: Iterable[str]) -> dict[str, IdentityView]:
        """Views of the given identities; unknown ones are absent from the result."""
        now = self._clock()
        with self._db.read() as tx:
            return {identity: view for identity in identities if (view := _views.view(tx, identity, now)) is not None}

    def list_identities(self, *, labels: Mapping[str, str] | None = None) -> list[IdentityView]:
        """All identities, sorted, optionally only those whose labels include ``labels``."""
        with self._db.read() as tx:
            return _identities.list_views(tx, labels, self._clock())

    def set_lifecycle(self, *, identity: str, fencing_token: int, lifecycle: str, reason: str = "") -> None:
        """Persist retired / broken / live for an identity, fenced."""
        if lifecycle not in _identities.LIFECYCLE_MARKERS:
            raise InvalidSpecError(f"unknown lifecycle marker {lifecycle!r}", field="lifecycle")
        with self._db.transaction() as tx:
            _identities.set_lifecycle(tx, identity=identity, fencing_token=fencing_token, lifecycle=lifecycle,
                                      reason=reason)

    def reset(self, *, identity: str, fencing_token: int) -> ContinuityRecord:
        """Start a new generation: new runtime id and session, version 0, no snapshot, no remembered keys."""
        with self._db.transaction() as tx:
            return _identities.reset(tx, identity=identity, fencing_token=fencing_token)

    def delete(self, *, identity: str, fencing_token: int) -> SnapshotPointer | None:
        """Remove an identity, its continuity record, lease, keys, edges and pause; return its last snapshot.

        Parked messages become dead letters (reason ``DELETED``). The fence high-water
        mark is kept forever, so a token issued before the delete can never write to
        an identity re-created under the same name.
        """
        with self._db.transaction() as tx:
            return _identities.delete(tx, identity=identity, fencing_token=fencing_token, now=self._clock())

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
        with self._db.transaction() as tx:
            return _leases.acquire(tx, holder=holder, identities=identities, ttl=ttl,
                                   create_continuity=create_continuity, now=self._clock())

    def renew(self, *, holder: str, tokens: Mapping[str, int]) -> dict[str, LeaseGrant | None]:
        """Extend many leases by their TTL in one commit; ``None`` means the lease is lost.

        A lease is renewed only if ``holder`` still holds it with the same token (an
        expired lease that nobody else took is renewed too: fencing, not the clock,
        decides who may write).
        """
        with self._db.transaction() as tx:
            return _leases.renew(tx, holder=holder, tokens=tokens, now=self._clock())

    def release(self, *, holder: str, tokens: Mapping[str, int]) -> int:
        """Give up leases (only those still held with the given token); returns how many."""
        with self._db.transaction() as tx:
            return _leases.release(tx, holder=holder, tokens=tokens)

    def revoke_holder(self, holder: str) -> list[str]:
        """Drop every lease of a holder known to be dead; returns the freed identities.

        Safe without waiting for the TTL because fencing, not timing, protects state:
        should the holder still be alive, its next write presents a superseded token.
        """
        with self._db.transaction() as tx:
            return _leases.free_holder(tx, holder)

    def check_fence(self, identity: str, token: int) -> None:
        """Raise unless ``token`` is the identity's current high-water mark."""
        with self._db.read() as tx:
            _leases.check_fence(tx, identity, token)

    def high_water(self, identity: str) -> int:
        """The highest token ever issued for ``identity`` (0 if none)."""
        with self._db.read() as tx:
            return _leases.high_water(tx, identity)

    # -- checkpoints --------------------------------------------------------------------

    def commit_checkpoints(self, commits: Iterable[CheckpointCommit]) -> list[RayfleetError | None]:
        """Move many snapshot pointers in one transaction; each is checked on its own.

        Returns one entry per commit, ``None`` when accepted, else the refusal
        (``StaleFencingTokenError``, ``StaleCheckpointVersionError``, ...). Refused
        entries change nothing; accepted ones are durable when this returns.
        """
        with self._db.transaction() as tx:
            return _checkpoints.commit(tx, commits)

    def dedup_window(self, identity: str) -> list[tuple[str, bytes]]:
        """The remembered idempotency keys of an identity, oldest first, with their replies."""
        with self._db.read() as tx:
            return _views.dedup_rows(tx, identity)

    def referenced_snapshot_files(self) -> set[str]:
        """Every file some continuity record points at (the GC keeps these)."""
        with self._db.read() as tx:
            return _checkpoints.referenced_files(tx)

    # -- topology -----------------------------------------------------------------------

    def wired_peers(self, identities: Iterable[str]) -> dict[str, tuple[str, ...]]:
        """The live peers of each identity."""
        with self._db.read() as tx:
            return _edges.wired_peers(tx, identities)

    def set_desired_edge(self, *, a: str, b: str, desired: bool) -> None:
        """Add or remove an explicit desired edge (``a < b``, canonical); both identities must exist."""
        with self._db.transaction() as tx:
            _edges.set_desired(tx, a=a, b=b, desired=desired)

    def topology(self) -> TopologySnapshot:
        """Everything reconciliation needs, read in one consistent view."""
        with self._db.read() as tx:
            return _edges.snapshot(tx)

    def apply_topology(self, change: TopologyChange) -> None:
        """Change live edges in one transaction."""
        with self._db.transaction() as tx:
            _edges.apply(tx, change)

    # -- workflow runs and their journal ------------------------------------------------

    def create_run(
        self, *, run_id: str, workflow: str, code_version: str, definition: bytes | None, force: bool = False
    ) -> str:
        """Register a run, or find it again to resume it; returns its status.

        Raises:
            InvalidSpecError: the run already ended, or exists under a different code
                version (pass ``force=True`` to resume it anyway, e.g. after a compatible fix).
        """
        with self._db.transaction() as tx:
            return _runs.create(tx, run_id=run_id, workflow=workflow, code_version=code_version,
                                definition=definition, force=force, now=self._clock())

    def run(self, run_id: str) -> RunRecord | None:
        """The registry record of a run, or ``None`` for an unknown run."""
        with self._db.read() as tx:
            return _runs.get(tx, run_id)

    def list_runs(self, *, statuses: Sequence[str] | None = None) -> list[RunRecord]:
        """Runs in creation order, optionally only those in ``statuses``."""
        with self._db.read() as tx:
            return _runs.list_runs(tx, statuses)

    def run_definition(self, run_id: str) -> bytes | None:
        """The pickled workflow of a submitted run, or ``None``."""
        with self._db.read() as tx:
            return _runs.definition(tx, run_id)

    def set_run_status(
        self, *, run_id: str, fencing_token: int, status: str, detail: str | None = "", outcome: bytes | None = None
    ) -> None:
        """Record a run's status (fenced by the run's token); ``detail=None`` keeps the detail already recorded.

        Raises:
            StaleRunTokenError: ``fencing_token`` is not the run's current token.
        """
        with self._db.transaction() as tx:
            _runs.set_status(tx, run_id=run_id, fencing_token=fencing_token, status=status, detail=detail,
                             outcome=outcome, now=self._clock())

    def request_run(self, *, run_id: str, cancel: bool | None = None, pause: bool | None = None) -> bool:
        """Ask a run to cancel or to pause/resume dispatching; returns False for an unknown run."""
        with self._db.transaction() as tx:
            return _runs.request(tx, run_id=run_id, cancel=cancel, pause=pause)

    def journal(self, run_id: str) -> JournalRecord:
        """A run's journaled step outputs (in completion order) and its successful compensations."""
        with self._db.read() as tx:
            return _runs.journal(tx, run_id)

    def journal_step(self, *, run_id: str, fencing_token: int, label: str, output: bytes, tokens: int) -> None:
        """Journal one step's output (fenced); a step is journaled once (a repeat keeps the first).

        Raises:
            StaleRunTokenError: ``fencing_token`` is not the run's current token; nothing is written.
        """
        with self._db.transaction() as tx:
            _runs.journal_step(tx, run_id=run_id, fencing_token=fencing_token, label=label, output=output,
                               tokens=tokens)

    def journal_compensation(self, *, run_id: str, fencing_token: int, label: str, ok: bool, error: str) -> None:
        """Record that a step's compensation ran, and whether it succeeded (fenced).

        Raises:
            StaleRunTokenError: ``fencing_token`` is not the run's current token; nothing is written.
        """
        with self._db.transaction() as tx:
            _runs.journal_compensation(tx, run_id=run_id, fencing_token=fencing_token, label=label, ok=ok,
                                       error=error)

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
        if ttl <= 0:
            raise InvalidSpecError(f"run lease ttl must be positive, got {ttl!r}", field="ttl")
        with self._db.transaction() as tx:
            return _runs.acquire_lease(tx, run_id=run_id, holder=holder, ttl=ttl, takeover_from=takeover_from,
                                       now=self._clock())

    def renew_run_lease(self, *, run_id: str, holder: str, token: int) -> RunLease:
        """Extend the run lease by its TTL if ``holder`` still holds it under ``token``.

        Raises:
            StaleRunTokenError: the token was superseded, or the lease was released.
        """
        with self._db.transaction() as tx:
            return _runs.renew_lease(tx, run_id=run_id, holder=holder, token=token, now=self._clock())

    def release_run_lease(self, *, run_id: str, holder: str, token: int) -> bool:
        """Give up the run lease if ``holder`` still holds it under ``token``; the token stays the high-water."""
        with self._db.transaction() as tx:
            return _runs.release_lease(tx, run_id=run_id, holder=holder, token=token)

    def acquire_step_lease(
        self, *, run_id: str, label: str, holder: str, fencing_token: int, ttl: float
    ) -> int:
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
        with self._db.transaction() as tx:
            return _runs.acquire_step_lease(tx, run_id=run_id, label=label, holder=holder,
                                            fencing_token=fencing_token, ttl=ttl, now=self._clock())

    def release_step_lease(self, *, run_id: str, label: str, holder: str, token: int) -> bool:
        """Give up a step lease if ``holder`` still holds it under ``token``."""
        with self._db.transaction() as tx:
            return _runs.release_step_lease(tx, run_id=run_id, label=label, holder=holder, token=token)

    # -- pause, parking and dead letters ------------------------------------------------

    def set_paused(self, *, identity: str, fencing_token: int, paused: bool) -> None:
        """Persist the pause flag of an identity (fenced); it survives host failover."""
        with self._db.transaction() as tx:
            _mailbox.set_paused(tx, identity=identity, fencing_token=fencing_token, paused=paused, now=self._clock())

    def is_paused(self, identity: str) -> bool:
        with self._db.read() as tx:
            return _mailbox.is_paused(tx, identity)

    def park(self, *, identity: str, fencing_token: int, message_id: str, envelope: bytes) -> int:
        """Hold a message durably, in arrival order (fenced); parking the same message twice is a no-op.

        Returns the parked message's sequence number.
        """
        with self._db.transaction() as tx:
            return _mailbox.park(tx, identity=identity, fencing_token=fencing_token, message_id=message_id,
                                 envelope=envelope, now=self._clock())

    def parked(self, identity: str, *, limit: int = 1000) -> list[StoredMessage]:
        """Parked messages of an identity, oldest first."""
        with self._db.read() as tx:
            return _mailbox.parked(tx, identity, limit)

    def unpark(self, *, identity: str, fencing_token: int, seq: int) -> None:
        """Forget a parked message once its replay has been handled (fenced)."""
        with self._db.transaction() as tx:
            _mailbox.unpark(tx, identity=identity, fencing_token=fencing_token, seq=seq)

    def cancel_parked(self, *, identity: str, fencing_token: int) -> int:
        """Move every parked message of an identity to the dead letters (reason ``CANCELLED``); fenced."""
        with self._db.transaction() as tx:
            return _mailbox.cancel_parked(tx, identity=identity, fencing_token=fencing_token, now=self._clock())

    def add_dead_letter(
        self, *, identity: str, message_id: str, envelope: bytes, reason: str, error: str, attempts: int
    ) -> int:
        """Record a message that could not be handled, with why; returns its letter id (not fenced)."""
        with self._db.transaction() as tx:
            return _mailbox.add_dead_letter(tx, identity=identity, message_id=message_id, envelope=envelope,
                                            reason=reason, error=error, attempts=attempts, now=self._clock())

    def dead_letters(self, *, identity: str | None = None, limit: int = 1000) -> list[StoredMessage]:
        """Dead letters, oldest first, optionally of one identity."""
        with self._db.read() as tx:
            return _mailbox.dead_letters(tx, identity=identity, limit=limit)

    def dead_letter(self, letter_id: int) -> StoredMessage | None:
        """One dead letter by id, or ``None``."""
        with self._db.read() as tx:
            return _mailbox.dead_letter(tx, letter_id)

    def purge_dead_letters(
        self, *, identity: str | None = None, ids: Sequence[int] | None = None, before: float | None = None
    ) -> int:
        """Delete dead letters matching every given filter (all of them when none is given)."""
        with self._db.transaction() as tx:
            return _mailbox.purge_dead_letters(tx, identity=identity, ids=ids, before=before)

    # -- hosts --------------------------------------------------------------------------

    def register_host(self, *, name: str, holder: str) -> list[str]:
        """Record a host incarnation; leases of an earlier incarnation of the same name are freed."""
        with self._db.transaction() as tx:
            return _hosts.register(tx, name=name, holder=holder, now=self._clock())

    def remove_host(self, *, name: str, holder: str | None = None) -> list[str]:
        """Forget a host (dead or scaled in) and free its leases; with ``holder``, only that incarnation."""
        with self._db.transaction() as tx:
            return _hosts.remove(tx, name=name, holder=holder)

    def set_host_draining(self, *, name: str, draining: bool) -> None:
        with self._db.transaction() as tx:
            _hosts.set_draining(tx, name=name, draining=draining)

    def hosts(self) -> list[HostInfo]:
        """Registered hosts, by name."""
        with self._db.read() as tx:
            return _hosts.hosts(tx)
