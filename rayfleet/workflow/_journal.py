"""The journal port of the workflow engine and its in-memory implementation.

The journal is everything the engine keeps about a run outside itself: step outputs,
compensation records, status, the run's lease and its exclusive-step leases. Every
write presents the run's fencing token, so an engine that lost the run cannot write.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from ..errors import StaleRunTokenError
from ..ledger._run_rules import Holding, fence_refusal, grant_refusal, renew_refusal
from ..ledger._values import RunRequests, StepJournaled
from ._definition import RunStatus, WorkflowOutcome


@dataclass(frozen=True, slots=True, kw_only=True)
class JournalState:
    """What a run journaled so far.

    Attributes:
        outputs: label -> output of every journaled step.
        completion_order: labels in the order their outputs were journaled.
        compensated: labels whose compensation was journaled as successful.
    """

    outputs: dict[str, Any] = field(default_factory=dict)
    completion_order: tuple[str, ...] = ()
    compensated: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class StartedRun:
    """What an engine starts a run with: its lease's token and what the run journaled so far."""

    token: int
    state: JournalState


@runtime_checkable
class Journal(Protocol):
    """Durable record of a run and its leases: outputs, compensations, status, ownership.

    The rules every implementation keeps (the ledger's, in ``rayfleet.ledger._run_rules``):
    a run lease's token is strictly larger than any issued before for the run; a live
    lease of another holder is refused with ``RunOwnedElsewhereError``; every write
    presents the run's token and any token but the newest is refused with
    ``StaleRunTokenError``; an exclusive step's lease excludes every other holder until
    released or lapsed, and its token is strictly larger than any step token before.
    """

    async def acquire_lease(self, run_id: str, holder: str, *, ttl: float, takeover_from: str | None = None) -> int:
        """Make ``holder`` the run's engine for ``ttl`` seconds; return its token.

        Raises:
            RunOwnedElsewhereError: another holder's lease is live (and is not ``takeover_from``).
        """
        ...

    async def start(self, run_id: str, holder: str, *, ttl: float, takeover_from: str | None = None) -> StartedRun:
        """:meth:`acquire_lease`, then :meth:`load` as of the grant, in one write.

        Raises:
            RunOwnedElsewhereError: another holder's lease is live (and is not ``takeover_from``).
        """
        ...

    async def renew_lease(self, run_id: str, holder: str, token: int) -> None:
        """Extend the lease by its TTL.

        Raises:
            StaleRunTokenError: the run was taken over (or the lease released).
        """
        ...

    async def release_lease(self, run_id: str, holder: str, token: int) -> None:
        """Give the run's lease up if ``holder`` still holds it under ``token``."""
        ...

    async def acquire_step_lease(self, run_id: str, label: str, holder: str, *, token: int, ttl: float) -> int:
        """Lease exclusive step ``label`` for ``ttl`` seconds under run token ``token``; return its fence.

        Raises:
            StaleRunTokenError: ``token`` is not the run's current token.
            RunOwnedElsewhereError: the step's lease is held and has not lapsed.
        """
        ...

    async def release_step_lease(self, run_id: str, label: str, holder: str, step_token: int) -> None:
        """Give a step lease up if ``holder`` still holds it under ``step_token``."""
        ...

    async def load(self, run_id: str) -> JournalState:
        """Everything journaled for ``run_id`` (an empty state for a new run)."""
        ...

    async def record_step(self, run_id: str, label: str, output: Any, tokens: int, *, token: int) -> RunRequests:
        """Durably record a step's verified output before its dependents start (fenced).

        Returns what is asked of the run (cancel, pause) as of the write: the engine acts
        on it before it starts another step, without a :meth:`status` read of its own.
        """
        ...

    async def record_compensation(self, run_id: str, label: str, ok: bool, error: str, *, token: int) -> None:
        """Record the result of a step's compensation (fenced)."""
        ...

    async def status(self, run_id: str) -> tuple[RunStatus | None, bool, bool]:
        """``(status, cancel_requested, pause_requested)``."""
        ...

    async def set_status(
        self, run_id: str, status: RunStatus, detail: str, *, token: int, outcome: WorkflowOutcome | None = None,
        release: str | None = None,
    ) -> RunRequests:
        """Record a status transition with a human-readable detail, and the outcome once it ended (fenced).

        With ``release`` (the holder), the run's lease is given up in the same write, as
        :meth:`release_lease` would. Returns what is asked of the run as of the write.
        """
        ...


@dataclass(slots=True)
class _RunRecord:
    outputs: dict[str, Any] = field(default_factory=dict)
    completed: list[str] = field(default_factory=list)
    tokens: dict[str, int] = field(default_factory=dict)
    compensations: list[tuple[str, bool, str]] = field(default_factory=list)
    status: RunStatus | None = None
    detail: str = ""
    history: list[tuple[RunStatus, str]] = field(default_factory=list)
    cancel_requested: bool = False
    pause_requested: bool = False
    outcome: WorkflowOutcome | None = None
    lease: Holding | None = None
    lease_ttl: float = 0.0
    step_leases: dict[str, Holding] = field(default_factory=dict)
    step_high_water: int = 0


SEED_HOLDER = "earlier-engine"
"""The holder :meth:`InMemoryJournal.seed_step` journals under."""


class InMemoryJournal:
    """A dict-backed :class:`Journal` for tests and for runs that need no durable ledger.

    It applies the ledger's own lease and fencing rules (the same functions), so an
    engine run against it meets exactly the refusals it would meet in production.
    Nothing survives the process; resuming works only with the same instance.

    Args:
        clock: wall-clock seconds for lease expiry (a ``ManualClock`` in tests).
    """

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._runs: dict[str, _RunRecord] = {}
        self._clock = clock
        self.step_lease_events: list[tuple[str, str, int | None]] = []
        """``("acquire", holder, fence)`` and ``("release", holder, None)`` for every step lease call, in order."""

    def _run(self, run_id: str) -> _RunRecord:
        return self._runs.setdefault(run_id, _RunRecord())

    def _check(self, run_id: str, token: int) -> _RunRecord:
        record = self._run(run_id)
        refusal = self._refusal(run_id, record, token)
        if refusal is not None:
            raise refusal
        return record

    @staticmethod
    def _refusal(run_id: str, record: _RunRecord, token: int) -> StaleRunTokenError | None:
        return fence_refusal(run_id=run_id, high_water=0 if record.lease is None else record.lease.token,
                             presented=token)

    @staticmethod
    def _journal(record: _RunRecord, label: str, output: Any, tokens: int) -> tuple[bool, RunRequests]:
        """Journal ``label`` unless it is already (a repeat keeps the first output, as the ledger does).

        Returns whether this output was journaled, and what is asked of the run.
        """
        inserted = label not in record.outputs
        if inserted:
            record.completed.append(label)
            record.outputs[label] = output
            record.tokens[label] = tokens
        return inserted, RunRequests(cancel=record.cancel_requested, pause=record.pause_requested)

    # -- leases

    async def acquire_lease(self, run_id: str, holder: str, *, ttl: float, takeover_from: str | None = None) -> int:
        return self._acquire(run_id, holder, ttl=ttl, takeover_from=takeover_from)

    def _acquire(self, run_id: str, holder: str, *, ttl: float, takeover_from: str | None) -> int:
        record, now = self._run(run_id), self._clock()
        refusal = grant_refusal(run_id=run_id, current=record.lease, holder=holder, now=now,
                                takeover_from=takeover_from)
        if refusal is not None:
            raise refusal
        previous = record.lease
        token = (0 if previous is None else previous.token) + 1
        record.lease, record.lease_ttl = Holding(holder=holder, token=token, expires_at=now + ttl), ttl
        if takeover_from is not None and previous is not None and previous.holder == takeover_from != holder:
            record.step_leases.clear()
        return token

    async def start(self, run_id: str, holder: str, *, ttl: float, takeover_from: str | None = None) -> StartedRun:
        token = self._acquire(run_id, holder, ttl=ttl, takeover_from=takeover_from)
        return StartedRun(token=token, state=self._state(run_id))

    async def renew_lease(self, run_id: str, holder: str, token: int) -> None:
        record = self._run(run_id)
        refusal = renew_refusal(run_id=run_id, current=record.lease, holder=holder, token=token)
        if refusal is not None:
            raise refusal
        record.lease = Holding(holder=holder, token=token, expires_at=self._clock() + record.lease_ttl)

    async def release_lease(self, run_id: str, holder: str, token: int) -> None:
        self._release(self._run(run_id), holder, token)

    @staticmethod
    def _release(record: _RunRecord, holder: str, token: int) -> None:
        lease = record.lease
        if lease is not None and lease.holder == holder and lease.token == token:
            record.lease = Holding(holder=None, token=token, expires_at=lease.expires_at)

    async def acquire_step_lease(self, run_id: str, label: str, holder: str, *, token: int, ttl: float) -> int:
        record, now = self._check(run_id, token), self._clock()
        refusal = grant_refusal(run_id=run_id, current=record.step_leases.get(label), holder=holder, now=now,
                                step=label)
        if refusal is not None:
            raise refusal
        record.step_high_water += 1
        record.step_leases[label] = Holding(holder=holder, token=record.step_high_water, expires_at=now + ttl)
        self.step_lease_events.append(("acquire", holder, record.step_high_water))
        return record.step_high_water

    async def release_step_lease(self, run_id: str, label: str, holder: str, step_token: int) -> None:
        self.step_lease_events.append(("release", holder, None))
        record = self._run(run_id)
        held = record.step_leases.get(label)
        if held is not None and held.holder == holder and held.token == step_token:
            del record.step_leases[label]

    # -- the journal

    async def load(self, run_id: str) -> JournalState:
        return self._state(run_id)

    def _state(self, run_id: str) -> JournalState:
        record = self._run(run_id)
        compensated = tuple(dict.fromkeys(label for label, ok, _ in record.compensations if ok))
        return JournalState(outputs=dict(record.outputs), completion_order=tuple(record.completed),
                            compensated=compensated)

    async def record_step(self, run_id: str, label: str, output: Any, tokens: int, *, token: int) -> RunRequests:
        _, requests = self._journal(self._check(run_id, token), label, output, tokens)
        return requests

    async def record_compensation(self, run_id: str, label: str, ok: bool, error: str, *, token: int) -> None:
        self._check(run_id, token).compensations.append((label, ok, error))

    def journal_with_turn(
        self, run_id: str, label: str, output: Any, tokens: int, *, token: int
    ) -> StepJournaled | None:
        """Journal a step as a host does in its agent's checkpoint transaction (not part of the protocol).

        ``None`` (nothing journaled, nothing refused) when ``token`` is not the run's
        current token; a step journaled before keeps its output (``inserted=False``).
        """
        record = self._run(run_id)
        if self._refusal(run_id, record, token) is not None:
            return None
        inserted, requests = self._journal(record, label, output, tokens)
        return StepJournaled(inserted=inserted, requests=requests)

    async def status(self, run_id: str) -> tuple[RunStatus | None, bool, bool]:
        record = self._run(run_id)
        return record.status, record.cancel_requested, record.pause_requested

    async def set_status(
        self, run_id: str, status: RunStatus, detail: str, *, token: int, outcome: WorkflowOutcome | None = None,
        release: str | None = None,
    ) -> RunRequests:
        record = self._check(run_id, token)
        record.status = RunStatus(status)
        record.detail = detail
        record.history.append((record.status, detail))
        if outcome is not None:
            record.outcome = outcome
        if release is not None:
            self._release(record, release, token)
        return RunRequests(cancel=record.cancel_requested, pause=record.pause_requested)

    # Control, seeding and inspection helpers (not part of the Journal protocol).

    async def seed_step(self, run_id: str, label: str, output: Any, tokens: int = 0) -> None:
        """Journal a step as an earlier engine of the run would have (under its own, released lease)."""
        token = await self.acquire_lease(run_id, SEED_HOLDER, ttl=1.0)
        await self.record_step(run_id, label, output, tokens, token=token)
        await self.release_lease(run_id, SEED_HOLDER, token)

    async def seed_compensation(self, run_id: str, label: str, ok: bool = True, error: str = "") -> None:
        """Journal a compensation as an earlier engine of the run would have (under its own, released lease)."""
        token = await self.acquire_lease(run_id, SEED_HOLDER, ttl=1.0)
        await self.record_compensation(run_id, label, ok, error, token=token)
        await self.release_lease(run_id, SEED_HOLDER, token)

    def request_cancel(self, run_id: str) -> None:
        """Ask the run to cancel before its next dispatch."""
        self._run(run_id).cancel_requested = True

    def request_pause(self, run_id: str, paused: bool = True) -> None:
        """Ask the run to stop dispatching new steps (``paused=False`` resumes it)."""
        self._run(run_id).pause_requested = paused

    def history(self, run_id: str) -> list[tuple[RunStatus, str]]:
        """Every status transition of the run, oldest first."""
        return list(self._run(run_id).history)

    def compensations(self, run_id: str) -> list[tuple[str, bool, str]]:
        """Every journaled compensation as ``(label, ok, error)``, oldest first."""
        return list(self._run(run_id).compensations)

    def tokens(self, run_id: str) -> dict[str, int]:
        """Tokens journaled per step."""
        return dict(self._run(run_id).tokens)

    def outcome(self, run_id: str) -> WorkflowOutcome | None:
        """The outcome recorded with the run's final status, if it ended."""
        return self._run(run_id).outcome

    def owner(self, run_id: str) -> tuple[str | None, int]:
        """``(holder, token)`` of the run's lease: the holder is ``None`` once released (or never granted)."""
        lease = self._run(run_id).lease
        return (None, 0) if lease is None else (lease.holder, lease.token)

    def step_holders(self, run_id: str) -> dict[str, str]:
        """label -> holder of every step lease still recorded (lapsed ones included)."""
        return {label: held.holder or "" for label, held in self._run(run_id).step_leases.items()}
