"""Everything Ray: the ledger actor, host actors, the ``Fleet`` driver API and the CLI."""

from __future__ import annotations

from ._fleet import AgentRef as AgentRef
from ._fleet import Fleet as Fleet
from ._fleet import FleetConfig as FleetConfig
from ._fleet import connect as connect
from ._host import AgentHost as AgentHost
from ._ledger_actor import LedgerActor as LedgerActor
from ._llm import ChatClient as ChatClient
from ._llm import ChatMessage as ChatMessage
from ._llm import ChatModel as ChatModel
from ._llm import ChatReply as ChatReply
from ._llm import ScriptedModel as ScriptedModel
from ._llm import reply_with_usage as reply_with_usage
from ._workflow import RunInfo as RunInfo
from ._workflow import RunnerActor as RunnerActor

__all__ = [
    "ChatClient",
    "ChatMessage",
    "ChatModel",
    "ChatReply",
    "ScriptedModel",
    "reply_with_usage",
    "AgentHost",
    "AgentRef",
    "Fleet",
    "FleetConfig",
    "LedgerActor",
    "RunInfo",
    "RunnerActor",
    "connect",
]
