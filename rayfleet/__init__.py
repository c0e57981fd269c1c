"""rayfleet: durable, identity-first agents on Ray.

Each agent is a stable name with a durable continuity record, exactly one live owner
guarded by a lease whose fencing token is checked wherever state is written, and
Arrow-backed checkpoints. Start with :func:`connect`.
"""

from __future__ import annotations

from .errors import BudgetExceededError as BudgetExceededError
from .errors import DeadlineExceededError as DeadlineExceededError
from .errors import FleetUnavailableError as FleetUnavailableError
from .errors import HandlerError as HandlerError
from .errors import InvalidArgumentsError as InvalidArgumentsError
from .errors import InvalidSpecError as InvalidSpecError
from .errors import InvalidStateError as InvalidStateError
from .errors import LeaseLostError as LeaseLostError
from .errors import NotAddressableError as NotAddressableError
from .errors import NotWiredError as NotWiredError
from .errors import RayfleetError as RayfleetError
from .errors import RunCancelledError as RunCancelledError
from .errors import SnapshotError as SnapshotError
from .errors import StaleCheckpointVersionError as StaleCheckpointVersionError
from .errors import StaleFencingTokenError as StaleFencingTokenError
from .errors import StepFailedError as StepFailedError
from .errors import UnknownHandlerError as UnknownHandlerError
from .errors import UnknownIdentityError as UnknownIdentityError
from .identity import Addressability as Addressability
from .identity import Agent as Agent
from .identity import AgentSpec as AgentSpec
from .identity import ContinuityRecord as ContinuityRecord
from .identity import DeadLetter as DeadLetter
from .identity import DeadLetterReason as DeadLetterReason
from .identity import Durability as Durability
from .identity import Envelope as Envelope
from .identity import EventKind as EventKind
from .identity import IdentityEvent as IdentityEvent
from .identity import IdentityStatus as IdentityStatus
from .identity import LeaseInfo as LeaseInfo
from .identity import LifecycleState as LifecycleState
from .identity import NotInAgentContextError as NotInAgentContextError
from .identity import ParkedMessage as ParkedMessage
from .identity import Reply as Reply
from .identity import Retryable as Retryable
from .identity import RetryPolicy as RetryPolicy
from .identity import State as State
from .identity import TopologyPolicy as TopologyPolicy
from .identity import Usage as Usage
from .identity import handler as handler
from .platform import AgentRef as AgentRef
from .platform import ChatClient as ChatClient
from .platform import ChatMessage as ChatMessage
from .platform import ChatModel as ChatModel
from .platform import ChatReply as ChatReply
from .platform import Fleet as Fleet
from .platform import FleetConfig as FleetConfig
from .platform import RunInfo as RunInfo
from .platform import ScriptedModel as ScriptedModel
from .platform import connect as connect
from .platform import reply_with_usage as reply_with_usage
from .workflow import AgentFailure as AgentFailure
from .workflow import AllOf as AllOf
from .workflow import AnyOf as AnyOf
from .workflow import Budget as Budget
from .workflow import FirstOf as FirstOf
from .workflow import Quorum as Quorum
from .workflow import RunStatus as RunStatus
from .workflow import Select as Select
from .workflow import StepContext as StepContext
from .workflow import Workflow as Workflow
from .workflow import WorkflowOutcome as WorkflowOutcome

__version__ = "0.1.0"

__all__ = [
    # Entry point and driver API
    "AgentRef",
    "Fleet",
    "FleetConfig",
    "connect",
    # Defining agents
    "Agent",
    "AgentSpec",
    "Reply",
    "State",
    "Usage",
    "handler",
    # Models (LLM access for agents)
    "ChatClient",
    "ChatMessage",
    "ChatModel",
    "ChatReply",
    "ScriptedModel",
    "reply_with_usage",
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
    "Workflow",
    "WorkflowOutcome",
    # Delivery
    "DeadLetter",
    "DeadLetterReason",
    "Envelope",
    "ParkedMessage",
    "RetryPolicy",
    "Retryable",
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
    "FleetUnavailableError",
    "HandlerError",
    "InvalidArgumentsError",
    "InvalidSpecError",
    "InvalidStateError",
    "LeaseLostError",
    "NotAddressableError",
    "NotInAgentContextError",
    "NotWiredError",
    "RayfleetError",
    "RunCancelledError",
    "SnapshotError",
    "StaleCheckpointVersionError",
    "StaleFencingTokenError",
    "StepFailedError",
    "UnknownHandlerError",
    "UnknownIdentityError",
]
