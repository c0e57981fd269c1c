"""Workflows on Ray: the dispatcher and journal the engine runs against, the runner actor, ``fleet.runs``.

The engine itself (ordering, gather, saga, budgets) is Ray-free in ``rayfleet.workflow``;
here a step's dispatch becomes a routed message to a host, the journal lives in the
ledger, and submitted runs execute in a detached runner actor that resumes unfinished
runs after it restarts.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import cloudpickle
import ray

from ..checkpoints._journal_files import JournalFileStore
from ..checkpoints._step_outputs import SPILL_THRESHOLD, decode_output, encode_output, spill_output
from ..errors import (
    FleetUnavailableError,
    RayfleetError,
    RunOwnedElsewhereError,
    StaleRunTokenError,
    UnknownIdentityError,
    WorkflowError,
)
from ..host._messages import Envelope, workflow_sender
from ..identity._agent import AgentSpec
from ..ledger._contract import LedgerClient
from ..ledger._location import LedgerLocation
from ..ledger._run_rules import DEFAULT_RUN_LEASE_TTL
from ..ledger._values import JournalRecord, RunRequests, SpecRecord
from ..retry import RetryPolicy
from ..workflow import JournalState, StartedRun
from ..workflow._definition import RunStatus, Workflow, WorkflowOutcome
from ..workflow._engine import JournalWith, StepReply, WorkflowEngine
from ..workflow._waits import WorkflowWaiter, waiter_runs
from ._ledger_client import connect_ledger_from
from ._metrics import RayRunMetrics
from ._replies import turn_reply_from_wire
from ._routing import Courier, HostDirectory, deliver_request
from ._shipping import spec_record

log = logging.getLogger("rayfleet.workflow")

RUNNER_ACTOR_NAME = "rayfleet-runner"
WAITER_DELETE_TIMEOUT = 10.0
"""Seconds an ended run's engine waits for its waiters to be deleted (together) before leaving them;
the run's outcome is recorded already, and ``fleet.run`` returns it after this at most."""
UNFINISHED = (RunStatus.PENDING.value, RunStatus.RUNNING.value, RunStatus.PAUSED.value)
WAITER_LABELS = {"rayfleet": "workflow-waiter"}
"""The labels of every waiter (see :func:`waiter_record`)."""
WAITER_SWEEP_INTERVAL = 600.0
"""Seconds between the runner's sweeps for waiters their run's end left behind (the first at its start)."""


# -- the engine's collaborators over Ray ----------------------------------------------

class RayDispatcher:
    """Dispatches workflow steps as messages from ``workflow:<run id>`` to agents on hosts."""

    def __init__(self, courier: Courier, run_id: str) -> None:
        self._courier = courier
        self._ledger = courier.ledger
        self._sender = workflow_sender(run_id)

    async def call(
        self, *, target: str, method: str, payload: Mapping[str, Any], idempotency_key: str, timeout: float,
        conversation: str | None = None, sequence: int | None = None, journal: JournalWith | None = None,
    ) -> StepReply:
        """One routed turn; with ``journal``, an ``EVERY_TURN`` agent's host journals the reply with its commit."""
        envelope = Envelope(
            target=target, method=method, kwargs=dict(payload), sender=self._sender,
            idempotency_key=idempotency_key, conversation=conversation, sequence=sequence,
            journal=None if journal is None else (journal.run_id, journal.label, journal.token),
        )
        wire = await self._courier.route_async(target, deliver_request(envelope), method=method, timeout=timeout)
        value, usage, journaled = turn_reply_from_wire(wire)
        return StepReply(value, usage, journaled)

    async def select(self, labels: Mapping[str, str]) -> list[str]:
        return await self._ledger.select_identities(labels=dict(labels))

    async def ensure_waiter(self, identity: str) -> None:
        await self._ledger.register(waiter_record(identity))

    async def retire_waiter(self, identity: str) -> None:
        await retire_waiter(self._courier, identity)


async def retire_waiter(courier: Courier, identity: str) -> None:
    """Delete a waiter through its owner (as ``fleet.delete``): a suspended wait of it ends with it.

    Raises what routing raises: no owner within :data:`WAITER_DELETE_TIMEOUT`, the ledger down.
    """
    try:
        await courier.route_async(identity, lambda host: host.delete.remote(identity), method="delete",
                                  timeout=WAITER_DELETE_TIMEOUT)
    except UnknownIdentityError:
        return  # deleted already, or its step never ran
    courier.directory.forget(identity)


def waiter_record(identity: str) -> SpecRecord:
    """The spec of the platform agent named ``identity`` that runs a workflow's waiting step."""
    return spec_record(AgentSpec(identity=identity, agent=WorkflowWaiter, labels=dict(WAITER_LABELS)))


async def retire_leftover_waiters(ledger: LedgerClient, retire: Callable[[str], Awaitable[None]]) -> int:
    """Delete (with ``retire``) the waiters of runs that have ended; returns how many.

    A run's engine deletes its waiters at its end, but leaves one whose delete failed (its
    owner unreachable for :data:`WAITER_DELETE_TIMEOUT`), and never had those of signals
    sent with ``fleet.signal_run`` for names no step of the run waits for. A waiter is
    deleted only when the run it is named after is in the ledger and has ended (under
    every reading of its name); one of a run not started yet (a signal sent first) stays,
    and so does one named by a digest (an odd run id or label), which ``fleet.delete``
    removes. A delete that fails is logged and tried again at the next sweep.
    """
    statuses: dict[str, str | None] = {}
    retired = 0
    for identity in await ledger.select_identities(labels=dict(WAITER_LABELS)):
        runs = waiter_runs(identity)
        for run_id in runs:
            if run_id not in statuses:
                record = await ledger.run(run_id)
                statuses[run_id] = None if record is None else record.status
        known = [statuses[run_id] for run_id in runs if statuses[run_id] is not None]
        if not known or any(status in UNFINISHED for status in known):
            continue
        try:
            await retire(identity)
        except Exception as error:  # noqa: BLE001 - the next sweep tries again
            log.warning("the waiter %s of an ended run is left for the next sweep: %s", identity, error)
            continue
        retired += 1
    return retired


class LedgerJournal:
    """The workflow journal in the ledger: a step's output is durable before dependents start.

    Every write carries the run's token and the ledger checks it in the writing
    transaction; leases are the ledger's run and step leases.

    With ``files`` (the fleet's storage), an output whose encoding exceeds
    :data:`SPILL_THRESHOLD` is first written to its own file under ``journal/``, and
    the ledger row holds only the pointer; the file is complete before the pointer is
    journaled, so a journaled step always reads back. Without ``files`` every output
    is journaled inline.
    """

    def __init__(self, ledger: LedgerClient, files: JournalFileStore | None = None) -> None:
        self._ledger = ledger
        self._files = files

    async def acquire_lease(self, run_id: str, holder: str, *, ttl: float, takeover_from: str | None = None) -> int:
        lease = await self._ledger.acquire_run_lease(run_id=run_id, holder=holder, ttl=ttl,
                                                     takeover_from=takeover_from)
        return lease.token

    async def start(self, run_id: str, holder: str, *, ttl: float, takeover_from: str | None = None) -> StartedRun:
        """Raises:
            RunOwnedElsewhereError: another holder's lease is live.
            WorkflowError: a spilled output cannot be read back (named step, file and storage).
        """
        started = await self._ledger.start_run(run_id=run_id, holder=holder, ttl=ttl, takeover_from=takeover_from)
        return StartedRun(token=started.lease.token, state=await self._state(run_id, started.journal))

    async def renew_lease(self, run_id: str, holder: str, token: int) -> None:
        await self._ledger.renew_run_lease(run_id=run_id, holder=holder, token=token)

    async def release_lease(self, run_id: str, holder: str, token: int) -> None:
        await self._ledger.release_run_lease(run_id=run_id, holder=holder, token=token)

    async def acquire_step_lease(self, run_id: str, label: str, holder: str, *, token: int, ttl: float) -> int:
        return await self._ledger.acquire_step_lease(run_id=run_id, label=label, holder=holder,
                                                     fencing_token=token, ttl=ttl)

    async def release_step_lease(self, run_id: str, label: str, holder: str, step_token: int) -> None:
        await self._ledger.release_step_lease(run_id=run_id, label=label, holder=holder, token=step_token)

    async def load(self, run_id: str) -> JournalState:
        """Raises:
            WorkflowError: a spilled output cannot be read back (named step, file and storage).
        """
        return await self._state(run_id, await self._ledger.journal(run_id))

    async def _state(self, run_id: str, journal: JournalRecord) -> JournalState:
        outputs = {}
        for entry in journal.steps:
            if entry.output[:1] == b"F":
                # Reading a file is blocking I/O (a network round trip on object stores): off the event loop.
                outputs[entry.label] = await asyncio.to_thread(self._read_spilled, run_id, entry.label, entry.output)
            else:
                outputs[entry.label] = decode_output(entry.output)
        return JournalState(
            outputs=outputs,
            completion_order=tuple(entry.label for entry in journal.steps),
            compensated=journal.compensated,
        )

    def _read_spilled(self, run_id: str, label: str, pointer: bytes) -> Any:
        try:
            return decode_output(pointer, self._files)
        except Exception as error:  # any failure to read it back is reported the same way
            where = self._files.storage.display if self._files is not None else "no storage"
            location = pointer[1:].decode(errors="replace")
            raise WorkflowError(
                f"run {run_id!r}: the journaled output of step {label!r} is a file ({location}) in "
                f"{where!r} that cannot be read: {type(error).__name__}: {error}. Restore the file, or connect "
                f"with the storage the run was written to, then resume the run",
                run_id=run_id, step=label,
            ) from error

    async def record_step(self, run_id: str, label: str, output: Any, tokens: int, *, token: int) -> RunRequests:
        blob = encode_output(output)
        if self._files is not None and len(blob) > SPILL_THRESHOLD:
            # Blocking I/O (an upload on object stores): off the event loop.
            blob = await asyncio.to_thread(spill_output, blob, self._files, run_id=run_id, label=label)
        return await self._ledger.journal_step(run_id=run_id, fencing_token=token, label=label, output=blob,
                                               tokens=int(tokens))

    async def record_compensation(self, run_id: str, label: str, ok: bool, error: str, *, token: int) -> None:
        await self._ledger.journal_compensation(run_id=run_id, fencing_token=token, label=label, ok=ok, error=error)

    async def status(self, run_id: str) -> tuple[RunStatus | None, bool, bool]:
        record = await self._ledger.run(run_id)
        if record is None:
            return None, False, False
        return RunStatus(record.status), record.cancel_requested, record.pause_requested

    async def set_status(
        self, run_id: str, status: RunStatus, detail: str, *, token: int, outcome: WorkflowOutcome | None = None,
        release: str | None = None,
    ) -> RunRequests:
        return await self._ledger.set_run_status(
            run_id=run_id, fencing_token=token, status=status.value, detail=detail,
            outcome=None if outcome is None else _pickle_outcome(outcome), release_holder=release,
        )


def runner_holder_prefix(namespace: str) -> str:
    """What every run-lease holder name of the runner actor of ``namespace`` starts with."""
    return f"runner:{namespace}:"


def driver_holder() -> str:
    """A fresh run-lease holder name for one ``fleet.run`` in this process."""
    return f"driver:{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


async def execute_run(
    courier: Courier, workflow: Workflow, run_id: str, files: JournalFileStore | None = None, *, holder: str,
    takeover_from: str | None = None, lease_ttl: float = DEFAULT_RUN_LEASE_TTL,
) -> WorkflowOutcome:
    """Run (or resume) one run to its end under the run's lease; the outcome is stored with its final status.

    ``files`` is where large step outputs go (see :class:`LedgerJournal`).

    Raises:
        RunOwnedElsewhereError: another live engine holds the run; nothing was done.
        StaleRunTokenError: the run was taken over meanwhile; this engine stopped.
    """
    engine = WorkflowEngine(
        workflow, run_id=run_id, dispatcher=RayDispatcher(courier, run_id),
        journal=LedgerJournal(courier.ledger, files), sender=workflow_sender(run_id), holder=holder,
        takeover_from=takeover_from, lease_ttl=lease_ttl, metrics=_RUN_METRICS,
    )
    return await engine.run()


_RUN_METRICS = RayRunMetrics()


def _pickle_outcome(outcome: WorkflowOutcome) -> bytes:
    try:
        pickled: bytes = cloudpickle.dumps(outcome)
    except Exception:  # noqa: BLE001 - an unpicklable output: keep the status and error, drop the outputs
        pickled = cloudpickle.dumps(WorkflowOutcome(
            run_id=outcome.run_id, status=outcome.status, outputs={}, compensated=outcome.compensated,
            error=outcome.error, usage_tokens=outcome.usage_tokens, invocations=outcome.invocations,
        ))
    return pickled


# -- submitted runs -------------------------------------------------------------------

@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0)
class RunnerActor:
    """Runs submitted workflows; after a restart it resumes every unfinished one from the journal."""

    def __init__(self, namespace: str, ledger: str, storage: str) -> None:
        self._namespace = namespace
        self._ledger_location = LedgerLocation.parse(ledger)
        # The fleet's storage root, where large step outputs are journaled as files.
        self._files = JournalFileStore(storage)
        # One name per incarnation: a restarted runner knows every other runner name of
        # its namespace belongs to a dead predecessor (Ray runs one incarnation at a time).
        self._holder = f"{runner_holder_prefix(namespace)}{uuid.uuid4().hex[:12]}"
        self._tasks: dict[str, asyncio.Task[WorkflowOutcome | None]] = {}
        # Ray runs an async actor's __init__ with its event loop already running: start
        # resuming at once, so a restarted runner picks its runs up without being called.
        self._boot = asyncio.get_event_loop().create_task(self._resume_unfinished())
        self._sweeper = asyncio.get_event_loop().create_task(self._sweep_waiters())

    async def _resume_unfinished(self) -> Courier:
        node = ray.get_runtime_context().get_node_id()
        ledger = await connect_ledger_from(self._ledger_location, namespace=self._namespace, node=node)
        courier = Courier(HostDirectory(self._namespace), ledger)
        await courier.refresh_async()
        for record in await ledger.list_runs(statuses=list(UNFINISHED)):
            if record.submitted and record.run_id not in self._tasks:
                self._launch(record.run_id)
        return courier

    async def _ready(self) -> Courier:
        return await asyncio.shield(self._boot)

    async def _sweep_waiters(self) -> None:
        """Delete the waiters ended runs left behind: at start, then every :data:`WAITER_SWEEP_INTERVAL`."""
        courier = await self._ready()
        while True:
            try:
                retired = await retire_leftover_waiters(courier.ledger, functools.partial(retire_waiter, courier))
                if retired:
                    log.info("deleted %d waiter(s) of ended runs", retired)
            except Exception as error:  # noqa: BLE001 - the next sweep tries again
                log.warning("the sweep for waiters of ended runs failed: %s", error)
            await asyncio.sleep(WAITER_SWEEP_INTERVAL)

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

    def _predecessor(self, owner: str | None) -> str | None:
        """``owner`` if it is an earlier incarnation of this runner (dead, so its lease may be taken at once)."""
        if owner is not None and owner != self._holder and owner.startswith(runner_holder_prefix(self._namespace)):
            return owner
        return None

    async def _execute(self, run_id: str) -> WorkflowOutcome | None:
        courier = await self._ready()
        record = await courier.ledger.run(run_id)
        takeover = self._predecessor(None if record is None else record.owner)
        try:
            definition = await courier.ledger.run_definition(run_id)
            if definition is None:
                raise LookupError(f"run {run_id!r} has no stored definition")
            workflow: Workflow = cloudpickle.loads(definition)
            return await execute_run(courier, workflow, run_id, self._files, holder=self._holder,
                                   takeover_from=takeover)
        except (RunOwnedElsewhereError, StaleRunTokenError) as error:
            # Another engine executes the run: it is theirs to finish and to record.
            log.warning("run %s is not this runner's to execute: %s", run_id, error)
            return None
        except Exception as error:
            # E.g. a builder pickled by reference to a module only the driver has: end the run, never hang it.
            log.exception("run %s failed outside its steps", run_id)
            failure = RayfleetError(
                f"run {run_id!r} could not run in the runner actor: {type(error).__name__}: {error}. "
                f"Make its payload builders importable on the cluster (or define them in your script)"
            )
            outcome = WorkflowOutcome(run_id=run_id, status=RunStatus.FAILED, error=failure)
            await self._record_failure(courier, run_id, outcome, takeover)
            return outcome

    async def _record_failure(
        self, courier: Courier, run_id: str, outcome: WorkflowOutcome, takeover: str | None
    ) -> None:
        """Record a run that could not run as FAILED, under the run's lease like any engine write."""
        journal = LedgerJournal(courier.ledger)
        try:
            token = await journal.acquire_lease(run_id, self._holder, ttl=DEFAULT_RUN_LEASE_TTL,
                                                takeover_from=takeover)
        except RunOwnedElsewhereError as error:
            log.warning("run %s failed here but another engine holds it; leaving it to them: %s", run_id, error)
            return
        try:
            detail = outcome.error.message if outcome.error is not None else "failed"
            await journal.set_status(run_id, RunStatus.FAILED, detail, token=token, outcome=outcome,
                                     release=self._holder)
        except StaleRunTokenError as error:
            log.warning("run %s was taken over before its failure was recorded: %s", run_id, error)


class RunnerClient:
    """Hands submitted runs to the detached runner actor of one namespace, creating it if needed.

    ``ledger`` is the ledger URL the runner connects to; ``storage`` the fleet's storage
    root, for journal files.
    """

    def __init__(self, namespace: str, ledger: str, storage: str) -> None:
        self.namespace = namespace
        self.ledger = ledger
        self.storage = storage

    def handle(self) -> ray.actor.ActorHandle:
        # ray.remote classes gain .options at run time; their stubs do not say so.
        handle: ray.actor.ActorHandle = RunnerActor.options(  # type: ignore[attr-defined]
            name=RUNNER_ACTOR_NAME, namespace=self.namespace, lifetime="detached", get_if_exists=True,
        ).remote(self.namespace, self.ledger, self.storage)
        return handle

    def start(self, run_id: str, *, patience: float = 60.0) -> None:
        """Start (or resume) a submitted run in the runner, waiting out a runner that is restarting.

        Raises:
            FleetUnavailableError: the runner did not come back within ``patience`` seconds.
        """
        deadline = time.monotonic() + patience
        for attempt in itertools.count():
            try:
                ray.get(self.handle().start.remote(run_id))
                return
            except (ray.exceptions.ActorUnavailableError, ray.exceptions.ActorDiedError) as error:
                if time.monotonic() > deadline:
                    raise FleetUnavailableError(detail=f"the workflow runner did not come back: {error}") from None
                time.sleep(RUNNER_START_RETRY.delay_for(attempt))

    def stop(self) -> None:
        """Kill the runner actor if one exists (its runs resume when a new one starts)."""
        with contextlib.suppress(ValueError):  # no run was ever submitted
            ray.kill(ray.get_actor(RUNNER_ACTOR_NAME, namespace=self.namespace))


RUNNER_START_RETRY = RetryPolicy(base_delay=0.05, max_delay=1.0, jitter=0.0)
"""Waits while the runner actor restarts; attempts are bounded by ``patience``, not ``max_attempts``."""


def new_run_id(workflow: Workflow) -> str:
    return f"{workflow.name}-{uuid.uuid4().hex[:12]}"

