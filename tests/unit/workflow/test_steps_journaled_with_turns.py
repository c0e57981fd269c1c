"""Steps journaled by the agent's turn (the host's checkpoint transaction) rather than by the engine.

The fake fleet journals a step it is asked to, as a host does: only under the run's
current token, keeping an output journaled before. The engine must then write nothing
itself, act on the requests the turn's write answered, adopt an earlier attempt's
journaled output, and still lose the run when its token went stale.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rayfleet.errors import StaleRunTokenError
from rayfleet.retry import RetryPolicy
from rayfleet.testing import InMemoryJournal
from rayfleet.workflow._definition import RunStatus, Workflow
from rayfleet.workflow._engine import WorkflowEngine
from rayfleet.workflow._journal import Journal


class CountingJournal(InMemoryJournal):
    """Counts the engine's own journal writes of steps."""

    def __init__(self) -> None:
        super().__init__()
        self.engine_writes: list[str] = []

    async def record_step(self, run_id: str, label: str, output: Any, tokens: int, *, token: int) -> Any:
        self.engine_writes.append(label)
        return await super().record_step(run_id, label, output, tokens, token=token)


def chain() -> Workflow:
    wf = Workflow("wf")
    wf.step("a", to="a1", call="work", payload={"n": 1})
    wf.step("b", to="a2", call="work", after=["a"], payload=lambda ctx: {"prev": ctx.outputs["a"]["n"]})
    return wf


async def test_steps_journaled_with_their_turns_are_not_journaled_again(fleet) -> None:
    journal = CountingJournal()
    fleet.journal_with_turns = journal
    outcome = await WorkflowEngine(chain(), run_id="r", dispatcher=fleet, journal=journal).run()
    assert outcome.status is RunStatus.COMPLETED
    assert journal.engine_writes == []
    state = await journal.load("r")
    assert state.outputs == {"a": {"by": "a1", "n": 1}, "b": {"by": "a2", "prev": 1}}
    assert state.completion_order == ("a", "b")
    assert [call["journal"].label for call in fleet.calls] == ["a", "b"]
    assert {call["journal"].token for call in fleet.calls} == {journal.owner("r")[1]}


async def test_without_a_journaling_dispatcher_the_engine_journals_each_step(fleet) -> None:
    journal = CountingJournal()
    outcome = await WorkflowEngine(chain(), run_id="r", dispatcher=fleet, journal=journal).run()
    assert outcome.status is RunStatus.COMPLETED and journal.engine_writes == ["a", "b"]


async def test_a_verified_step_is_journaled_by_the_engine_after_its_verdict(fleet) -> None:
    journal = CountingJournal()
    fleet.journal_with_turns = journal
    wf = Workflow("wf")
    wf.step("a", to="a1", call="work", payload={"n": 1}).verify(lambda output: output["n"] == 1)
    outcome = await WorkflowEngine(wf, run_id="r", dispatcher=fleet, journal=journal).run()
    assert outcome.status is RunStatus.COMPLETED
    assert fleet.calls[0]["journal"] is None and journal.engine_writes == ["a"]


async def test_a_cancel_answered_by_the_turns_write_stops_the_next_step(fleet) -> None:
    journal = CountingJournal()
    fleet.journal_with_turns = journal

    async def then_cancel(identity: str, payload: dict[str, Any]) -> Any:
        journal.request_cancel("r")  # asked while the turn runs: its journal write answers it
        return {"by": identity}

    fleet.on("first", then_cancel)
    wf = Workflow("wf")
    wf.step("a", to="a1", call="first")
    wf.step("b", to="a2", call="work", after=["a"])
    outcome = await WorkflowEngine(wf, run_id="r", dispatcher=fleet, journal=journal).run()
    assert outcome.status is RunStatus.CANCELLED
    assert [call["method"] for call in fleet.calls] == ["first"]


async def test_an_earlier_attempts_late_journal_entry_is_the_steps_output(fleet) -> None:
    """Attempt 1 times out; its turn journals late (as a host whose commit landed after the engine gave
    up on it), before attempt 2's turn commits: attempt 1's output is the step's, in the run and the journal."""
    journal = CountingJournal()
    fleet.journal_with_turns = journal
    late: list[asyncio.Task[Any]] = []

    async def journal_late() -> None:
        await asyncio.sleep(0.15)  # after the engine's timeout of attempt 1
        token = journal.owner("r")[1]
        assert journal.journal_with_turn("r", "a", {"attempt": 1}, 0, token=token) is not None

    async def slow_then_fast(identity: str, payload: dict[str, Any]) -> Any:
        if not late:
            late.append(asyncio.create_task(journal_late()))
            await asyncio.sleep(10)  # cut off by the step's timeout
        await late[0]
        return {"attempt": 2}

    fleet.on("slow", slow_then_fast)
    wf = Workflow("wf")
    wf.step("a", to="a1", call="slow").timeout(0.1).retry(RetryPolicy(max_attempts=2, base_delay=0.0))
    outcome = await WorkflowEngine(wf, run_id="r", dispatcher=fleet, journal=journal).run()
    assert outcome.status is RunStatus.COMPLETED, outcome.error
    assert outcome.outputs == {"a": {"attempt": 1}} == (await journal.load("r")).outputs
    assert journal.engine_writes == []


async def test_a_stale_run_token_journals_nothing_and_the_engine_loses_the_run(fleet) -> None:
    journal = CountingJournal()
    fleet.journal_with_turns = journal

    async def taken_over(identity: str, payload: dict[str, Any]) -> Any:
        # Another engine takes the run while this turn runs.
        await journal.acquire_lease("r", "other-engine", ttl=60.0, takeover_from=engine.holder)
        return {"by": identity}

    fleet.on("first", taken_over)
    wf = Workflow("wf")
    wf.step("a", to="a1", call="first")
    wf.step("b", to="a2", call="work", after=["a"])
    engine = WorkflowEngine(wf, run_id="r", dispatcher=fleet, journal=journal)
    with pytest.raises(StaleRunTokenError):
        await engine.run()
    assert (await journal.load("r")).outputs == {}
    assert journal.engine_writes == ["a"]  # told nothing was journaled, the engine tried, and was refused
    assert [call["method"] for call in fleet.calls] == ["first"]


class CallLog(InMemoryJournal):
    """Records every journal call the engine makes, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __getattribute__(self, name: str) -> Any:
        attribute = super().__getattribute__(name)
        if name in _JOURNAL_CALLS:
            super().__getattribute__("calls").append(name)
        return attribute


_JOURNAL_CALLS = frozenset(name for name in vars(Journal) if not name.startswith("_"))


async def test_a_run_opens_and_ends_with_one_journal_write_each(fleet) -> None:
    # Each journal call is a ledger transaction (a round trip on PostgreSQL): taking the
    # lease and reading the journal are one, recording RUNNING answers the run's requests
    # so no read of its own precedes the first step, and the last status releases the lease.
    journal = CallLog()
    fleet.journal_with_turns = journal
    outcome = await WorkflowEngine(chain(), run_id="r", dispatcher=fleet, journal=journal).run()
    assert outcome.status is RunStatus.COMPLETED
    assert journal.calls == ["start", "set_status", "set_status"]
    assert journal.owner("r")[0] is None  # released by the last status write
