"""Budgets: the meter's arithmetic and the engine's invocation, token and wall-clock breaches."""

from __future__ import annotations

from typing import Any

import pytest

from rayfleet.errors import BudgetExceededError, InvalidSpecError
from rayfleet.identity._handlers import Reply, Usage
from rayfleet.workflow._definition import Budget, BudgetMeter, RunStatus, Workflow
from rayfleet.workflow._engine import WorkflowEngine
from rayfleet.workflow._journal import InMemoryJournal


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_meter_allows_reaching_a_ceiling_and_refuses_exceeding_it() -> None:
    meter = BudgetMeter(Budget(invocations=2, tokens=10))
    meter.charge_invocation()
    meter.charge_invocation()
    meter.charge_tokens(10)
    meter.check()
    meter.charge_invocation()
    with pytest.raises(BudgetExceededError) as caught:
        meter.check()
    assert (caught.value.budget, caught.value.ceiling, caught.value.spent) == ("invocations", 2, 3)


def test_meter_checks_tokens_then_wall_clock() -> None:
    clock = FakeClock()
    meter = BudgetMeter(Budget(tokens=5, wall_clock=10.0), clock=clock)
    assert meter.started == 100.0 and meter.remaining_wall_clock() == 10.0
    clock.now = 111.0
    meter.charge_tokens(6)
    with pytest.raises(BudgetExceededError, match="tokens"):
        meter.check()
    meter.tokens = 0
    with pytest.raises(BudgetExceededError) as caught:
        meter.check()
    assert (caught.value.budget, caught.value.ceiling, caught.value.spent) == ("wall_clock", 10.0, 11.0)
    assert meter.remaining_wall_clock() == 0.0


def test_unbounded_meter_never_breaches() -> None:
    meter = BudgetMeter(None)
    for _ in range(1000):
        meter.charge_invocation()
    meter.charge_tokens(10**9)
    meter.check()
    assert meter.remaining_wall_clock() is None
    with pytest.raises(InvalidSpecError):
        meter.charge_tokens(-1)


def chain(budget: Budget, calls: tuple[str, ...] = ("work", "work", "work")) -> Workflow:
    wf = Workflow("wf", budget=budget)
    previous: tuple[str, ...] = ()
    for index, call in enumerate(calls, start=1):
        wf.step(f"s{index}", to="a1", call=call, after=previous).compensate("undo")
        previous = (f"s{index}",)
    return wf


async def test_invocation_breach_fails_before_dispatch(fleet) -> None:
    outcome = await WorkflowEngine(chain(Budget(invocations=2)), run_id="r", dispatcher=fleet,
                                   journal=InMemoryJournal()).run()
    assert outcome.status is RunStatus.COMPENSATED
    assert isinstance(outcome.error, BudgetExceededError) and outcome.error.budget == "invocations"
    assert (outcome.error.ceiling, outcome.error.spent) == (2, 3)
    assert fleet.counts[("a1", "work")] == 2
    assert outcome.compensated == ("s2", "s1")


async def test_token_breach_fails_after_journaling_and_compensates_that_step(fleet) -> None:
    async def costly(identity: str, payload: dict[str, Any]) -> Any:
        return Reply({"ok": True}, Usage(prompt_tokens=4, completion_tokens=3))

    fleet.on("costly", costly)
    journal = InMemoryJournal()
    outcome = await WorkflowEngine(chain(Budget(tokens=10), ("costly", "costly", "costly")), run_id="r",
                                   dispatcher=fleet, journal=journal).run()
    assert isinstance(outcome.error, BudgetExceededError)
    assert (outcome.error.budget, outcome.error.ceiling, outcome.error.spent) == ("tokens", 10, 14)
    assert outcome.usage_tokens == 14
    assert list((await journal.load("r")).outputs) == ["s1", "s2"]
    assert journal.tokens("r") == {"s1": 7, "s2": 7}
    assert outcome.compensated == ("s2", "s1")
    assert fleet.counts[("a1", "costly")] == 2


async def test_wall_clock_breach_with_injected_clock(fleet) -> None:
    clock = FakeClock()

    async def slow(identity: str, payload: dict[str, Any]) -> Any:
        clock.now += 6.0
        return "done"

    fleet.on("slow", slow)
    outcome = await WorkflowEngine(chain(Budget(wall_clock=10.0), ("slow", "slow", "slow")), run_id="r",
                                   dispatcher=fleet, journal=InMemoryJournal(), clock=clock).run()
    assert isinstance(outcome.error, BudgetExceededError) and outcome.error.budget == "wall_clock"
    assert (outcome.error.ceiling, outcome.error.spent) == (10.0, 12.0)
    assert outcome.compensated == ("s2", "s1")
    assert fleet.counts[("a1", "slow")] == 2


async def test_step_timeout_is_capped_by_remaining_wall_clock(fleet) -> None:
    clock = FakeClock()
    wf = Workflow("wf", budget=Budget(wall_clock=5.0))
    wf.step("s", to="a1", call="work", timeout=30.0)
    clock.now += 0  # the meter starts when run() starts
    outcome = await WorkflowEngine(wf, run_id="r", dispatcher=fleet, journal=InMemoryJournal(),
                                   clock=clock).run()
    assert outcome.status is RunStatus.COMPLETED
    assert fleet.calls[0]["timeout"] == 5.0


async def test_replayed_steps_cost_nothing(fleet) -> None:
    journal = InMemoryJournal()
    await journal.seed_step("r", "s1", "old", 100)
    await journal.seed_step("r", "s2", "old", 100)
    outcome = await WorkflowEngine(chain(Budget(invocations=1, tokens=1)), run_id="r", dispatcher=fleet,
                                   journal=journal).run()
    assert outcome.status is RunStatus.COMPLETED and outcome.invocations == 1 and outcome.usage_tokens == 0
