"""The typed contract of the ledger: every operation, once, with typed arguments and frozen replies.

Callers (hosts, the driver, the runner) hold a :class:`LedgerClient` and never a
database. Each operation returns a :class:`LedgerCall`: ``await`` it from async code,
or call ``.result()`` from blocking code; both give the reply or raise the ledger's
refusal (a :class:`~rayfleet.errors.RayfleetError` such as ``StaleFencingTokenError``)
as the ledger raised it. Each operation is one transaction; the rules behind each are
documented on :class:`~rayfleet.ledger._ledger.Ledger`.

Transports: ``rayfleet.platform`` sends each operation to the ledger actor over Ray;
:class:`~rayfleet.ledger._local.LocalLedgerClient` runs it in this process.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from ..errors import RayfleetError
from ..identity._values import (
    ContinuityRecord,
    LeaseDenied,
    SnapshotPointer,
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

T_co = TypeVar("T_co", covariant=True)


class LedgerCall(Protocol[T_co]):
    """One ledger operation in flight: awaitable, or waited for with :meth:`result`."""

    def __await__(self) -> Generator[Any, None, T_co]: ...

    def result(self, timeout: float | None = None) -> T_co:
        """Block until the reply arrives (at most ``timeout`` seconds) and return it, or raise the refusal."""
        ...


class LedgerClient(Protocol):
    """Every ledger operation. Fenced writes present ``(identity, fencing_token)`` and are refused when stale."""

    route: str
    """How calls reach the ledger: ``"direct"`` (this process's own connection to the database) or
    ``"ledger actor"`` (a Ray call to the actor that serves a SQLite file on another node)."""

    # -- the ledger itself
    def incarnation(self) -> LedgerCall[str]:
        """An id that changes every time the ledger restarts."""
        ...

    def fleet_identity(self, claim: str | None = None) -> LedgerCall[str | None]:
        """The fleet id this ledger records; with ``claim``, record it first if none is recorded."""
        ...

    # -- identities
    def register(self, record: SpecRecord) -> LedgerCall[RegisterOutcome]:
        """Record a spawned identity; idempotent for an identical spec (``InvalidSpecError`` for a different one)."""
        ...

    def register_many(self, records: Sequence[SpecRecord]) -> LedgerCall[list[RegisterOutcome]]:
        """Register many identities in one transaction, all or nothing; one outcome per record."""
        ...

    def apply_specs(self, *, creates: Sequence[SpecRecord], updates: Sequence[SpecRecord]) -> LedgerCall[None]:
        """Create and update many identities, all or nothing."""
        ...

    def resolve(self, identities: Iterable[str]) -> LedgerCall[dict[str, IdentityView]]:
        """Views of the given identities; unknown ones are absent."""
        ...

    def list_identities(self, *, labels: Mapping[str, str] | None = None) -> LedgerCall[list[IdentityView]]:
        """All identities, sorted, optionally only those whose labels include ``labels``."""
        ...

    def select_identities(self, *, labels: Mapping[str, str]) -> LedgerCall[list[str]]:
        """Names of the live identities whose labels include ``labels``, sorted (no views: one read)."""
        ...

    def leases(self, identities: Iterable[str]) -> LedgerCall[dict[str, LeaseView | None]]:
        """The live lease of each identity now (``None``: none, or lapsed); unknown identities are absent."""
        ...

    def set_lifecycle(
        self, *, identity: str, fencing_token: int, lifecycle: str, reason: str = ""
    ) -> LedgerCall[None]:
        """Persist retired / broken / live (fenced)."""
        ...

    def reset(self, *, identity: str, fencing_token: int) -> LedgerCall[ContinuityRecord]:
        """Start a new generation with a fresh State (fenced)."""
        ...

    def delete(self, *, identity: str, fencing_token: int) -> LedgerCall[SnapshotPointer | None]:
        """Remove the identity; its token high-water mark is kept forever (fenced)."""
        ...

    # -- leases and fencing
    def acquire(
        self, *, holder: str, identities: Iterable[str], ttl: float = DEFAULT_LEASE_TTL, create_continuity: bool = True
    ) -> LedgerCall[dict[str, Activation | LeaseDenied | RayfleetError]]:
        """Grant leases under strictly larger tokens, persisted before the reply."""
        ...

    def renew(self, *, holder: str, tokens: Mapping[str, int]) -> LedgerCall[frozenset[str]]:
        """Extend leases still held with the same token by their TTL; returns the presented identities lost."""
        ...

    def renew_holder(self, *, holder: str, ttl: float) -> LedgerCall[bool]:
        """Extend every lease of a live holder in one write; ``False`` (nothing changed) once it lapsed."""
        ...

    def arm_holder(self, *, holder: str, ttl: float) -> LedgerCall[int]:
        """Make a holder live after renewing its leases one by one; drops (and counts) its lapsed leases."""
        ...

    def release(self, *, holder: str, tokens: Mapping[str, int]) -> LedgerCall[int]:
        """Give up leases still held with the given tokens; returns how many."""
        ...

    def revoke_holder(self, holder: str) -> LedgerCall[list[str]]:
        """Drop every lease of a holder known to be dead; returns the freed identities."""
        ...

    def check_fence(self, identity: str, token: int) -> LedgerCall[None]:
        """Raise unless ``token`` is the identity's current high-water mark."""
        ...

    def high_water(self, identity: str) -> LedgerCall[int]:
        """The highest token ever issued for ``identity`` (0 if none)."""
        ...

    # -- checkpoints
    def commit_checkpoints(self, commits: Sequence[CheckpointCommit]) -> LedgerCall[list[CommitOutcome]]:
        """Move snapshot pointers (fenced, versions strictly increasing); one refusal or ``None`` per commit."""
        ...

    def latest_checkpoints(
        self, *, after: str = "", limit: int = 1000, agent_class: str | None = None
    ) -> LedgerCall[list[CheckpointRow]]:
        """A page of identities named after ``after`` (sorted, at most ``limit``), each with its latest checkpoint."""
        ...

    def dedup_window(self, identity: str) -> LedgerCall[list[tuple[str, bytes]]]:
        """The remembered idempotency keys of an identity with their replies, oldest first."""
        ...

    def referenced_snapshot_files(self) -> LedgerCall[set[str]]:
        """Every snapshot file a continuity record points at."""
        ...

    # -- topology
    def wired_peers(self, identities: Iterable[str]) -> LedgerCall[dict[str, tuple[str, ...]]]:
        """The live peers of each identity."""
        ...

    def set_desired_edge(self, *, a: str, b: str, desired: bool) -> LedgerCall[None]:
        """Add or remove an explicit desired edge (canonical ``a < b``)."""
        ...

    def topology(self) -> LedgerCall[TopologySnapshot]:
        """Everything reconciliation needs, in one consistent view."""
        ...

    def apply_topology(self, change: TopologyChange) -> LedgerCall[None]:
        """Change live edges in one transaction."""
        ...

    # -- workflow runs
    def create_run(
        self, *, run_id: str, workflow: str, code_version: str, definition: bytes | None, force: bool = False
    ) -> LedgerCall[str]:
        """Register a run or find it again to resume it; returns its status."""
        ...

    def run(self, run_id: str) -> LedgerCall[RunRecord | None]:
        """The registry record of a run, or ``None``."""
        ...

    def list_runs(self, *, statuses: Sequence[str] | None = None) -> LedgerCall[list[RunRecord]]:
        """Runs in creation order, optionally only those in ``statuses``."""
        ...

    def run_definition(self, run_id: str) -> LedgerCall[bytes | None]:
        """The pickled workflow of a submitted run."""
        ...

    def set_run_status(
        self, *, run_id: str, fencing_token: int, status: str, detail: str | None = "", outcome: bytes | None = None,
        release_holder: str | None = None,
    ) -> LedgerCall[RunRequests]:
        """Record a run's status under the run's token (``detail=None`` keeps the recorded detail; fenced).

        With ``release_holder``, also give up that holder's run lease under the token. Answers
        what is asked of the run (cancel, pause) as of the write."""
        ...

    def request_run(
        self, *, run_id: str, cancel: bool | None = None, pause: bool | None = None
    ) -> LedgerCall[bool]:
        """Ask a run to cancel, pause or resume; False for an unknown run."""
        ...

    def journal(self, run_id: str) -> LedgerCall[JournalRecord]:
        """A run's journaled steps and successful compensations."""
        ...

    def journal_step(
        self, *, run_id: str, fencing_token: int, label: str, output: bytes, tokens: int
    ) -> LedgerCall[RunRequests]:
        """Journal one step's output once (a repeat keeps the first; fenced by the run's token).

        Answers what is asked of the run (cancel, pause) as of the write."""
        ...

    def journal_compensation(
        self, *, run_id: str, fencing_token: int, label: str, ok: bool, error: str
    ) -> LedgerCall[None]:
        """Record a compensation and whether it succeeded (fenced by the run's token)."""
        ...

    def acquire_run_lease(
        self, *, run_id: str, holder: str, ttl: float = DEFAULT_LEASE_TTL, takeover_from: str | None = None
    ) -> LedgerCall[RunLease]:
        """Make ``holder`` the run's engine under a strictly larger token (``RunOwnedElsewhereError`` if held)."""
        ...

    def start_run(
        self, *, run_id: str, holder: str, ttl: float = DEFAULT_LEASE_TTL, takeover_from: str | None = None
    ) -> LedgerCall[RunStart]:
        """:meth:`acquire_run_lease` and the run's journal as of the grant, in one transaction."""
        ...

    def renew_run_lease(self, *, run_id: str, holder: str, token: int) -> LedgerCall[RunLease]:
        """Extend a run lease still held under ``token`` (``StaleRunTokenError`` once it is not)."""
        ...

    def release_run_lease(self, *, run_id: str, holder: str, token: int) -> LedgerCall[bool]:
        """Give up a run lease still held under ``token``; the token stays the run's high-water."""
        ...

    def acquire_step_lease(
        self, *, run_id: str, label: str, holder: str, fencing_token: int, ttl: float
    ) -> LedgerCall[int]:
        """Lease an exclusive step (fenced by the run's token); returns its strictly larger conversation fence."""
        ...

    def release_step_lease(self, *, run_id: str, label: str, holder: str, token: int) -> LedgerCall[bool]:
        """Give up a step lease still held under ``token``."""
        ...

    # -- pause, parking and dead letters
    def set_paused(self, *, identity: str, fencing_token: int, paused: bool) -> LedgerCall[None]:
        """Persist the pause flag (fenced)."""
        ...

    def is_paused(self, identity: str) -> LedgerCall[bool]:
        """Whether the identity is paused."""
        ...

    def park(self, *, identity: str, fencing_token: int, message_id: str, envelope: bytes) -> LedgerCall[int]:
        """Hold a message durably, in order (fenced); returns its sequence number."""
        ...

    def parked(self, identity: str, *, limit: int = 1000) -> LedgerCall[list[StoredMessage]]:
        """Parked messages of an identity, oldest first."""
        ...

    def unpark(self, *, identity: str, fencing_token: int, seq: int) -> LedgerCall[None]:
        """Forget a parked message once its replay was handled (fenced)."""
        ...

    def cancel_parked(self, *, identity: str, fencing_token: int) -> LedgerCall[int]:
        """Move parked messages to the dead letters (fenced); returns how many."""
        ...

    # -- durable turns
    def write_turn(self, *, identity: str, fencing_token: int, turn: TurnWrite) -> LedgerCall[None]:
        """Journal a durable turn (fenced); a completed entry is never changed by a later write."""
        ...

    def end_turn(self, *, identity: str, fencing_token: int, ended: TurnEnd) -> LedgerCall[None]:
        """End a durable turn without a commit of State (fenced); drops its journal."""
        ...

    def turn(self, *, identity: str, turn_id: str) -> LedgerCall[TurnRecord | None]:
        """A turn's row and journal, or ``None``."""
        ...

    def turns(
        self, *, identity: str | None = None, statuses: Sequence[str] = ("RUNNING", "SUSPENDED"), limit: int = 1000,
    ) -> LedgerCall[list[TurnRecord]]:
        """Turns with one of ``statuses``, newest first, without their journals."""
        ...

    def claim_wakes(self, *, limit: int = 500, claim_for: float = 30.0) -> LedgerCall[list[TurnWake]]:
        """Suspended turns due now, claimed for ``claim_for`` seconds."""
        ...

    def wake_turns(self, *, identity: str, waiting_for: str) -> LedgerCall[list[str]]:
        """Make the suspended turns waiting for ``waiting_for`` due now; returns their ids."""
        ...

    def send_signal(self, *, identity: str, name: str, signal_id: str, value: bytes) -> LedgerCall[list[TurnWake]]:
        """Record a signal once per id; make the turns waiting for it due now and return them (not fenced)."""
        ...

    def wait_signal(self, *, identity: str, fencing_token: int, name: str, turn: TurnWrite) -> LedgerCall[bytes | None]:
        """Take the oldest pending signal as the wait entry's outcome, or write ``turn`` (the suspension, or the
        timeout) fenced; an entry a signal completed already returns that signal."""
        ...

    def pending_signals(self, *, identity: str) -> LedgerCall[list[tuple[str, str, float]]]:
        """Signals no turn has taken yet: ``(name, signal id, sent at)``, oldest first."""
        ...

    def request_approval(
        self, *, identity: str, fencing_token: int, request: ApprovalRequest, turn: TurnWrite,
    ) -> LedgerCall[ApprovalRow]:
        """Keep a turn's approval request (fenced) and, while pending, write the turn's suspension."""
        ...

    def resolve_approval(
        self, *, approval_id: str, approved: bool, by: str, comment: str = "", data: bytes | None = None,
        expect_version: int | None = None,
    ) -> LedgerCall[ApprovalResolved]:
        """Decide a pending approval once (compare-and-set, not fenced); wake its turn."""
        ...

    def approval(self, *, approval_id: str) -> LedgerCall[ApprovalRow | None]:
        """One approval, or ``None``."""
        ...

    def approvals(
        self, *, status: str | None = "PENDING", identity: str | None = None, limit: int = 1000,
        run_id: str | None = None,
    ) -> LedgerCall[list[ApprovalRow]]:
        """Approvals by status, identity glob and workflow run, oldest first."""
        ...

    def set_timer(self, *, identity: str, fencing_token: int, timer: TimerSpec) -> LedgerCall[None]:
        """Register a reminder or schedule (fenced), replacing one of the same name."""
        ...

    def forget_timer(self, *, identity: str, name: str, fencing_token: int | None = None) -> LedgerCall[bool]:
        """Remove a timer (fenced when a token is given); whether there was one."""
        ...

    def claim_timers(self, *, limit: int = 500, claim_for: float = 30.0, holder: str | None = None,
                     holder_first: float = 0.0) -> LedgerCall[list[TimerRow]]:
        """Timers due now, claimed for ``claim_for`` seconds; another holder's first for ``holder_first`` s."""
        ...

    def settle_timers(self, *, fired: list[TimerFired]) -> LedgerCall[list[bool]]:
        """Move fired timers to their next times (one-offs are removed), in one transaction."""
        ...

    def release_timer(self, *, identity: str, name: str, scheduled: float, next_due: float) -> LedgerCall[bool]:
        """Move an overlapping timer to its next time while this firing runs."""
        ...

    def fire_timer_now(self, *, identity: str, name: str) -> LedgerCall[bool]:
        """Make a timer due now; whether there is one."""
        ...

    def timers(self, *, identity: str | None = None, due_before: float | None = None,
               limit: int = 1000) -> LedgerCall[list[TimerRow]]:
        """Timers, soonest due first."""
        ...

    def purge_turns(self, *, ended_before: float, limit: int = 10_000) -> LedgerCall[int]:
        """Forget ended turns last changed before ``ended_before``; returns how many."""
        ...

    # -- turn streams
    def append_turn_events(self, *, events: Sequence[TurnEventRow]) -> LedgerCall[list[str]]:
        """Persist stream events of many identities, each fenced by its epoch; returns the identities refused."""
        ...

    def turn_events(self, *, identity: str, turn_id: str, after_epoch: int = 0, after_seq: int = 0,
                    limit: int = 1000) -> LedgerCall[list[TurnEventRow]]:
        """A turn's persisted events after ``after_epoch.after_seq``, oldest first."""
        ...

    def last_turn_event(self, *, identity: str, turn_id: str) -> LedgerCall[TurnEventRow | None]:
        """A turn's latest persisted event, or ``None``."""
        ...

    def turn_event_owner(self, *, identity: str, epoch: int, seq: int) -> LedgerCall[str | None]:
        """The turn whose persisted event is ``epoch.seq``, or ``None``."""
        ...

    def purge_turn_events(self, *, ended_before: float, limit: int = 1000) -> LedgerCall[int]:
        """Forget the streams of at most ``limit`` turns ended before ``ended_before``; returns how many."""
        ...

    def purge_abandoned_turn_events(self, *, idle_before: float, after: float = 0.0,
                                    limit: int = 1000) -> LedgerCall[AbandonedSweep]:
        """Forget streams that never ended, idle since ``idle_before``, whose turns are not in progress."""
        ...

    def add_dead_letter(
        self, *, identity: str, message_id: str, envelope: bytes, reason: str, error: str, attempts: int
    ) -> LedgerCall[int]:
        """Record a message that could not be handled; returns its letter id (not fenced)."""
        ...

    def hold_tell(self, *, identity: str, message_id: str, envelope: bytes) -> LedgerCall[int]:
        """Hold a tell durably until it is settled (not fenced); returns its sequence number."""
        ...

    def claim_tells(self, *, min_age: float, limit: int = 100) -> LedgerCall[list[StoredMessage]]:
        """Held tells not attempted for ``min_age`` seconds, oldest first, claimed for another ``min_age``."""
        ...

    def settle_tell(
        self, *, identity: str, message_id: str, reason: str | None = None, error: str = ""
    ) -> LedgerCall[bool]:
        """Forget a handled tell; with ``reason``, record its dead letter first unless one exists."""
        ...

    def dead_letters(self, *, identity: str | None = None, limit: int = 1000) -> LedgerCall[list[StoredMessage]]:
        """Dead letters, oldest first, optionally of one identity."""
        ...

    def dead_letter(self, letter_id: int) -> LedgerCall[StoredMessage | None]:
        """One dead letter by id, or ``None``."""
        ...

    def purge_dead_letters(
        self, *, identity: str | None = None, ids: Sequence[int] | None = None, before: float | None = None
    ) -> LedgerCall[int]:
        """Delete dead letters matching every given filter; returns how many."""
        ...

    # -- hosts
    def register_host(
        self, *, name: str, holder: str, node: str | None = None, pid: int | None = None, process: str | None = None,
    ) -> LedgerCall[list[str]]:
        """Record a host incarnation (and where its process runs: see ``HostInfo``); leases of an earlier
        incarnation of the name are freed."""
        ...

    def remove_host(self, *, name: str, holder: str | None = None) -> LedgerCall[list[str]]:
        """Forget a host and free its leases."""
        ...

    def set_host_draining(self, *, name: str, draining: bool) -> LedgerCall[None]:
        """Mark a host as draining (no new activations) or not."""
        ...

    def hosts(self) -> LedgerCall[list[HostInfo]]:
        """Registered hosts, by name."""
        ...


def ledger_operations() -> frozenset[str]:
    """The names of every operation of :class:`LedgerClient` (what a transport must serve, and nothing else)."""
    return frozenset(name for name in vars(LedgerClient) if not name.startswith("_"))
