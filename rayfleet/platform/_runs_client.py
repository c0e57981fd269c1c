"""``fleet.runs``: the run registry seen from the driver — status, wait, cancel, pause, resume."""

from __future__ import annotations

import time
from dataclasses import dataclass

import cloudpickle

from ..errors import DeadlineExceededError, InternalError, UnknownRunError
from ..ledger._contract import LedgerClient
from ..ledger._values import RunRecord
from ..workflow._definition import RunStatus, Workflow, WorkflowOutcome
from ._runner import UNFINISHED, RunnerClient


@dataclass(frozen=True, slots=True, kw_only=True)
class RunInfo:
    """What the run registry knows about one run."""

    run_id: str
    workflow: str
    status: RunStatus
    detail: str
    code_version: str
    cancel_requested: bool
    pause_requested: bool
    submitted: bool
    created_at: float
    updated_at: float

    @classmethod
    def from_record(cls, record: RunRecord) -> RunInfo:
        return cls(
            run_id=record.run_id, workflow=record.workflow, status=RunStatus(record.status), detail=record.detail,
            code_version=record.code_version, cancel_requested=record.cancel_requested,
            pause_requested=record.pause_requested, submitted=record.submitted, created_at=record.created_at,
            updated_at=record.updated_at,
        )


class RunsView:
    """The run registry as read: one run, or all of them. It only reads the ledger.

    Args:
        ledger: where runs are registered and journaled.
    """

    def __init__(self, ledger: LedgerClient) -> None:
        self._ledger = ledger

    def get(self, run_id: str) -> RunInfo:
        """The run ``run_id``.

        Raises:
            UnknownRunError: no run has that id.
        """
        record = self._ledger.run(run_id).result()
        if record is None:
            raise UnknownRunError(run_id=run_id)
        return RunInfo.from_record(record)

    def list_runs(self, status: RunStatus | str | None = None) -> list[RunInfo]:
        """Every run in creation order, or only those with ``status``."""
        statuses = None if status is None else [RunStatus(status).value]
        return [RunInfo.from_record(record) for record in self._ledger.list_runs(statuses=statuses).result()]


class RunsClient(RunsView):
    """The run registry (``fleet.runs``): status, wait, cancel, pause and resume.

    Every method taking a ``run_id`` raises :class:`~rayfleet.UnknownRunError` when no run has it.

    Args:
        ledger: where runs are registered and journaled.
        runner: starts submitted runs in the runner actor (for ``resume``).
    """

    def __init__(self, ledger: LedgerClient, runner: RunnerClient) -> None:
        super().__init__(ledger)
        self._runner = runner

    def wait(self, run_id: str, *, timeout: float | None = None, poll_interval: float = 0.1) -> WorkflowOutcome:
        """Block until the run ends and return its outcome.

        Raises:
            DeadlineExceededError: it did not end within ``timeout`` seconds.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            record = self._ledger.run(run_id).result()
            if record is None:
                raise UnknownRunError(run_id=run_id)
            if record.status not in UNFINISHED and record.outcome is not None:
                outcome: WorkflowOutcome = cloudpickle.loads(record.outcome)
                return outcome
            if deadline is not None and time.monotonic() > deadline:
                raise DeadlineExceededError(identity=run_id, method="wait", timeout=timeout or 0.0)
            time.sleep(poll_interval)

    def cancel(self, run_id: str) -> None:
        """Ask the run to stop; it compensates what it completed and ends CANCELLED."""
        self._request(run_id, cancel=True)

    def pause(self, run_id: str) -> None:
        """Stop dispatching new steps (steps in flight finish); ``resume`` continues."""
        self._request(run_id, pause=True)

    def resume(self, run_id: str, *, force: bool = False) -> None:
        """Continue a paused run, or restart an unfinished submitted run from its journal.

        Raises:
            InvalidSpecError: the run's code version differs (pass ``force=True``).
        """
        info = self.get(run_id)
        self._request(run_id, pause=False)
        if info.submitted and info.status.value in UNFINISHED:
            definition = self._ledger.run_definition(run_id).result()
            if definition is None:
                raise InternalError(detail=f"submitted run {run_id!r} has no stored definition to resume")
            workflow: Workflow = cloudpickle.loads(definition)
            self._ledger.create_run(run_id=run_id, workflow=workflow.name, code_version=workflow.code_version(),
                                    definition=None, force=force).result()
            self._runner.start(run_id)

    def _request(self, run_id: str, *, cancel: bool | None = None, pause: bool | None = None) -> None:
        if not self._ledger.request_run(run_id=run_id, cancel=cancel, pause=pause).result():
            raise UnknownRunError(run_id=run_id)
