"""Workflow engine against an in-process fleet: scheduling, gathers, saga, resume, control, leases."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rayfleet.errors import (
    DeadlineExceededError,
    HandlerError,
    InternalError,
    InvalidSpecError,
    RunCancelledError,
    StepFailedError,
)
from rayfleet.retry import RetryPolicy
from rayfleet.workflow._definition import (
    AgentFailure,
    AllOf,
    AnyOf,
    FirstOf,
    Quorum,
    RunStatus,
    Select,
    Workflow,
)
from rayfleet.workflow._engine import StepOutcome, WorkflowEngine
from rayfleet.workflow._journal import InMemoryJournal

WORK = Select({"skill": "work"})


def engine(wf: Workflow, fleet: Any, journal: InMemoryJournal | None = None, run_id: str = "run-1",
           **options: Any) -> WorkflowEngine:
    return WorkflowEngine(wf, run_id=run_id, dispatcher=fleet, journal=journal or InMemoryJournal(), **options)


async def fail(identity: str, payload: dict[str, Any]) -> Any:
    raise HandlerError(identity=identity, method="boom", remote_type="ValueError", remote_message="bad input",
                       remote_traceback="")


async def test_linear_run_completes_and_passes_outputs(fleet) -> None:
    wf = Workflow("wf")
    wf.step("a", to="a1", call="work", payload={"n": 1})
    wf.step("b", to="a2", call="work", after=["a"], payload=lambda ctx: {"prev": ctx.outputs["a"]["n"] + 1})
    journal = InMemoryJournal()
    outcome = await engine(wf, fleet, journal).run()
    assert outcome.status is RunStatus.COMPLETED and outcome.error is None
    assert outcome.outputs == {"a": {"by": "a1", "n": 1}, "b": {"by": "a2", "prev": 2}}
    assert outcome.invocations == 2
    assert [status for status, _ in journal.history("run-1")] == [RunStatus.RUNNING, RunStatus.COMPLETED]


async def test_invalid_workflow_raises_before_anything_runs(fleet) -> None:
    wf = Workflow("wf")
    wf.step("a", to="a1", call="work", after=["missing"])
    with pytest.raises(InvalidSpecError):
        await engine(wf, fleet).run()
    assert fleet.calls == []


async def test_independent_steps_overlap(fleet) -> None:
    events: list[str] = []
    both_started = asyncio.Event()

    async def tracked(identity: str, payload: dict[str, Any]) -> Any:
        events.append(f"start:{identity}")
        if sum(e.startswith("start") for e in events) == 2:
            both_started.set()
        await asyncio.wait_for(both_started.wait(), 5)
        events.append(f"end:{identity}")
        return identity

    fleet.on("track", tracked)
    wf = Workflow("wf")
    wf.step("x", to="a1", call="track")
    wf.step("y", to="a2", call="track")
    wf.step("z", to="a3", call="work", after=["x", "y"])
    outcome = await engine(wf, fleet).run()
    assert outcome.status is RunStatus.COMPLETED
    assert events[:2] == ["start:a1", "start:a2"]
    assert {events[2], events[3]} == {"end:a1", "end:a2"}


async def test_parallelism_cap_is_respected(fleet) -> None:
    in_flight = 0
    peak = 0

    async def slow(identity: str, payload: dict[str, Any]) -> Any:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        for _ in range(5):
            await asyncio.sleep(0)
        in_flight -= 1
        return identity

    fleet.on("slow", slow)
    wf = Workflow("wf", parallelism=2)
    for i in range(5):
        wf.step(f"s{i}", to="a1", call="slow")
    outcome = await engine(wf, fleet).run()
    assert outcome.status is RunStatus.COMPLETED and peak == 2


async def test_dependents_start_only_after_journaling(fleet) -> None:
    journal = InMemoryJournal()
    seen: list[list[str]] = []

    async def check(identity: str, payload: dict[str, Any]) -> Any:
        seen.append(list((await journal.load("run-1")).outputs))
        return "ok"

    fleet.on("check", check)
    wf = Workflow("wf")
    wf.step("a", to="a1", call="work")
    wf.step("b", to="a1", call="check", after=["a"])
    await engine(wf, fleet, journal).run()
    assert seen == [["a"]]


# ------------------------------------------------------------------ gather policies


async def test_scatter_all_of_success(fleet) -> None:
    wf = Workflow("wf")
    wf.step("panel", scatter=WORK, call="work", payload={"q": 1})
    outcome = await engine(wf, fleet).run()
    assert outcome.outputs["panel"] == {a: {"by": a, "q": 1} for a in ("a1", "a2", "a3")}


async def test_scatter_all_of_failure_lists_failures(fleet) -> None:
    fleet.on("work", fail, identity="a2")
    wf = Workflow("wf")
    wf.step("panel", scatter=WORK, call="work")
    outcome = await engine(wf, fleet).run()
    assert outcome.status is RunStatus.COMPENSATED
    assert isinstance(outcome.error, StepFailedError) and outcome.error.step == "panel"
    assert "a2" in str(outcome.error) and "bad input" in str(outcome.error)


async def test_scatter_any_of_tolerates_failures(fleet) -> None:
    fleet.on("work", fail, identity="a1")
    fleet.on("work", fail, identity="a2")
    wf = Workflow("wf")
    wf.step("panel", scatter=WORK, call="work", gather=AnyOf())
    outcome = await engine(wf, fleet).run()
    assert outcome.status is RunStatus.COMPLETED
    panel = outcome.outputs["panel"]
    assert [agent for agent, out in panel.items() if not isinstance(out, AgentFailure)] == ["a3"]
    assert all(isinstance(panel[agent], AgentFailure) for agent in panel if agent != "a3")


async def test_scatter_any_of_fails_when_all_fail(fleet) -> None:
    fleet.on("work", fail)
    wf = Workflow("wf")
    wf.step("panel", scatter=WORK, call="work", gather=AnyOf())
    outcome = await engine(wf, fleet).run()
    assert outcome.status is RunStatus.COMPENSATED and outcome.error.step == "panel"


async def test_scatter_first_of_first_reply_decides(fleet) -> None:
    release = asyncio.Event()

    async def late(identity: str, payload: dict[str, Any]) -> Any:
        await release.wait()
        return identity

    async def quick_fail(identity: str, payload: dict[str, Any]) -> Any:
        release.set()
        await fail(identity, payload)

    fleet.on("work", late)
    fleet.on("work", quick_fail, identity="a3")
    wf = Workflow("wf")
    wf.step("panel", scatter=WORK, call="work", gather=FirstOf())
    outcome = await engine(wf, fleet).run()
    assert outcome.status is RunStatus.COMPENSATED and outcome.error.step == "panel"

    fleet2_release = asyncio.Event()

    async def quick(identity: str, payload: dict[str, Any]) -> Any:
        return identity

    async def never(identity: str, payload: dict[str, Any]) -> Any:
        await fleet2_release.wait()
        raise AssertionError("cancelled before")

    fleet.on("work", never)
    fleet.on("work", quick, identity="a2")
    outcome = await engine(wf, fleet, run_id="run-2").run()
    assert outcome.status is RunStatus.COMPLETED and outcome.outputs["panel"] == {"a2": "a2"}


async def test_scatter_quorum_two_of_three_with_one_failure(fleet) -> None:
    fleet.on("work", fail, identity="a1")
    wf = Workflow("wf")
    wf.step("panel", scatter=WORK, call="work", gather=Quorum(2))
    outcome = await engine(wf, fleet).run()
    assert outcome.status is RunStatus.COMPLETED
    panel = outcome.outputs["panel"]
    assert sorted(agent for agent, out in panel.items() if not isinstance(out, AgentFailure)) == ["a2", "a3"]
    assert isinstance(panel.get("a1", AgentFailure("not yet answered")), AgentFailure)


async def test_scatter_quorum_unreachable_fails(fleet) -> None:
    fleet.on("work", fail, identity="a1")
    fleet.on("work", fail, identity="a2")
    wf = Workflow("wf")
    wf.step("panel", scatter=WORK, call="work", gather=Quorum(2))
    outcome = await engine(wf, fleet).run()
    assert outcome.status is RunStatus.COMPENSATED and "Quorum(k=2)" in str(outcome.error)


async def test_scatter_with_no_matching_agent_fails(fleet) -> None:
    wf = Workflow("wf")
    wf.step("panel", scatter=Select({"skill": "none"}), call="work")
    outcome = await engine(wf, fleet).run()
    assert isinstance(outcome.error, StepFailedError) and "no ACTIVE or DORMANT agent" in str(outcome.error)


async def test_select_picks_first_capable_agent(fleet) -> None:
    wf = Workflow("wf")
    wf.step("s", select=WORK, call="work")
    outcome = await engine(wf, fleet).run()
    assert outcome.outputs["s"]["by"] == "a1"


async def test_select_without_capable_agent_fails(fleet) -> None:
    wf = Workflow("wf")
    wf.step("s", select=Select({"skill": "none"}), call="work")
    outcome = await engine(wf, fleet).run()
    assert outcome.error.step == "s" and "spawn one" in str(outcome.error)


# ------------------------------------------------------------------ saga


def three_steps(fail_third: bool = True) -> Workflow:
    wf = Workflow("wf")
    wf.step("one", to="a1", call="work", payload={"id": 1}).compensate("undo")
    wf.step("two", to="a2", call="work", payload={"id": 2}, after=["one"]).compensate("undo")
    wf.step("three", to="a3", call="boom" if fail_third else "work", after=["two"]).compensate("undo")
    return wf


async def test_saga_compensates_in_reverse_completion_order(fleet) -> None:
    fleet.on("boom", fail)
    journal = InMemoryJournal()
    outcome = await engine(three_steps(), fleet, journal).run()
    assert outcome.status is RunStatus.COMPENSATED
    assert outcome.compensated == ("two", "one")
    assert isinstance(outcome.error, StepFailedError) and outcome.error.step == "three"
    undo = fleet.dispatched("undo")
    assert [(c["target"], c["payload"]["id"]) for c in undo] == [("a2", 2), ("a1", 1)]
    assert [c["key"] for c in undo] == ["run-1/two/compensate", "run-1/one/compensate"]
    assert journal.compensations("run-1") == [("two", True, ""), ("one", True, "")]
    assert journal.history("run-1")[-1][0] is RunStatus.COMPENSATED


async def test_custom_compensation_payload_sees_the_output(fleet) -> None:
    fleet.on("boom", fail)
    wf = Workflow("wf")
    wf.step("one", to="a1", call="work", payload={"id": 7}).compensate(
        "undo", lambda ctx: {"refund": ctx.outputs["one"]["id"]})
    wf.step("two", to="a2", call="boom", after=["one"])
    await engine(wf, fleet).run()
    assert fleet.dispatched("undo")[0]["payload"] == {"refund": 7}


async def test_failed_compensation_gives_failed_with_both_errors(fleet) -> None:
    fleet.on("boom", fail)
    fleet.on("undo", fail, identity="a2")
    journal = InMemoryJournal()
    outcome = await engine(three_steps(), fleet, journal).run()
    assert outcome.status is RunStatus.FAILED
    assert outcome.error.step == "three"
    assert set(outcome.compensation_errors) == {"two"} and "bad input" in outcome.compensation_errors["two"]
    assert outcome.compensated == ("one",)
    assert fleet.counts[("a2", "undo")] == 3  # retried per the compensation policy
    status, detail = journal.history("run-1")[-1]
    assert status is RunStatus.FAILED and "three" in detail and "compensation failed for two" in detail


async def test_scatter_compensation_reaches_every_agent_that_completed(fleet) -> None:
    fleet.on("boom", fail)
    wf = Workflow("wf")
    wf.step("panel", scatter=WORK, call="work", payload={"v": 1}).compensate("undo")
    wf.step("next", to="a1", call="boom", after=["panel"])
    outcome = await engine(wf, fleet).run()
    assert outcome.status is RunStatus.COMPENSATED
    assert sorted(c["target"] for c in fleet.dispatched("undo")) == ["a1", "a2", "a3"]
    assert fleet.dispatched("undo")[0]["payload"] == {"by": "a1", "v": 1}


async def test_in_flight_siblings_finish_and_are_compensated(fleet) -> None:
    gate = asyncio.Event()

    async def slow(identity: str, payload: dict[str, Any]) -> Any:
        await gate.wait()
        return "slow-done"

    async def failing(identity: str, payload: dict[str, Any]) -> Any:
        gate.set()
        await fail(identity, payload)

    fleet.on("slow", slow)
    fleet.on("failing", failing)
    wf = Workflow("wf")
    wf.step("slow", to="a1", call="slow").compensate("undo")
    wf.step("bad", to="a2", call="failing")
    wf.step("later", to="a3", call="work", after=["slow"])
    outcome = await engine(wf, fleet).run()
    assert outcome.status is RunStatus.COMPENSATED and outcome.error.step == "bad"
    assert outcome.outputs == {"slow": "slow-done"} and outcome.compensated == ("slow",)
    assert fleet.counts[("a3", "work")] == 0


async def test_resume_skips_journaled_steps_and_compensates_them(fleet) -> None:
    fleet.on("boom", fail)
    journal = InMemoryJournal()
    await journal.seed_step("run-1", "one", {"id": 1, "by": "a1"}, 0)
    outcome = await engine(three_steps(), fleet, journal).run()
    assert fleet.counts[("a1", "work")] == 0
    assert fleet.counts[("a2", "work")] == 1
    assert outcome.outputs["one"] == {"id": 1, "by": "a1"}
    assert outcome.compensated == ("two", "one")
    assert outcome.invocations == 2


async def test_resume_skips_compensations_already_journaled(fleet) -> None:
    fleet.on("boom", fail)
    journal = InMemoryJournal()
    await journal.seed_step("run-1", "one", {"id": 1}, 0)
    await journal.seed_compensation("run-1", "one", True, "")
    outcome = await engine(three_steps(), fleet, journal).run()
    assert outcome.compensated == ("two",)
    assert fleet.counts[("a1", "undo")] == 0


async def test_completed_run_replays_without_dispatch(fleet) -> None:
    journal = InMemoryJournal()
    first = await engine(three_steps(fail_third=False), fleet, journal).run()
    calls = len(fleet.calls)
    second = await engine(three_steps(fail_third=False), fleet, journal).run()
    assert second.status is RunStatus.COMPLETED and second.outputs == first.outputs
    assert len(fleet.calls) == calls and second.invocations == 0


async def test_payload_builder_error_names_step_and_compensates(fleet) -> None:
    def broken(ctx: Any) -> dict[str, Any]:
        raise KeyError("missing")

    wf = Workflow("wf")
    wf.step("one", to="a1", call="work").compensate("undo")
    wf.step("two", to="a2", call="work", after=["one"], payload=broken)
    outcome = await engine(wf, fleet).run()
    assert outcome.status is RunStatus.COMPENSATED and outcome.compensated == ("one",)
    assert isinstance(outcome.error, StepFailedError) and outcome.error.step == "two"
    assert "payload builder raised KeyError" in str(outcome.error)
    assert fleet.counts[("a2", "work")] == 0


async def test_async_payload_builder_and_non_dict_result(fleet) -> None:
    async def builder(ctx: Any) -> dict[str, Any]:
        return {"attempt": ctx.attempt, "run": ctx.run_id}

    wf = Workflow("wf")
    wf.step("one", to="a1", call="work", payload=builder)
    wf.step("two", to="a1", call="work", payload=lambda ctx: [1, 2], after=["one"])
    outcome = await engine(wf, fleet).run()
    assert outcome.outputs["one"] == {"by": "a1", "attempt": 1, "run": "run-1"}
    assert "not a dict" in str(outcome.error)


@pytest.mark.parametrize("verifier", [lambda out: False, lambda out: 1 / 0])
async def test_verifier_false_or_raising_fails_the_step(fleet, verifier) -> None:
    journal = InMemoryJournal()
    wf = Workflow("wf")
    wf.step("one", to="a1", call="work").compensate("undo")
    wf.step("two", to="a2", call="work", after=["one"]).verify(verifier)
    outcome = await engine(wf, fleet, journal).run()
    assert outcome.error.step == "two" and "verifier" in str(outcome.error)
    assert outcome.compensated == ("one",)
    assert "two" not in (await journal.load("run-1")).outputs


# ------------------------------------------------------------------ cancel and pause


async def test_cancel_compensates_and_reports_cancelled(fleet) -> None:
    journal = InMemoryJournal()

    async def then_cancel(identity: str, payload: dict[str, Any]) -> Any:
        journal.request_cancel("run-1")
        return {"done": True}

    fleet.on("first", then_cancel)
    wf = Workflow("wf")
    wf.step("one", to="a1", call="first").compensate("undo")
    wf.step("two", to="a2", call="work", after=["one"])
    outcome = await engine(wf, fleet, journal).run()
    assert outcome.status is RunStatus.CANCELLED
    assert isinstance(outcome.error, RunCancelledError)
    assert outcome.compensated == ("one",) and fleet.counts[("a2", "work")] == 0
    assert journal.history("run-1")[-1][0] is RunStatus.CANCELLED


async def test_a_chain_reads_the_run_requests_from_its_journal_writes_not_once_per_step(fleet) -> None:
    # Each journal write answers what is asked of the run; a read of its own per step
    # would cost every step one more ledger round trip.
    class CountingJournal(InMemoryJournal):
        reads = 0

        async def status(self, run_id: str):  # type: ignore[no-untyped-def]
            CountingJournal.reads += 1
            return await super().status(run_id)

    wf = Workflow("wf")
    for index in range(10):
        wf.step(f"s{index}", to="a1", call="work", after=[f"s{index - 1}"] if index else ())
    outcome = await engine(wf, fleet, CountingJournal()).run()
    assert outcome.status is RunStatus.COMPLETED and len(outcome.outputs) == 10
    assert CountingJournal.reads == 0  # the RUNNING write answered them before the first step


async def test_a_cancel_asked_before_the_run_starts_is_answered_by_its_running_write(fleet) -> None:
    journal = InMemoryJournal()
    journal.request_cancel("run-1")
    wf = Workflow("wf")
    wf.step("a", to="a1", call="work")
    outcome = await engine(wf, fleet, journal).run()
    assert outcome.status is RunStatus.CANCELLED and fleet.counts[("a1", "work")] == 0
    assert [status for status, _ in journal.history("run-1")] == [RunStatus.RUNNING, RunStatus.CANCELLED]
    assert journal.owner("run-1")[0] is None


async def test_a_cancel_asked_while_parallel_steps_run_stops_the_steps_after_them(fleet) -> None:
    journal = InMemoryJournal()

    async def then_cancel(identity: str, payload: dict[str, Any]) -> Any:
        journal.request_cancel("run-1")
        return 1

    fleet.on("first", then_cancel)
    wf = Workflow("wf")
    wf.step("left", to="a1", call="work").compensate("undo")
    wf.step("right", to="a2", call="first").compensate("undo")
    wf.step("after", to="a1", call="work", after=["left", "right"])
    outcome = await engine(wf, fleet, journal).run()
    assert outcome.status is RunStatus.CANCELLED
    assert "after" not in outcome.outputs and set(outcome.compensated) == {"left", "right"}


async def test_pause_holds_new_steps_until_cleared(fleet) -> None:
    journal = InMemoryJournal()
    started_two = asyncio.Event()

    async def then_pause(identity: str, payload: dict[str, Any]) -> Any:
        journal.request_pause("run-1")
        return 1

    async def two(identity: str, payload: dict[str, Any]) -> Any:
        started_two.set()
        return 2

    fleet.on("first", then_pause)
    fleet.on("second", two)
    wf = Workflow("wf")
    wf.step("one", to="a1", call="first")
    wf.step("two", to="a2", call="second", after=["one"])
    task = asyncio.create_task(engine(wf, fleet, journal, poll_interval=0.01).run())
    while not any(status is RunStatus.PAUSED for status, _ in journal.history("run-1")):
        await asyncio.sleep(0.005)
    for _ in range(5):
        await asyncio.sleep(0.01)
    assert not started_two.is_set()
    journal.request_pause("run-1", paused=False)
    outcome = await asyncio.wait_for(task, 5)
    assert outcome.status is RunStatus.COMPLETED and started_two.is_set()
    statuses = [status for status, _ in journal.history("run-1")]
    assert statuses == [RunStatus.RUNNING, RunStatus.PAUSED, RunStatus.RUNNING, RunStatus.COMPLETED]


# ------------------------------------------------------------------ exclusive, reassign, retries


async def test_exclusive_step_is_fenced_and_releases_its_lease(fleet) -> None:
    wf = Workflow("wf")
    wf.step("pay", to="a1", call="work").exclusive()
    journal = InMemoryJournal()
    outcome = await engine(wf, fleet, journal).run()
    assert outcome.status is RunStatus.COMPLETED
    call = fleet.dispatched("work")[0]
    assert call["sequence"] == 1 and call["conversation"] == "run-1/pay"
    assert journal.step_lease_events == [("acquire", "workflow:run-1:pay:1", 1),
                                         ("release", "workflow:run-1:pay:1", None)]
    assert journal.step_holders("run-1") == {}


async def test_exclusive_lease_released_when_dispatch_fails(fleet) -> None:
    fleet.on("boom", fail)
    wf = Workflow("wf")
    wf.step("pay", to="a1", call="boom").exclusive()
    journal = InMemoryJournal()
    outcome = await engine(wf, fleet, journal).run()
    assert outcome.error.step == "pay"
    assert [event[0] for event in journal.step_lease_events] == ["acquire", "release"]
    assert journal.step_holders("run-1") == {}


async def test_exclusive_lease_released_when_verifier_fails(fleet) -> None:
    wf = Workflow("wf")
    wf.step("pay", to="a1", call="work").exclusive().verify(lambda out: False)
    wf.step("next", to="a1", call="work", after=["pay"]).exclusive()
    journal = InMemoryJournal()
    outcome = await engine(wf, fleet, journal).run()
    assert outcome.error.step == "pay" and journal.step_holders("run-1") == {}


async def test_reassign_on_timeout_picks_other_capable_agents(fleet) -> None:
    async def hang(identity: str, payload: dict[str, Any]) -> Any:
        await asyncio.sleep(10)

    fleet.on("work", hang, identity="a1")
    fleet.on("work", hang, identity="a2")
    wf = Workflow("wf")
    wf.step("job", select=WORK, call="work", timeout=0.05).exclusive().on_timeout("reassign")
    journal = InMemoryJournal()
    outcome = await engine(wf, fleet, journal).run()
    assert outcome.status is RunStatus.COMPLETED and outcome.outputs["job"]["by"] == "a3"
    calls = fleet.dispatched("work")
    assert [c["target"] for c in calls] == ["a1", "a2", "a3"]
    assert [c["key"] for c in calls] == ["run-1/job/1-0", "run-1/job/2-1", "run-1/job/3-2"]
    assert [c["sequence"] for c in calls] == [1, 2, 3]
    assert {c["conversation"] for c in calls} == {"run-1/job"}
    assert journal.step_holders("run-1") == {} and outcome.invocations == 1


async def test_reassign_gives_up_after_two_reassignments(fleet) -> None:
    async def hang(identity: str, payload: dict[str, Any]) -> Any:
        await asyncio.sleep(10)

    fleet.on("work", hang)
    fleet.agent("a4", skill="work")
    wf = Workflow("wf")
    wf.step("job", select=WORK, call="work", timeout=0.05).exclusive().on_timeout("reassign")
    journal = InMemoryJournal()
    outcome = await engine(wf, fleet, journal).run()
    assert outcome.error.step == "job" and "did not finish" in str(outcome.error)
    assert [c["target"] for c in fleet.dispatched("work")] == ["a1", "a2", "a3"]
    assert journal.step_holders("run-1") == {}


async def test_reassign_with_to_redispatches_with_new_epoch_and_fence(fleet) -> None:
    attempts = 0

    async def flaky(identity: str, payload: dict[str, Any]) -> Any:
        nonlocal attempts
        attempts += 1
        if attempts == 1:
            await asyncio.sleep(10)
        return "ok"

    fleet.on("flaky", flaky)
    wf = Workflow("wf")
    wf.step("job", to="a1", call="flaky", timeout=0.05).exclusive().on_timeout("reassign")
    outcome = await engine(wf, fleet).run()
    assert outcome.outputs["job"] == "ok"
    calls = fleet.dispatched("flaky")
    assert [(c["target"], c["key"], c["sequence"]) for c in calls] == [
        ("a1", "run-1/job/1-0", 1), ("a1", "run-1/job/2-1", 2)]


@pytest.mark.parametrize(
    "transient",
    [
        lambda identity: ConnectionError("reset"),
        lambda identity: DeadlineExceededError(identity=identity, method="work", timeout=1),
        lambda identity: HandlerError(identity=identity, method="work", remote_type="rayfleet.RetryableError",
                                      remote_message="busy", remote_traceback=""),
    ],
)
async def test_retryable_errors_are_retried_then_succeed(fleet, transient) -> None:
    attempts = 0

    async def flaky(identity: str, payload: dict[str, Any]) -> Any:
        nonlocal attempts
        attempts += 1
        if attempts < 3:
            raise transient(identity)
        return {"attempt": payload["attempt"]}

    fleet.on("flaky", flaky)
    wf = Workflow("wf")
    wf.step("job", to="a1", call="flaky", payload=lambda ctx: {"attempt": ctx.attempt},
            retry=RetryPolicy(max_attempts=3, base_delay=0.001, max_delay=0.01))
    outcome = await engine(wf, fleet).run()
    assert outcome.status is RunStatus.COMPLETED and outcome.outputs["job"] == {"attempt": 3}
    assert [c["key"] for c in fleet.dispatched("flaky")] == ["run-1/job/1-0", "run-1/job/2-0", "run-1/job/3-0"]
    assert outcome.invocations == 1


async def test_non_retryable_errors_are_not_retried(fleet) -> None:
    fleet.on("boom", fail)
    wf = Workflow("wf")
    wf.step("job", to="a1", call="boom", retry=RetryPolicy(max_attempts=3, base_delay=0.001))
    outcome = await engine(wf, fleet).run()
    assert outcome.error.step == "job" and fleet.counts[("a1", "boom")] == 1


async def test_retries_exhausted_fail_the_step(fleet) -> None:
    async def down(identity: str, payload: dict[str, Any]) -> Any:
        raise ConnectionError("down")

    fleet.on("down", down)
    wf = Workflow("wf")
    wf.step("job", to="a1", call="down", retry=RetryPolicy(max_attempts=2, base_delay=0.001))
    outcome = await engine(wf, fleet).run()
    assert "after 2 attempt(s)" in str(outcome.error) and fleet.counts[("a1", "down")] == 2


async def test_idempotency_key_format_and_dedup(fleet) -> None:
    wf = Workflow("wf")
    wf.step("a", to="a1", call="work")
    wf.step("b", scatter=WORK, call="work", after=["a"])
    journal = InMemoryJournal()
    await engine(wf, fleet, journal, run_id="r-9").run()
    keys = {(c["target"], c["key"]) for c in fleet.calls}
    assert keys == {("a1", "r-9/a/1-0"), ("a1", "r-9/b/1-0"), ("a2", "r-9/b/1-0"), ("a3", "r-9/b/1-0")}
    # A fresh journal with the same run id re-dispatches; the agents' dedup answers without re-running.
    before = sum(fleet.counts.values())
    outcome = await engine(wf, fleet, InMemoryJournal(), run_id="r-9").run()
    assert outcome.status is RunStatus.COMPLETED and sum(fleet.counts.values()) == before


async def test_unknown_handler_becomes_step_failure(fleet) -> None:
    wf = Workflow("wf")
    wf.step("job", to="a1", call="nope")
    outcome = await engine(wf, fleet).run()
    assert outcome.status is RunStatus.COMPENSATED and outcome.error.step == "job"
    assert isinstance(outcome.error.__cause__, AttributeError)


async def test_all_of_default_on_directed_step_is_ignored(fleet) -> None:
    wf = Workflow("wf")
    wf.step("job", to="a1", call="work", gather=AllOf())
    assert (await engine(wf, fleet).run()).status is RunStatus.COMPLETED


async def test_replayed_steps_compensate_in_journaled_completion_order(fleet) -> None:
    fleet.on("boom", fail)
    wf = Workflow("wf")
    wf.step("x", to="a1", call="work").compensate("undo")
    wf.step("y", to="a2", call="work").compensate("undo")
    wf.step("z", to="a3", call="boom", after=["x", "y"])
    journal = InMemoryJournal()
    await journal.seed_step("run-1", "y", {"v": "y"}, 0)
    await journal.seed_step("run-1", "x", {"v": "x"}, 0)
    state = await journal.load("run-1")
    assert state.completion_order == ("y", "x")
    outcome = await engine(wf, fleet, journal, sender="workflow:run-1").run()
    assert outcome.compensated == ("x", "y") and outcome.invocations == 1


class RecordingRunMetrics:
    """A ``RunMetrics`` that keeps what it was told."""

    def __init__(self) -> None:
        self.events: list[tuple[str, ...]] = []

    def run_started(self, workflow: str) -> None:
        self.events.append(("started", workflow))

    def run_ended(self, workflow: str, status: RunStatus) -> None:
        self.events.append(("ended", workflow, status.value))

    def step(self, workflow: str, outcome: StepOutcome) -> None:
        self.events.append(("step", workflow, outcome.value))


async def test_runs_and_steps_are_reported_to_the_metrics_port(fleet) -> None:
    fleet.on("boom", fail)
    metrics = RecordingRunMetrics()
    await engine(three_steps(), fleet, metrics=metrics).run()
    assert metrics.events == [
        ("started", "wf"), ("step", "wf", "COMPLETED"), ("step", "wf", "COMPLETED"), ("step", "wf", "FAILED"),
        ("step", "wf", "COMPENSATED"), ("step", "wf", "COMPENSATED"), ("ended", "wf", "COMPENSATED"),
    ]
    completed = RecordingRunMetrics()
    await engine(three_steps(fail_third=False), fleet, run_id="run-2", metrics=completed).run()
    assert completed.events[-1] == ("ended", "wf", "COMPLETED")


def test_ready_steps_follow_the_journal_in_the_workflows_order() -> None:
    from rayfleet.workflow._engine import _ReadySteps

    wf = Workflow("wf")
    wf.step("a", to="a1", call="work")
    wf.step("b", to="a1", call="work")
    wf.step("c", to="a1", call="work", after=["a", "b"])
    wf.step("d", to="a1", call="work", after=["a"])
    wf.step("e", to="a1", call="work", after=["c", "d"])
    steps = _ReadySteps(wf.order(), wf.steps, journaled={"b": 1})  # b was journaled by an earlier engine
    assert steps.first(8) == ["a"]
    steps.start("a")
    assert steps.first(8) == []
    steps.journaled("a")
    both = [label for label in wf.order() if label in ("c", "d")]
    assert steps.first(8) == both and steps.first(1) == both[:1]
    with pytest.raises(InternalError):
        steps.start(both[1])  # only the first ready step starts next
    steps.start(both[0])
    steps.start(both[1])
    steps.journaled("d")
    assert steps.first(8) == []  # e still waits for c
    steps.journaled("c")
    assert steps.first(8) == ["e"] and steps.first(0) == []
