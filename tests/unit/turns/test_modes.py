"""Handling modes (queue, steer, interrupt, reject) and shared handlers, on a real host runtime and SQLite."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import cloudpickle
import pytest

import rayfleet as rf
from rayfleet.checkpoints._store import SnapshotStore
from rayfleet.host._runtime import HostRuntime
from rayfleet.ledger._ledger import Ledger
from rayfleet.ledger._local import LocalLedgerClient
from rayfleet.ledger._values import SpecRecord
from rayfleet.turns._context import encode_signal

GATE: dict[str, asyncio.Event] = {}


class Chat(rf.Agent):
    class State(rf.State):
        said: list[str] = []

    @rf.handler
    async def talk(self, text: str, hold: str = "") -> list[str]:
        self.state.said.append(text)
        if hold:
            await GATE[hold].wait()
        heard = [text, *self.steering()]
        return heard

    @rf.handler
    async def deaf(self, text: str, hold: str) -> str:
        self.state.said.append(text)
        await GATE[hold].wait()
        return text

    @rf.handler
    async def pay(self) -> object:
        self.state.said.append("pay")
        return await self.wait_signal("paid")

    @rf.handler(shared=True)
    async def said(self) -> list[str]:
        return list(self.state.said)

    @rf.handler(shared=True)
    async def sneaky(self) -> None:
        self.state.said.append("sneaky")


@pytest.fixture(autouse=True)
def _gates() -> None:
    GATE.clear()


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    led = Ledger(tmp_path / "ledger.sqlite")
    for identity, on_busy in (("chat/1", "queue"), ("chat/strict", "reject")):
        spec = rf.AgentSpec(identity=identity, agent=Chat, on_busy=on_busy)
        led.register(SpecRecord(identity=identity, spec=cloudpickle.dumps(spec), fingerprint=spec.fingerprint(),
                                agent_class=spec.agent_class_path, labels={},
                                addressability=spec.addressability.value))
    return led


def host(ledger: Ledger, tmp_path: Path) -> HostRuntime:
    return HostRuntime(name="a", ledger=LocalLedgerClient(ledger), snapshots=SnapshotStore(str(tmp_path)),
                       incarnation="a", wake_interval=0.05)


def send(runtime: HostRuntime, method: str, target: str = "chat/1", mode: str | None = None,
         **kwargs: object) -> asyncio.Future[rf.Envelope]:
    envelope = rf.Envelope(target=target, method=method, kwargs=kwargs, mode=mode)
    return asyncio.ensure_future(runtime.delivery.deliver(envelope))


async def running(runtime: HostRuntime, target: str = "chat/1") -> None:
    deadline = time.monotonic() + 20
    while runtime._entries.get(target) is None or runtime._entries[target].running_turn is None:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)


async def test_reject_refuses_at_once_while_a_turn_runs_or_is_suspended(ledger: Ledger, tmp_path: Path) -> None:
    GATE["g"] = asyncio.Event()
    async with host(ledger, tmp_path) as a:
        first = send(a, "deaf", text="one", hold="g")
        await running(a)
        with pytest.raises(rf.AgentBusyError) as busy:
            await send(a, "talk", mode="reject", text="two")
        assert busy.value.status == "RUNNING"
        GATE["g"].set()
        assert (await first).value == "one"
        paying = send(a, "pay", target="chat/strict")
        await asyncio.sleep(0.3)
        with pytest.raises(rf.AgentBusyError) as busy:  # the spec's on_busy="reject"
            await send(a, "talk", target="chat/strict", text="late")
        assert busy.value.status == "SUSPENDED"
        ledger.send_signal(identity="chat/strict", name="paid", signal_id="s", value=encode_signal("x", "paid", 5))
        assert (await asyncio.wait_for(paying, 20)).value == 5


async def test_interrupt_stops_the_running_turn_commits_nothing_and_runs(ledger: Ledger, tmp_path: Path) -> None:
    GATE["forever"] = asyncio.Event()
    async with host(ledger, tmp_path) as a:
        first = send(a, "deaf", text="lost", hold="forever")
        await running(a)
        interrupting = rf.Envelope(target="chat/1", method="talk", kwargs={"text": "instead"}, mode="interrupt")
        second = asyncio.ensure_future(a.delivery.deliver(interrupting))
        with pytest.raises(rf.TurnInterruptedError) as stopped:
            await asyncio.wait_for(first, 20)
        assert stopped.value.by == interrupting.message_id
        assert (await asyncio.wait_for(second, 20)).value == ["instead"]
        assert (await send(a, "said")).value == ["instead"]  # nothing of the interrupted turn committed


async def test_interrupt_ends_a_suspended_turn_and_its_caller_learns(ledger: Ledger, tmp_path: Path) -> None:
    async with host(ledger, tmp_path) as a:
        paying = send(a, "pay")
        await asyncio.sleep(0.3)
        (suspended,) = ledger.turns(identity="chat/1", statuses=("SUSPENDED",))
        queued = send(a, "talk", text="queued")  # parks behind the suspended turn
        await asyncio.sleep(0.2)
        assert (await asyncio.wait_for(send(a, "talk", mode="interrupt", text="now"), 20)).value == ["now"]
        with pytest.raises(rf.TurnInterruptedError):
            await asyncio.wait_for(paying, 20)
        assert (await asyncio.wait_for(queued, 20)).value == ["queued"]
        assert ledger.turn(identity="chat/1", turn_id=suspended.turn_id).status == "INTERRUPTED"
        assert (await send(a, "said")).value == ["now", "queued"]


async def test_a_steer_message_joins_the_running_turn_and_shares_its_reply(ledger: Ledger, tmp_path: Path) -> None:
    GATE["g"] = asyncio.Event()
    async with host(ledger, tmp_path) as a:
        first = send(a, "talk", text="hello", hold="g")
        await running(a)
        steer = send(a, "talk", mode="steer", text="in French")
        await asyncio.sleep(0.1)
        GATE["g"].set()
        assert (await first).value == ["hello", "in French"]
        assert (await steer).value == ["hello", "in French"]  # its caller gets the turn it joined
        assert (await send(a, "said")).value == ["hello"]


async def test_a_steer_message_the_turn_never_reads_runs_after_it(ledger: Ledger, tmp_path: Path) -> None:
    GATE["g"] = asyncio.Event()
    async with host(ledger, tmp_path) as a:
        first = send(a, "deaf", text="busy", hold="g")
        await running(a)
        steer = send(a, "talk", mode="steer", text="later")
        await asyncio.sleep(0.1)
        GATE["g"].set()
        assert (await first).value == "busy"
        assert (await asyncio.wait_for(steer, 20)).value == ["later"]
        steer_alone = await send(a, "talk", mode="steer", text="alone")  # no turn in progress: a plain message
        assert steer_alone.value == ["alone"]


async def test_shared_handlers_read_beside_a_running_or_suspended_turn_and_cannot_write(
    ledger: Ledger, tmp_path: Path,
) -> None:
    GATE["g"] = asyncio.Event()
    async with host(ledger, tmp_path) as a:
        assert (await send(a, "talk", text="one")).value == ["one"]
        blocked = send(a, "deaf", text="two", hold="g")
        await running(a)
        assert (await asyncio.wait_for(send(a, "said"), 5)).value == ["one", "two"]  # did not wait its turn
        with pytest.raises(rf.UsageError, match="shared"):
            await send(a, "sneaky")
        GATE["g"].set()
        await blocked
        paying = send(a, "pay")
        await asyncio.sleep(0.3)
        assert (await asyncio.wait_for(send(a, "said"), 5)).value == ["one", "two"]  # beside a suspended turn
        ledger.send_signal(identity="chat/1", name="paid", signal_id="s", value=encode_signal("x", "paid", 1))
        await asyncio.wait_for(paying, 20)
        assert (await send(a, "said")).value == ["one", "two", "pay"]


def test_a_bad_mode_is_refused_naming_the_modes() -> None:
    with pytest.raises(rf.InvalidSpecError, match="mode must be one of"):
        rf.Envelope(target="chat/1", method="talk", mode="shout")
    with pytest.raises(rf.InvalidSpecError, match="mode must be one of"):
        rf.AgentSpec(identity="chat/2", agent=Chat, on_busy="whenever")
