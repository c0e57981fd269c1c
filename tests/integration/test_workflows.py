"""The workflow driver on a real local Ray: sagas, concurrency, gathers, replay, fences, budgets, control.

Every test gets its own fleet (namespace and storage). Agents defined here are shipped
to the hosts by value. Handlers that must wait for something wait for a marker file
(bounded polling with ``asyncio.sleep``), so the tests prove orderings and overlaps by
events, never by wall-clock thresholds.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pydantic
import pytest
import ray
from ray_helpers import kill_actor

import rayfleet as rf
from rayfleet.demo import Bank, Booking, Reviewer

RUNNER = "rayfleet-runner"
WAIT = 60.0
"""Upper bound for anything the tests wait on; a healthy run finishes far sooner."""


# --------------------------------------------------------------------------- helpers (driver and agents)


async def _await_file(path: str, bound: float) -> bool:
    """Poll for ``path`` (bounded); True once it exists."""
    for _ in range(int(bound / 0.05)):
        if os.path.exists(path):
            return True
        await asyncio.sleep(0.05)
    return os.path.exists(path)


def _append(path: str, line: str) -> None:
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(line + "\n")
        handle.flush()


def wait_until(predicate: Callable[[], Any], *, what: str, timeout: float = WAIT, interval: float = 0.05) -> Any:
    """Bounded polling in the driver."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(interval)


def report(fleet: rf.Fleet, identity: str) -> dict[str, Any]:
    return fleet.agent(identity).call("report", timeout=WAIT)


# --------------------------------------------------------------------------- agents


class Quote(pydantic.BaseModel):
    """A pydantic step output (journaled as Arrow)."""

    items: list[int | str] = []
    note: str = ""


class Worker(rf.Agent):
    """A step target that counts its effects and can touch, wait for, and log marker files."""

    class State(rf.State):
        calls: int = 0
        tags: list[str] = pydantic.Field(default_factory=list)
        undone: list[str] = pydantic.Field(default_factory=list)

    @rf.handler
    async def work(
        self,
        tag: str = "",
        touch: str | None = None,
        wait_for: str | None = None,
        log: str | None = None,
        fail: str | None = None,
        fail_if: str | None = None,
        bound: float = 20.0,
    ) -> dict[str, Any]:
        if fail_if and os.path.exists(fail_if):
            raise ValueError(f"{self.identity} refuses while {fail_if} exists")
        self.state.calls += 1
        self.state.tags = [*self.state.tags, tag]
        if log:
            _append(log, f"start {tag}")
        if touch:
            Path(touch).touch()
        seen = None
        if wait_for:
            seen = await _await_file(wait_for, bound)
        if log:
            _append(log, f"end {tag}")
        if fail:
            raise ValueError(fail)
        return {"tag": tag, "by": self.identity, "seen": seen}

    @rf.handler
    async def table(self, tag: str = "") -> pa.Table:
        self.state.calls += 1
        self.state.tags = [*self.state.tags, tag]
        return pa.table({"seat": ["12A", "12B"], "price": [120, 95]})

    @rf.handler
    async def quote(self, tag: str = "", items: list[int | str] | None = None) -> Quote:
        self.state.calls += 1
        self.state.tags = [*self.state.tags, tag]
        return Quote(items=items if items is not None else [1, 2], note=tag)

    @rf.handler
    async def undo(self, tag: str = "?", **_: object) -> str:
        self.state.undone = [*self.state.undone, tag]
        return f"undid {tag}"

    @rf.handler
    async def broken_undo(self, **_: object) -> str:
        raise RuntimeError("the undo desk is closed")

    @rf.handler
    async def report(self) -> dict[str, Any]:
        return self.state.model_dump()


class Panelist(rf.Agent):
    """A scatter target whose behaviour comes from its ``mode`` label: ok, fail, slow or after-fail.

    ``after-fail`` succeeds only once a failing panelist of the same run has raised (it
    touches ``failed`` first), and half a second later, so its success reaches the
    engine after that failure.
    """

    class State(rf.State):
        votes: int = 0
        retracted: int = 0

    @rf.handler
    async def vote(self, release: str | None = None, done: str | None = None, failed: str | None = None,
                   **_: object) -> dict[str, Any]:
        mode = self.spec.labels.get("mode", "ok")
        if mode == "slow":
            await _await_file(str(release), 20.0)
        if mode == "after-fail":
            await _await_file(str(failed), 20.0)
            await asyncio.sleep(0.5)
        if mode == "fail":
            if failed:
                Path(failed).touch()
            raise ValueError(f"{self.identity} votes no")
        self.state.votes += 1
        if done:
            Path(done, self.identity.replace("/", "_")).touch()
        return {"by": self.identity}

    @rf.handler
    async def retract(self, **_: object) -> int:
        self.state.retracted += 1
        return self.state.retracted

    @rf.handler
    async def report(self) -> dict[str, Any]:
        return self.state.model_dump()


class Flaky(rf.Agent):
    """Fails with a retryable error while its flag file exists (removing it), then succeeds."""

    class State(rf.State):
        calls: int = 0

    @rf.handler
    async def reserve(self, flag: str, **_: object) -> dict[str, Any]:
        if os.path.exists(flag):
            os.remove(flag)
            raise rf.RetryableError("transient failure, try again")
        self.state.calls += 1
        return {"by": self.identity, "calls": self.state.calls}

    @rf.handler
    async def report(self) -> dict[str, Any]:
        return self.state.model_dump()


def spawn_workers(fleet: rf.Fleet, *names: str) -> None:
    for name in names:
        fleet.spawn(name, Worker)


def trip(amount: int, *, name: str = "book-trip") -> rf.Workflow:
    """The trip-booking saga of the README / smoke example."""
    wf = rf.Workflow(name, budget=rf.Budget(invocations=20, wall_clock=60.0, tokens=50_000))
    wf.step("flight", to="airline/main", call="reserve", payload=lambda ctx: {"trip": "T1"}) \
        .compensate("cancel").exclusive()
    wf.step("hotel", to="hotel/main", call="reserve", payload=lambda ctx: {"trip": "T1", "nights": 2},
            after=["flight"]).compensate("cancel")
    wf.step("reviews", scatter=rf.Select(labels={"role": "reviewer"}), call="review",
            payload=lambda ctx: {"trip": ctx.outputs["hotel"]["trip"]}, gather=rf.Quorum(2), after=["hotel"])
    wf.step("pay", to="bank/main", call="charge", payload=lambda ctx: {"trip": "T1", "amount": amount},
            after=["reviews"]).verify(lambda out: out["ok"])
    return wf


def spawn_trip_agents(fleet: rf.Fleet) -> None:
    fleet.spawn("airline/main", Booking)
    fleet.spawn("hotel/main", Booking)
    fleet.spawn("bank/main", Bank)
    for index in range(3):
        fleet.spawn(f"review/{index}", Reviewer, labels={"role": "reviewer"})


# --------------------------------------------------------------------------- 1-2. the trip saga


@pytest.mark.timeout(180)
def test_trip_saga_completes(fleet: rf.Fleet) -> None:
    spawn_trip_agents(fleet)
    outcome = fleet.run(trip(100), run_id="trip-ok")

    assert outcome.status is rf.RunStatus.COMPLETED and outcome.ok and outcome.error is None
    assert outcome.run_id == "trip-ok"
    assert list(outcome.outputs) == ["flight", "hotel", "reviews", "pay"]
    assert outcome.outputs["flight"] == {"trip": "T1", "by": "airline/main", "nights": 1, "ok": True}
    assert outcome.outputs["hotel"] == {"trip": "T1", "by": "hotel/main", "nights": 2, "ok": True}
    reviews = outcome.outputs["reviews"]
    assert len(reviews) == 2 and set(reviews) <= {"review/0", "review/1", "review/2"}
    assert all(review["reviewer"] == who for who, review in reviews.items())
    assert outcome.outputs["pay"] == {"ok": True, "trip": "T1", "amount": 100}
    # Quorum(2): the step is decided (and charged) on two replies of 40 + 10 tokens each.
    assert outcome.usage_tokens == 100
    assert outcome.invocations == 4
    assert outcome.compensated == () and outcome.compensation_errors == {}

    info = fleet.runs.get("trip-ok")
    assert info.status is rf.RunStatus.COMPLETED
    assert info.workflow == "book-trip" and info.submitted is False
    assert info.code_version == trip(100).code_version()
    assert [run.run_id for run in fleet.runs.list_runs(rf.RunStatus.COMPLETED)] == ["trip-ok"]
    assert fleet.runs.wait("trip-ok", timeout=WAIT).status is rf.RunStatus.COMPLETED

    assert report(fleet, "airline/main")["reservations"] == {"T1": 1}
    assert report(fleet, "hotel/main")["reservations"] == {"T1": 2}
    assert report(fleet, "airline/main")["cancelled"] == []


@pytest.mark.timeout(180)
def test_submitted_trip_saga_completes_in_the_runner(fleet: rf.Fleet) -> None:
    spawn_trip_agents(fleet)
    run_id = fleet.submit(trip(100))
    assert run_id.startswith("book-trip-")
    outcome = fleet.runs.wait(run_id, timeout=WAIT)
    assert outcome.status is rf.RunStatus.COMPLETED, outcome.error
    assert list(outcome.outputs) == ["flight", "hotel", "reviews", "pay"]
    assert outcome.usage_tokens == 100
    info = fleet.runs.get(run_id)
    assert info.status is rf.RunStatus.COMPLETED and info.submitted is True


@pytest.mark.timeout(180)
def test_declined_payment_compensates_in_reverse_completion_order(fleet: rf.Fleet) -> None:
    spawn_trip_agents(fleet)
    outcome = fleet.run(trip(5000), run_id="trip-declined")

    assert outcome.status is rf.RunStatus.COMPENSATED
    assert outcome.compensated == ("hotel", "flight")
    assert outcome.compensation_errors == {}
    assert isinstance(outcome.error, rf.StepFailedError)
    assert outcome.error.step == "pay"
    assert "card declined" in str(outcome.error)
    # The steps that completed stay journaled; the failed one is not.
    assert list(outcome.outputs) == ["flight", "hotel", "reviews"]
    with pytest.raises(rf.StepFailedError):
        outcome.raise_error()

    for desk in ("airline/main", "hotel/main"):
        state = report(fleet, desk)
        assert state["reservations"] == {}, desk
        assert state["cancelled"] == ["T1"], desk
        assert state["calls"] == 1, desk
    assert fleet.runs.get("trip-declined").status is rf.RunStatus.COMPENSATED


# --------------------------------------------------------------------------- 3. concurrency


@pytest.mark.timeout(180)
def test_independent_steps_overlap(fleet: rf.Fleet, tmp_path: Path) -> None:
    spawn_workers(fleet, "w/a", "w/b")
    started_a, started_b = str(tmp_path / "a.started"), str(tmp_path / "b.started")
    wf = rf.Workflow("overlap", parallelism=2)
    # Each step waits until the other has started: both can only see the other's marker if
    # they were in flight at the same time (with parallelism 1 the first would wait in vain).
    wf.step("a", to="w/a", call="work", payload={"tag": "a", "touch": started_a, "wait_for": started_b},
            timeout=25.0)
    wf.step("b", to="w/b", call="work", payload={"tag": "b", "touch": started_b, "wait_for": started_a},
            timeout=25.0)
    outcome = fleet.run(wf)
    assert outcome.status is rf.RunStatus.COMPLETED, outcome.error
    assert outcome.outputs["a"]["seen"] is True
    assert outcome.outputs["b"]["seen"] is True


@pytest.mark.timeout(180)
def test_parallelism_one_runs_independent_steps_one_at_a_time(fleet: rf.Fleet, tmp_path: Path) -> None:
    spawn_workers(fleet, "w/a", "w/b", "w/c")
    log = str(tmp_path / "events.log")
    wf = rf.Workflow("serial", parallelism=1)
    for name in ("a", "b", "c"):
        wf.step(name, to=f"w/{name}", call="work", payload={"tag": name, "log": log})
    outcome = fleet.run(wf)
    assert outcome.status is rf.RunStatus.COMPLETED, outcome.error
    events = Path(log).read_text().split("\n")[:-1]
    # Authored order, and every step ends before the next one starts.
    assert events == ["start a", "end a", "start b", "end b", "start c", "end c"]


# --------------------------------------------------------------------------- 4. gather policies


def spawn_panel(fleet: rf.Fleet, panel: str, modes: dict[str, str]) -> None:
    for name, mode in modes.items():
        fleet.spawn(f"{panel}/{name}", Panelist, labels={"panel": panel, "mode": mode},
                    retry=rf.RetryPolicy(max_attempts=1))


def vote(panel: str, gather: Any, release: Path | None = None, failed: Path | None = None) -> rf.Workflow:
    wf = rf.Workflow("vote")
    payload = {key: str(path) for key, path in (("release", release), ("failed", failed)) if path}
    wf.step("vote", scatter=rf.Select(labels={"panel": panel}), call="vote", gather=gather, payload=payload or None)
    return wf


@pytest.mark.timeout(180)
def test_allof_needs_every_agent(fleet: rf.Fleet) -> None:
    spawn_panel(fleet, "good", {"a": "ok", "b": "ok", "c": "ok"})
    spawn_panel(fleet, "mixed", {"a": "ok", "b": "fail", "c": "ok"})

    ok = fleet.run(vote("good", rf.AllOf()))
    assert ok.status is rf.RunStatus.COMPLETED, ok.error
    assert ok.outputs["vote"] == {f"good/{n}": {"by": f"good/{n}"} for n in "abc"}

    failed = fleet.run(vote("mixed", rf.AllOf()))
    assert failed.status is rf.RunStatus.COMPENSATED
    assert isinstance(failed.error, rf.StepFailedError) and failed.error.step == "vote"
    assert "mixed/b" in str(failed.error) and "votes no" in str(failed.error)
    assert "vote" not in failed.outputs


@pytest.mark.timeout(180)
def test_anyof_succeeds_on_one_success_and_fails_only_when_all_fail(fleet: rf.Fleet, tmp_path: Path) -> None:
    # some/b succeeds only after some/a has failed, so the outcome holds both replies.
    spawn_panel(fleet, "some", {"a": "fail", "b": "after-fail"})
    spawn_panel(fleet, "none", {"a": "fail", "b": "fail"})

    ok = fleet.run(vote("some", rf.AnyOf(), failed=tmp_path / "failed"))
    assert ok.status is rf.RunStatus.COMPLETED, ok.error
    assert ok.outputs["vote"]["some/b"] == {"by": "some/b"}
    assert isinstance(ok.outputs["vote"]["some/a"], rf.AgentFailure)  # an agent that failed maps to its error

    failed = fleet.run(vote("none", rf.AnyOf()))
    assert failed.status is rf.RunStatus.COMPENSATED
    assert isinstance(failed.error, rf.StepFailedError) and failed.error.step == "vote"
    assert "none/a" in str(failed.error) and "none/b" in str(failed.error)


@pytest.mark.timeout(180)
def test_firstof_the_first_reply_decides(fleet: rf.Fleet, tmp_path: Path) -> None:
    # The slow panelists cannot reply before the run has returned: they wait for a
    # release file the test creates afterwards, so the fast one's reply is the first.
    spawn_panel(fleet, "win", {"fast": "ok", "slow": "slow"})
    spawn_panel(fleet, "lose", {"fast": "fail", "slow": "slow"})
    release = tmp_path / "release"
    try:
        ok = fleet.run(vote("win", rf.FirstOf(), release))
        assert ok.status is rf.RunStatus.COMPLETED, ok.error
        assert ok.outputs["vote"] == {"win/fast": {"by": "win/fast"}}

        failed = fleet.run(vote("lose", rf.FirstOf(), release))
        assert failed.status is rf.RunStatus.COMPENSATED
        assert isinstance(failed.error, rf.StepFailedError) and failed.error.step == "vote"
        assert "lose/fast" in str(failed.error)
    finally:
        release.touch()
    # The slow ones were still running when the step was decided; they finish on release.
    assert wait_until(lambda: fleet.agent("win/slow").call("report", timeout=WAIT)["votes"] == 1,
                      what="the slow panelist to finish")


@pytest.mark.timeout(180)
def test_quorum_tolerates_failures_up_to_the_margin(fleet: rf.Fleet) -> None:
    spawn_panel(fleet, "q", {"a": "ok", "b": "fail", "c": "ok"})
    spawn_panel(fleet, "short", {"a": "ok", "b": "fail", "c": "fail"})

    ok = fleet.run(vote("q", rf.Quorum(2)))
    assert ok.status is rf.RunStatus.COMPLETED, ok.error
    assert ok.outputs["vote"]["q/a"] == {"by": "q/a"} and ok.outputs["vote"]["q/c"] == {"by": "q/c"}
    # The quorum is reached once two agents said yes; the third may not have answered by then
    # (under load its dispatch can be re-sent after a failover), and then it is not listed.
    if "q/b" in ok.outputs["vote"]:
        assert "votes no" in ok.outputs["vote"]["q/b"].error

    failed = fleet.run(vote("short", rf.Quorum(2)))
    assert failed.status is rf.RunStatus.COMPENSATED
    assert isinstance(failed.error, rf.StepFailedError) and failed.error.step == "vote"
    assert "of 3 agent(s) succeeded" in str(failed.error)
    assert "short/b" in str(failed.error) and "short/c" in str(failed.error)


@pytest.mark.timeout(180)
def test_scatter_compensation_reaches_every_agent_it_was_sent_to(fleet: rf.Fleet) -> None:
    # An agent that failed (or finished after the gather decided) may still have had an
    # effect, so the saga compensates every agent the step was sent to; compensations
    # must tolerate having nothing to undo.
    spawn_panel(fleet, "q", {"a": "ok", "b": "fail", "c": "ok"})
    spawn_workers(fleet, "w/end")
    wf = rf.Workflow("panel-saga")
    wf.step("vote", scatter=rf.Select(labels={"panel": "q"}), call="vote", gather=rf.Quorum(2)) \
        .compensate("retract")
    wf.step("end", to="w/end", call="work", payload={"fail": "boom"}, after=["vote"])
    outcome = fleet.run(wf)
    assert outcome.status is rf.RunStatus.COMPENSATED, outcome.compensation_errors
    assert outcome.compensated == ("vote",)
    assert [report(fleet, f"q/{n}")["retracted"] for n in "abc"] == [1, 1, 1]


@pytest.mark.timeout(180)
def test_scatter_compensation_reaches_an_agent_that_completed_after_the_quorum(
    fleet: rf.Fleet, tmp_path: Path,
) -> None:
    spawn_panel(fleet, "q", {"a": "ok", "b": "ok", "c": "slow"})
    spawn_workers(fleet, "w/end")
    release, done = tmp_path / "release", tmp_path / "done"
    done.mkdir()
    wf = rf.Workflow("late-panel")
    wf.step("vote", scatter=rf.Select(labels={"panel": "q"}), call="vote", gather=rf.Quorum(2),
            payload={"release": str(release), "done": str(done)}).compensate("retract")
    # The next step lets the slow panelist finish its vote, waits until it has, then fails.
    wf.step("end", to="w/end", call="work", after=["vote"],
            payload={"touch": str(release), "wait_for": str(done / "q_c"), "fail": "boom"})
    try:
        outcome = fleet.run(wf)
    finally:
        release.touch()
    assert outcome.status is rf.RunStatus.COMPENSATED, outcome.compensation_errors
    assert outcome.outputs["vote"] == {"q/a": {"by": "q/a"}, "q/b": {"by": "q/b"}}
    states = {n: report(fleet, f"q/{n}") for n in "abc"}
    assert [states[n]["votes"] for n in "abc"] == [1, 1, 1]  # all three voted
    assert [states[n]["retracted"] for n in "abc"] == [1, 1, 1], states


# --------------------------------------------------------------------------- 5. replay after a runner restart


def blocking_chain(tmp_path: Path, name: str) -> tuple[rf.Workflow, Path, Path]:
    """s1 (an Arrow table) -> s2 (a pydantic model) -> s3, which blocks until a release file exists."""
    started, release = tmp_path / f"{name}.started", tmp_path / f"{name}.release"
    wf = rf.Workflow(name)
    wf.step("s1", to="w/1", call="table", payload={"tag": "s1"})
    wf.step("s2", to="w/2", call="quote", payload={"tag": "s2"}, after=["s1"])
    wf.step("s3", to="w/3", call="work", after=["s2"],
            payload={"tag": "s3", "touch": str(started), "wait_for": str(release), "bound": 40.0})
    return wf, started, release


def _runner_pid(fleet: rf.Fleet) -> int:
    runner = ray.get_actor(RUNNER, namespace=fleet.config.namespace)
    return int(ray.get(runner.__ray_call__.remote(lambda actor: os.getpid()), timeout=WAIT))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def kill_runner_midway(fleet: rf.Fleet, tmp_path: Path, name: str) -> tuple[str, Path, int]:
    """Submit the blocking chain, wait until s3 is in flight, then kill the runner (Ray restarts it).

    Returns the run id, the release file of s3 and the killed runner's process id.
    """
    spawn_workers(fleet, "w/1", "w/2", "w/3")
    wf, started, release = blocking_chain(tmp_path, name)
    run_id = fleet.submit(wf, run_id=f"{name}-1")
    try:
        wait_until(started.exists, what="s3 to start")
        assert fleet.runs.get(run_id).status is rf.RunStatus.RUNNING
        # s1 and s2 are journaled (s3 runs after them) and each ran once.
        assert report(fleet, "w/1")["calls"] == 1 and report(fleet, "w/2")["calls"] == 1
        pid = _runner_pid(fleet)
        ray.kill(ray.get_actor(RUNNER, namespace=fleet.config.namespace), no_restart=False)
    except BaseException:
        release.touch()
        raise
    return run_id, release, pid


def assert_each_step_ran_once(fleet: rf.Fleet, outcome: rf.WorkflowOutcome) -> None:
    assert outcome.status is rf.RunStatus.COMPLETED, outcome.error
    assert list(outcome.outputs) == ["s1", "s2", "s3"]
    # s1 and s2 come back from the journal (Arrow for the table and the model), not from the agents.
    table = outcome.outputs["s1"]
    assert isinstance(table, pa.Table) and table.to_pydict() == {"seat": ["12A", "12B"], "price": [120, 95]}
    model = outcome.outputs["s2"]
    assert type(model).__name__ == "Quote" and model.model_dump() == {"items": [1, 2], "note": "s2"}
    assert outcome.outputs["s3"]["seen"] is True
    for index in (1, 2, 3):
        state = report(fleet, f"w/{index}")
        assert state["calls"] == 1, (index, state)  # s3 was re-sent with the same key: its effect is once
        assert state["tags"] == [f"s{index}"], (index, state)
    # The resumed engine dispatched at most the step that was not journaled when it loaded the journal:
    # s3's own turn journals s3 with its checkpoint if it commits before the new engine takes the run
    # (the killed engine's token is still the run's then), else s3 is sent again under its key.
    assert outcome.invocations in (0, 1)
    assert fleet.runs.get(outcome.run_id).status is rf.RunStatus.COMPLETED


@pytest.mark.timeout(180)
def test_restarted_runner_resumes_the_run_from_its_journal(fleet: rf.Fleet, tmp_path: Path) -> None:
    run_id, release, pid = kill_runner_midway(fleet, tmp_path, "auto")
    release.touch()
    outcome = fleet.runs.wait(run_id, timeout=WAIT)
    assert_each_step_ran_once(fleet, outcome)
    assert _runner_pid(fleet) != pid  # it was a restarted runner that finished the run


@pytest.mark.timeout(180)
def test_resume_while_the_runner_restarts(fleet: rf.Fleet, tmp_path: Path) -> None:
    run_id, release, pid = kill_runner_midway(fleet, tmp_path, "manual")
    try:
        # Resume once the old runner process is gone: Ray needs a while to start its replacement.
        wait_until(lambda: not _alive(pid), what="the killed runner process to exit")
        # A typed refusal (e.g. FleetUnavailableError) would be acceptable; a raw Ray error is not.
        with contextlib.suppress(rf.RayfleetError):
            fleet.runs.resume(run_id)
    finally:
        release.touch()
    outcome = fleet.runs.wait(run_id, timeout=WAIT)
    assert_each_step_ran_once(fleet, outcome)


@pytest.mark.timeout(180)
def test_a_run_the_runner_cannot_load_ends_failed(fleet: rf.Fleet, tmp_path: Path) -> None:
    module_name = f"driver_only_builders_{os.getpid()}"
    (tmp_path / f"{module_name}.py").write_text("def build(ctx):\n    return {'tag': 's1'}\n")
    sys.path.insert(0, str(tmp_path))
    try:
        module = __import__(module_name)
        spawn_workers(fleet, "w/1")
        wf = rf.Workflow("unloadable")
        wf.step("s1", to="w/1", call="work", payload=module.build)  # pickled by reference to module_name
        run_id = fleet.submit(wf)
        outcome = fleet.runs.wait(run_id, timeout=10.0)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(module_name, None)
    assert outcome.status is rf.RunStatus.FAILED
    assert outcome.error is not None and module_name in str(outcome.error)
    assert fleet.runs.get(run_id).status is rf.RunStatus.FAILED
    assert report(fleet, "w/1")["calls"] == 0


# --------------------------------------------------------------------------- 5b. one engine per run


def _runner_task_done(fleet: rf.Fleet, run_id: str) -> tuple[bool, Any]:
    """(done, result) of the runner's task for ``run_id``."""
    runner = ray.get_actor(RUNNER, namespace=fleet.config.namespace)

    def probe(actor: Any) -> tuple[bool, Any]:
        task = actor._tasks.get(run_id)
        return (False, None) if task is None or not task.done() else (True, task.result())

    return tuple(ray.get(runner.__ray_call__.remote(probe), timeout=WAIT))  # type: ignore[return-value]


@pytest.mark.timeout(180)
def test_a_second_engine_is_refused_while_the_runner_executes_the_run(fleet: rf.Fleet, tmp_path: Path) -> None:
    spawn_workers(fleet, "w/1", "w/2")
    started, release = tmp_path / "started", tmp_path / "release"
    wf = rf.Workflow("owned")
    wf.step("s1", to="w/1", call="work", payload={"tag": "s1", "touch": str(started), "wait_for": str(release),
                                                   "bound": 40.0}).compensate("undo").exclusive()
    wf.step("s2", to="w/2", call="work", payload={"tag": "s2"}, after=["s1"]).compensate("undo")
    run_id = fleet.submit(wf, run_id="owned-1")
    try:
        wait_until(started.exists, what="s1 to start in the runner")
        with pytest.raises(rf.RunOwnedElsewhereError) as caught:
            fleet.run(wf, run_id=run_id)
        assert caught.value.run_id == run_id and caught.value.step == ""
        assert caught.value.owner.startswith(f"runner:{fleet.config.namespace}:")
        assert caught.value.owner == fleet._ledger.run(run_id).result().owner
        assert fleet.runs.get(run_id).status is rf.RunStatus.RUNNING
    finally:
        release.touch()
    outcome = fleet.runs.wait(run_id, timeout=WAIT)
    assert outcome.status is rf.RunStatus.COMPLETED, outcome.error
    # The refused driver dispatched nothing and undid nothing: each effect happened once, in the runner.
    assert [report(fleet, w)["calls"] for w in ("w/1", "w/2")] == [1, 1]
    assert [report(fleet, w)["undone"] for w in ("w/1", "w/2")] == [[], []]
    assert fleet._ledger.run(run_id).result().owner is None  # released at the end


@pytest.mark.timeout(180)
def test_a_zombie_runner_is_fenced_out_and_stops_without_compensating(fleet: rf.Fleet, tmp_path: Path) -> None:
    spawn_workers(fleet, "w/1", "w/2", "w/3")
    started, release = tmp_path / "started", tmp_path / "release"
    wf = rf.Workflow("zombie")
    wf.step("s1", to="w/1", call="work", payload={"tag": "s1"}).compensate("undo")
    wf.step("s2", to="w/2", call="work", after=["s1"],
            payload={"tag": "s2", "touch": str(started), "wait_for": str(release), "bound": 40.0}).compensate("undo")
    wf.step("s3", to="w/3", call="work", payload={"tag": "s3"}, after=["s2"])
    run_id = fleet.submit(wf, run_id="zombie-1")
    try:
        wait_until(started.exists, what="s2 to start in the runner")
        runner_holder = fleet._ledger.run(run_id).result().owner
        assert runner_holder is not None and runner_holder.startswith("runner:")
        # A second engine declares the (live) runner dead and takes the run: the runner is now a zombie.
        lease = fleet._ledger.acquire_run_lease(run_id=run_id, holder="test:second-engine",
                                                takeover_from=runner_holder).result()
        assert fleet._ledger.run(run_id).result().owner == "test:second-engine"
    finally:
        release.touch()
    # s2 finishes on the agent; the zombie's journal write is refused and it stops.
    _, result = wait_until(lambda: (value := _runner_task_done(fleet, run_id))[0] and value,
                           what="the zombie engine to stop")
    assert result is None  # stopped, no outcome
    record = fleet._ledger.run(run_id).result()
    assert record.status == "RUNNING" and record.outcome is None  # no status written after the takeover
    assert [entry.label for entry in fleet._ledger.journal(run_id).result().steps] == ["s1"]
    assert report(fleet, "w/2")["calls"] == 1
    assert report(fleet, "w/3")["calls"] == 0  # nothing started after the refusal
    assert report(fleet, "w/1")["undone"] == [] and report(fleet, "w/2")["undone"] == []  # nothing compensated
    with pytest.raises(rf.StaleRunTokenError):
        fleet._ledger.set_run_status(run_id=run_id, fencing_token=lease.token - 1, status="FAILED").result()

    # The new owner hands the run on; the driver resumes it: s1 from the journal, s2 deduplicated.
    assert fleet._ledger.release_run_lease(run_id=run_id, holder="test:second-engine", token=lease.token).result()
    outcome = fleet.run(wf, run_id=run_id)
    assert outcome.status is rf.RunStatus.COMPLETED, outcome.error
    assert [report(fleet, f"w/{n}")["calls"] for n in (1, 2, 3)] == [1, 1, 1]


@pytest.mark.timeout(180)
def test_the_exclusive_step_lease_excludes_a_second_holder_on_the_real_ledger(fleet: rf.Fleet) -> None:
    ledger = fleet._ledger
    ledger.create_run(run_id="steps-1", workflow="wf", code_version="v1", definition=None).result()
    engine = ledger.acquire_run_lease(run_id="steps-1", holder="test:engine").result()
    first = ledger.acquire_step_lease(run_id="steps-1", label="pay", holder="h1", fencing_token=engine.token,
                                      ttl=WAIT).result()
    with pytest.raises(rf.RunOwnedElsewhereError) as caught:
        ledger.acquire_step_lease(run_id="steps-1", label="pay", holder="h2", fencing_token=engine.token,
                                  ttl=WAIT).result()
    assert (caught.value.owner, caught.value.step) == ("h1", "pay")
    # A second engine cannot even ask while the first holds the run, nor with a superseded token.
    with pytest.raises(rf.RunOwnedElsewhereError):
        ledger.acquire_run_lease(run_id="steps-1", holder="test:other").result()
    with pytest.raises(rf.StaleRunTokenError):
        ledger.acquire_step_lease(run_id="steps-1", label="pay", holder="h2", fencing_token=engine.token - 1,
                                  ttl=WAIT).result()
    assert ledger.release_step_lease(run_id="steps-1", label="pay", holder="h1", token=first).result()
    second = ledger.acquire_step_lease(run_id="steps-1", label="pay", holder="h2", fencing_token=engine.token,
                                       ttl=WAIT).result()
    assert second > first


# --------------------------------------------------------------------------- 6-7. exclusive steps


@pytest.mark.timeout(180)
def test_exclusive_step_fences_out_a_stale_holder(fleet: rf.Fleet, tmp_path: Path) -> None:
    flaky = fleet.spawn("desk/flaky", Flaky, retry=rf.RetryPolicy(max_attempts=1))
    flag = tmp_path / "fail-once"
    flag.touch()
    wf = rf.Workflow("fenced")
    wf.step("flight", to="desk/flaky", call="reserve", payload={"flag": str(flag)}) \
        .exclusive().retry(rf.RetryPolicy(max_attempts=2, base_delay=0.01, max_delay=0.01))
    outcome = fleet.run(wf, run_id="fenced-1")
    assert outcome.status is rf.RunStatus.COMPLETED, outcome.error
    assert not flag.exists()  # the first attempt (fence 1) failed, the retry (fence 2) succeeded
    assert report(fleet, "desk/flaky")["calls"] == 1

    conversation = "fenced-1/flight"
    for stale in (0, 1):
        with pytest.raises(rf.StaleSequenceError) as caught:
            flaky.call("reserve", flag=str(flag), conversation=conversation, sequence=stale, timeout=WAIT)
        assert (caught.value.presented, caught.value.current) == (stale, 2)
    assert report(fleet, "desk/flaky")["calls"] == 1  # the refused calls never ran
    letters = fleet.dead_letters("desk/flaky")
    assert [letter.reason for letter in letters].count(rf.DeadLetterReason.STALE_SEQUENCE) == 2
    # The current holder's fence (and a later one) still passes; other conversations are unaffected.
    assert flaky.call("reserve", flag=str(flag), conversation=conversation, sequence=2, timeout=WAIT)["calls"] == 2
    assert flaky.call("reserve", flag=str(flag), conversation="other-run/flight", sequence=0, timeout=WAIT)["calls"] == 3


@pytest.mark.timeout(180)
def test_exclusive_step_reassigns_on_timeout(fleet: rf.Fleet, tmp_path: Path) -> None:
    release = tmp_path / "release"
    # desk/a sorts first, so it is picked first; it blocks until released (after the run).
    spawn_panel(fleet, "desk", {"a": "slow", "b": "ok"})
    for desk in ("desk/a", "desk/b"):
        report(fleet, desk)  # warm: activated and routed before the 0.5 s timeouts apply
    wf = rf.Workflow("reassign")
    wf.step("book", select=rf.Select(labels={"panel": "desk"}), call="vote", payload={"release": str(release)}) \
        .exclusive().on_timeout("reassign").timeout(0.5)
    try:
        outcome = fleet.run(wf, run_id="reassign-1")
    finally:
        release.touch()
    assert outcome.status is rf.RunStatus.COMPLETED, outcome.error
    assert outcome.outputs["book"] == {"by": "desk/b"}
    assert outcome.invocations == 1  # one step, whatever its reassignments
    assert report(fleet, "desk/b")["votes"] == 1
    # The reassignment took a new, larger fence: desk/b now refuses the first dispatch's fence.
    with pytest.raises(rf.StaleSequenceError):
        fleet.agent("desk/b").call("vote", conversation="reassign-1/book", sequence=1, timeout=WAIT)
    # The timed-out holder finishes once released; its late reply was ignored.
    wait_until(lambda: report(fleet, "desk/a")["votes"] == 1, what="desk/a to finish")
    assert outcome.outputs["book"] == {"by": "desk/b"}


# --------------------------------------------------------------------------- 8. budgets


def chain(name: str, budget: rf.Budget, *calls: dict[str, Any]) -> rf.Workflow:
    wf = rf.Workflow(name, budget=budget)
    previous: tuple[str, ...] = ()
    for index, payload in enumerate(calls, start=1):
        label = f"s{index}"
        wf.step(label, to=f"w/{index}", call="work", payload={"tag": label, **payload}, after=previous) \
            .compensate("undo")
        previous = (label,)
    return wf


@pytest.mark.timeout(180)
def test_invocation_budget_breach_stops_before_dispatch_and_compensates(fleet: rf.Fleet) -> None:
    spawn_workers(fleet, "w/1", "w/2", "w/3")
    outcome = fleet.run(chain("inv", rf.Budget(invocations=2), {}, {}, {}))
    assert outcome.status is rf.RunStatus.COMPENSATED
    assert isinstance(outcome.error, rf.BudgetExceededError)
    assert (outcome.error.budget, outcome.error.ceiling, outcome.error.spent) == ("invocations", 2, 3)
    assert outcome.compensated == ("s2", "s1")
    assert report(fleet, "w/3")["calls"] == 0
    assert report(fleet, "w/1")["undone"] == ["s1"] and report(fleet, "w/2")["undone"] == ["s2"]


@pytest.mark.timeout(180)
def test_token_budget_breach_compensates_completed_steps(fleet: rf.Fleet) -> None:
    spawn_workers(fleet, "w/1", "w/3")
    for index in range(3):
        fleet.spawn(f"review/{index}", Reviewer, labels={"role": "reviewer"})
    wf = rf.Workflow("tokens", budget=rf.Budget(tokens=100))
    wf.step("s1", to="w/1", call="work", payload={"tag": "s1"}).compensate("undo")
    wf.step("reviews", scatter=rf.Select(labels={"role": "reviewer"}), call="review", payload={"trip": "T"},
            after=["s1"])
    wf.step("s3", to="w/3", call="work", payload={"tag": "s3"}, after=["reviews"])
    outcome = fleet.run(wf)
    assert outcome.status is rf.RunStatus.COMPENSATED
    assert isinstance(outcome.error, rf.BudgetExceededError)
    assert (outcome.error.budget, outcome.error.ceiling, outcome.error.spent) == ("tokens", 100, 150)
    assert outcome.usage_tokens == 150
    assert outcome.compensated == ("s1",)
    assert report(fleet, "w/1")["undone"] == ["s1"]
    assert report(fleet, "w/3")["calls"] == 0


def slow_wall_clock(tmp_path: Path, *, retry: bool) -> rf.Workflow:
    # s1 and s2 start together; s1 is quick, s2 waits for a file that only appears after
    # the run has returned, so it cannot finish inside the 2 s wall-clock budget.
    wf = rf.Workflow("wall", budget=rf.Budget(wall_clock=2.0))
    wf.step("s1", to="w/1", call="work", payload={"tag": "s1"}).compensate("undo")
    handle = wf.step("s2", to="w/2", call="work",
                     payload={"tag": "s2", "wait_for": str(tmp_path / "never"), "bound": 20.0})
    if retry:
        handle.retry(rf.RetryPolicy(max_attempts=2, base_delay=0.01, max_delay=0.01))
    return wf


@pytest.mark.timeout(180)
def test_wall_clock_budget_breach_with_a_retrying_step(fleet: rf.Fleet, tmp_path: Path) -> None:
    spawn_workers(fleet, "w/1", "w/2")
    report(fleet, "w/1")
    report(fleet, "w/2")
    try:
        outcome = fleet.run(slow_wall_clock(tmp_path, retry=True))
    finally:
        (tmp_path / "never").touch()
    assert outcome.status is rf.RunStatus.COMPENSATED
    assert isinstance(outcome.error, rf.BudgetExceededError), outcome.error
    assert outcome.error.budget == "wall_clock" and outcome.error.ceiling == 2.0
    assert outcome.compensated == ("s1",)
    assert report(fleet, "w/1")["undone"] == ["s1"]


@pytest.mark.timeout(180)
def test_wall_clock_budget_breach_during_a_step(fleet: rf.Fleet, tmp_path: Path) -> None:
    spawn_workers(fleet, "w/1", "w/2")
    report(fleet, "w/1")
    report(fleet, "w/2")
    try:
        outcome = fleet.run(slow_wall_clock(tmp_path, retry=False))
    finally:
        (tmp_path / "never").touch()
    assert outcome.status is rf.RunStatus.COMPENSATED
    assert outcome.compensated == ("s1",)
    assert isinstance(outcome.error, rf.BudgetExceededError), outcome.error
    assert outcome.error.budget == "wall_clock"


# --------------------------------------------------------------------------- 9. cancel and pause


@pytest.mark.timeout(180)
def test_cancel_a_submitted_run(fleet: rf.Fleet, tmp_path: Path) -> None:
    spawn_workers(fleet, "w/1", "w/2", "w/3")
    started, release = tmp_path / "started", tmp_path / "release"
    wf = chain("cancel-me", rf.Budget(), {}, {"touch": str(started), "wait_for": str(release), "bound": 40.0}, {})
    run_id = fleet.submit(wf)
    try:
        wait_until(started.exists, what="s2 to start")
        fleet.runs.cancel(run_id)
        assert fleet.runs.get(run_id).cancel_requested is True
    finally:
        release.touch()
    outcome = fleet.runs.wait(run_id, timeout=WAIT)
    assert outcome.status is rf.RunStatus.CANCELLED
    assert isinstance(outcome.error, rf.RunCancelledError) and outcome.error.run_id == run_id
    # s2 was in flight when the cancel came: it finished, was journaled, and is undone too.
    assert outcome.compensated == ("s2", "s1")
    assert report(fleet, "w/3")["calls"] == 0
    assert report(fleet, "w/1")["undone"] == ["s1"] and report(fleet, "w/2")["undone"] == ["s2"]
    assert fleet.runs.get(run_id).status is rf.RunStatus.CANCELLED


@pytest.mark.timeout(180)
def test_pause_and_resume_a_submitted_run(fleet: rf.Fleet, tmp_path: Path) -> None:
    spawn_workers(fleet, "w/1", "w/2")
    started, release = tmp_path / "started", tmp_path / "release"
    wf = rf.Workflow("pause-me")
    wf.step("s1", to="w/1", call="work",
            payload={"tag": "s1", "touch": str(started), "wait_for": str(release), "bound": 40.0})
    wf.step("s2", to="w/2", call="work", payload={"tag": "s2"}, after=["s1"])
    run_id = fleet.submit(wf)
    try:
        wait_until(started.exists, what="s1 to start")
        fleet.runs.pause(run_id)
    finally:
        release.touch()
    wait_until(lambda: fleet.runs.get(run_id).status is rf.RunStatus.PAUSED, what="the run to pause")
    assert report(fleet, "w/1")["calls"] == 1  # s1 finished
    for _ in range(10):  # stays paused: s2 is not dispatched
        info = fleet.runs.get(run_id)
        assert info.status is rf.RunStatus.PAUSED and info.pause_requested is True
        assert report(fleet, "w/2")["calls"] == 0
        time.sleep(0.1)
    fleet.runs.resume(run_id)
    outcome = fleet.runs.wait(run_id, timeout=WAIT)
    assert outcome.status is rf.RunStatus.COMPLETED, outcome.error
    assert report(fleet, "w/2")["calls"] == 1 and report(fleet, "w/1")["calls"] == 1
    assert fleet.runs.get(run_id).pause_requested is False


# --------------------------------------------------------------------------- 10. bad input


def _invalid_workflows() -> list[tuple[str, Callable[[rf.Workflow], object], str]]:
    """(case, how to make the workflow invalid, the step the error must name)."""

    def unknown_dependency(wf: rf.Workflow) -> None:
        wf.step("s1", to="w/1", call="work")
        wf.step("s2", to="w/1", call="work", after=["nope"])

    def cycle(wf: rf.Workflow) -> None:
        wf.step("s0", to="w/1", call="work")
        wf.step("s1", to="w/1", call="work", after=["s2"])
        wf.step("s2", to="w/1", call="work", after=["s1"])

    def exclusive_scatter(wf: rf.Workflow) -> None:
        wf.step("s1", to="w/1", call="work")
        wf.step("s2", scatter=rf.Select(labels={"role": "w"}), call="work").exclusive()

    def reassign_without_exclusive(wf: rf.Workflow) -> None:
        wf.step("s1", to="w/1", call="work")
        wf.step("s2", select=rf.Select(labels={"role": "w"}), call="work").on_timeout("reassign")

    return [
        ("unknown dependency", unknown_dependency, "s2"),
        ("cycle", cycle, "s1"),
        ("exclusive scatter", exclusive_scatter, "s2"),
        ("reassign without exclusive", reassign_without_exclusive, "s2"),
    ]


@pytest.mark.timeout(180)
def test_invalid_workflows_are_refused_before_anything_is_dispatched(fleet: rf.Fleet) -> None:
    fleet.spawn("w/1", Worker, labels={"role": "w"})
    wf = rf.Workflow("dup")
    wf.step("s1", to="w/1", call="work")
    with pytest.raises(rf.InvalidSpecError) as caught:
        wf.step("s1", to="w/1", call="work")
    assert caught.value.field == "s1" and "s1" in str(caught.value)

    for case, build, culprit in _invalid_workflows():
        wf = rf.Workflow("bad")
        build(wf)
        for start in (fleet.run, fleet.submit):
            with pytest.raises(rf.InvalidSpecError) as caught:
                start(wf)
            assert caught.value.field == culprit, case
            assert culprit in str(caught.value), case
    assert report(fleet, "w/1")["calls"] == 0
    assert fleet.runs.list_runs() == []


@pytest.mark.timeout(180)
def test_unknown_runs_and_a_blocking_run_in_an_event_loop_raise_precise_errors(fleet: rf.Fleet) -> None:
    for call in (fleet.runs.get, fleet.runs.wait, fleet.runs.cancel, fleet.runs.pause, fleet.runs.resume):
        with pytest.raises(rf.UnknownRunError) as caught:
            call("no-such-run")
        assert caught.value.run_id == "no-such-run" and "fleet.runs.list_runs()" in str(caught.value), call
        assert isinstance(caught.value, rf.WorkflowError) and isinstance(caught.value, KeyError)

    async def inside_a_loop() -> None:
        fleet.run(rf.Workflow("never"))

    with pytest.raises(rf.UsageError, match="run_async") as misuse:
        asyncio.run(inside_a_loop())
    assert misuse.value.api == "fleet.run()" and isinstance(misuse.value, RuntimeError)


@pytest.mark.timeout(180)
def test_submit_refuses_an_unpicklable_payload_builder(fleet: rf.Fleet) -> None:
    spawn_workers(fleet, "w/1", "w/2")
    lock = threading.Lock()
    wf = rf.Workflow("locked")
    wf.step("s1", to="w/1", call="work", payload={"tag": "s1"})
    wf.step("s2", to="w/2", call="work", after=["s1"], payload=lambda ctx: {"tag": "s2" if lock else "?"})
    with pytest.raises(rf.InvalidSpecError) as caught:
        fleet.submit(wf)
    assert caught.value.field == "s2" and "pickled" in str(caught.value)
    assert fleet.runs.list_runs() == []
    assert report(fleet, "w/1")["calls"] == 0
    # In-process, nothing needs pickling: the same workflow runs.
    assert fleet.run(wf).status is rf.RunStatus.COMPLETED


def _boom(ctx: rf.StepContext) -> dict[str, Any]:
    raise RuntimeError("builder exploded")


@pytest.mark.timeout(180)
def test_raising_payload_builder_fails_the_step_and_compensates(fleet: rf.Fleet) -> None:
    spawn_workers(fleet, "w/1", "w/2")
    wf = rf.Workflow("builder")
    wf.step("s1", to="w/1", call="work", payload={"tag": "s1"}).compensate("undo")
    wf.step("s2", to="w/2", call="work", payload=_boom, after=["s1"])
    outcome = fleet.run(wf)
    assert outcome.status is rf.RunStatus.COMPENSATED
    assert isinstance(outcome.error, rf.StepFailedError) and outcome.error.step == "s2"
    assert "builder exploded" in str(outcome.error)
    assert outcome.compensated == ("s1",)
    assert report(fleet, "w/2")["calls"] == 0
    assert report(fleet, "w/1")["undone"] == ["s1"]


@pytest.mark.timeout(180)
def test_raising_verifier_fails_the_step_and_compensates(fleet: rf.Fleet) -> None:
    spawn_workers(fleet, "w/1", "w/2")

    def verifier(output: dict[str, Any]) -> bool:
        raise KeyError("verifier exploded")

    wf = rf.Workflow("verifier")
    wf.step("s1", to="w/1", call="work", payload={"tag": "s1"}).compensate("undo")
    wf.step("s2", to="w/2", call="work", payload={"tag": "s2"}, after=["s1"]).compensate("undo").verify(verifier)
    outcome = fleet.run(wf)
    assert outcome.status is rf.RunStatus.COMPENSATED
    assert isinstance(outcome.error, rf.StepFailedError) and outcome.error.step == "s2"
    assert "verifier" in str(outcome.error) and "verifier exploded" in str(outcome.error)
    # s2 ran but was never journaled, so only s1 is compensated.
    assert outcome.compensated == ("s1",)
    assert "s2" not in outcome.outputs
    assert report(fleet, "w/2")["calls"] == 1 and report(fleet, "w/2")["undone"] == []
    assert report(fleet, "w/1")["undone"] == ["s1"]


@pytest.mark.timeout(180)
def test_unknown_identity_target_fails_and_compensates(fleet: rf.Fleet) -> None:
    spawn_workers(fleet, "w/1")
    wf = rf.Workflow("ghost")
    wf.step("s1", to="w/1", call="work", payload={"tag": "s1"}).compensate("undo")
    wf.step("s2", to="w/ghost", call="work", after=["s1"])
    outcome = fleet.run(wf)
    assert outcome.status is rf.RunStatus.COMPENSATED
    assert isinstance(outcome.error, rf.StepFailedError) and outcome.error.step == "s2"
    assert "w/ghost" in str(outcome.error)
    assert isinstance(outcome.error.cause, rf.UnknownIdentityError)
    assert outcome.compensated == ("s1",)
    assert report(fleet, "w/1")["undone"] == ["s1"]


@pytest.mark.timeout(180)
def test_retired_identity_target_fails_and_compensates(fleet: rf.Fleet) -> None:
    spawn_workers(fleet, "w/1", "w/2")
    report(fleet, "w/2")
    fleet.retire("w/2")
    wf = rf.Workflow("retired")
    wf.step("s1", to="w/1", call="work", payload={"tag": "s1"}).compensate("undo")
    wf.step("s2", to="w/2", call="work", after=["s1"])
    outcome = fleet.run(wf)
    assert outcome.status is rf.RunStatus.COMPENSATED
    assert isinstance(outcome.error, rf.StepFailedError) and outcome.error.step == "s2"
    assert "w/2" in str(outcome.error) and "RETIRING" in str(outcome.error)
    assert outcome.compensated == ("s1",)
    assert report(fleet, "w/1")["undone"] == ["s1"]


@pytest.mark.timeout(180)
def test_resuming_under_a_different_code_version_needs_force(fleet: rf.Fleet, tmp_path: Path) -> None:
    spawn_workers(fleet, "w/1", "w/2", "w/3")
    release, started = tmp_path / "release", tmp_path / "s2-started"
    s2 = {"tag": "s2", "touch": str(started), "wait_for": str(release), "bound": 60.0}
    first = rf.Workflow("pinned")
    first.step("s1", to="w/1", call="work", payload={"tag": "s1"})
    first.step("s2", to="w/2", call="work", payload=s2, after=["s1"])
    run_id = fleet.submit(first, run_id="pinned-1")
    for _ in range(400):
        if started.exists():
            break
        time.sleep(0.05)
    assert started.exists()
    # The runner dies for good mid-run: the run stays unfinished, to be resumed by hand.
    kill_actor(RUNNER, fleet.config.namespace)

    changed = rf.Workflow("pinned")
    changed.step("s1", to="w/1", call="work", payload={"tag": "s1"})
    changed.step("s2", to="w/2", call="work", payload=s2, after=["s1"])
    changed.step("s3", to="w/3", call="work", payload={"tag": "s3"}, after=["s2"])
    assert changed.code_version() != first.code_version()
    with pytest.raises(rf.InvalidSpecError) as caught:
        fleet.run(changed, run_id=run_id)
    assert "code version" in str(caught.value) and caught.value.field == "code_version"
    assert report(fleet, "w/3")["calls"] == 0
    assert fleet.runs.get(run_id).code_version == first.code_version()

    release.touch()
    outcome = fleet.run(changed, run_id=run_id, force=True)
    assert outcome.status is rf.RunStatus.COMPLETED, outcome.error
    assert list(outcome.outputs) == ["s1", "s2", "s3"]
    # s1 came from the journal; s2's repeat was answered by the agent's dedup window.
    assert [report(fleet, f"w/{n}")["calls"] for n in (1, 2, 3)] == [1, 1, 1]
    assert fleet.runs.get(run_id).code_version == changed.code_version()
    with pytest.raises(rf.InvalidSpecError, match="already ended"):
        fleet.run(changed, run_id=run_id)


@pytest.mark.timeout(180)
def test_failed_compensation_ends_the_run_failed(fleet: rf.Fleet) -> None:
    spawn_workers(fleet, "w/1", "w/2", "w/3")
    wf = rf.Workflow("unrecoverable")
    wf.step("s1", to="w/1", call="work", payload={"tag": "s1"}).compensate("undo")
    wf.step("s2", to="w/2", call="work", payload={"tag": "s2"}, after=["s1"]).compensate("broken_undo")
    wf.step("s3", to="w/3", call="work", payload={"tag": "s3", "fail": "boom"}, after=["s2"])
    outcome = fleet.run(wf, run_id="unrecoverable-1")
    assert outcome.status is rf.RunStatus.FAILED
    assert isinstance(outcome.error, rf.StepFailedError) and outcome.error.step == "s3"  # the original failure
    assert set(outcome.compensation_errors) == {"s2"}
    assert "the undo desk is closed" in outcome.compensation_errors["s2"]
    # The unwind went on past the failed compensation.
    assert outcome.compensated == ("s1",)
    assert report(fleet, "w/1")["undone"] == ["s1"]
    assert fleet.runs.get("unrecoverable-1").status is rf.RunStatus.FAILED


@pytest.mark.timeout(180)
def test_failed_run_detail_names_the_failed_compensation(fleet: rf.Fleet) -> None:
    spawn_workers(fleet, "w/1", "w/2")
    wf = rf.Workflow("unrecoverable")
    wf.step("s1", to="w/1", call="work", payload={"tag": "s1"}).compensate("broken_undo")
    wf.step("s2", to="w/2", call="work", payload={"tag": "s2", "fail": "boom"}, after=["s1"])
    outcome = fleet.run(wf, run_id="unrecoverable-2")
    assert outcome.status is rf.RunStatus.FAILED
    detail = fleet.runs.get("unrecoverable-2").detail
    assert "step 's2' failed" in detail
    assert "compensation failed for s1" in detail, detail


@pytest.mark.timeout(180)
def test_a_pydantic_output_with_mixed_types_is_journaled(fleet: rf.Fleet) -> None:
    spawn_workers(fleet, "w/1")
    wf = rf.Workflow("mixed")
    wf.step("q", to="w/1", call="quote", payload={"tag": "q", "items": [1, "a"]})
    outcome = fleet.run(wf)
    assert outcome.status is rf.RunStatus.COMPLETED, outcome.error
    assert outcome.outputs["q"].model_dump() == {"items": [1, "a"], "note": "q"}


@pytest.mark.timeout(180)
def test_resuming_a_compensated_run_does_not_complete_on_undone_steps(fleet: rf.Fleet, tmp_path: Path) -> None:
    spawn_workers(fleet, "w/1", "w/2")
    blocker = tmp_path / "declined"
    blocker.touch()
    wf = rf.Workflow("again")
    wf.step("s1", to="w/1", call="work", payload={"tag": "s1"}).compensate("undo")
    wf.step("s2", to="w/2", call="work", payload={"tag": "s2", "fail_if": str(blocker)}, after=["s1"])
    first = fleet.run(wf, run_id="again-1")
    assert first.status is rf.RunStatus.COMPENSATED and first.compensated == ("s1",)

    blocker.unlink()  # the cause is fixed; the same run id is run again
    try:
        second = fleet.run(wf, run_id="again-1")
    except rf.RayfleetError:
        return  # refusing to resume a saga that has already ended is a correct answer
    w1 = report(fleet, "w/1")
    in_place = w1["calls"] - len(w1["undone"])  # s1 effects not undone
    # A COMPLETED run must not rest on a step whose effect was compensated.
    assert second.status is not rf.RunStatus.COMPLETED or in_place == 1, (second.status, w1)
