"""Public values of durable turns: statuses, handling modes, turn listings, stream events and decisions."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class TurnStatus(str, enum.Enum):
    """Where a turn is (``fleet.turns``, ``TurnHandle``)."""

    RUNNING = "RUNNING"
    """A host is running its handler now."""
    SUSPENDED = "SUSPENDED"
    """Waiting durably (a sleep, a signal, an approval); no host holds it."""
    COMPLETED = "COMPLETED"
    """The handler returned; its State and reply were committed."""
    FAILED = "FAILED"
    """The handler failed for good; nothing of it was committed."""
    INTERRUPTED = "INTERRUPTED"
    """Cancelled by an ``INTERRUPT`` message or ``TurnHandle.cancel()``; nothing of it was committed."""

    @property
    def ended(self) -> bool:
        return self in (TurnStatus.COMPLETED, TurnStatus.FAILED, TurnStatus.INTERRUPTED)


class HandlingMode(str, enum.Enum):
    """What a message does when its agent has a turn in progress (running or suspended)."""

    QUEUE = "queue"
    """Wait, durably and in order, until the turn in progress ends (the default)."""
    STEER = "steer"
    """Join the running turn: ``self.steering()`` returns it. A turn that never reads it gets it
    queued after the turn; an agent with no turn in progress gets it as a plain message."""
    INTERRUPT = "interrupt"
    """Cancel the turn in progress at its next ``await`` (nothing of it commits, its caller gets
    ``TurnInterruptedError``), then run."""
    REJECT = "reject"
    """Refuse at once with ``AgentBusyError``."""

    @classmethod
    def parse(cls, value: HandlingMode | str) -> HandlingMode:
        """``value`` as a mode; raises ``InvalidSpecError`` naming the modes for anything else."""
        if isinstance(value, HandlingMode):
            return value
        try:
            return cls(str(value).lower())
        except ValueError:
            from ..errors import InvalidSpecError

            raise InvalidSpecError(
                f"mode must be one of {', '.join(repr(m.value) for m in cls)}, got {value!r}", field="mode",
            ) from None


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnInfo:
    """One turn in progress, or recently ended, as ``fleet.turns(identity)`` lists it."""

    id: str
    """The turn's id: the id of the message that started it."""
    identity: str
    method: str
    status: TurnStatus
    waiting_for: str = ""
    """While suspended: ``sleep``, ``signal:<name>`` or ``approval:<id>``; otherwise ``""``."""
    wake_at: float | None = None
    """While suspended on a timer (a sleep, or a wait's timeout): when it wakes (``time.time()`` seconds)."""
    started: float = 0.0
    """When the turn first journaled something (``time.time()`` seconds)."""
    updated: float = 0.0
    steps: int = 0
    """Journal entries so far (steps, waits, steering reads)."""
    error: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnEvent:
    """One event of a turn's stream.

    ``id`` is ``<owner epoch>.<sequence>``: the fencing token of the owner that wrote it and its
    place in that owner's part of the stream, so ids order the whole stream across failovers.
    Persisted events (``emit`` and the platform's boundary events) can be read again after
    their id; deltas (``kind == "delta"``) are live only and carry no replayable id.
    """

    id: str
    turn_id: str
    kind: str
    """``started``, ``step``, ``suspended``, ``resumed``, ``approval.requested``, ``approval.resolved``,
    ``completed``, ``failed``, ``interrupted``, ``reset`` (what the reader was shown since the last event
    the ledger keeps was lost with a host: drop it), ``delta``, or the kind an ``emit`` gave."""
    data: Any = None
    at: float = 0.0
    persisted: bool = True

    @property
    def final(self) -> bool:
        """Whether this event ends the stream (the turn completed, failed or was interrupted)."""
        return self.kind in ("completed", "failed", "interrupted")


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    """What a person (or a timeout) decided on an approval; what ``await self.approval(...)`` returns."""

    approved: bool
    by: str
    """Who decided (``"timeout"`` when the approval's timeout decided it)."""
    comment: str = ""
    data: Any = None
    """Anything the decider attached (an amended amount, a reason code)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ApprovalInfo:
    """One approval, as ``fleet.approvals.list/get`` return it."""

    id: str
    identity: str
    """The agent whose turn waits on it (``workflow/<run id>/step/<label>`` for a workflow's approval step)."""
    turn_id: str
    """The waiting turn."""
    run_id: str
    """The workflow run whose step asked (a ``wf.approval`` step, or any step whose turn asks); ``""`` for
    an agent's own turn. ``fleet.approvals.list(run_id=...)`` lists one run's."""
    subject: str
    data: Any
    approvers: tuple[str, ...]
    status: str
    """``PENDING``, ``APPROVED`` or ``REJECTED``."""
    version: int
    """Raised by every change; pass it as ``expect_version`` to decide only on what you read."""
    decided_by: str = ""
    comment: str = ""
    decision_data: Any = None
    created: float = 0.0
    decided: float | None = None
    due: float | None = None
    """When its timeout decides it (``time.time()`` seconds), or ``None``."""
    on_timeout: str = "reject"
    audit: tuple[dict[str, Any], ...] = field(default_factory=tuple)
    """Every request and decision, oldest first: ``{"at", "action", "by", "comment", "version"}``."""

    @property
    def pending(self) -> bool:
        return self.status == "PENDING"


@dataclass(frozen=True, slots=True, kw_only=True)
class TimerInfo:
    """A reminder or schedule of an identity, as ``fleet.timers()`` lists it."""

    identity: str
    name: str
    method: str
    """The handler each firing calls."""
    payload: dict[str, Any]
    """Its keyword arguments."""
    next_due: float
    """The next scheduled time (``time.time()`` seconds)."""
    every: float | None
    """Seconds between firings of a periodic reminder (``None`` otherwise)."""
    cron: str
    """A schedule's cron expression (``""`` for a reminder)."""
    tz: str
    overlap: str
    catch_up: str
    created: float
    last_fired: float | None
    fired: int
    missed: int
    """Scheduled times skipped by the catch-up policy (the fleet was down, a firing ran long)."""
    late: int
    """Firings that came more than 2 seconds after their scheduled time."""
    last_lateness: float | None

    @property
    def kind(self) -> str:
        """``schedule``, ``periodic`` or ``reminder``."""
        return "schedule" if self.cron else "periodic" if self.every is not None else "reminder"
