"""The gateway's wire models: pydantic request and response bodies, built from rayfleet's frozen values.

These models are the one source of the OpenAPI document: a field added here is
documented, validated and serialised in one place. Requests are strict about keys
(``extra="forbid"``); responses mirror the public values (``rf.IdentityStatus``,
``rf.RunInfo``, ``rf.DeadLetter``, ...) field for field where JSON can carry them.
"""

from __future__ import annotations

from typing import Any, Literal

import pydantic
from pydantic_core import to_jsonable_python

from ..host._messages import DeadLetter, DeadLetterReason
from ..identity._values import Addressability, IdentityStatus, LifecycleState
from ..platform._runs_client import RunInfo
from ..roster._apply import ApplyReport
from ..topology._graph import Edge, LiveEdge
from ..topology._reconcile import ReconcileReport
from ..turns._values import ApprovalInfo, TimerInfo, TurnInfo
from ..workflow._definition import RunStatus

_DOTTED_NAME = r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*"
IMPORT_PATH_PATTERN = f"^{_DOTTED_NAME}:{_DOTTED_NAME}$"
"""``pkg.module:attribute``: dotted Python names on both sides of one colon."""


class _Request(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)


class _Response(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(frozen=True)


# --------------------------------------------------------------------------- query strings


class CallQuery(_Request):
    """Query of a call or a replay."""

    timeout: float | None = pydantic.Field(
        default=None, gt=0, description="Seconds to wait for the reply (default and maximum set by the operator)."
    )
    mode: Literal["queue", "steer", "interrupt", "reject"] | None = pydantic.Field(
        default=None, description="What the call does if the agent has a turn in progress (default: its on_busy).")


class StartTurnQuery(_Request):
    """Query of a turn's start."""

    mode: Literal["queue", "steer", "interrupt", "reject"] | None = pydantic.Field(
        default=None, description="What the message does if the agent has a turn in progress (default: its on_busy).")


class TurnEventsQuery(_Request):
    """Query of a turn's event stream."""

    after: str | None = pydantic.Field(
        default=None, min_length=1, max_length=100, pattern=r"^[0-9]+\.[0-9]+(\.[0-9]+)?$",
        description="Resume after this event id (as the Last-Event-ID header, which wins when both are given).")


class ListAgentsQuery(_Request):
    """Query of the agent listing."""

    label: list[str] = pydantic.Field(
        default_factory=list,
        description="Label filters 'key=value'; repeat for several (an agent must match all).",
    )
    limit: int | None = pydantic.Field(default=None, ge=1, description="Agents per page.")
    cursor: str | None = pydantic.Field(
        default=None, max_length=400, description="The next_cursor of the previous page (agents after it, by identity)."
    )


class ApplyRosterQuery(_Request):
    """Query of a roster apply."""

    dry_run: bool = pydantic.Field(default=False, description="Only report what applying would do.")
    prune: bool = pydantic.Field(default=False, description="Retire identities the roster does not list.")


class ListRunsQuery(_Request):
    """Query of the run listing."""

    status: RunStatus | None = pydantic.Field(default=None, description="Only runs with this status.")
    limit: int | None = pydantic.Field(default=None, ge=1, description="Runs per page.")
    cursor: str | None = pydantic.Field(
        default=None, pattern=r"^[0-9]{1,12}$", description="The next_cursor of the previous page."
    )


class TopologyQuery(_Request):
    """Query of a topology export."""

    format: Literal["json", "dot", "mermaid"] = pydantic.Field(
        default="json", description="'json' answers a document; 'dot' and 'mermaid' answer text."
    )


class DeadLettersQuery(_Request):
    """Query of the dead-letter listing."""

    identity: str | None = pydantic.Field(default=None, max_length=200, description="Only this identity's letters.")
    limit: int | None = pydantic.Field(default=None, ge=1, description="Letters to list, oldest first.")


class ApprovalsQuery(_Request):
    """Query of the approvals listing."""

    status: Literal["PENDING", "APPROVED", "REJECTED", "ALL"] = pydantic.Field(
        default="PENDING", description="Only approvals with this status (ALL: any).")
    identity: str | None = pydantic.Field(default=None, min_length=1, max_length=200,
                                          description="Only approvals of identities matching this glob (support/*).")
    run_id: str | None = pydantic.Field(default=None, min_length=1, max_length=200,
                                        description="Only approvals asked by the steps of this workflow run.")
    limit: int | None = pydantic.Field(default=None, ge=1, description="Approvals to list, oldest first.")


class TimersQuery(_Request):
    """Query of the timers listing."""

    identity: str | None = pydantic.Field(default=None, min_length=1, max_length=200,
                                          description="Only this identity's timers.")
    due_within: float | None = pydantic.Field(default=None, ge=0, description="Only timers due within these seconds.")
    limit: int | None = pydantic.Field(default=None, ge=1, description="Timers to list, soonest due first.")


# --------------------------------------------------------------------------- request bodies


class SignalRequest(_Request):
    """A signal's value and id."""

    value: Any = pydantic.Field(default=None, description="The signal's value (JSON); the waiting turn gets it.")
    signal_id: str | None = pydantic.Field(default=None, min_length=1, max_length=200,
                                           description="Repeat-safe id: the signal is recorded once per id.")


class DecisionRequest(_Request):
    """A decision on an approval."""

    approved: pydantic.StrictBool
    by: str = pydantic.Field(min_length=1, max_length=200, description="Who decides (one of its approvers, if any).")
    comment: str = pydantic.Field(default="", max_length=4000)
    data: Any = pydantic.Field(default=None, description="Data attached to the decision (JSON).")
    expect_version: int | None = pydantic.Field(
        default=None, ge=1, description="Decide only if the approval is still at this version (409 otherwise).")


class SubmitRunRequest(_Request):
    """A workflow to run in the fleet's runner, named by import path."""

    workflow: str = pydantic.Field(
        max_length=400, pattern=IMPORT_PATH_PATTERN,
        description="'pkg.module:attribute' naming an rf.Workflow, or a function returning one (called with params). "
        "The module must be one the operator allows (RAYFLEET_ALLOWED_MODULES).",
        examples=["myapp.workflows:book_trip"],
    )
    run_id: str | None = pydantic.Field(
        default=None, min_length=1, max_length=200,
        description="Run id to use; an unfinished run with this id is resumed. Default: a new id.",
    )
    params: dict[str, Any] = pydantic.Field(
        default_factory=dict, description="Keyword arguments for a workflow function (JSON values)."
    )


# --------------------------------------------------------------------------- responses


class ErrorDetail(_Response):
    type: str = pydantic.Field(description="The kind of problem: a rayfleet error class name or a gateway name.")
    message: str = pydantic.Field(description="What was wrong and what to do.")
    field: str | None = pydantic.Field(description="The request field at fault, if one is.")


class ErrorBody(_Response):
    """Every error answer."""

    error: ErrorDetail


class LeaseModel(_Response):
    fencing_token: int
    ttl_remaining: float
    healthy: bool = pydantic.Field(description="True while more than 20 % of the TTL remains.")


class AgentStatusModel(_Response):
    """What the fleet knows about one identity right now (rf.IdentityStatus)."""

    identity: str
    state: LifecycleState
    generation: int | None
    checkpoint_version: int | None
    runtime_id: str | None
    session_id: str | None
    lease: LeaseModel | None
    host: str | None
    paused: bool
    agent_class: str
    labels: dict[str, str]
    addressability: Addressability
    broken_reason: str

    @classmethod
    def of(cls, status: IdentityStatus) -> AgentStatusModel:
        lease = status.lease
        return cls(
            identity=status.identity, state=status.state, generation=status.generation,
            checkpoint_version=status.checkpoint_version, runtime_id=status.runtime_id,
            session_id=status.session_id,
            lease=None if lease is None else LeaseModel(fencing_token=lease.fencing_token,
                                                         ttl_remaining=lease.ttl_remaining, healthy=lease.healthy),
            host=status.host, paused=status.paused, agent_class=status.agent_class, labels=dict(status.labels),
            addressability=status.addressability, broken_reason=status.broken_reason,
        )


class AgentPage(_Response):
    agents: list[AgentStatusModel]
    next_cursor: str | None = pydantic.Field(description="Pass as cursor for the next page; null on the last page.")


class CallResult(_Response):
    identity: str
    method: str
    value: Any = pydantic.Field(description="What the handler returned, as JSON.")


class EdgeModel(_Response):
    a: str
    b: str

    @classmethod
    def of(cls, edge: Edge) -> EdgeModel:
        return cls(a=edge.a, b=edge.b)


class ReconcileReportModel(_Response):
    adopted: list[EdgeModel]
    wired: list[EdgeModel]
    unwired: list[EdgeModel]
    forgotten: list[EdgeModel]
    waiting: list[EdgeModel]
    failures: list[str]

    @classmethod
    def of(cls, report: ReconcileReport) -> ReconcileReportModel:
        def edges(items: tuple[Edge, ...]) -> list[EdgeModel]:
            return [EdgeModel.of(edge) for edge in items]

        return cls(adopted=edges(report.adopted), wired=edges(report.wired), unwired=edges(report.unwired),
                   forgotten=edges(report.forgotten), waiting=edges(report.waiting), failures=list(report.failures))


class ApplyReportModel(_Response):
    """What applying a roster did (or, with dry_run, would do) (rf.ApplyReport)."""

    created: list[str]
    updated: dict[str, list[str]] = pydantic.Field(description="Identity to the spec fields that changed.")
    unchanged: list[str]
    retired: list[str]
    topology: ReconcileReportModel | None = pydantic.Field(description="The reconcile that followed; null if dry_run.")
    dry_run: bool
    changed: bool

    @classmethod
    def of(cls, report: ApplyReport) -> ApplyReportModel:
        return cls(
            created=list(report.created), updated={k: list(v) for k, v in report.updated.items()},
            unchanged=list(report.unchanged), retired=list(report.retired),
            topology=None if report.topology is None else ReconcileReportModel.of(report.topology),
            dry_run=report.dry_run, changed=report.changed,
        )


class RunModel(_Response):
    """What the run registry knows about one run (rf.RunInfo)."""

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
    def of(cls, info: RunInfo) -> RunModel:
        return cls(
            run_id=info.run_id, workflow=info.workflow, status=info.status, detail=info.detail,
            code_version=info.code_version, cancel_requested=info.cancel_requested,
            pause_requested=info.pause_requested, submitted=info.submitted, created_at=info.created_at,
            updated_at=info.updated_at,
        )


class RunPage(_Response):
    runs: list[RunModel]
    next_cursor: str | None = pydantic.Field(description="Pass as cursor for the next page; null on the last page.")


class RunSubmitted(_Response):
    run_id: str


class RunCancelRequested(_Response):
    run_id: str
    cancel_requested: bool


class TopologyExport(_Response):
    format: Literal["json", "dot", "mermaid"]
    document: dict[str, Any] | None = pydantic.Field(description="The graph (nodes, edges) for format json.")
    text: str | None = pydantic.Field(description="The DOT or Mermaid source for those formats.")


class LiveEdgeModel(_Response):
    a: str
    b: str
    managed: bool = pydantic.Field(description="Wired by reconciliation (and unwired by it), or found live.")

    @classmethod
    def of(cls, edge: LiveEdge) -> LiveEdgeModel:
        return cls(a=edge.a, b=edge.b, managed=edge.managed)


class EdgeList(_Response):
    edges: list[LiveEdgeModel]


class DeadLetterModel(_Response):
    """A message that could not be handled (rf.DeadLetter); arguments that JSON cannot hold show as their repr."""

    id: int
    identity: str
    method: str
    reason: DeadLetterReason
    error: str
    attempts: int
    at: float
    message_id: str
    sender: str | None
    idempotency_key: str | None
    args: list[Any]
    kwargs: dict[str, Any]

    @classmethod
    def of(cls, letter: DeadLetter) -> DeadLetterModel:
        envelope = letter.envelope
        return cls(
            id=letter.id, identity=letter.identity, method=envelope.method, reason=letter.reason, error=letter.error,
            attempts=letter.attempts, at=letter.at, message_id=envelope.message_id, sender=envelope.sender,
            idempotency_key=envelope.idempotency_key,
            args=to_jsonable_python(list(envelope.args), fallback=repr),
            kwargs=to_jsonable_python(dict(envelope.kwargs), fallback=repr),
        )


class DeadLetterList(_Response):
    dead_letters: list[DeadLetterModel]


class ReplayResult(_Response):
    letter_id: int
    value: Any = pydantic.Field(description="What the handler returned to the replayed message, as JSON.")


class SignalSent(_Response):
    identity: str
    name: str
    woken: int = pydantic.Field(description="Suspended turns it resumed (0: kept until a turn waits for it).")


class ApprovalModel(_Response):
    """One approval of the registry (rf.ApprovalInfo)."""

    id: str
    identity: str
    turn_id: str
    run_id: str
    subject: str
    data: Any
    approvers: list[str]
    status: str
    version: int
    decided_by: str
    comment: str
    decision_data: Any
    created: float
    decided: float | None
    due: float | None
    on_timeout: str
    audit: list[dict[str, Any]]

    @classmethod
    def of(cls, info: ApprovalInfo) -> ApprovalModel:
        return cls(
            id=info.id, identity=info.identity, turn_id=info.turn_id, run_id=info.run_id, subject=info.subject,
            data=to_jsonable_python(info.data, fallback=repr), approvers=list(info.approvers), status=info.status,
            version=info.version, decided_by=info.decided_by, comment=info.comment,
            decision_data=to_jsonable_python(info.decision_data, fallback=repr), created=info.created,
            decided=info.decided, due=info.due, on_timeout=info.on_timeout, audit=[dict(entry) for entry in info.audit],
        )


class ApprovalList(_Response):
    approvals: list[ApprovalModel]


class TimerModel(_Response):
    """One reminder or schedule (rf.TimerInfo)."""

    identity: str
    name: str
    kind: str
    method: str
    payload: Any
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
    last_lateness: float | None

    @classmethod
    def of(cls, info: TimerInfo) -> TimerModel:
        return cls(
            identity=info.identity, name=info.name, kind=info.kind, method=info.method,
            payload=to_jsonable_python(info.payload, fallback=repr), next_due=info.next_due, every=info.every,
            cron=info.cron, tz=info.tz, overlap=info.overlap, catch_up=info.catch_up, created=info.created,
            last_fired=info.last_fired, fired=info.fired, missed=info.missed, late=info.late,
            last_lateness=info.last_lateness,
        )


class TimerList(_Response):
    timers: list[TimerModel]


class TimerChanged(_Response):
    identity: str
    name: str
    due_now: bool = False
    cancelled: bool = False


class TurnStarted(_Response):
    """A turn was started; follow it at ``events``."""

    identity: str
    method: str
    turn_id: str
    events: str = pydantic.Field(description="The path of its event stream (Server-Sent Events).")


class TurnModel(_Response):
    """One turn (rf.TurnInfo), with its value once this gateway saw it complete."""

    id: str
    identity: str
    method: str
    status: Literal["RUNNING", "SUSPENDED", "COMPLETED", "FAILED", "INTERRUPTED"]
    waiting_for: str = ""
    wake_at: float | None = None
    started: float = 0.0
    updated: float = 0.0
    steps: int = 0
    error: str = ""
    value: Any = pydantic.Field(default=None, description="The handler's value (COMPLETED turns this gateway "
                                                          "started; otherwise null).")

    @classmethod
    def of(cls, info: TurnInfo, value: Any = None) -> TurnModel:
        return cls(id=info.id, identity=info.identity, method=info.method, status=info.status.value,
                   waiting_for=info.waiting_for, wake_at=info.wake_at, started=info.started, updated=info.updated,
                   steps=info.steps, error=info.error, value=value)


class TurnCancelled(_Response):
    identity: str
    turn_id: str
    cancelled: bool = pydantic.Field(description="Whether the turn was in progress and is now interrupted.")
