"""Workflows: DAGs of agent calls with budgets, gather policies, fenced exclusivity and sagas.

The names users write workflows with (``Workflow``, ``Budget``, ``Select``, ...) are
exported from :mod:`rayfleet`; this namespace holds the seams for running the engine
elsewhere: the ``Dispatcher`` and ``Journal`` contracts and the journal's state.
"""

from __future__ import annotations

from ._engine import Dispatcher as Dispatcher
from ._journal import Journal as Journal
from ._journal import JournalState as JournalState

__all__ = [
    "Dispatcher",
    "Journal",
    "JournalState",
]
