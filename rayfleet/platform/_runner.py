"""Workflows on Ray: the dispatcher and journal the engine runs against, the runner actor, ``fleet.runs``.

The engine itself (ordering, gather, saga, budgets) is Ray-free in ``rayfleet.workflow``;
here a step's dispatch becomes a routed message to a host, the journal lives in the
ledger, and submitted runs execute in a detached runner actor that resumes unfinished
runs after it restarts.
"""

from __future__ import annotations

import asyncio
import io
import itertools
import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import cloudpickle
import pyarrow as pa
import pydantic
import ray

from ..errors import (
    DeadlineExceededError,
    FleetUnavailableError,
    RayfleetError,
    UnknownRunError,
)
from ..host._messages import Envelope
from ..identity._agent import Usage
from ..identity._values import PERSISTED_LIVE
from ..retry import RetryPolicy
from ..workflow import JournalState
from ..workflow._definition import RunStatus, Workflow, WorkflowOutcome
from ..workflow._engine import WorkflowEngine
from ._ledger_actor import LEDGER_ACTOR_NAME, RayLedgerClient
from ._routing import Courier, HostDirectory

if TYPE_CHECKING:
    from ._fleet import Fleet

log = logging.getLogger("rayfleet.workflow")

RUNNER_ACTOR_NAME = "rayfleet-runner"
UNFINISHED = (RunStatus.PENDING.value, RunStatus.RUNNING.value, RunStatus.PAUSED.value)


# -- step outputs in the journal ------------------------------------------------------

def encode_output(value: Any) -> bytes:
    """Tabular outputs and pydantic models as Arrow IPC, anything else with cloudpickle."""
    if isinstance(value, (pa.Table, pa.RecordBatch)):
        table = value if isinstance(value, pa.Table) else pa.Table.from_batches([value])
        return b"A" + _ipc(table)
    if isinstance(value, pydantic.BaseModel):
        try:
            table = pa.Table.from_pylist([value.model_dump(mode="json")])
        except (pa.ArrowException, TypeError, ValueError):
            pass  # e.g. a list of mixed types: Arrow cannot hold it, pickle can
        else:
            header = cloudpickle.dumps(type(value))
            return b"M" + len(header).to_bytes(8, "big") + header + _ipc(table)
    return b"P" + cloudpickle.dumps(value)


def decode_output(blob: bytes) -> Any:
    kind, body = blob[:1], blob[1:]
    if kind == b"A":
        return pa.ipc.open_stream(body).read_all()
    if kind == b"M":
        size = int.from_bytes(body[:8], "big")
        model = cloudpickle.loads(body[8:8 + size])
        return model.model_validate(pa.ipc.open_stream(body[8 + size:]).read_all().to_pylist()[0])
    return cloudpickle.loads(body)


def _ipc(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


# -- the engine's collaborators over Ray ----------------------------------------------

class RayDispatcher:
    """Dispatches workflow steps as messages from ``workflow:<run id>`` to agents on hosts."""

    def __init__(self, courier: Courier, run_id: str) -> None:
        self._courier = courier
        self._ledger = RayLedgerClient(courier.ledger)
        self._sender = f"workflow:{run_id}"

    async def call(
        self, *, target: str, method: str, payload: Mapping[str, Any], idempotency_key: str, timeout: float,
        conversation: str | None = None, fence: int | None = None,
    ) -> tuple[Any, Usage]:
        envelope = Envelope(
            target=target, method=method, kwargs=dict(payload), sender=self._sender,
            idempotency_key=idempotency_key, conversation=conversation, fence=fence,
        )
        try:
            value, usage = await asyncio.wait_for(self._courier.route_async(target, "dispatch", envelope), timeout)
        except asyncio.TimeoutError:
            raise DeadlineExceededError(identity=target, method=method, timeout=timeout) from None
        return value, usage

    async def select(self, labels: Mapping[str, str]) -> list[str]:
        views = await self._ledger.call("list_identities", labels=dict(labels))
        return sorted(view.identity for view in views if view.lifecycle == PERSISTED_LIVE)

    async def acquire_run_lease(self, *, run_id: str, holder: str) -> int:
        return int(await self._ledger.call("acquire_run_lease", run_id=run_id, holder=holder))

    async def release_run_lease(self, *, run_id: str, holder: str) -> None:
        await self._ledger.call("release_run_lease", run_id=run_id, holder=holder)


class LedgerJournal:
    """The workflow journal in the ledger: a step's output is durable before dependents start."""

    def __init__(self, handle: ray.actor.ActorHandle) -> None:
        self._ledger = RayLedgerClient(handle)

    async def load(self, run_id: str) -> JournalState:
        stored = await self._ledger.call("journal_load", run_id=run_id)
        steps = stored["steps"]
        return JournalState(
            outputs={label: decode_output(blob) for label, blob, _ in steps},
            completion_order=tuple(label for label, _, _ in steps),
            compensated=tuple(stored["compensated"]),
        )

    async def record_step(self, run_id: str, label: str, output: Any, tokens: int) -> None:
        await self._ledger.call("journal_step", run_id=run_id, label=label, output=encode_output(output),
                                tokens=int(tokens))

    async def record_compensation(self, run_id: str, label: str, ok: bool, error: str) -> None:
        await self._ledger.call("journal_compensation", run_id=run_id, label=label, ok=ok, error=error)

    async def status(self, run_id: str) -> tuple[RunStatus | None, bool, bool]:
        info = await self._ledger.call("run_info", run_id=run_id)
        if info is None:
            return None, False, False
        return RunStatus(info["status"]), bool(info["cancel_requested"]), bool(info["pause_requested"])

    async def set_status(self, run_id: str, status: RunStatus, detail: str) -> None:
        await self._ledger.call("set_run_status", run_id=run_id, status=status.value, detail=detail)


async def execute_run(courier: Courier, workflow: Workflow, run_id: str) -> WorkflowOutcome:
    """Run (or resume) one run to its end and store its outcome in the ledger."""
    engine = WorkflowEngine(
        workflow, run_id=run_id, dispatcher=RayDispatcher(courier, run_id), journal=LedgerJournal(courier.ledger),
        sender=f"workflow:{run_id}",
    )
    outcome = await engine.run()
    # The engine already recorded the detail (including failed compensations); keep it.
    await RayLedgerClient(courier.ledger).call(
        "set_run_status", run_id=run_id, status=outcome.status.value, detail=None, outcome=_pickle_outcome(outcome),
    )
    return outcome


def _pickle_outcome(outcome: WorkflowOutcome) -> bytes:
    try:
        return cloudpickle.dumps(outcome)
    except Exception:  # an unpicklable output: keep the status and error, drop the outputs
        return cloudpickle.dumps(WorkflowOutcome(
            run_id=outcome.run_id, status=outcome.status, outputs={}, compensated=outcome.compensated,
            error=outcome.error, usage_tokens=outcome.usage_tokens, invocations=outcome.invocations,
        ))


# -- submitted runs -------------------------------------------------------------------

@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0)
class RunnerActor:
    """Runs submitted workflows; after a restart it resumes every unfinished one from the journal."""

    def __init__(self, namespace: str) -> None:
        self._namespace = namespace
        self._tasks: dict[str, asyncio.Task[WorkflowOutcome]] = {}
        # Ray runs an async actor's __init__ with its event loop already running: start
        # resuming at once, so a restarted runner picks its runs up without being called.
        self._boot = asyncio.get_event_loop().create_task(self._resume_unfinished())

    async def _resume_unfinished(self) -> Courier:
        ledger = ray.get_actor(LEDGER_ACTOR_NAME, namespace=self._namespace)
        courier = Courier(HostDirectory(self._namespace), ledger)
        await courier.refresh_async()
        for info in await RayLedgerClient(ledger).call("list_runs", statuses=list(UNFINISHED)):
            if info["submitted"] and info["run_id"] not in self._tasks:
                self._launch(info["run_id"])
        return courier

    async def _ready(self) -> Courier:
        return await asyncio.shield(self._boot)

    async def ping(self) -> int:
        await self._ready()
        return len(self._tasks)

    async def start(self, run_id: str) -> bool:
        """Start (or resume) a submitted run unless it is already running here."""
        await self._ready()
        return self._launch(run_id)

    def _launch(self, run_id: str) -> bool:
        task = self._tasks.get(run_id)
        if task is not None and not task.done():
            return False
        self._tasks[run_id] = asyncio.get_running_loop().create_task(self._execute(run_id))
        return True

    async def _execute(self, run_id: str) -> WorkflowOutcome:
        courier = await self._ready()
        try:
            definition = await RayLedgerClient(courier.ledger).call("run_definition", run_id=run_id)
            workflow: Workflow = cloudpickle.loads(definition)
            return await execute_run(courier, workflow, run_id)
        except Exception as error:
            # E.g. a builder pickled by reference to a module only the driver has: end the run, never hang it.
            log.exception("run %s failed outside its steps", run_id)
            failure = RayfleetError(
                f"run {run_id!r} could not run in the runner actor: {type(error).__name__}: {error}. "
                f"Make its payload builders importable on the cluster (or define them in your script)"
            )
            outcome = WorkflowOutcome(run_id=run_id, status=RunStatus.FAILED, error=failure)
            await RayLedgerClient(courier.ledger).call(
                "set_run_status", run_id=run_id, status=RunStatus.FAILED.value, detail=failure.message,
                outcome=_pickle_outcome(outcome),
            )
            return outcome


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


class RunsClient:
    """The run registry (``fleet.runs``): status, wait, cancel, pause and resume.

    Every method taking a ``run_id`` raises :class:`UnknownRunError` when no run has it.
    """

    def __init__(self, fleet: Fleet) -> None:
        self._fleet = fleet

    def get(self, run_id: str) -> RunInfo:
        info = self._fleet._ledger.call("run_info", run_id=run_id)
        if info is None:
            raise UnknownRunError(run_id=run_id)
        return _info(info)

    def list(self, status: RunStatus | str | None = None) -> list[RunInfo]:
        statuses = None if status is None else [RunStatus(status).value]
        return [_info(info) for info in self._fleet._ledger.call("list_runs", statuses=statuses)]

    def wait(self, run_id: str, *, timeout: float | None = None, poll_interval: float = 0.1) -> WorkflowOutcome:
        """Block until the run ends and return its outcome.

        Raises:
            DeadlineExceededError: it did not end within ``timeout`` seconds.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            info = self._fleet._ledger.call("run_info", run_id=run_id)
            if info is None:
                raise UnknownRunError(run_id=run_id)
            if info["status"] not in UNFINISHED and info["outcome"] is not None:
                return cloudpickle.loads(info["outcome"])
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
            definition = self._fleet._ledger.call("run_definition", run_id=run_id)
            workflow: Workflow = cloudpickle.loads(definition)
            self._fleet._ledger.call("create_run", run_id=run_id, workflow=workflow.name,
                                     code_version=workflow.code_version(), definition=None, force=force)
            start_on_runner(self._fleet, run_id)

    def _request(self, run_id: str, **flags: bool) -> None:
        if not self._fleet._ledger.call("request_run", run_id=run_id, **flags):
            raise UnknownRunError(run_id=run_id)


def _info(info: Mapping[str, Any]) -> RunInfo:
    return RunInfo(
        run_id=info["run_id"], workflow=info["workflow"], status=RunStatus(info["status"]), detail=info["detail"],
        code_version=info["code_version"], cancel_requested=info["cancel_requested"],
        pause_requested=info["pause_requested"], submitted=info["submitted"], created_at=info["created_at"],
        updated_at=info["updated_at"],
    )


RUNNER_START_RETRY = RetryPolicy(base_delay=0.05, max_delay=1.0, jitter=0.0)
"""Waits while the runner actor restarts; attempts are bounded by ``patience``, not ``max_attempts``."""


def start_on_runner(fleet: Fleet, run_id: str, *, patience: float = 60.0) -> None:
    """Hand a run to the runner actor, waiting out a runner that is restarting.

    Raises:
        FleetUnavailableError: the runner did not come back within ``patience`` seconds.
    """
    deadline = time.monotonic() + patience
    for attempt in itertools.count():
        try:
            ray.get(fleet._runner().start.remote(run_id))
            return
        except (ray.exceptions.ActorUnavailableError, ray.exceptions.ActorDiedError) as error:
            if time.monotonic() > deadline:
                raise FleetUnavailableError(detail=f"the workflow runner did not come back: {error}") from None
            time.sleep(RUNNER_START_RETRY.delay_for(attempt))


def new_run_id(workflow: Workflow) -> str:
    return f"{workflow.name}-{uuid.uuid4().hex[:12]}"

