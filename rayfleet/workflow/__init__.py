"""Workflows: DAGs of agent calls with budgets, gather policies, fenced exclusivity and sagas.

The names users write workflows with (``Workflow``, ``Budget``, ``Select``, ...) are
exported from :mod:`rayfleet`; this namespace holds the seams for running the engine
elsewhere: the ``Dispatcher`` and ``Journal`` contracts, the journal's state, and the
values a dispatcher takes and answers when it journals steps with their turns.
"""

from __future__ import annotations

from ._engine import Dispatcher as Dispatcher
from ._engine import JournalWith as JournalWith
from ._engine import StepReply as StepReply
from ._journal import Journal as Journal
from ._journal import JournalState as JournalState
from ._journal import StartedRun as StartedRun

__all__ = [
    "Dispatcher",
    "Journal",
    "JournalState",
    "JournalWith",
    "StartedRun",
    "StepReply",
]
