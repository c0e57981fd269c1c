"""One engine per run: the run's lease, fenced journal writes, takeover, exclusive-step leases.

Every test runs twice: against ``InMemoryJournal`` (the public double) and against the
production ``LedgerJournal`` over a real ``Ledger`` in this process, so the double is
shown to refuse exactly what the ledger refuses. Both run on a manual clock; waits are
on events, never on wall-clock thresholds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rayfleet.errors import RunOwnedElsewhereError, StaleRunTokenError
from rayfleet.ledger._ledger import Ledger
from rayfleet.ledger._local import LocalLedgerClient
from rayfleet.platform._runner import LedgerJournal
from rayfleet.testing import InMemoryJournal, ManualClock
from rayfleet.workflow import Journal
from rayfleet.workflow._definition import RunStatus, Workflow
from rayfleet.workflow._engine import WorkflowEngine

TTL = 10.0


def in_memory(clock: ManualClock, tmp_path: Path) -> Journal:
    return InMemoryJournal(clock=clock)


def ledger_backed(clock: ManualClock, tmp_path: Path) -> Journal:
    client = LocalLedgerClient(Ledger(tmp_path / "ledger.sqlite", clock=clock))
    # The driver registers a run before any engine exists (PENDING); every test uses this one.
    client.create_run(run_id="run-1", workflow="wf", code_version="v1", definition=None).result()
    return LedgerJournal(client)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture(params=[in_memory, ledger_backed], ids=["in-memory", "ledger"])
def journal(request: pytest.FixtureRequest, clock: ManualClock, tmp_path: Path) -> Journal:
    factory: Callable[[ManualClock, Path], Journal] = request.param
    return factory(clock, tmp_path)


def gated(fleet: Any, method: str) -> tuple[asyncio.Event, asyncio.Event]:
    """Make ``method`` signal when it starts and wait for a release; returns (started, release)."""
    started, release = asyncio.Event(), asyncio.Event()

    async def handler(identity: str, payload: dict[str, Any]) -> Any:
        started.set()
        await release.wait()
        return {"by": identity}

    fleet.on(method, handler)
    return started, release


def two_steps(first: str = "slow") -> Workflow:
    """s1 (``first``) -> s2, both compensable."""
    wf = Workflow("wf")
    wf.step("s1", to="a1", call=first).compensate("undo")
    wf.step("s2", to="a2", call="work", after=["s1"]).compensate("undo")
    return wf


async def test_a_run_held_by_another_live_engine_is_refused_before_anything_runs(fleet, journal, clock) -> None:
    before = await journal.status("run-1")
    await journal.acquire_lease("run-1", "driver:other", ttl=TTL)
    clock.advance(TTL - 1)
    wf = Workflow("wf")
    wf.step("s1", to="a1", call="work")
    with pytest.raises(RunOwnedElsewhereError) as caught:
        await WorkflowEngine(wf, run_id="run-1", dispatcher=fleet, journal=journal, holder="driver:me").run()
    assert (caught.value.run_id, caught.value.owner) == ("run-1", "driver:other")
    assert caught.value.expires_in == pytest.approx(1.0)
    assert fleet.calls == []
    assert await journal.status("run-1") == before


async def test_a_lapsed_lease_is_taken_over_and_the_run_completes_under_a_larger_token(fleet, journal, clock) -> None:
    old = await journal.acquire_lease("run-1", "driver:gone", ttl=TTL)
    clock.advance(TTL)
    wf = Workflow("wf")
    wf.step("s1", to="a1", call="work")
    outcome = await WorkflowEngine(wf, run_id="run-1", dispatcher=fleet, journal=journal, holder="driver:me").run()
    assert outcome.status is RunStatus.COMPLETED
    # The engine released its lease at the end: the next engine gets the run at once, above both tokens.
    nxt = await journal.acquire_lease("run-1", "driver:next", ttl=TTL)
    assert nxt == old + 2
    # The gone driver's token can no longer write.
    with pytest.raises(StaleRunTokenError):
        await journal.set_status("run-1", RunStatus.FAILED, "zombie", token=old)


async def test_a_restarted_engine_naming_its_dead_predecessor_takes_over_at_once(fleet, journal) -> None:
    await journal.acquire_lease("run-1", "runner:ns:old", ttl=TTL)
    wf = Workflow("wf")
    wf.step("s1", to="a1", call="work")
    outcome = await WorkflowEngine(wf, run_id="run-1", dispatcher=fleet, journal=journal, holder="runner:ns:new",
                                   takeover_from="runner:ns:old").run()
    assert outcome.status is RunStatus.COMPLETED


async def test_a_zombie_engine_whose_journal_write_is_refused_stops_without_compensating(
    fleet, journal, clock
) -> None:
    started, release = gated(fleet, "slow")
    wf = Workflow("wf")
    wf.step("s0", to="a3", call="work").compensate("undo")
    wf.step("s1", to="a1", call="slow", after=["s0"]).compensate("undo")
    wf.step("s2", to="a2", call="work", after=["s1"]).compensate("undo")
    zombie = asyncio.create_task(
        WorkflowEngine(wf, run_id="run-1", dispatcher=fleet, journal=journal, holder="E1").run())
    await started.wait()
    # E1 stops renewing (say, a partition): its lease lapses and E2 takes the run over.
    clock.advance(TTL + 1)
    taken = await journal.acquire_lease("run-1", "E2", ttl=TTL)
    release.set()
    with pytest.raises(StaleRunTokenError) as caught:
        await zombie
    assert (caught.value.run_id, caught.value.current) == ("run-1", taken)
    state = await journal.load("run-1")
    assert list(state.outputs) == ["s0"]  # s1's output was refused
    assert fleet.dispatched("undo") == [] and fleet.dispatched("work") == [fleet.calls[0]]  # no s2, no saga
    assert (await journal.status("run-1"))[0] is RunStatus.RUNNING  # E1's last accepted write
    # E2 owns the run: it writes, and resumes from what E1 journaled before it lost the run.
    await journal.set_status("run-1", RunStatus.RUNNING, "resumed", token=taken)


async def test_renewal_that_finds_the_run_taken_over_stops_the_engine_at_once(fleet, journal, clock) -> None:
    started, _never = gated(fleet, "slow")
    # A short TTL makes the engine renew every few milliseconds; only the manual clock decides expiry.
    engine = WorkflowEngine(two_steps(), run_id="run-1", dispatcher=fleet, journal=journal, holder="E1",
                            lease_ttl=0.03)
    running = asyncio.create_task(engine.run())
    await started.wait()
    clock.advance(1.0)
    taken = await journal.acquire_lease("run-1", "E2", ttl=TTL)
    with pytest.raises(StaleRunTokenError) as caught:
        await running  # the step in flight never finishes: the engine cancelled it
    assert caught.value.current == taken
    assert fleet.dispatched("work") == [] and fleet.dispatched("undo") == []
    assert (await journal.load("run-1")).outputs == {}
    assert (await journal.status("run-1"))[0] is RunStatus.RUNNING


async def test_an_engine_whose_compensation_record_is_refused_undoes_nothing_more(fleet, journal, clock) -> None:
    async def undo_then_lose(identity: str, payload: dict[str, Any]) -> Any:
        clock.advance(TTL + 1)  # the lease lapses during the compensation ...
        await journal.acquire_lease("run-1", "E2", ttl=TTL)  # ... and another engine takes the run
        return "undone"

    async def boom(identity: str, payload: dict[str, Any]) -> Any:
        raise ValueError("declined")

    fleet.on("undo_then_lose", undo_then_lose)
    fleet.on("boom", boom)
    wf = Workflow("wf")
    wf.step("s0", to="a1", call="work").compensate("undo")
    wf.step("s1", to="a2", call="work", after=["s0"]).compensate("undo_then_lose")
    wf.step("s2", to="a3", call="boom", after=["s1"])
    with pytest.raises(StaleRunTokenError):
        await WorkflowEngine(wf, run_id="run-1", dispatcher=fleet, journal=journal, holder="E1").run()
    # s1's compensation ran but its record was refused: s0 is not undone, no status follows RUNNING.
    assert [call["target"] for call in fleet.dispatched("undo_then_lose")] == ["a2"]
    assert fleet.dispatched("undo") == []
    assert (await journal.load("run-1")).compensated == ()
    assert (await journal.status("run-1"))[0] is RunStatus.RUNNING


class CountingRefusals:
    """A journal wrapper that signals when an exclusive step's lease is refused."""

    def __init__(self, inner: Journal) -> None:
        self._inner = inner
        self.refused = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def acquire_step_lease(self, run_id: str, label: str, holder: str, *, token: int, ttl: float) -> int:
        try:
            return await self._inner.acquire_step_lease(run_id, label, holder, token=token, ttl=ttl)
        except RunOwnedElsewhereError:
            self.refused.set()
            raise


async def test_an_exclusive_step_waits_for_the_previous_engines_step_lease_to_lapse(fleet, journal, clock) -> None:
    # E0 dispatched the exclusive step, then vanished; its run lease lapses before its step lease does.
    e0 = await journal.acquire_lease("run-1", "E0", ttl=TTL)
    e0_fence = await journal.acquire_step_lease("run-1", "pay", "workflow:run-1:pay:1", token=e0, ttl=TTL + 0.5)
    clock.advance(TTL)
    watched = CountingRefusals(journal)
    wf = Workflow("wf")
    wf.step("pay", to="a1", call="work").exclusive()
    running = asyncio.create_task(
        WorkflowEngine(wf, run_id="run-1", dispatcher=fleet, journal=watched, holder="E1").run())  # type: ignore[arg-type]
    await watched.refused.wait()
    assert fleet.calls == []  # not dispatched while E0's dispatch may still be under way
    clock.advance(0.5)  # E0's step lease lapses
    outcome = await running
    assert outcome.status is RunStatus.COMPLETED
    [call] = fleet.dispatched("work")
    assert call["conversation"] == "run-1/pay" and call["sequence"] > e0_fence


async def test_a_zombie_cannot_take_an_exclusive_steps_lease(fleet, journal, clock) -> None:
    old = await journal.acquire_lease("run-1", "E1", ttl=TTL)
    clock.advance(TTL)
    await journal.acquire_lease("run-1", "E2", ttl=TTL)
    with pytest.raises(StaleRunTokenError):
        await journal.acquire_step_lease("run-1", "pay", "workflow:run-1:pay:1", token=old, ttl=TTL)


async def test_the_final_status_carries_the_outcome_and_the_lease_is_released(fleet) -> None:
    journal = InMemoryJournal()
    wf = Workflow("wf")
    wf.step("s1", to="a1", call="work", payload={"n": 1})
    outcome = await WorkflowEngine(wf, run_id="run-1", dispatcher=fleet, journal=journal, holder="E1").run()
    assert journal.outcome("run-1") == outcome
    assert journal.owner("run-1") == (None, 1)
