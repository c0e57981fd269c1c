"""The identity core: names, specs, agents, the ledger, snapshots and the host runtime.

Plain asyncio Python; nothing here imports Ray (``rayfleet.platform`` adapts it).
"""

from __future__ import annotations

from ._agent import Agent as Agent
from ._agent import AgentContext as AgentContext
from ._agent import NotInAgentContextError as NotInAgentContextError
from ._agent import Reply as Reply
from ._agent import State as State
from ._agent import Usage as Usage
from ._agent import handler as handler
from ._agent import resolve_agent_class as resolve_agent_class
from ._contracts import LedgerClient as LedgerClient
from ._contracts import LocalLedgerClient as LocalLedgerClient
from ._contracts import Router as Router
from ._delivery import DeadLetter as DeadLetter
from ._delivery import DeadLetterReason as DeadLetterReason
from ._delivery import DedupWindow as DedupWindow
from ._delivery import Envelope as Envelope
from ._delivery import FenceMap as FenceMap
from ._delivery import ParkedMessage as ParkedMessage
from ._delivery import Retryable as Retryable
from ._delivery import RetryPolicy as RetryPolicy
from ._ledger import Ledger as Ledger
from ._names import format_runtime_id as format_runtime_id
from ._names import parse_runtime_id as parse_runtime_id
from ._names import validate_identity as validate_identity
from ._runtime import HostRuntime as HostRuntime
from ._runtime import HostStatistics as HostStatistics
from ._snapshots import SnapshotStore as SnapshotStore
from ._spec import AgentSpec as AgentSpec
from ._types import Addressability as Addressability
from ._types import ContinuityRecord as ContinuityRecord
from ._types import Durability as Durability
from ._types import EventKind as EventKind
from ._types import IdentityEvent as IdentityEvent
from ._types import IdentityStatus as IdentityStatus
from ._types import LeaseGrant as LeaseGrant
from ._types import LeaseInfo as LeaseInfo
from ._types import LifecycleState as LifecycleState
from ._types import TopologyPolicy as TopologyPolicy

__all__ = [
    # Agents
    "Agent",
    "AgentContext",
    "AgentSpec",
    "NotInAgentContextError",
    "Reply",
    "State",
    "Usage",
    "handler",
    "resolve_agent_class",
    # Delivery
    "DeadLetter",
    "DeadLetterReason",
    "DedupWindow",
    "Envelope",
    "FenceMap",
    "ParkedMessage",
    "RetryPolicy",
    "Retryable",
    # Names and values
    "Addressability",
    "ContinuityRecord",
    "Durability",
    "EventKind",
    "IdentityEvent",
    "IdentityStatus",
    "LeaseGrant",
    "LeaseInfo",
    "LifecycleState",
    "TopologyPolicy",
    "format_runtime_id",
    "parse_runtime_id",
    "validate_identity",
    # Authorities and the runtime
    "HostRuntime",
    "HostStatistics",
    "Ledger",
    "LedgerClient",
    "LocalLedgerClient",
    "Router",
    "SnapshotStore",
]
