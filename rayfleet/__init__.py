"""rayfleet: durable, identity-first agents on Ray.

Each agent is a stable name with a durable continuity record, exactly one live owner
guarded by a lease whose fencing token is checked wherever state is written, and
Arrow-backed checkpoints. Start with :func:`connect`.
"""

from __future__ import annotations

from . import _version
from .chat._agent import ChatAgent as ChatAgent
from .chat._model import Model as Model
from .chat._peers import handoff as handoff
from .chat._peers import peer_tool as peer_tool
from .chat._tools import tool as tool
from .checkpoints._export import ExportReport as ExportReport
from .errors import AgentBusyError as AgentBusyError
from .errors import ApprovalConflictError as ApprovalConflictError
from .errors import BudgetExceededError as BudgetExceededError
from .errors import DeadlineExceededError as DeadlineExceededError
from .errors import DeliveryError as DeliveryError
from .errors import FleetMismatchError as FleetMismatchError
from .errors import FleetNotFoundError as FleetNotFoundError
from .errors import FleetUnavailableError as FleetUnavailableError
from .errors import HandlerError as HandlerError
from .errors import IdentityError as IdentityError
from .errors import InternalError as InternalError
from .errors import InvalidArgumentsError as InvalidArgumentsError
from .errors import InvalidSpecError as InvalidSpecError
from .errors import InvalidStateError as InvalidStateError
from .errors import LeaseLostError as LeaseLostError
from .errors import LedgerError as LedgerError
from .errors import LedgerSchemaError as LedgerSchemaError
from .errors import LedgerUnavailableError as LedgerUnavailableError
from .errors import ModelError as ModelError
from .errors import ModelRequestError as ModelRequestError
from .errors import ModelResponseError as ModelResponseError
from .errors import ModelTimeoutError as ModelTimeoutError
from .errors import ModelUnavailableError as ModelUnavailableError
from .errors import NonDeterminismError as NonDeterminismError
from .errors import NotAddressableError as NotAddressableError
from .errors import NotInAgentContextError as NotInAgentContextError
from .errors import NotWiredError as NotWiredError
from .errors import PeerCycleError as PeerCycleError
from .errors import RayfleetError as RayfleetError
from .errors import RetryableError as RetryableError
from .errors import RunCancelledError as RunCancelledError
from .errors import RunOwnedElsewhereError as RunOwnedElsewhereError
from .errors import SnapshotError as SnapshotError
from .errors import StaleCheckpointVersionError as StaleCheckpointVersionError
from .errors import StaleFencingTokenError as StaleFencingTokenError
from .errors import StaleRunTokenError as StaleRunTokenError
from .errors import StaleSequenceError as StaleSequenceError
from .errors import StepFailedError as StepFailedError
from .errors import StepOutcomeUnknownError as StepOutcomeUnknownError
from .errors import StepValueError as StepValueError
from .errors import StorageError as StorageError
from .errors import StorageUnavailableError as StorageUnavailableError
from .errors import TurnError as TurnError
from .errors import TurnInterruptedError as TurnInterruptedError
from .errors import UnknownApprovalError as UnknownApprovalError
from .errors import UnknownDeadLetterError as UnknownDeadLetterError
from .errors import UnknownHandlerError as UnknownHandlerError
from .errors import UnknownIdentityError as UnknownIdentityError
from .errors import UnknownRunError as UnknownRunError
from .errors import UnknownTurnEventError as UnknownTurnEventError
from .errors import UsageError as UsageError
from .errors import WaitTimeoutError as WaitTimeoutError
from .errors import WorkflowError as WorkflowError
from .host._messages import DeadLetter as DeadLetter
from .host._messages import DeadLetterReason as DeadLetterReason
from .host._messages import Envelope as Envelope
from .host._messages import ParkedMessage as ParkedMessage
from .host._reports import DeactivationReport as DeactivationReport
from .host._reports import DrainReport as DrainReport
from .host._reports import HostStatistics as HostStatistics
from .identity._agent import Agent as Agent
from .identity._agent import AgentSpec as AgentSpec
from .identity._handlers import Reply as Reply
from .identity._handlers import State as State
from .identity._handlers import Usage as Usage
from .identity._handlers import handler as handler
from .identity._values import Addressability as Addressability
from .identity._values import ContinuityRecord as ContinuityRecord
from .identity._values import Durability as Durability
from .identity._values import EventKind as EventKind
from .identity._values import IdentityEvent as IdentityEvent
from .identity._values import IdentityStatus as IdentityStatus
from .identity._values import LeaseInfo as LeaseInfo
from .identity._values import LifecycleState as LifecycleState
from .identity._values import TopologyPolicy as TopologyPolicy
from .ledger._values import HostInfo as HostInfo
from .llm._chat import ChatClient as ChatClient
from .llm._chat import ChatStream as ChatStream
from .llm._values import ChatDelta as ChatDelta
from .llm._values import ChatMessage as ChatMessage
from .llm._values import ChatModel as ChatModel
from .llm._values import ChatReply as ChatReply
from .llm._values import ToolCall as ToolCall
from .llm._values import reply_with_usage as reply_with_usage
from .platform._approvals_client import ApprovalsClient as ApprovalsClient
from .platform._fleet import Fleet as Fleet
from .platform._fleet import FleetConfig as FleetConfig
from .platform._fleet import connect as connect
from .platform._ref import AgentRef as AgentRef
from .platform._ref import CallOptions as CallOptions
from .platform._runs_client import RunInfo as RunInfo
from .platform._runs_client import RunsClient as RunsClient
from .platform._topology_client import TopologyClient as TopologyClient
from .platform._turn_handle import TurnHandle as TurnHandle
from .retry import RetryPolicy as RetryPolicy
from .roster._apply import ApplyReport as ApplyReport
from .turns._values import ApprovalInfo as ApprovalInfo
from .turns._values import Decision as Decision
from .turns._values import TimerInfo as TimerInfo
from .turns._values import TurnEvent as TurnEvent
from .turns._values import TurnInfo as TurnInfo
from .turns._values import TurnStatus as TurnStatus
from .workflow._definition import AgentFailure as AgentFailure
from .workflow._definition import AllOf as AllOf
from .workflow._definition import AnyOf as AnyOf
from .workflow._definition import Budget as Budget
from .workflow._definition import FirstOf as FirstOf
from .workflow._definition import Quorum as Quorum
from .workflow._definition import RunStatus as RunStatus
from .workflow._definition import Select as Select
from .workflow._definition import StepContext as StepContext
from .workflow._definition import StepHandle as StepHandle
from .workflow._definition import Workflow as Workflow
from .workflow._definition import WorkflowOutcome as WorkflowOutcome

__version__ = _version.VERSION

__all__ = [
    # Entry point and driver API
    "AgentRef",
    "CallOptions",
    "Fleet",
    "FleetConfig",
    "HostInfo",
    "DeactivationReport",
    "DrainReport",
    "ExportReport",
    "HostStatistics",
    "RunsClient",
    "ApprovalsClient",
    "TopologyClient",
    "connect",
    # Defining agents
    "Agent",
    "AgentSpec",
    "Reply",
    "State",
    "Usage",
    "handler",
    # Models (LLM access for agents)
    "ChatAgent",
    "ChatClient",
    "ChatDelta",
    "ChatMessage",
    "ChatModel",
    "ChatReply",
    "ChatStream",
    "Model",
    "ToolCall",
    "handoff",
    "peer_tool",
    "reply_with_usage",
    "tool",
    # Workflows
    "AgentFailure",
    "AllOf",
    "AnyOf",
    "Budget",
    "FirstOf",
    "Quorum",
    "RunInfo",
    "RunStatus",
    "Select",
    "StepContext",
    "StepHandle",
    "Workflow",
    "WorkflowOutcome",
    # Rosters
    "ApplyReport",
    # Delivery
    "DeadLetter",
    "DeadLetterReason",
    "Envelope",
    "ParkedMessage",
    "RetryPolicy",
    "RetryableError",
    # Values
    "Addressability",
    "ContinuityRecord",
    "Durability",
    "EventKind",
    "IdentityEvent",
    "IdentityStatus",
    "LeaseInfo",
    "LifecycleState",
    "TopologyPolicy",
    # Errors
    "BudgetExceededError",
    "DeadlineExceededError",
    "DeliveryError",
    "FleetMismatchError",
    "FleetNotFoundError",
    "FleetUnavailableError",
    "HandlerError",
    "IdentityError",
    "InternalError",
    "InvalidArgumentsError",
    "InvalidSpecError",
    "InvalidStateError",
    "LeaseLostError",
    "LedgerError",
    "LedgerSchemaError",
    "LedgerUnavailableError",
    "StorageError",
    "StorageUnavailableError",
    "ModelError",
    "ModelRequestError",
    "ModelResponseError",
    "ModelTimeoutError",
    "ModelUnavailableError",
    "NotAddressableError",
    "NotInAgentContextError",
    "NotWiredError",
    "PeerCycleError",
    "RayfleetError",
    "RunCancelledError",
    "RunOwnedElsewhereError",
    "SnapshotError",
    "StaleCheckpointVersionError",
    "StaleFencingTokenError",
    "StaleRunTokenError",
    "StaleSequenceError",
    "StepFailedError",
    "UnknownDeadLetterError",
    "UnknownHandlerError",
    "UnknownIdentityError",
    "UnknownRunError",
    "UsageError",
    "WorkflowError",
    "AgentBusyError",
    "ApprovalConflictError",
    "NonDeterminismError",
    "StepOutcomeUnknownError",
    "StepValueError",
    "TurnError",
    "TurnStatus",
    "TurnHandle",
    "TurnInfo",
    "TurnEvent",
    "Decision",
    "ApprovalInfo",
    "TimerInfo",
    "TurnInterruptedError",
    "UnknownApprovalError",
    "UnknownTurnEventError",
    "WaitTimeoutError",
]
