"""The workflow engine: run ownership, concurrent DAG scheduling, retries, leases, budgets and the saga."""

from __future__ import annotations

import asyncio
import enum
import heapq
import inspect
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Protocol, TypeVar, runtime_checkable

from .._deadlines import within
from ..errors import (
    BudgetExceededError,
    DeadlineExceededError,
    FleetUnavailableError,
    InternalError,
    InvalidSpecError,
    LeaseLostError,
    LedgerUnavailableError,
    RayfleetError,
    RunCancelledError,
    RunOwnedElsewhereError,
    StaleRunTokenError,
    StepFailedError,
    StorageUnavailableError,
    is_retryable,
)
from ..identity._handlers import Reply, Usage
from ..ledger._run_rules import DEFAULT_RUN_LEASE_TTL
from ..ledger._values import RunRequests, StepJournaled
from ..retry import RetryPolicy, retry_async
from ..turns._values import Decision as ApprovalDecision
from ._definition import (
    MAX_REASSIGNMENTS,
    AgentFailure,
    BudgetMeter,
    RunStatus,
    Step,
    StepContext,
    Workflow,
    WorkflowOutcome,
)
from ._journal import Journal, JournalState
from ._waits import Wait, waiter_identity

logger = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_POLL_INTERVAL = 0.2
"""Seconds between status polls while a run is paused."""
COMPENSATION_RETRY = RetryPolicy(max_attempts=3, base_delay=0.05)
INFRASTRUCTURE_RETRY = RetryPolicy(max_attempts=8, base_delay=0.2, max_delay=5.0)
"""Re-sends of one dispatch that met a failover or an outage rather than its handler's verdict.

The owner lost its lease mid-turn, no host could be reached, or the ledger or storage
was away: the turn left no effect (or, when the outcome is unknown, the same idempotency
key makes a re-send answer from the committed reply), so it is sent again under the same
key, without counting against the step's own retry policy, until the step timeout."""
_INFRASTRUCTURE_FAILURES = (LeaseLostError, FleetUnavailableError, LedgerUnavailableError, StorageUnavailableError)
TIMEOUT_GRACE = 1.0
"""Seconds the engine waits past a step timeout before giving up on a dispatcher that ignores it."""
STEP_LEASE_POLL = 0.05
"""Least wait before asking again for an exclusive step's lease that another holder still has."""


@dataclass(frozen=True, slots=True)
class JournalWith:
    """Asks a dispatch's turn to journal its reply as step ``label`` of ``run_id``, fenced by run token ``token``."""

    run_id: str
    label: str
    token: int


@dataclass(frozen=True, slots=True)
class StepReply:
    """A dispatch's reply, and what became of the step it was asked to journal (``None``: nothing was journaled)."""

    value: Any
    usage: Usage
    journaled: StepJournaled | None = None


@runtime_checkable
class Dispatcher(Protocol):
    """How the engine reaches agents (the fleet in production, a fake in tests)."""

    async def call(
        self,
        *,
        target: str,
        method: str,
        payload: dict[str, Any],
        idempotency_key: str,
        timeout: float,
        conversation: str | None = None,
        sequence: int | None = None,
        journal: JournalWith | None = None,
    ) -> tuple[Any, Usage] | StepReply:
        """Call ``method`` on ``target``; return ``(output, usage)`` or a :class:`StepReply`.

        A repeated ``idempotency_key`` must return the first reply without re-running.
        ``journal`` may be honoured by journaling the output with the turn's own durable
        write, under the run token it names, and saying so in ``StepReply.journaled``;
        a dispatcher that journals nothing returns ``journaled=None`` (or a tuple), and
        the engine journals the step itself.

        Raises:
            TimeoutError: (or ``DeadlineExceededError``) when ``timeout`` passes.
            RayfleetError: for any other failure.
        """
        ...

    async def select(self, labels: Mapping[str, str]) -> list[str]:
        """Identities of ACTIVE or DORMANT agents carrying every label, sorted."""
        ...

    async def ensure_waiter(self, identity: str) -> None:
        """Make sure a :class:`~rayfleet.workflow._waits.WorkflowWaiter` named ``identity`` exists (idempotent)."""
        ...

    async def retire_waiter(self, identity: str) -> None:
        """Delete the waiter named ``identity`` of a run that ended, if it exists (its decided approvals stay).

        Raises:
            RayfleetError: it could not be deleted now (the engine logs it and goes on).
        """
        ...


class StepOutcome(str, enum.Enum):
    """How one step of a run ended, as counted by ``rayfleet_workflow_steps``."""

    COMPLETED = "COMPLETED"
    """Dispatched, verified and journaled."""
    REPLAYED = "REPLAYED"
    """Found in the journal when the run resumed: re-derived, not dispatched again."""
    FAILED = "FAILED"
    """Failed for good (the run then compensates)."""
    COMPENSATED = "COMPENSATED"
    """Its compensation ran and succeeded."""
    COMPENSATION_FAILED = "COMPENSATION_FAILED"


class RunMetrics(Protocol):
    """What the engine reports for dashboards; calls must not block. :data:`NO_RUN_METRICS` drops them."""

    def run_started(self, workflow: str) -> None:
        """An engine took a run of ``workflow`` (new or resumed) and starts executing it."""
        ...

    def run_ended(self, workflow: str, status: RunStatus) -> None:
        """A run of ``workflow`` ended with ``status`` (COMPLETED, COMPENSATED, FAILED or CANCELLED)."""
        ...

    def step(self, workflow: str, outcome: StepOutcome) -> None:
        """One step of a run of ``workflow`` ended with ``outcome``."""
        ...


class _NoRunMetrics:
    __slots__ = ()

    def run_started(self, workflow: str) -> None:
        pass

    def run_ended(self, workflow: str, status: RunStatus) -> None:
        pass

    def step(self, workflow: str, outcome: StepOutcome) -> None:
        pass


NO_RUN_METRICS: RunMetrics = _NoRunMetrics()
"""The default :class:`RunMetrics`: reports nothing."""


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def _as_failure(label: str, error: BaseException) -> RayfleetError:
    """The run-level error for a step task that raised ``error``."""
    if isinstance(error, (StepFailedError, BudgetExceededError, RunCancelledError, StaleRunTokenError)):
        return error
    failure = StepFailedError(step=label, detail=f"{_describe(error)}; see the cause for details")
    failure.__cause__ = error
    return failure


def _unpack_reply(result: Any) -> tuple[Any, int, StepJournaled | None]:
    # Dispatchers return (output, Usage) or a StepReply; a Reply or a bare (output, None) is accepted too.
    if isinstance(result, StepReply):
        return result.value, max(0, result.usage.total_tokens), result.journaled
    if isinstance(result, Reply):
        return result.value, result.usage.total_tokens, None
    if isinstance(result, tuple) and len(result) == 2:
        output, usage = result
        tokens = usage.total_tokens if isinstance(usage, Usage) else int(usage or 0)
        return output, max(0, tokens), None
    raise TypeError(f"dispatcher.call must return (output, Usage) or a StepReply, got {type(result).__name__}")


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


class _ReadySteps:
    """The steps of a run not journaled yet, each ready once every step it comes ``after`` is journaled.

    Kept up to date step by step (:meth:`journaled`), so finding the ready steps costs
    what changed rather than a scan of every waiting step after each step (a long chain
    of steps was quadratic). Ready steps start in the workflow's order.
    """

    __slots__ = ("_dependents", "_position", "_ready", "_unmet")

    def __init__(self, order: list[str], steps: Mapping[str, Step], *, journaled: Mapping[str, Any]) -> None:
        self._position = {label: index for index, label in enumerate(order)}
        self._unmet: dict[str, set[str]] = {}
        self._dependents: dict[str, list[str]] = {}
        self._ready: list[tuple[int, str]] = []
        for label in order:
            if label in journaled:
                continue
            unmet = {dep for dep in steps[label].after if dep not in journaled}
            if not unmet:
                heapq.heappush(self._ready, (self._position[label], label))
                continue
            self._unmet[label] = unmet
            for dep in unmet:
                self._dependents.setdefault(dep, []).append(label)

    def journaled(self, label: str) -> None:
        """``label`` is journaled: the steps that waited only for it are ready."""
        for dependent in self._dependents.pop(label, ()):
            unmet = self._unmet[dependent]
            unmet.discard(label)
            if not unmet:
                del self._unmet[dependent]
                heapq.heappush(self._ready, (self._position[dependent], dependent))

    def first(self, count: int) -> list[str]:
        """Up to ``count`` ready steps, in the workflow's order (not yet started)."""
        return [label for _, label in heapq.nsmallest(count, self._ready)] if count > 0 else []

    def start(self, label: str) -> None:
        """``label``, the first ready step, is started."""
        first = self._ready[0][1] if self._ready else None
        if first != label:
            raise InternalError(detail=f"step {label!r} started before the ready step {first!r}")
        heapq.heappop(self._ready)


class WorkflowEngine:
    """Runs one workflow run to completion, compensation or cancellation.

    Guarantees:
        * The workflow is validated before anything is loaded or dispatched.
        * **One engine per run.** Before loading or dispatching anything the engine takes
          the run's lease (``holder``, ``lease_ttl``) from the journal, renews it every
          ``lease_ttl / 3`` while it runs and releases it when it ends. Every journal
          write presents the lease's token. When the journal refuses the token
          (``StaleRunTokenError``: another engine took the run over), the engine stops at
          once: it cancels its in-flight steps, starts nothing, compensates nothing,
          records no status and raises that error.
        * A step starts only after every step in its ``after`` is journaled; at most
          ``workflow.parallelism`` steps are in flight.
        * Journaled steps are never re-dispatched (replay); they count as completed
          for the saga, in their journaled order.
        * An exclusive step holds a step lease for its dispatch, verification and
          journaling (bounded by the step's timeout); one still held by another holder
          (a previous engine's dispatch) is waited for until it lapses. The lease is
          released on every exit path.
        * Step failures, budget breaches and cancellation never raise: they come back
          in the :class:`WorkflowOutcome`, which is recorded with the final status.
          Only invalid workflows (``InvalidSpecError``), a run held by another live
          engine (``RunOwnedElsewhereError``, nothing done), a lost run
          (``StaleRunTokenError``) and errors of the journal's lease, load and status
          calls raise.

    Args:
        workflow: the definition to run.
        run_id: the run's id; reusing it resumes the run from its journal.
        dispatcher: how steps reach agents.
        journal: where outputs, compensations, status and the run's leases are recorded.
        holder: who this engine is, as the run's lease names it (default: a fresh
            ``engine:<random>``).
        lease_ttl: seconds the run's lease lasts without renewal.
        takeover_from: a holder known to be dead whose live lease on the run may be
            taken at once (a restarted runner names its predecessor).
        sender: who the steps come from (defaults to the workflow's name); kept as
            ``engine.sender`` for dispatchers and logs, not passed through ``call``.
        clock: monotonic clock for the wall-clock budget (injectable for tests).
        poll_interval: seconds between status polls while paused.
        rng: random source for retry jitter.
        metrics: where runs and steps are counted for dashboards (nothing by default).
    """

    def __init__(
        self,
        workflow: Workflow,
        *,
        run_id: str,
        dispatcher: Dispatcher,
        journal: Journal,
        sender: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        rng: random.Random | None = None,
        holder: str | None = None,
        lease_ttl: float = DEFAULT_RUN_LEASE_TTL,
        takeover_from: str | None = None,
        metrics: RunMetrics = NO_RUN_METRICS,
    ) -> None:
        self._metrics = metrics
        if not isinstance(run_id, str) or not run_id:
            raise InvalidSpecError(f"run_id must be a non-empty string, got {run_id!r}", field="run_id")
        if holder is not None and (not isinstance(holder, str) or not holder):
            raise InvalidSpecError(f"holder must be a non-empty string, got {holder!r}", field="holder")
        if not isinstance(lease_ttl, (int, float)) or lease_ttl <= 0:
            raise InvalidSpecError(f"lease_ttl must be a positive number of seconds, got {lease_ttl!r}",
                                   field="lease_ttl")
        self.holder = holder if holder is not None else f"engine:{random.SystemRandom().getrandbits(48):012x}"
        self._lease_ttl = float(lease_ttl)
        self._takeover_from = takeover_from
        self._token = 0
        self._lost: StaleRunTokenError | None = None
        self._ending = False
        """The run's last status write, which releases its lease, is under way or done."""
        self._released = False
        """That write released the lease: nothing is left to release."""
        self._body: asyncio.Task[WorkflowOutcome] | None = None
        self.workflow = workflow
        self.run_id = run_id
        if sender is not None and (not isinstance(sender, str) or not sender):
            raise InvalidSpecError(f"sender must be a non-empty string, got {sender!r}", field="sender")
        self.sender = sender if sender is not None else workflow.name
        self._dispatcher = dispatcher
        self._journal = journal
        self._clock = clock
        self._poll_interval = poll_interval
        self._rng = rng
        self._steps: Mapping[str, Step] = workflow.steps
        self._meter = BudgetMeter(workflow.budget, clock)
        self._outputs: dict[str, Any] = {}
        self._completed: list[str] = []
        self._served_by: dict[str, tuple[str, ...]] = {}
        self._dispatched: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {}
        self._requests: RunRequests | None = None
        """What the last step's journal write answered was asked of the run; ``None`` once acted on."""

    # ------------------------------------------------------------------ run

    async def run(self) -> WorkflowOutcome:
        """Take the run's lease, run (or resume) the workflow under it, and report how it ended.

        Raises:
            InvalidSpecError: when the workflow is not valid (nothing is dispatched).
            RunOwnedElsewhereError: another live engine holds the run (nothing is done).
            StaleRunTokenError: the run was taken over while this engine ran it; this
                engine stopped without compensating or recording a status.
        """
        self.workflow.validate()
        self._lost = None
        self._ending = self._released = False
        # The wall clock starts before replay, so replay time counts against the budget.
        self._meter = BudgetMeter(self.workflow.budget, self._clock)
        started = await self._journal.start(self.run_id, self.holder, ttl=self._lease_ttl,
                                            takeover_from=self._takeover_from)
        self._token = started.token
        body = self._body = asyncio.create_task(self._run_owned(started.state), name=f"workflow:{self.run_id}")
        keeper = asyncio.create_task(self._keep_lease(), name=f"workflow:{self.run_id}:lease")
        try:
            return await body
        except asyncio.CancelledError:
            if self._lost is not None and body.cancelled():
                raise self._lost from None
            raise
        finally:
            keeper.cancel()
            if not body.done():
                body.cancel()
            await asyncio.gather(keeper, body, return_exceptions=True)
            if self._lost is None and not self._released:
                try:
                    await self._journal.release_lease(self.run_id, self.holder, self._token)
                except Exception as error:  # noqa: BLE001 - the lease lapses by TTL anyway
                    logger.warning("releasing the lease of run %r failed: %s", self.run_id, error)

    def _lose(self, error: StaleRunTokenError) -> None:
        """The run is someone else's now: remember why and stop everything this engine does for it."""
        if self._lost is None:
            logger.warning("engine %s lost run %r: %s", self.holder, self.run_id, error)
            self._lost = error
        if self._body is not None and not self._body.done():
            self._body.cancel()

    async def _fenced(self, write: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        """Make one journal write under the run's token; a refused token stops the engine."""
        if self._lost is not None:
            raise self._lost
        try:
            return await write(*args, token=self._token, **kwargs)
        except StaleRunTokenError as error:
            self._lose(error)
            raise

    async def _keep_lease(self) -> None:
        """Renew the run's lease every TTL/3 until cancelled or refused."""
        while True:
            await asyncio.sleep(self._lease_ttl / 3)
            try:
                await self._journal.renew_lease(self.run_id, self.holder, self._token)
            except StaleRunTokenError as error:
                if not self._ending:  # else the run's last status write released the lease meanwhile
                    self._lose(error)
                return
            except Exception as error:  # noqa: BLE001 - e.g. the ledger restarting: fencing, not renewal, decides
                logger.warning("renewing the lease of run %r failed (%s); retrying", self.run_id, error)

    async def _set_status(self, status: RunStatus, detail: str) -> RunRequests:
        return await self._fenced(self._journal.set_status, self.run_id, status, detail)

    async def _end(self, status: RunStatus, detail: str, outcome: WorkflowOutcome) -> None:
        """Record how the run ended, giving up its lease in the same write."""
        self._ending = True
        await self._fenced(self._journal.set_status, self.run_id, status, detail, outcome=outcome,
                           release=self.holder)
        self._released = True
        await self._retire_waiters()

    async def _retire_waiters(self) -> None:
        """The run ended: delete the waiters of its waiting steps, so they do not pile up among the
        fleet's agents. Never raises: a waiter left behind is only listed, never run again."""
        waiters = sorted({waiter_identity(self.run_id, step.wait, step.label)
                          for step in self.workflow.steps.values() if step.wait is not None})
        # Together: the run's outcome waits for the slowest one, never for their sum.
        results = await asyncio.gather(*(self._dispatcher.retire_waiter(identity) for identity in waiters),
                                       return_exceptions=True)
        for identity, result in zip(waiters, results, strict=True):
            if isinstance(result, BaseException):
                logger.warning("the waiter %s of ended run %r is left in the fleet: %s", identity, self.run_id, result)

    async def _run_owned(self, state: JournalState) -> WorkflowOutcome:
        order = self.workflow.order()
        self._steps = self.workflow.steps
        self._outputs = dict(state.outputs)
        journaled = [label for label in state.completion_order if label in self._outputs]
        journaled += [label for label in self._outputs if label not in journaled]
        # Journal labels of no declared step stay visible in outputs but are never compensated.
        self._completed = [label for label in journaled if label in self._steps]
        self._served_by = {}
        self._dispatched = {}
        replayed = len(self._completed)
        # What this write answers is as fresh as a read: the first steps start on it.
        self._requests = await self._set_status(
            RunStatus.RUNNING, f"resumed with {replayed} journaled step(s)" if replayed else "started",
        )
        name = self.workflow.name
        self._metrics.run_started(name)
        for _ in range(replayed):
            self._metrics.step(name, StepOutcome.REPLAYED)

        failure, cancelled = await self._schedule(order)
        if self._lost is not None:
            raise self._lost
        if failure is None:
            outcome = self._outcome(RunStatus.COMPLETED, None, (), {})
            await self._end(RunStatus.COMPLETED, "every step completed", outcome)
            self._metrics.run_ended(name, RunStatus.COMPLETED)
            return outcome

        compensated, compensation_errors = await self._compensate(set(state.compensated))
        if cancelled:
            status = RunStatus.CANCELLED
        else:
            status = RunStatus.FAILED if compensation_errors else RunStatus.COMPENSATED
        detail = str(failure)
        if compensation_errors:
            listing = "; ".join(f"{label}: {reason}" for label, reason in compensation_errors.items())
            detail += f" | compensation failed for {listing}; undo those steps by hand or rerun their compensation"
        outcome = self._outcome(status, failure, tuple(compensated), compensation_errors)
        await self._end(status, detail, outcome)
        self._metrics.run_ended(name, status)
        return outcome

    def _outcome(
        self, status: RunStatus, error: RayfleetError | None, compensated: tuple[str, ...],
        compensation_errors: dict[str, str],
    ) -> WorkflowOutcome:
        ordered = {label: self._outputs[label] for label in self.workflow.order() if label in self._outputs}
        ordered.update({label: self._outputs[label] for label in sorted(self._outputs) if label not in ordered})
        return WorkflowOutcome(
            run_id=self.run_id, status=status, outputs=ordered, compensated=compensated, error=error,
            usage_tokens=self._meter.tokens, invocations=self._meter.invocations,
            compensation_errors=dict(compensation_errors),
        )

    # ------------------------------------------------------------------ scheduling

    async def _schedule(self, order: list[str]) -> tuple[RayfleetError | None, bool]:
        """Start ready steps until all are done or one fails; return ``(failure, cancelled)``.

        After a failure no new step starts, but in-flight steps run to the end so the
        ones that succeed are journaled and compensated.
        """
        steps = _ReadySteps(order, self._steps, journaled=self._outputs)
        completed = len(self._completed)
        running: dict[asyncio.Task[None], str] = {}
        failure: RayfleetError | None = None
        cancelled = False
        paused = False
        parallelism = self.workflow.parallelism

        def reap(done: set[asyncio.Task[None]]) -> None:
            nonlocal failure
            for task in sorted(done, key=lambda t: running[t]):
                label = running.pop(task)
                error = task.exception()
                if isinstance(error, StaleRunTokenError):
                    self._lose(error)
                elif error is not None and failure is None:
                    self._metrics.step(self.workflow.name, StepOutcome.FAILED)
                    failure = _as_failure(label, error)
                elif error is not None:
                    self._metrics.step(self.workflow.name, StepOutcome.FAILED)
                    logger.warning("step %r of run %r also failed: %s", label, self.run_id, error)

        try:
            while True:
                if self._lost is not None:
                    return failure, cancelled  # the run is another engine's: start and finish nothing
                for label in self._completed[completed:]:
                    steps.journaled(label)
                completed = len(self._completed)
                ready = [] if failure is not None else steps.first(parallelism - len(running))
                if ready:
                    # What the last step's journal write answered is as fresh as a read; it is
                    # used once, so steps started for any other reason read the requests anew.
                    if self._requests is None:
                        _, cancel_requested, pause_requested = await self._journal.status(self.run_id)
                    else:
                        cancel_requested, pause_requested = self._requests.cancel, self._requests.pause
                        self._requests = None
                    if cancel_requested:
                        failure, cancelled = RunCancelledError(run_id=self.run_id), True
                    elif pause_requested:
                        if not paused:
                            paused = True
                            await self._set_status(
                                RunStatus.PAUSED, "pause requested: no new step starts; in-flight steps finish",
                            )
                        if running:
                            done, _ = await asyncio.wait(
                                running, timeout=self._poll_interval, return_when=asyncio.FIRST_COMPLETED)
                            reap(done)
                        else:
                            await asyncio.sleep(self._poll_interval)
                        continue
                    else:
                        if paused:
                            paused = False
                            await self._set_status(RunStatus.RUNNING, "resumed after pause")
                        for label in ready:
                            self._meter.charge_invocation()
                            try:
                                self._meter.check()
                            except BudgetExceededError as error:
                                failure = error
                                break
                            steps.start(label)
                            task = asyncio.create_task(self._run_step(self._steps[label]),
                                                       name=f"workflow:{self.run_id}:{label}")
                            running[task] = label
                if not running:
                    return failure, cancelled
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                reap(done)
        finally:
            # Only reached with tasks left when run() is cancelled, the run was lost, or a status call raised.
            for task in running:
                task.cancel()
            if running:
                await asyncio.gather(*running, return_exceptions=True)

    # ------------------------------------------------------------------ one step

    async def _run_step(self, step: Step) -> None:
        if step.wait is not None:
            await self._wait(step, step.wait)
        elif step.scatter is not None:
            output, tokens, served = await self._scatter(step)
            await self._finalize(step, output, tokens, served)
        else:
            await self._directed(step)  # finalizes itself, under the lease when exclusive
        # Post-dispatch check: the step is already journaled, so a breach compensates it too.
        self._meter.check()

    async def _wait(self, step: Step, wait: Wait) -> None:
        """Run a waiting step as a turn of its waiter, once per run (see ``workflow/_waits.py``).

        Its key does not change when the run resumes, so a resumed run's dispatch joins
        the turn still waiting rather than asking again. The engine journals the output
        itself: a rejected approval must fail the step, not be journaled as its output.
        """
        target = waiter_identity(self.run_id, wait, step.label)
        data = wait.data
        if wait.data_builder is not None:
            context = StepContext(run_id=self.run_id, outputs=MappingProxyType(dict(self._outputs)), attempt=1)
            try:
                data = await _maybe_await(wait.data_builder(context))
            except Exception as error:
                raise StepFailedError(step=step.label, detail=f"its approval data builder raised {_describe(error)}; "
                                      f"fix the builder (ctx.outputs holds {sorted(context.outputs)})") from error
        try:
            await self._dispatcher.ensure_waiter(target)
            output, tokens, _ = await self._call(
                target=target, method=step.call, payload=wait.payload(run_id=self.run_id, label=step.label, data=data),
                key=f"{self.run_id}/{step.label}/1-0", timeout=self._timeout_for(step.timeout))
        except (StepFailedError, BudgetExceededError, StaleRunTokenError):
            raise
        except Exception as error:
            remaining = self._meter.remaining_wall_clock()
            if isinstance(error, TimeoutError) and remaining is not None and remaining <= 0:
                self._meter.check()
            raise StepFailedError(step=step.label, detail=f"its wait ({wait.kind}) on {target!r} failed: "
                                  f"{_describe(error)}") from error
        if isinstance(output, ApprovalDecision) and not output.approved:
            comment = f" ({output.comment})" if output.comment else ""
            raise StepFailedError(step=step.label, detail=f"approval {wait.subject!r} was rejected by "
                                  f"{output.by!r}{comment}")
        await self._finalize(step, output, tokens, (target,))

    def _journal_with(self, step: Step) -> JournalWith | None:
        """What a directed step's dispatch asks its turn to journal, when the output needs no verdict first."""
        if step.verifier is not None or step.scatter is not None:
            return None  # journaled only once verified; a scatter's output is the gathered whole
        return JournalWith(run_id=self.run_id, label=step.label, token=self._token)

    async def _finalize(
        self, step: Step, output: Any, tokens: int, served: tuple[str, ...], journaled: StepJournaled | None = None,
    ) -> None:
        """Charge tokens, verify, then journal the output; dependents may start afterwards.

        ``journaled``: the dispatch's turn journaled the step already (under this
        engine's token), so only what it answered is taken: the requests, and, when an
        earlier attempt's output was journaled first, that output, which is the step's.
        """
        self._meter.charge_tokens(tokens)  # spent whether or not the output passes verification
        if journaled is not None:
            if not journaled.inserted:
                output = await self._journaled_output(step.label)
            self._requests = journaled.requests
            self._complete(step, output, served)
            return
        if step.verifier is not None:
            try:
                verdict = await _maybe_await(step.verifier(output))
            except Exception as error:
                raise StepFailedError(
                    step=step.label,
                    detail=f"its verifier raised {_describe(error)}; fix the verifier or the handler's output",
                ) from error
            if not verdict:
                raise StepFailedError(
                    step=step.label,
                    detail=f"its verifier rejected the output {repr(output)[:200]}; check the handler "
                    f"{step.call!r} or relax .verify()",
                )
        try:
            self._requests = await self._fenced(self._journal.record_step, self.run_id, step.label, output, tokens)
        except StaleRunTokenError:
            raise
        except Exception as error:
            raise StepFailedError(
                step=step.label,
                detail=f"journaling its output failed ({_describe(error)}); check the journal, then rerun "
                f"with the same run_id to resume",
            ) from error
        self._complete(step, output, served)

    def _complete(self, step: Step, output: Any, served: tuple[str, ...]) -> None:
        self._outputs[step.label] = output
        self._completed.append(step.label)
        self._served_by[step.label] = served
        self._metrics.step(self.workflow.name, StepOutcome.COMPLETED)

    async def _journaled_output(self, label: str) -> Any:
        """The output journaled for ``label`` (an earlier attempt's, journaled when it finished late)."""
        state = await self._journal.load(self.run_id)
        if label not in state.outputs:
            raise InternalError(detail=f"step {label!r} of run {self.run_id!r} was reported journaled but is not")
        logger.info("step %r of run %r: an earlier attempt's journaled output stands", label, self.run_id)
        return state.outputs[label]

    async def _build_payload(self, step: Step, attempt: int) -> dict[str, Any]:
        payload = step.payload
        if payload is None:
            return {}
        if isinstance(payload, Mapping):
            return dict(payload)
        context = StepContext(run_id=self.run_id, outputs=MappingProxyType(dict(self._outputs)), attempt=attempt)
        try:
            value = await _maybe_await(payload(context))
        except Exception as error:
            raise StepFailedError(
                step=step.label,
                detail=f"its payload builder raised {_describe(error)}; fix the builder "
                f"(ctx.outputs holds {sorted(context.outputs)})",
            ) from error
        if not isinstance(value, Mapping):
            raise StepFailedError(
                step=step.label,
                detail=f"its payload builder returned {type(value).__name__}, not a dict; return the "
                f"handler's keyword arguments as a dict",
            )
        return dict(value)

    def _timeout_for(self, seconds: float) -> float:
        remaining = self._meter.remaining_wall_clock()
        if remaining is None:
            return seconds
        self._meter.check()  # an exhausted budget fails the step rather than dispatching with no time
        return min(seconds, max(remaining, 1e-3))

    async def _call(
        self, *, target: str, method: str, payload: dict[str, Any], key: str, timeout: float,
        conversation: str | None = None, sequence: int | None = None, journal: JournalWith | None = None,
    ) -> tuple[Any, int, StepJournaled | None]:
        deadline = time.monotonic() + timeout
        for resend in range(INFRASTRUCTURE_RETRY.max_attempts):
            remaining = timeout if resend == 0 else max(deadline - time.monotonic(), 0.0)
            try:
                result = await within(
                    self._dispatcher.call(
                        target=target, method=method, payload=payload, idempotency_key=key, timeout=remaining,
                        conversation=conversation, sequence=sequence, journal=journal,
                    ),
                    remaining + TIMEOUT_GRACE,
                )
            except _INFRASTRUCTURE_FAILURES as error:
                pause = INFRASTRUCTURE_RETRY.delay_for(resend, rng=self._rng)
                if resend + 1 == INFRASTRUCTURE_RETRY.max_attempts or time.monotonic() + pause >= deadline:
                    raise
                logger.info("step dispatch %s to %r met %s; sending it again", key, target, type(error).__name__)
                await asyncio.sleep(pause)
                continue
            except TimeoutError as error:
                if isinstance(error, RayfleetError):
                    raise
                raise DeadlineExceededError(identity=target, method=method, timeout=timeout) from error
            return _unpack_reply(result)
        raise InternalError(detail=f"dispatch {key} ended its re-send loop without an answer")

    async def _with_retries(
        self, step: Step, target: str, *, epoch: int, counter: list[int], timeout: float,
        retry_timeouts: bool, payload: dict[str, Any] | None = None,
    ) -> tuple[Any, int, StepJournaled | None]:
        """Dispatch to ``target`` with the step's retry policy; raise the last error unchanged.

        ``counter`` numbers attempts across reassignments, so every dispatch of a step
        has its own idempotency key and lease holder. Returns ``(output, tokens,
        journaled)`` (see :meth:`_finalize`).
        """
        policy = step.retry
        for retry_index in range(policy.max_attempts):
            counter[0] += 1
            attempt = counter[0]
            body = payload if payload is not None else await self._build_payload(step, attempt)
            key = f"{self.run_id}/{step.label}/{attempt}-{epoch}"
            try:
                call_timeout = self._timeout_for(timeout)
                if step.exclusive:
                    return await self._dispatch_exclusive(step, target, body, key, call_timeout, attempt)
                return await self._call(target=target, method=step.call, payload=body, key=key,
                                        timeout=call_timeout, journal=self._journal_with(step))
            except (StepFailedError, BudgetExceededError, StaleRunTokenError):
                raise
            except Exception as error:
                remaining = self._meter.remaining_wall_clock()
                if isinstance(error, TimeoutError) and remaining is not None and remaining <= 0:
                    # The dispatch was cut short by the wall-clock budget, not by the step's timeout.
                    self._meter.check()
                last = retry_index == policy.max_attempts - 1
                if last or not is_retryable(error, handler_failures=True) or (
                    isinstance(error, TimeoutError) and not retry_timeouts
                ):
                    raise
                logger.info("step %r attempt %d on %r failed (%s); retrying", step.label, attempt, target, error)
                await asyncio.sleep(policy.delay_for(retry_index, rng=self._rng))
        # RetryPolicy refuses max_attempts < 1, so the loop always returns or raises.
        raise InternalError(detail=f"step {step.label!r} ended its retry loop without an attempt")

    async def _dispatch_exclusive(
        self, step: Step, target: str, payload: dict[str, Any], key: str, timeout: float, attempt: int,
    ) -> tuple[Any, int, StepJournaled | None]:
        """One dispatch under the step's fenced lease; verify and journal before releasing it."""
        holder = f"workflow:{self.run_id}:{step.label}:{attempt}"
        # The lease covers the dispatch (bounded by its timeout), then verification and journaling.
        step_token = await self._step_lease(step, holder, ttl=timeout + TIMEOUT_GRACE + self._lease_ttl)
        try:
            output, tokens, journaled = await self._call(
                target=target, method=step.call, payload=payload, key=key, timeout=timeout,
                conversation=f"{self.run_id}/{step.label}", sequence=step_token, journal=self._journal_with(step),
            )
            await self._finalize(step, output, tokens, (target,), journaled)
            return output, tokens, journaled
        finally:
            # Always released, on every path; a release error must not
            # mask the step's own result, and the lease lapses by TTL anyway.
            try:
                await self._journal.release_step_lease(self.run_id, step.label, holder, step_token)
            except Exception as error:  # noqa: BLE001 - must not mask the step's own result
                logger.warning("releasing the lease of step %r of run %r failed: %s", step.label, self.run_id, error)

    async def _step_lease(self, step: Step, holder: str, *, ttl: float) -> int:
        """The step's lease and fence; a lease another holder still has is waited for until it lapses.

        Only the run's current engine gets step leases (they are fenced by its token), so
        a lease held by someone else belongs to an earlier engine of this run whose
        dispatch may still be under way; it lapses within that dispatch's bound.
        """
        while True:
            if self._lost is not None:
                raise self._lost
            try:
                return int(await self._journal.acquire_step_lease(self.run_id, step.label, holder,
                                                                  token=self._token, ttl=ttl))
            except StaleRunTokenError as error:
                self._lose(error)
                raise
            except RunOwnedElsewhereError as held:
                self._meter.check()  # waiting spends the wall-clock budget like any dispatch
                logger.info("step %r of run %r: waiting %.1f s for %s's lease to lapse",
                            step.label, self.run_id, held.expires_in, held.owner)
                await asyncio.sleep(max(held.expires_in, STEP_LEASE_POLL))

    async def _pick_target(self, step: Step, excluded: list[str], last_error: BaseException | None) -> str:
        if step.to is not None:
            return step.to
        assert step.select is not None
        candidates = [agent for agent in await self._dispatcher.select(step.select.labels) if agent not in excluded]
        if candidates:
            return min(candidates)
        if excluded:
            raise StepFailedError(
                step=step.label,
                detail=f"timed out on {excluded} and no other capable agent is left to reassign to; "
                f"raise .timeout() or add agents labelled {dict(step.select.labels)}",
            ) from last_error
        raise StepFailedError(
            step=step.label,
            detail=f"no ACTIVE or DORMANT agent matches {dict(step.select.labels)}; spawn one with these labels "
            f"or fix select=",
        )

    async def _directed(self, step: Step) -> None:
        reassign = step.on_timeout == "reassign"
        epochs = 1 + MAX_REASSIGNMENTS if reassign else 1
        counter = [0]
        timed_out: list[str] = []
        last_error: BaseException | None = None
        for epoch in range(epochs):
            target = await self._pick_target(step, timed_out, last_error)
            final_epoch = epoch == epochs - 1
            try:
                output, tokens, journaled = await self._with_retries(
                    step, target, epoch=epoch, counter=counter, timeout=step.timeout,
                    retry_timeouts=not reassign or final_epoch,
                )
            except (StepFailedError, BudgetExceededError, StaleRunTokenError):
                raise
            except Exception as error:
                if reassign and not final_epoch and isinstance(error, TimeoutError):
                    if step.select is not None:
                        timed_out.append(target)
                    last_error = error
                    logger.info("step %r timed out on %r; reassigning", step.label, target)
                    continue
                raise StepFailedError(
                    step=step.label,
                    detail=f"{step.call!r} on {target!r} failed after {counter[0]} attempt(s): {_describe(error)}; "
                    f"fix the handler or add .retry(RetryPolicy(...)) for transient errors",
                ) from error
            if not step.exclusive:
                await self._finalize(step, output, tokens, (target,), journaled)
            return

    async def _scatter(self, step: Step) -> tuple[dict[str, Any], int, tuple[str, ...]]:
        """Call every matching agent concurrently; gather per the step's policy.

        Returns ``({identity: output} of successes, tokens of successes, identities)``.
        Calls still in flight once the policy decides are cancelled.
        """
        assert step.scatter is not None
        agents = sorted(await self._dispatcher.select(step.scatter.labels))
        if not agents:
            raise StepFailedError(
                step=step.label,
                detail=f"no ACTIVE or DORMANT agent matches {dict(step.scatter.labels)}; spawn agents with these "
                f"labels or fix scatter=",
            )
        payload = await self._build_payload(step, 1)  # one payload for the whole panel
        timeout = step.per_agent_timeout or step.timeout
        tasks = {
            asyncio.create_task(self._with_retries(
                step, agent, epoch=0, counter=[0], timeout=timeout, retry_timeouts=True, payload=payload,
            )): agent
            for agent in agents
        }
        # Done callbacks run in completion order, so replies are judged in the order they
        # arrived (FirstOf depends on it), not in the arbitrary order of a done set.
        arrivals: asyncio.Queue[asyncio.Task[tuple[Any, int, StepJournaled | None]]] = asyncio.Queue()
        for task in tasks:
            task.add_done_callback(arrivals.put_nowait)
        successes: dict[str, tuple[Any, int]] = {}
        failures: dict[str, str] = {}
        total = len(agents)
        decision = step.gather.decide(0, 0, total)
        try:
            while decision == "wait" and tasks:
                task = await arrivals.get()
                agent = tasks.pop(task)
                error = task.exception()
                if error is None:
                    output, tokens, _ = task.result()  # a scatter's agents journal nothing themselves
                    successes[agent] = (output, tokens)
                else:
                    failures[agent] = _describe(error)
                decision = step.gather.decide(len(successes), len(failures), total)
        finally:
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
        if decision != "done":
            listing = "; ".join(f"{agent}: {reason}" for agent, reason in failures.items()) or "none"
            raise StepFailedError(
                step=step.label,
                detail=f"gather {step.gather!r} not met: {len(successes)} of {total} agent(s) succeeded "
                f"(failures: {listing}); fix the failing agents or relax gather=",
            )
        # Agents still working when the policy decided may complete later: the saga must reach them too.
        self._dispatched[step.label] = (tuple(agents), payload)
        served = tuple(sorted(successes))
        # The result maps every agent that answered to its output, or to why it failed.
        output = {agent: successes[agent][0] if agent in successes else AgentFailure(failures[agent])
                  for agent in sorted([*successes, *failures])}
        tokens = sum(successes[agent][1] for agent in served)
        return output, tokens, served

    # ------------------------------------------------------------------ saga

    async def _compensate(self, already_done: set[str]) -> tuple[list[str], dict[str, str]]:
        """Undo completed steps in reverse completion order; return (compensated, errors by label)."""
        compensated: list[str] = []
        errors: dict[str, str] = {}
        for label in reversed(self._completed):
            step = self._steps[label]
            if step.compensation is None or label in already_done:
                continue
            try:
                await self._compensate_step(step)
            except Exception as error:  # noqa: BLE001 - any failure is recorded, the unwind goes on
                reason = _describe(error)
                errors[label] = reason
                ok = False
            else:
                compensated.append(label)
                ok, reason = True, ""
            self._metrics.step(self.workflow.name, StepOutcome.COMPENSATED if ok else StepOutcome.COMPENSATION_FAILED)
            try:
                await self._fenced(self._journal.record_compensation, self.run_id, label, ok, reason)
            except StaleRunTokenError:
                raise
            except Exception as error:  # noqa: BLE001 - a journal failure is a compensation failure
                errors.setdefault(label, f"journaling the compensation failed: {_describe(error)}")
        return compensated, errors

    async def _compensate_step(self, step: Step) -> None:
        assert step.compensation is not None
        output = self._outputs[step.label]
        request: dict[str, Any] | None = None
        if step.scatter is not None and step.label in self._dispatched:
            # Every agent the step was sent to, including those that finished after the gather decided.
            dispatched, request = self._dispatched[step.label]
            targets = list(dispatched)
        elif step.scatter is not None:
            targets = list(self._served_by.get(step.label) or (sorted(output) if isinstance(output, Mapping) else []))
        elif step.to is not None:
            targets = [step.to]
        else:
            # A replayed select step does not record who served it: the first capable agent undoes it.
            targets = list(self._served_by.get(step.label) or [])
            if not targets and step.select is not None:
                capable = sorted(await self._dispatcher.select(step.select.labels))
                if not capable:
                    raise StepFailedError(step=step.label, detail="no capable agent is left to run its compensation")
                targets = capable[:1]
        shared: dict[str, Any] | None = None
        if step.compensation_payload is not None:
            context = StepContext(run_id=self.run_id, outputs=MappingProxyType(dict(self._outputs)), attempt=1)
            value = await _maybe_await(step.compensation_payload(context))
            if not isinstance(value, Mapping):
                raise StepFailedError(step=step.label,
                                      detail=f"its compensation payload returned {type(value).__name__}, not a dict")
            shared = dict(value)
        problems: list[str] = []
        for target in targets:
            if shared is not None:
                payload = shared
            else:
                own = output.get(target) if step.scatter is not None and isinstance(output, Mapping) else output
                if (own is None or isinstance(own, AgentFailure)) and request is not None:
                    own = request  # a late finisher: undo what it was asked to do
                payload = dict(own) if isinstance(own, Mapping) else {"output": own}
            try:
                await self._compensate_one(step, target, payload)
            except Exception as error:  # noqa: BLE001 - collect every target's failure
                problems.append(f"{target}: {_describe(error)}")
        if problems:
            raise StepFailedError(step=step.label, detail=f"compensation {step.compensation!r} failed on "
                                  + "; ".join(problems))

    async def _compensate_one(self, step: Step, target: str, payload: dict[str, Any]) -> None:
        assert step.compensation is not None
        method, key = step.compensation, f"{self.run_id}/{step.label}/compensate"
        await retry_async(
            lambda: self._call(target=target, method=method, payload=payload, key=key, timeout=step.timeout),
            COMPENSATION_RETRY,
            # Compensations share one idempotency key, so retrying any error is safe.
            retry_on=lambda error: True,
            rng=self._rng,
        )
