"""Workflow steps that wait (``wf.approval``, ``wf.sleep``, ``wf.wait_signal``) on a real fleet.

A waiting step is a durable turn of a platform agent: the run survives its runner's
restart while it waits, the approval is in the fleet's registry, and a rejection fails
the step so the saga compensates.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import pytest
import ray

import rayfleet as rf

WAIT = 60.0


class Ledger(rf.Agent):
    """Books and refunds; counts each effect."""

    class State(rf.State):
        booked: int = 0
        refunded: int = 0
        paid: int = 0

    @rf.handler
    async def book(self, eur: int) -> int:
        self.state.booked += 1
        return eur

    @rf.handler
    async def unbook(self, output: int) -> None:
        self.state.refunded += 1

    @rf.handler
    async def pay(self, eur: int) -> int:
        self.state.paid += 1
        return eur

    @rf.handler
    async def report(self) -> dict[str, int]:
        return {"booked": self.state.booked, "refunded": self.state.refunded, "paid": self.state.paid}


def until(predicate: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + WAIT
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.05)
    return value


def refund_flow(name: str) -> rf.Workflow:
    wf = rf.Workflow(name)
    wf.step("book", to="books/main", call="book", payload={"eur": 500}).compensate("unbook")
    wf.approval("manager", subject="refund over 100 EUR", approvers=["alice"], after=["book"],
                data=lambda ctx: {"eur": ctx.outputs["book"]})
    wf.step("pay", to="books/main", call="pay", payload={"eur": 500}, after=["manager"])
    return wf


def waiters_of(fleet: rf.Fleet, run_id: str) -> list[str]:
    return [agent.identity for agent in fleet.list_agents() if agent.identity.startswith(f"workflow/{run_id}/")]


def pending_for(fleet: rf.Fleet, run_id: str) -> list[rf.ApprovalInfo]:
    return [info for info in fleet.approvals.list(identity="workflow/*") if info.data["run"] == run_id]


@pytest.mark.timeout(180)
def test_an_approval_step_survives_a_runner_restart_and_asks_once(fleet: rf.Fleet) -> None:
    fleet.spawn("books/main", Ledger)
    run_id = fleet.submit(refund_flow("refund-approved"))
    (request,) = until(lambda: pending_for(fleet, run_id), "the approval request")
    assert request.subject == "refund over 100 EUR" and request.approvers == ("alice",)
    assert request.data == {"run": run_id, "step": "manager", "data": {"eur": 500}}
    assert fleet.runs.get(run_id).status is rf.RunStatus.RUNNING

    runner = ray.get_actor("rayfleet-runner", namespace=fleet.config.namespace)
    ray.kill(runner, no_restart=False)  # Ray restarts it; the restarted runner resumes the run
    time.sleep(1.0)
    decided = fleet.approvals.resolve(request.id, approved=True, by="alice", comment="ok")
    assert decided.status == "APPROVED"

    outcome = fleet.runs.wait(run_id, timeout=WAIT)
    assert outcome.status is rf.RunStatus.COMPLETED, outcome.error
    decision = outcome.outputs["manager"]
    assert isinstance(decision, rf.Decision) and decision.approved and decision.by == "alice"
    assert fleet.agent("books/main").call("report") == {"booked": 1, "refunded": 0, "paid": 1}
    # The resumed run joined the waiting turn: still one request for the run.
    assert len([info for info in fleet.approvals.list(status=None, identity="workflow/*")
                if info.data["run"] == run_id]) == 1
    # The run's waiter is deleted with its end; the decision stays in the registry.
    until(lambda: not waiters_of(fleet, run_id), "the run's waiter to be deleted")
    kept = fleet.approvals.get(request.id)
    assert kept.status == "APPROVED" and kept.decided_by == "alice"


@pytest.mark.timeout(180)
def test_a_rejected_approval_fails_the_step_and_the_run_compensates(fleet: rf.Fleet) -> None:
    fleet.spawn("books/main", Ledger)
    run_id = fleet.submit(refund_flow("refund-rejected"))
    (request,) = until(lambda: pending_for(fleet, run_id), "the approval request")
    fleet.approvals.resolve(request.id, approved=False, by="alice", comment="too much")
    outcome = fleet.runs.wait(run_id, timeout=WAIT)
    assert outcome.status is rf.RunStatus.COMPENSATED
    assert isinstance(outcome.error, rf.StepFailedError) and outcome.error.step == "manager"
    assert "rejected by 'alice' (too much)" in str(outcome.error)
    assert fleet.agent("books/main").call("report") == {"booked": 1, "refunded": 1, "paid": 0}


@pytest.mark.timeout(180)
def test_sleep_and_a_signal_sent_before_its_step_starts(fleet: rf.Fleet) -> None:
    wf = rf.Workflow("paid-later")
    wf.sleep("cool-off", 0.3)
    wf.wait_signal("payment", "paid", after=["cool-off"], timeout=120)
    run_id = "paid-later-1"
    assert fleet.signal_run(run_id, "paid", {"eur": 42}) == 0  # nobody waits yet: kept
    started = time.monotonic()
    outcome = fleet.run(wf, run_id=run_id)
    assert outcome.status is rf.RunStatus.COMPLETED, outcome.error
    assert time.monotonic() - started >= 0.3
    assert outcome.outputs == {"cool-off": None, "payment": {"eur": 42}}
    until(lambda: not waiters_of(fleet, run_id), "the run's waiters to be deleted")
    # A signal to a run that has ended would be kept by nobody, forever: refused.
    with pytest.raises(rf.UsageError, match="has ended"):
        fleet.signal_run(run_id, "paid", {"eur": 1})
    assert not waiters_of(fleet, run_id)


@pytest.mark.timeout(180)
def test_a_signal_wait_that_times_out_fails_its_step(fleet: rf.Fleet) -> None:
    wf = rf.Workflow("never-paid")
    wf.wait_signal("payment", "paid", timeout=0.3)
    outcome = fleet.run(wf, run_id="never-paid-1")
    assert outcome.status is rf.RunStatus.COMPENSATED and outcome.compensated == ()
    assert isinstance(outcome.error, rf.StepFailedError) and outcome.error.step == "payment"
    assert "WaitTimeoutError" in str(outcome.error)


def test_bad_waiting_steps_are_refused_when_built() -> None:
    wf = rf.Workflow("bad")
    with pytest.raises(rf.InvalidSpecError, match="needs a subject"):
        wf.approval("a", subject="")
    with pytest.raises(rf.InvalidSpecError, match="on_timeout must be 'reject' or 'approve'"):
        wf.approval("a", subject="x", on_timeout="ignore")
    with pytest.raises(rf.InvalidSpecError, match="approvers must be a list of names"):
        wf.approval("a", subject="x", approvers="alice")
    with pytest.raises(rf.InvalidSpecError, match="finite number of seconds >= 0"):
        wf.sleep("s", -1)
    with pytest.raises(rf.InvalidSpecError, match="needs the signal's name"):
        wf.wait_signal("w", "")
    handle = wf.sleep("s", 1)
    with pytest.raises(rf.InvalidSpecError, match="cannot have a compensation"):
        handle.compensate("undo")
    assert list(wf.steps) == ["s"]  # nothing half-added


@pytest.mark.timeout(180)
def test_the_runner_deletes_the_waiters_an_ended_run_left_behind(fleet: rf.Fleet) -> None:
    wf = rf.Workflow("stray-signal")
    wf.sleep("nap", 0.05)
    run_id = "stray-signal-1"
    fleet.signal_run(run_id, "refunded", True)  # no step of the run will wait for it
    assert fleet.run(wf, run_id=run_id).status is rf.RunStatus.COMPLETED
    # The run's end deleted the waiters of its waiting steps; this one waited for none of them.
    assert waiters_of(fleet, run_id) == [f"workflow/{run_id}/signal/refunded"]
    # The runner sweeps for such waiters when it starts (and every 10 minutes after).
    with contextlib.suppress(ValueError):  # no runner yet: the submit below starts one
        ray.kill(ray.get_actor("rayfleet-runner", namespace=fleet.config.namespace), no_restart=False)
    other = rf.Workflow("wake-the-runner")
    other.sleep("nap", 0.05)
    assert fleet.runs.wait(fleet.submit(other), timeout=WAIT).status is rf.RunStatus.COMPLETED
    until(lambda: not waiters_of(fleet, run_id), "the runner to delete the waiter left behind")
