"""The ledger's records of durable turns: a turn's row, its journal entries, and what a host writes.

A turn has a row only once it journals something (a step, a wait, a steering read): a
turn that journals nothing is a plain turn, committed with its reply as before.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class TurnEntryKind(str, enum.Enum):
    """What one journal entry records."""

    STEP = "step"
    """``await self.step(name, fn, ...)``: a function's outcome."""
    SLEEP = "sleep"
    """``await self.sleep(seconds)``: a durable timer."""
    SIGNAL = "signal"
    """``await self.wait_signal(name)``: the signal it received (or its timeout)."""
    APPROVAL = "approval"
    """``await self.approval(subject)``: the decision."""
    STEERING = "steering"
    """``self.steering()``: the steer messages the turn read."""


class TurnEntryState(str, enum.Enum):
    """How far one journal entry got."""

    REQUESTED = "requested"
    """Started and not finished: after a crash the step's policy decides (retry, or an unknown outcome)."""
    WAITING = "waiting"
    """A wait (sleep, signal, approval) is pending; the turn is suspended on it."""
    COMPLETED = "completed"
    """Finished: ``value`` holds the outcome, which a replay returns instead of running again."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnEntry:
    """One entry of a turn's journal, at ``position`` (0, 1, ...) in the order the handler reached it.

    ``value`` is the encoded outcome (``rayfleet.turns`` encodes and decodes it; an outcome
    over the spill threshold is a pointer to a file in storage); ``None`` until completed.
    """

    position: int
    kind: TurnEntryKind
    name: str
    state: TurnEntryState
    value: bytes | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnRecord:
    """A turn's row and its journal, oldest entry first."""

    identity: str
    turn_id: str
    method: str
    status: str
    """``RUNNING``, ``SUSPENDED``, ``COMPLETED``, ``FAILED`` or ``INTERRUPTED`` (``rf.TurnStatus`` values)."""
    envelope: bytes
    """The message that started the turn (pickled ``Envelope``): what a wake delivers again."""
    waiting_for: str
    wake_at: float | None
    started: float
    updated: float
    error: str
    entries: tuple[TurnEntry, ...]
    """The journal, oldest first (empty in a listing: see ``steps``)."""
    steps: int
    """How many journal entries the turn has."""
    last_event: TurnEventRow | None = None
    """The turn's latest persisted stream event, read with the journal (``None`` in a listing, or when
    the turn has no stream): what a host resuming the turn needs to go on with its stream."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnWrite:
    """What a host writes for one turn in one fenced transaction.

    The row is created on the first write (``method`` and ``envelope`` are kept from
    then on) and its status, wait and wake time replaced on every write. Entries are
    upserted by position: a completed entry is never changed again, so a zombie's
    late write can at most repeat what is there (and is refused by the fence anyway).
    """

    turn_id: str
    method: str
    envelope: bytes
    status: str = "RUNNING"
    waiting_for: str = ""
    wake_at: float | None = None
    entries: tuple[TurnEntry, ...] = ()
    entries_only: bool = False
    """The row exists and keeps its status: write only ``entries`` (a running turn's next step),
    which spares the row's indexes a write per step. ``envelope`` may then be empty."""
    flush: bool = True
    """Answer only once the write is on disk. ``False`` for a write whose loss only means what
    it records is done again (a ``retry`` step's outcome): a store may then answer once the
    write is committed and visible, before its log reaches the disk (PostgreSQL:
    ``synchronous_commit`` off for that transaction). Only the store's own crash can lose
    it, never a host's; and a later flushed write (the turn's commit, a suspension) makes it
    durable too, the log being written in order."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnEnd:
    """A turn ended: carried by the checkpoint commit that commits its final State, or written alone.

    The turn's journal is dropped with it (the reply is remembered by message id, as for
    any turn), and its row keeps the status and error until retention purges it.
    """

    turn_id: str
    status: str = "COMPLETED"
    error: str = ""
    events: tuple[TurnEventRow, ...] = ()
    """The turn stream's end event, written in the same transaction: a turn whose end
    committed has its end event in the ledger (it is not left to the stream's own writer)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnWake:
    """A suspended turn whose wake came (its wake time, a signal, a decision), to deliver to its owner."""

    identity: str
    turn_id: str
    envelope: bytes
    waiting_for: str
    wake_at: float
    taken: TurnEntry | None = None
    """The waiting entry a signal completed in the transaction that made this wake, as the ledger
    now holds it; ``None`` when this wake completed nothing (a timer, a decision, a signal sent
    again). The host that suspended the turn resumes it from the journal it holds with this
    entry applied, instead of reading the journal back."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ApprovalRequest:
    """What a turn asks for when it reaches ``await self.approval(...)`` (kept once per id)."""

    approval_id: str
    """Stable across the turn's replays (derived from identity, turn and position)."""
    turn_id: str
    position: int
    subject: str
    data: bytes
    """The encoded data shown to the approvers."""
    approvers: tuple[str, ...] = ()
    """Who may decide (empty: anyone)."""
    due: float | None = None
    """When the timeout decides it (wall-clock seconds), or ``None``."""
    on_timeout: str = "reject"
    run_id: str = ""
    """The workflow run whose step started the turn (``""``: none)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ApprovalRow:
    """One approval as the ledger keeps it (``rf.ApprovalInfo`` is its decoded form)."""

    approval_id: str
    identity: str
    turn_id: str
    run_id: str
    position: int
    subject: str
    data: bytes
    approvers: tuple[str, ...]
    status: str
    """``PENDING``, ``APPROVED`` or ``REJECTED``."""
    version: int
    decided_by: str
    comment: str
    decision_data: bytes | None
    created: float
    decided: float | None
    due: float | None
    on_timeout: str
    audit: str
    """JSON list of ``{"at", "action", "by", "comment", "version"}``, oldest first."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ApprovalResolved:
    """A decision applied: the approval as it is now, and the turn it woke (to deliver at once), if any."""

    approval: ApprovalRow
    woken: TurnWake | None


@dataclass(frozen=True, slots=True, kw_only=True)
class TimerSpec:
    """A reminder or schedule of an identity, as an agent registers it (replacing one of the same name)."""

    name: str
    method: str
    payload: bytes
    """The handler's keyword arguments, pickled."""
    next_due: float
    """The first scheduled time (wall-clock seconds)."""
    every: float | None = None
    """Seconds between firings of a periodic reminder."""
    cron: str = ""
    """A schedule's cron expression (with ``tz``)."""
    tz: str = ""
    overlap: str = "skip"
    """``skip``: a firing waits for the one before it to end (the times passed meanwhile follow
    ``catch_up``); ``allow``: each firing is queued as its time comes."""
    catch_up: str = "latest"
    """After times were missed (the fleet down, a firing running long): ``latest`` fires once for
    the latest, ``all`` fires each, ``none`` fires none and waits for the next."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TimerRow:
    """A registered reminder or schedule with its counters."""

    identity: str
    name: str
    method: str
    payload: bytes
    next_due: float
    every: float | None
    cron: str
    tz: str
    overlap: str
    catch_up: str
    created: float
    last_fired: float | None
    fired: int
    missed: int
    late: int
    """Firings that came more than ``LATE_AFTER`` seconds after their scheduled time."""
    last_lateness: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class TimerFired:
    """A firing settled by the host that made it: the scheduled time it was for, what comes next."""

    identity: str
    name: str
    scheduled: float
    """The scheduled time this firing was for (the claim's ``next_due``)."""
    next_due: float | None
    """The next scheduled time, or ``None``: the timer is done (a one-off reminder) and removed."""
    missed: int = 0
    """Scheduled times skipped by the catch-up policy."""
    lateness: float = 0.0
    late: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class AbandonedSweep:
    """What one batch of the sweep of abandoned streams did, and where the next batch starts."""

    forgotten: int
    """Streams forgotten."""
    next_after: float | None
    """The start time the next batch reads after; ``None``: this batch reached the newest
    candidate, so the next one starts from the oldest again."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnEventRow:
    """One persisted event of a turn's stream (table ``turn_events``).

    Its place is ``(epoch, seq)``: ``epoch`` is the fencing token of the owner that wrote
    it (the write is refused unless it is the identity's current token) and ``seq`` its
    sequence among that owner's events of the identity, so an id names one event of one
    turn. ``data`` is the event's JSON text.
    """

    identity: str
    turn_id: str
    epoch: int
    seq: int
    kind: str
    data: str
    at: float
