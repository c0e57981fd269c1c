"""Durable steps on a real host runtime, a real SQLite ledger and real files (no Ray).

A host "dies" here by being abandoned mid-turn and its leases revoked, as a crashed
process's would lapse; the next host delivers the same message (a router's re-send)
and must resume the turn from its journal.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
from delivery import deliver

import rayfleet as rf
from rayfleet.checkpoints._store import SnapshotStore
from rayfleet.host._runtime import HostRuntime
from rayfleet.ledger._ledger import Ledger
from rayfleet.ledger._local import LocalLedgerClient
from rayfleet.ledger._values import SpecRecord

EFFECTS: list[str] = []
"""What step functions did, in order, across hosts (one process)."""
HOLD: dict[str, asyncio.Event] = {}
"""Handlers wait on the event named by their ``hold`` argument once, so a test can kill the host mid-turn."""
ASK_FOR = {"first": "first"}
"""The name the ``order`` handler gives its first step; a test changes it to show non-determinism."""


def effect(label: str, value: Any = None) -> Any:
    EFFECTS.append(label)
    return label if value is None else value


class Orders(rf.Agent):
    class State(rf.State):
        placed: int = 0

    @rf.handler
    async def order(self, hold: str = "") -> list[str]:
        first = await self.step(ASK_FOR["first"], effect, "first")
        if hold and hold in HOLD:
            await HOLD.pop(hold).wait()  # the host "dies" here: this never ends
        second = await self.step("second", effect, "second")
        self.state.placed += 1
        return [first, second]

    @rf.handler
    async def charge(self, hold: str = "") -> str:
        async def pay() -> str:
            EFFECTS.append(f"pay {self.step_key}")
            if hold and hold in HOLD:
                await HOLD.pop(hold).wait()
            return "paid"
        try:
            return await self.step("pay", pay, policy="unknown")
        except rf.StepOutcomeUnknownError as unknown:
            return f"unknown {unknown.step_key}"

    @rf.handler
    async def keys(self) -> list[str]:
        first = await self.step("a", lambda: self.step_key)
        second = await self.step("b", lambda: self.step_key)
        return [first, second]

    @rf.handler
    async def failing(self) -> str:
        def fail() -> None:
            EFFECTS.append("fail")
            raise ValueError("card declined")
        try:
            await self.step("fail", fail)
        except ValueError as error:
            await asyncio.sleep(0)
            return f"caught {error}"
        return "unreachable"

    @rf.handler
    async def big(self, hold: str = "", fail: bool = False, wait: bool = False) -> int:
        blob = await self.step("blob", effect, "big", b"x" * (300 * 1024))
        if hold and hold in HOLD:
            await HOLD.pop(hold).wait()
        if fail:
            raise ValueError("no")
        if wait:
            await self.wait_signal("never")
        return len(blob)

    @rf.handler
    async def unpicklable(self) -> None:
        await self.step("lock", lambda: __import__("threading").Lock())

    @rf.handler
    async def misuse(self) -> str:
        return self.step_key


@pytest.fixture(autouse=True)
def _clean() -> None:
    EFFECTS.clear()
    HOLD.clear()
    ASK_FOR["first"] = "first"


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    led = Ledger(tmp_path / "ledger.sqlite")
    spec = rf.AgentSpec(identity="shop/1", agent=Orders)
    led.register(SpecRecord(identity="shop/1", spec=cloudpickle.dumps(spec), fingerprint=spec.fingerprint(),
                            agent_class=spec.agent_class_path, labels={}, addressability=spec.addressability.value))
    return led


def host(ledger: Ledger, tmp_path: Path, name: str) -> HostRuntime:
    return HostRuntime(name=name, ledger=LocalLedgerClient(ledger), snapshots=SnapshotStore(str(tmp_path)),
                       incarnation=name)


async def kill_mid_turn(ledger: Ledger, dying: HostRuntime, envelope: rf.Envelope, hold: str) -> asyncio.Task[Any]:
    """Deliver ``envelope`` to ``dying`` and "kill" the host once the handler waits on ``hold``."""
    HOLD[hold] = asyncio.Event()
    task = asyncio.ensure_future(dying.delivery.deliver(envelope))
    while hold in HOLD:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)  # whatever the handler journaled before waiting has landed
    ledger.revoke_holder(dying.holder)
    return task


async def test_steps_run_once_and_the_turn_ends_with_its_commit(ledger: Ledger, tmp_path: Path) -> None:
    async with host(ledger, tmp_path, "a") as a:
        result = await deliver(a, "shop/1", "order")
        assert result.value == ["first", "second"] and EFFECTS == ["first", "second"]
        records = ledger.turns(identity="shop/1", statuses=("COMPLETED",))
        assert len(records) == 1 and records[0].entries == ()
        turn_id = records[0].turn_id
        assert ledger.turns(identity="shop/1") == []  # nothing in progress
    record = ledger.turn(identity="shop/1", turn_id=turn_id)
    assert record is not None and record.status == "COMPLETED"


async def test_a_turn_retried_after_its_host_died_resumes_from_the_journal(ledger: Ledger, tmp_path: Path) -> None:
    envelope = rf.Envelope(target="shop/1", method="order", kwargs={"hold": "crash"})
    async with host(ledger, tmp_path, "a") as a:
        dying = await kill_mid_turn(ledger, a, envelope, "crash")
        in_progress = ledger.turns(identity="shop/1")
        assert [(t.turn_id, t.status, t.steps) for t in in_progress] == [(envelope.message_id, "RUNNING", 1)]
        async with host(ledger, tmp_path, "b") as b:
            result = await b.delivery.deliver(envelope)  # the router's re-send reaches the new owner
            assert result.value == ["first", "second"]
            assert EFFECTS == ["first", "second"]  # the completed step was not run again
            assert (await deliver(b, "shop/1", "order")).value == ["first", "second"]
        dying.cancel()
    assert ledger.turns(identity="shop/1") == []


async def test_a_zombie_cannot_journal_and_its_turn_stops_at_the_next_step(ledger: Ledger, tmp_path: Path) -> None:
    envelope = rf.Envelope(target="shop/1", method="order", kwargs={"hold": "zombie"})
    async with host(ledger, tmp_path, "a") as a:
        zombie = await kill_mid_turn(ledger, a, envelope, "zombie")
        async with host(ledger, tmp_path, "b") as b:
            assert (await deliver(b, "shop/1", "order")).value == ["first", "second"]
            HOLD["zombie"] = asyncio.Event()
        # Nothing holds the zombie's turn now: it reaches its next step, whose write is refused.
        HOLD.clear()
    with pytest.raises((rf.LeaseLostError, asyncio.CancelledError)):
        await asyncio.wait_for(zombie, 30)
    assert EFFECTS.count("second") == 1  # only the new owner's turn completed a second step
    assert rf.DeadLetterReason.REJECTED.value not in {letter.reason for letter in ledger.dead_letters()}


async def test_a_changed_handler_fails_the_replay_with_a_non_determinism_error(ledger: Ledger, tmp_path: Path) -> None:
    envelope = rf.Envelope(target="shop/1", method="order", kwargs={"hold": "crash"})
    async with host(ledger, tmp_path, "a") as a:
        dying = await kill_mid_turn(ledger, a, envelope, "crash")
        ASK_FOR["first"] = "renamed"  # the handler deployed on the next host asks for another step first
        async with host(ledger, tmp_path, "b") as b:
            with pytest.raises(rf.HandlerError) as failed:
                await b.delivery.deliver(envelope)
        dying.cancel()
    assert failed.value.remote_type.endswith("NonDeterminismError")
    assert "'step:first'" in failed.value.remote_message and "'step:renamed'" in failed.value.remote_message
    assert EFFECTS == ["first"]
    record = ledger.turn(identity="shop/1", turn_id=envelope.message_id)
    assert record is not None and record.status == "FAILED" and "NonDeterminismError" in record.error
    assert [letter.reason for letter in ledger.dead_letters()] == [rf.DeadLetterReason.REJECTED.value]


async def test_an_unknown_policy_step_cut_short_raises_its_unknown_outcome_in_the_handler(
    ledger: Ledger, tmp_path: Path,
) -> None:
    envelope = rf.Envelope(target="shop/1", method="charge", kwargs={"hold": "crash"})
    async with host(ledger, tmp_path, "a") as a:
        dying = await kill_mid_turn(ledger, a, envelope, "crash")
        async with host(ledger, tmp_path, "b") as b:
            result = await b.delivery.deliver(envelope)
        dying.cancel()
    key = f"shop/1:{envelope.message_id}:0"
    assert result.value == f"unknown {key}"
    assert [f"pay {key}"] == EFFECTS  # started once, never again


async def test_a_step_key_is_stable_and_only_readable_inside_a_step(ledger: Ledger, tmp_path: Path) -> None:
    async with host(ledger, tmp_path, "a") as a:
        result = await deliver(a, "shop/1", "keys", message_id="m-1")
        assert result.value == ["shop/1:m-1:0", "shop/1:m-1:1"]
        with pytest.raises(rf.HandlerError) as misuse:
            await deliver(a, "shop/1", "misuse")
    assert misuse.value.remote_type.endswith("UsageError") and "self.step_key" in misuse.value.remote_message


async def test_a_step_error_is_an_outcome_and_a_retry_of_the_turn_replays_it(ledger: Ledger, tmp_path: Path) -> None:
    async with host(ledger, tmp_path, "a") as a:
        assert (await deliver(a, "shop/1", "failing")).value == "caught card declined"
    assert EFFECTS == ["fail"]


async def until_gone(folder: Path) -> None:
    for _ in range(500):
        if not list(folder.rglob("*.bin")):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"spilled step values left behind: {list(folder.rglob('*.bin'))}")


async def test_a_large_step_value_lives_in_storage_until_its_turn_ends(ledger: Ledger, tmp_path: Path) -> None:
    envelope = rf.Envelope(target="shop/1", method="big", kwargs={"hold": "crash"})
    async with host(ledger, tmp_path, "a") as a:
        dying = await kill_mid_turn(ledger, a, envelope, "crash")
        assert len(list((tmp_path / "journal").rglob("*.bin"))) == 1  # the journal points at it
        async with host(ledger, tmp_path, "b") as b:
            # The next owner's replay reads the value back from storage: the step does not run again.
            assert (await b.delivery.deliver(envelope)).value == 300 * 1024
            assert EFFECTS == ["big"]
            # The turn's end is committed: its spilled values go with its journal.
            await until_gone(tmp_path / "journal")
            with pytest.raises(rf.HandlerError):
                await deliver(b, "shop/1", "big", kwargs={"fail": True})  # a turn that fails for good ends too
            await until_gone(tmp_path / "journal")
            # And one interrupted while it waits, suspended, with nothing of it on any host.
            waiting = rf.Envelope(target="shop/1", method="big", kwargs={"wait": True})
            call = asyncio.ensure_future(b.delivery.deliver(waiting))
            while [turn.status for turn in ledger.turns(identity="shop/1")] != ["SUSPENDED"]:
                await asyncio.sleep(0.01)
            assert len(list((tmp_path / "journal").rglob("*.bin"))) == 1
            assert await b.delivery.cancel_turn("shop/1", waiting.message_id)
            with pytest.raises(rf.TurnInterruptedError):
                await asyncio.wait_for(call, 20)
            await until_gone(tmp_path / "journal")
        dying.cancel()


async def test_a_step_value_that_cannot_be_serialized_fails_the_turn_clearly(ledger: Ledger, tmp_path: Path) -> None:
    async with host(ledger, tmp_path, "a") as a:
        with pytest.raises(rf.HandlerError) as failed:
            await deliver(a, "shop/1", "unpicklable")
        assert failed.value.remote_type.endswith("StepValueError")
        assert "'lock'" in failed.value.remote_message and "cannot be journaled" in failed.value.remote_message
        assert (await deliver(a, "shop/1", "order")).value == ["first", "second"]  # still serving


class _RecordingJournal:
    """A journal port that keeps what a turn writes (the turn context alone, no host)."""

    files = None

    def __init__(self) -> None:
        self.writes: list[Any] = []

    async def read(self, turn_id: str) -> None:
        return None

    async def write(self, turn: Any) -> None:
        self.writes.append(turn)

    def take_steering(self) -> list[Any]:
        return []


def test_only_a_retry_steps_outcome_may_skip_waiting_for_the_disk() -> None:
    from rayfleet.turns._context import TurnContext

    port = _RecordingJournal()
    turn = TurnContext(identity="a", turn_id="t1", method="go", envelope=lambda: b"envelope",
                       port=port)  # type: ignore[arg-type]

    async def steps() -> None:
        await turn.step("opens the row", effect, ("one",), {}, "retry")
        await turn.step("plain", effect, ("two",), {}, "retry")
        await turn.step("once", effect, ("three",), {}, "unknown")

    asyncio.run(steps())
    written = [(w.entries[-1].name, w.entries[-1].state.value, w.flush) for w in port.writes]
    assert written == [("opens the row", "completed", True),  # creates the turn's row
                       ("plain", "completed", False),
                       ("once", "requested", True), ("once", "completed", True)]
