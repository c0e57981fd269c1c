"""Public test doubles: run rayfleet's Ray-free parts in one process, deterministically.

Each public name of rayfleet is exported from exactly one namespace; these are the
ones meant for tests.
"""

from __future__ import annotations

from ..ledger._local import LocalLedgerClient as LocalLedgerClient
from ..llm._scripted import ScriptedModel as ScriptedModel
from ..llm._scripted_server import ScriptedModelServer as ScriptedModelServer
from ..llm._scripted_server import ScriptedReply as ScriptedReply
from ..workflow._journal import InMemoryJournal as InMemoryJournal
from ._clock import ManualClock as ManualClock

__all__ = [
    "InMemoryJournal",
    "LocalLedgerClient",
    "ManualClock",
    "ScriptedModel",
    "ScriptedModelServer",
    "ScriptedReply",
]
