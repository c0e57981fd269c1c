"""A step dispatch that meets a failover or an outage is sent again under the same key.

The owner losing its lease mid-turn, no reachable host, the ledger or storage away: none
of these is the handler's verdict, so they neither fail the step (and compensate the run)
nor use up the step's own retries; the same idempotency key keeps the effect single.
"""

from __future__ import annotations

from typing import Any

import pytest

import rayfleet as rf
from rayfleet.workflow._definition import RunStatus, Workflow
from rayfleet.workflow._engine import WorkflowEngine
from rayfleet.workflow._journal import InMemoryJournal

FAILOVERS = [
    rf.LeaseLostError(identity="a1", detail="the lease was lost while the handler ran"),
    rf.FleetUnavailableError(detail="no live rayfleet host is registered"),
    rf.LedgerUnavailableError(location="sqlite:///l", detail="restarting", committed_unknown=True),
    rf.StorageUnavailableError(root="/s", detail="No space left on device"),
]


@pytest.mark.parametrize("failover", FAILOVERS, ids=lambda error: type(error).__name__)
async def test_a_dispatch_that_met_a_failover_is_sent_again_under_the_same_key(fleet: Any, failover: Exception) -> None:
    met: list[int] = []

    async def work_after_a_failover(identity: str, payload: dict[str, Any]) -> Any:
        if not met:
            met.append(1)
            raise failover
        return {"by": identity, **payload}

    fleet.on("work", work_after_a_failover)
    wf = Workflow("wf")
    wf.step("a", to="a1", call="work", payload={"n": 1}).compensate("undo")
    outcome = await WorkflowEngine(wf, run_id="run-1", dispatcher=fleet, journal=InMemoryJournal()).run()

    assert outcome.status is RunStatus.COMPLETED, outcome.error
    assert outcome.invocations == 1
    keys = [call["key"] for call in fleet.calls if call["method"] == "work"]
    assert len(keys) == 2 and keys[0] == keys[1]  # one dispatch, sent twice, one key
    assert fleet.dispatched("undo") == []  # nothing was compensated


async def test_a_handler_failure_is_still_the_steps_verdict(fleet: Any) -> None:
    async def fails(identity: str, payload: dict[str, Any]) -> Any:
        raise rf.HandlerError(identity=identity, method="work", remote_type="ValueError", remote_message="no",
                              remote_traceback="")

    fleet.on("work", fails)
    wf = Workflow("wf")
    wf.step("a", to="a1", call="work", payload={"n": 1})
    outcome = await WorkflowEngine(wf, run_id="run-1", dispatcher=fleet, journal=InMemoryJournal()).run()
    assert outcome.status is not RunStatus.COMPLETED
    assert len([call for call in fleet.calls if call["method"] == "work"]) == 1
