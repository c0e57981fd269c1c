"""The journal port of the workflow engine and its in-memory implementation."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from ._definition import RunStatus


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


@runtime_checkable
class Journal(Protocol):
    """Durable record of a run: step outputs, compensations and status flags."""

    async def load(self, run_id: str) -> JournalState:
        """Everything journaled for ``run_id`` (an empty state for a new run)."""
        ...

    async def record_step(self, run_id: str, label: str, output: Any, tokens: int) -> None:
        """Durably record a step's verified output before its dependents start."""
        ...

    async def record_compensation(self, run_id: str, label: str, ok: bool, error: str) -> None:
        """Record the result of a step's compensation."""
        ...

    async def status(self, run_id: str) -> tuple[RunStatus | None, bool, bool]:
        """``(status, cancel_requested, pause_requested)``."""
        ...

    async def set_status(self, run_id: str, status: RunStatus, detail: str) -> None:
        """Record a status transition with a human-readable detail."""
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


class InMemoryJournal:
    """A dict-backed :class:`Journal` for tests and for runs that need no durable ledger.

    Nothing survives the process; resuming works only with the same instance.
    """

    def __init__(self) -> None:
        self._runs: dict[str, _RunRecord] = {}

    def _run(self, run_id: str) -> _RunRecord:
        return self._runs.setdefault(run_id, _RunRecord())

    async def load(self, run_id: str) -> JournalState:
        record = self._run(run_id)
        compensated = tuple(dict.fromkeys(label for label, ok, _ in record.compensations if ok))
        return JournalState(outputs=dict(record.outputs), completion_order=tuple(record.completed),
                            compensated=compensated)

    async def record_step(self, run_id: str, label: str, output: Any, tokens: int) -> None:
        record = self._run(run_id)
        if label not in record.outputs:
            record.completed.append(label)
        # A later record of the same label overwrites the output, as a log replay would.
        record.outputs[label] = output
        record.tokens[label] = tokens

    async def record_compensation(self, run_id: str, label: str, ok: bool, error: str) -> None:
        self._run(run_id).compensations.append((label, ok, error))

    async def status(self, run_id: str) -> tuple[RunStatus | None, bool, bool]:
        record = self._run(run_id)
        return record.status, record.cancel_requested, record.pause_requested

    async def set_status(self, run_id: str, status: RunStatus, detail: str) -> None:
        record = self._run(run_id)
        record.status = RunStatus(status)
        record.detail = detail
        record.history.append((record.status, detail))

    # Control and inspection helpers (not part of the Journal protocol).

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
