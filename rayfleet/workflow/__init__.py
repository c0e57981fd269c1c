"""Workflows: DAGs of agent calls with budgets, gather policies, fenced exclusivity and sagas."""

from __future__ import annotations

from ._definition import AgentFailure as AgentFailure
from ._definition import AllOf as AllOf
from ._definition import AnyOf as AnyOf
from ._definition import Budget as Budget
from ._definition import BudgetMeter as BudgetMeter
from ._definition import FirstOf as FirstOf
from ._definition import Quorum as Quorum
from ._definition import RunStatus as RunStatus
from ._definition import Select as Select
from ._definition import Step as Step
from ._definition import StepContext as StepContext
from ._definition import StepHandle as StepHandle
from ._definition import Workflow as Workflow
from ._definition import WorkflowOutcome as WorkflowOutcome
from ._engine import Dispatcher as Dispatcher
from ._engine import WorkflowEngine as WorkflowEngine
from ._journal import InMemoryJournal as InMemoryJournal
from ._journal import Journal as Journal
from ._journal import JournalState as JournalState

__all__ = [  # noqa: RUF022 - grouped by purpose
    # definition
    "Workflow",
    "StepHandle",
    "Step",
    "StepContext",
    # selection and gathering
    "AgentFailure",
    "Select",
    "AllOf",
    "AnyOf",
    "FirstOf",
    "Quorum",
    # budgets
    "Budget",
    "BudgetMeter",
    # running
    "WorkflowEngine",
    "Dispatcher",
    "Journal",
    "JournalState",
    "InMemoryJournal",
    "RunStatus",
    "WorkflowOutcome",
]
