"""Turn streams on real host runtimes and a real SQLite ledger (no Ray).

A turn that emits (or is watched) has an ordered stream: boundary events, persisted
``emit`` events (ids ``<epoch>.<seq>``, written by the host's group commit, fenced) and
live deltas. After a failover the next owner's part starts with one ``reset``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from pathlib import Path

import cloudpickle
import pytest

import rayfleet as rf
from rayfleet.checkpoints._store import SnapshotStore
from rayfleet.host._runtime import HostRuntime
from rayfleet.host._streams import LIVE_EVENTS, parse_event_id
from rayfleet.ledger._ledger import Ledger
from rayfleet.ledger._local import LocalLedgerClient
from rayfleet.ledger._values import SpecRecord
from rayfleet.turns._context import encode_signal

GATES: dict[str, asyncio.Event] = {}
ATTEMPTS: list[int] = []


class Writer(rf.Agent):
    class State(rf.State):
        written: int = 0

    @rf.handler
    async def write(self, words: list[str], gate: str = "") -> str:
        self.emit("status", {"phase": "writing"})
        for word in words:
            self.emit_delta(word)
            await asyncio.sleep(0)
        if gate:
            await GATES[gate].wait()
        self.emit("status", {"phase": "done"})
        self.state.written += 1
        return " ".join(words)

    @rf.handler
    async def plain(self) -> int:
        self.state.written += 1
        return self.state.written

    @rf.handler
    async def bad(self, what: str) -> None:
        if what == "kind":
            self.emit("completed", {})
        elif what == "json":
            self.emit("status", {"a": object()})
        elif what == "size":
            self.emit("status", "x" * 70_000)
        else:
            self.emit_delta(42)  # type: ignore[arg-type]

    @rf.handler
    async def wait_pay(self) -> int:
        self.emit("status", "waiting")
        value: int = await self.wait_signal("payment")
        await self.step("charge", lambda: value)
        return value

    @rf.handler
    async def wait_quiet(self) -> int:
        value: int = await self.wait_signal("payment")
        return value

    @rf.handler
    async def flaky(self) -> str:
        self.emit("status", "before")
        await self.step("s", lambda: 1)
        self.emit("status", "after")
        ATTEMPTS.append(1)
        if len(ATTEMPTS) == 1:
            raise rf.RetryableError("once more")
        return "done"

    @rf.handler
    async def stepped(self) -> int:
        self.emit("status", "before")
        value: int = await self.step("s", lambda: 5)
        self.emit("status", "after")
        return value

    @rf.handler
    async def stepped_fails(self) -> int:
        self.emit("status", "before")
        await self.step("s", lambda: 5)
        raise ValueError("no stock")

    @rf.handler
    async def many(self, count: int) -> int:
        for index in range(count):
            self.emit("n", index)
        return count


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    led = Ledger(tmp_path / "ledger.sqlite")
    spec = rf.AgentSpec(identity="w/1", agent=Writer, retry=rf.RetryPolicy(max_attempts=2, base_delay=0.0))
    led.register(SpecRecord(identity="w/1", spec=cloudpickle.dumps(spec), fingerprint=spec.fingerprint(),
                            agent_class=spec.agent_class_path, labels={}, addressability=spec.addressability.value))
    return led


class Counted:
    def __init__(self) -> None:
        self.events: Counter[str] = Counter()

    def turn_event(self, agent_class: str, event: str, count: int = 1) -> None:
        self.events[event] += count

    def __getattr__(self, name: str) -> object:
        return lambda *args, **kwargs: None


def host(ledger: Ledger, tmp_path: Path, name: str, metrics: object = None) -> HostRuntime:
    extra = {} if metrics is None else {"metrics": metrics}
    return HostRuntime(name=name, ledger=LocalLedgerClient(ledger), snapshots=SnapshotStore(str(tmp_path)),
                       incarnation=name, wake_interval=0.05, **extra)


async def until(condition, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def watch_all(runtime: HostRuntime, turn_id: str, after: str | None = None) -> list[tuple]:
    """Every event of the turn this host has after ``after``, until the stream ends."""
    seen: list[tuple] = []
    while True:
        events, state, gap = await runtime.delivery.watch_turn("w/1", turn_id, after, 5.0)
        assert not gap
        seen += events
        if events:
            after = events[-1][0]
        if (state == "ended" and not events) or any(event[2] in ("completed", "failed", "interrupted")
                                                 for event in events):
            return seen


def persisted(ledger: Ledger, turn_id: str) -> list[tuple[str, str]]:
    return [(f"{row.epoch}.{row.seq}", row.kind) for row in ledger.turn_events(identity="w/1", turn_id=turn_id)]


async def test_a_turn_streams_its_events_and_deltas_live_in_order_and_persists_the_events(
    ledger: Ledger, tmp_path: Path,
) -> None:
    metrics = Counted()
    GATES["g"] = asyncio.Event()
    async with host(ledger, tmp_path, "a", metrics=metrics) as a:
        envelope = rf.Envelope(target="w/1", method="write", kwargs={"words": ["Hel", "lo"], "gate": "g"})
        call = asyncio.ensure_future(a.delivery.deliver(envelope))
        watching = asyncio.ensure_future(watch_all(a, envelope.message_id))
        await until(lambda: a.delivery.streams.has(envelope.message_id))
        GATES["g"].set()
        assert (await asyncio.wait_for(call, 20)).value == "Hel lo"
        events = await asyncio.wait_for(watching, 20)
        await a.delivery.streams.flush()
    kinds = [(event[2], json.loads(event[3]), event[5]) for event in events]
    assert kinds == [("started", {"method": "write"}, True), ("status", {"phase": "writing"}, True),
                     ("delta", "Hel", False), ("delta", "lo", False), ("status", {"phase": "done"}, True),
                     ("completed", {"value": "Hel lo"}, True)]
    keys = [parse_event_id(event[0]) for event in events]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)
    token = keys[0][0]
    assert [event[0] for event in events] == [f"{token}.1", f"{token}.2", f"{token}.2.1", f"{token}.2.2",
                                              f"{token}.3", f"{token}.4"]
    # Deltas are live only: the ledger keeps the rest, with the same ids.
    assert persisted(ledger, envelope.message_id) == [(f"{token}.1", "started"), (f"{token}.2", "status"),
                                                      (f"{token}.3", "status"), (f"{token}.4", "completed")]
    assert metrics.events["emitted"] == 2 and metrics.events["delta"] == 2


async def test_a_plain_turn_nobody_watches_writes_no_stream(ledger: Ledger, tmp_path: Path) -> None:
    async with host(ledger, tmp_path, "a") as a:
        envelope = rf.Envelope(target="w/1", method="plain")
        assert (await a.delivery.deliver(envelope)).value == 1
        await a.delivery.streams.flush()
        assert persisted(ledger, envelope.message_id) == []
        # A watcher that comes after learns it ended.
        assert await a.delivery.watch_turn("w/1", envelope.message_id, None, 0.0) == ([], "ended", False)


async def test_a_watcher_that_comes_first_gets_the_whole_stream_of_a_plain_turn(ledger: Ledger, tmp_path: Path) -> None:
    async with host(ledger, tmp_path, "a") as a:
        envelope = rf.Envelope(target="w/1", method="plain")
        watching = asyncio.ensure_future(watch_all(a, envelope.message_id))
        await until(lambda: envelope.message_id in a.delivery.streams._streams)
        assert (await a.delivery.deliver(envelope)).value == 1
        events = await asyncio.wait_for(watching, 20)
        assert [event[2] for event in events] == ["started", "completed"]
        assert json.loads(events[-1][3]) == {"value": 1}


async def test_a_client_resumes_after_its_last_event_id(ledger: Ledger, tmp_path: Path) -> None:
    async with host(ledger, tmp_path, "a") as a:
        envelope = rf.Envelope(target="w/1", method="many", kwargs={"count": 5})
        assert (await a.delivery.deliver(envelope)).value == 5
        await a.delivery.streams.flush()
        ids = [event_id for event_id, _ in persisted(ledger, envelope.message_id)]
        events, state, gap = await a.delivery.watch_turn("w/1", envelope.message_id, ids[3], 0.0)
        assert [event[0] for event in events] == ids[4:] and state == "ended" and not gap


async def test_bad_events_fail_the_turn_with_a_usage_error(ledger: Ledger, tmp_path: Path) -> None:
    async with host(ledger, tmp_path, "a") as a:
        for what, words in (("kind", "platform"), ("json", "JSON"), ("size", "65536"), ("delta", "string")):
            with pytest.raises(rf.HandlerError) as caught:
                await a.delivery.deliver(rf.Envelope(target="w/1", method="bad", kwargs={"what": what}))
            assert caught.value.remote_type == "rayfleet.errors.UsageError" and words in caught.value.remote_message


async def test_a_suspended_turn_streams_suspended_then_resumed(ledger: Ledger, tmp_path: Path) -> None:
    async with host(ledger, tmp_path, "a") as a:
        envelope = rf.Envelope(target="w/1", method="wait_pay")
        paying = asyncio.ensure_future(a.delivery.deliver(envelope))
        await until(lambda: bool(ledger.turns(identity="w/1", statuses=("SUSPENDED",))))
        ledger.send_signal(identity="w/1", name="payment", signal_id="s", value=encode_signal("w/1", "payment", 7))
        assert (await asyncio.wait_for(paying, 20)).value == 7
        await a.delivery.streams.flush()
    kinds = [kind for _, kind in persisted(ledger, envelope.message_id)]
    # The replay does not emit again what the first run emitted before its wait.
    assert kinds == ["started", "status", "suspended", "resumed", "step", "completed"]


async def test_after_a_failover_the_stream_carries_one_reset_and_the_zombie_cannot_append(
    ledger: Ledger, tmp_path: Path,
) -> None:
    GATES["never"] = asyncio.Event()
    envelope = rf.Envelope(target="w/1", method="write", kwargs={"words": ["par", "tial"], "gate": "never"})
    async with host(ledger, tmp_path, "a") as a:
        first = asyncio.ensure_future(a.delivery.deliver(envelope))
        await until(lambda: a.delivery.streams.has(envelope.message_id))
        await until(lambda: len(persisted(ledger, envelope.message_id)) == 2)  # started, status
        old = parse_event_id(persisted(ledger, envelope.message_id)[0][0])[0]
        ledger.revoke_holder(a.holder)  # host a is gone; its turn runs on as a zombie's
        GATES["never"] = asyncio.Event()
        GATES["never"].set()
        async with host(ledger, tmp_path, "b") as b:
            assert (await asyncio.wait_for(b.delivery.deliver(envelope), 20)).value == "par tial"
            await b.delivery.streams.flush()
            # The zombie's turn goes on, but what it emits now is refused by the fence.
            a.delivery.streams.emit("w/1", envelope.message_id, "late", "null")
            await a.delivery.streams.flush()
        first.cancel()
    rows = persisted(ledger, envelope.message_id)
    assert [kind for _, kind in rows] == ["started", "status", "reset", "started", "status", "status", "completed"]
    assert [parse_event_id(event_id)[0] for event_id, _ in rows][:2] == [old, old]
    assert all(parse_event_id(event_id)[0] > old for event_id, _ in rows[2:])


async def test_cancel_interrupts_the_running_turn_and_its_stream_ends(ledger: Ledger, tmp_path: Path) -> None:
    GATES["c"] = asyncio.Event()
    async with host(ledger, tmp_path, "a") as a:
        envelope = rf.Envelope(target="w/1", method="write", kwargs={"words": ["a"], "gate": "c"})
        call = asyncio.ensure_future(a.delivery.deliver(envelope))
        await until(lambda: a.delivery.streams.has(envelope.message_id))
        assert await a.delivery.cancel_turn("w/1", envelope.message_id)
        with pytest.raises(rf.TurnInterruptedError):
            await asyncio.wait_for(call, 20)
        assert not await a.delivery.cancel_turn("w/1", envelope.message_id)
        events = await watch_all(a, envelope.message_id)
        assert events[-1][2] == "interrupted"


async def test_a_watcher_far_behind_is_told_to_read_the_ledger(ledger: Ledger, tmp_path: Path) -> None:
    async with host(ledger, tmp_path, "a") as a:
        envelope = rf.Envelope(target="w/1", method="many", kwargs={"count": LIVE_EVENTS + 10})
        watching = asyncio.ensure_future(a.delivery.deliver(envelope))
        assert (await asyncio.wait_for(watching, 20)).value == LIVE_EVENTS + 10
        events, _, gap = await a.delivery.watch_turn("w/1", envelope.message_id, None, 0.0)
        assert gap and events == []


async def test_retention_forgets_finished_streams(ledger: Ledger, tmp_path: Path) -> None:
    async with host(ledger, tmp_path, "a") as a:
        envelope = rf.Envelope(target="w/1", method="many", kwargs={"count": 2})
        await a.delivery.deliver(envelope)
        await a.delivery.streams.flush()
        assert await a.sweep_streams() == 0  # kept 24 h by default
        a.stream_retention = 0.0
        assert await a.sweep_streams() == 1
    assert persisted(ledger, envelope.message_id) == []


async def test_a_retried_attempt_replays_quietly_after_one_reset(ledger: Ledger, tmp_path: Path) -> None:
    ATTEMPTS.clear()
    async with host(ledger, tmp_path, "a") as a:
        envelope = rf.Envelope(target="w/1", method="flaky")
        assert (await a.delivery.deliver(envelope)).value == "done"
        await a.delivery.streams.flush()
    # The retry does not emit again what came before the journaled step; what came after it is voided by a reset.
    assert [kind for _, kind in persisted(ledger, envelope.message_id)] == [
        "started", "status", "step", "status", "reset", "status", "completed"]


async def test_a_turn_that_fails_before_its_stream_is_ready_shows_its_end_once_the_whole_stream_is_written(
    ledger: Ledger, tmp_path: Path,
) -> None:
    async with host(ledger, tmp_path, "a") as a:
        hub = a.delivery.streams
        envelope = rf.Envelope(target="w/1", method="plain")
        await a.delivery.deliver(rf.Envelope(target="w/1", method="plain"))  # activated: the hub knows the token
        hub.begin("w/1", envelope.message_id, "plain")
        hub.emit("w/1", envelope.message_id, "status", "null")  # starts the stream: its reset check is in flight
        assert not hub._streams[envelope.message_id].ready
        await hub.finish(envelope.message_id, {"error": "boom"}, kind="failed")
        assert [kind for _, kind in persisted(ledger, envelope.message_id)] == ["started", "status", "failed"]
        events, state, _ = await hub.watch("w/1", envelope.message_id, None, 5.0, in_progress=False)
        assert [event[2] for event in events] == ["started", "status", "failed"] and state == "ended"


async def test_flushes_at_once_write_every_event_once(ledger: Ledger, tmp_path: Path) -> None:
    async with host(ledger, tmp_path, "a") as a:
        await a.delivery.deliver(rf.Envelope(target="w/1", method="plain"))  # activated: the hub knows the token
        hub = a.delivery.streams
        hub.begin("w/1", "t-many", "many")
        hub.emit("w/1", "t-many", "first", "null")
        await until(lambda: hub._streams["t-many"].ready)  # the reset check is done: ids are given at once
        await hub.flush()
        for index in range(40):
            hub.emit("w/1", "t-many", "n", str(index))
        await asyncio.gather(hub.flush(), hub.flush(), hub.flush())
        rows = [row for row in ledger.turn_events(identity="w/1", turn_id="t-many") if row.kind == "n"]
        assert [row.data for row in rows] == [str(index) for index in range(40)]


@pytest.mark.parametrize("durability", ["EVERY_TURN", "PERIODIC"])
@pytest.mark.parametrize(("method", "kwargs"), [("write", {"words": ["a", "b"]}), ("many", {"count": 3}),
                                                ("stepped", {})])
async def test_a_streamed_turn_replies_only_once_its_whole_stream_is_in_the_ledger(
    tmp_path: Path, durability: str, method: str, kwargs: dict,
) -> None:
    # A turn that changes State and commits (write), one that commits nothing (many), a
    # journaled one (stepped); with every-turn and periodic commits. The reply comes only
    # after the end event is written, so a caller holding the reply (or a reader who saw
    # "completed") finds the whole stream in the ledger, whatever happens to the host next.
    ledger = Ledger(tmp_path / f"{durability}.sqlite")
    spec = rf.AgentSpec(identity="w/1", agent=Writer, durability=rf.Durability(durability))
    ledger.register(SpecRecord(identity="w/1", spec=cloudpickle.dumps(spec), fingerprint=spec.fingerprint(),
                               agent_class=spec.agent_class_path, labels={},
                               addressability=spec.addressability.value))
    async with host(ledger, tmp_path, "a") as a:
        envelope = rf.Envelope(target="w/1", method=method, kwargs=kwargs)
        watching = asyncio.ensure_future(watch_all(a, envelope.message_id))
        await until(lambda: envelope.message_id in a.delivery.streams._streams)
        await a.delivery.deliver(envelope)
        rows = persisted(ledger, envelope.message_id)  # no flush: what the ledger holds as the reply comes
        events = await asyncio.wait_for(watching, 20)
    assert rows[0][1] == "started" and rows[-1][1] == "completed"
    assert [event[0] for event in events if event[5]] == [event_id for event_id, _ in rows]


async def test_an_end_event_the_ledger_refused_is_never_shown(tmp_path: Path) -> None:
    GATES["z"] = asyncio.Event()
    ledger = Ledger(tmp_path / "periodic.sqlite")
    spec = rf.AgentSpec(identity="w/1", agent=Writer, durability=rf.Durability.PERIODIC)
    ledger.register(SpecRecord(identity="w/1", spec=cloudpickle.dumps(spec), fingerprint=spec.fingerprint(),
                               agent_class=spec.agent_class_path, labels={},
                               addressability=spec.addressability.value))
    async with host(ledger, tmp_path, "a") as a:
        envelope = rf.Envelope(target="w/1", method="write", kwargs={"words": ["x"], "gate": "z"})
        call = asyncio.ensure_future(a.delivery.deliver(envelope))
        await until(lambda: len(persisted(ledger, envelope.message_id)) == 2)  # started, status
        ledger.revoke_holder(a.holder)  # host a is gone: its turn ends as a zombie's, answered before durable
        async with host(ledger, tmp_path, "b") as b:
            await b.delivery.deliver(rf.Envelope(target="w/1", method="plain"))  # the next owner's token
            watching = asyncio.ensure_future(watch_all(a, envelope.message_id))
            GATES["z"].set()
            await asyncio.wait_for(call, 20)
            events = await asyncio.wait_for(watching, 20)
    assert "completed" not in [event[2] for event in events]
    assert "completed" not in [kind for _, kind in persisted(ledger, envelope.message_id)]


class EndsNotWrittenAlone(LocalLedgerClient):
    """A ledger client whose stream writer can write every event but an end event (as if
    the host died just before its group commit wrote it); ends written with the turn's end pass."""

    def append_turn_events(self, *, events):  # type: ignore[no-untyped-def]
        if any(event.kind in ("completed", "failed", "interrupted") for event in events):
            raise ConnectionError("the host died before it wrote the end event")
        return super().append_turn_events(events=events)


@pytest.mark.parametrize("method", ["write", "stepped"])
async def test_a_committed_turn_writes_its_end_event_in_its_commit(ledger: Ledger, tmp_path: Path,
                                                                   method: str) -> None:
    runtime = HostRuntime(name="a", ledger=EndsNotWrittenAlone(ledger), snapshots=SnapshotStore(str(tmp_path)),
                          incarnation="a", wake_interval=0.05)
    async with runtime as a:
        envelope = rf.Envelope(target="w/1", method=method, kwargs={"words": ["a"]} if method == "write" else {})
        watching = asyncio.ensure_future(watch_all(a, envelope.message_id))
        await until(lambda: envelope.message_id in a.delivery.streams._streams)
        await asyncio.wait_for(a.delivery.deliver(envelope), 20)
        assert persisted(ledger, envelope.message_id)[-1][1] == "completed"
        await asyncio.wait_for(watching, 20)


async def test_a_stream_whose_turn_was_cut_off_and_never_sent_again_is_forgotten_in_time(
    ledger: Ledger, tmp_path: Path,
) -> None:
    async with host(ledger, tmp_path, "a") as a:
        await a.delivery.deliver(rf.Envelope(target="w/1", method="plain"))  # activated: the hub knows the token
        hub = a.delivery.streams
        hub.begin("w/1", "t-cut", "write")
        hub.emit("w/1", "t-cut", "status", "null")
        await hub.settle("t-cut")
        hub.stop("t-cut")  # stopped without an end (its lease went), and nobody sends it again
        assert [kind for _, kind in persisted(ledger, "t-cut")] == ["started", "status"]
        assert await a.sweep_streams() == 0  # kept a week by default
        a.abandoned_stream_age = 0.0
        assert await a.sweep_streams() == 1
        assert persisted(ledger, "t-cut") == []


async def test_a_turn_cut_off_here_is_not_reported_running_here_afterwards(ledger: Ledger, tmp_path: Path) -> None:
    """A turn that stopped here without an end (its lease went; it was sent to, and ended on, another
    owner) is not "running" here when its identity comes back: a reader told so would poll forever."""
    async with host(ledger, tmp_path, "a") as a:
        await a.delivery.deliver(rf.Envelope(target="w/1", method="plain"))
        hub = a.delivery.streams
        hub.begin("w/1", "t-moved", "write")
        hub.emit("w/1", "t-moved", "status", "null")
        await hub.settle("t-moved")
        hub.stop("t-moved")
        events, state, gap = await a.delivery.watch_turn("w/1", "t-moved", None, 0.05)
        assert state == "unknown", (events, state, gap)
        assert [event[2] for event in events] == ["started", "status"]


async def test_a_journaled_turn_that_fails_writes_its_end_event_with_its_end(ledger: Ledger, tmp_path: Path) -> None:
    runtime = HostRuntime(name="a", ledger=EndsNotWrittenAlone(ledger), snapshots=SnapshotStore(str(tmp_path)),
                          incarnation="a", wake_interval=0.05)
    async with runtime as a:
        envelope = rf.Envelope(target="w/1", method="stepped_fails")
        watching = asyncio.ensure_future(watch_all(a, envelope.message_id))
        await until(lambda: envelope.message_id in a.delivery.streams._streams)
        with pytest.raises(rf.HandlerError, match="no stock"):
            await asyncio.wait_for(a.delivery.deliver(envelope), 20)
        assert persisted(ledger, envelope.message_id)[-1][1] == "failed"  # in the ledger as the caller hears
        events = await asyncio.wait_for(watching, 20)
    assert events[-1][2] == "failed" and "no stock" in events[-1][3]
    assert ledger.turn(identity="w/1", turn_id=envelope.message_id).status == "FAILED"


class CountingReads(LocalLedgerClient):
    """A ledger client that counts separate reads of a turn's latest stream event."""

    def __init__(self, ledger: Ledger) -> None:
        super().__init__(ledger)
        self.last_event_reads = 0

    def last_turn_event(self, *, identity: str, turn_id: str):  # type: ignore[no-untyped-def]
        self.last_event_reads += 1
        return super().last_turn_event(identity=identity, turn_id=turn_id)


async def test_a_resumed_turn_reads_its_stream_with_its_journal_not_apart(ledger: Ledger, tmp_path: Path) -> None:
    # Whether the turn has a stream, and its latest event, come with the journal's read (B11: every
    # read on a woken turn's way is latency). One turn without a stream, one with; each suspends on
    # host a and resumes on host b, which knows nothing of its stream.
    for method, signal_id in (("wait_quiet", "s1"), ("wait_pay", "s2")):
        envelope = rf.Envelope(target="w/1", method=method)
        async with host(ledger, tmp_path, f"a-{method}") as a:
            waiting = asyncio.ensure_future(a.delivery.deliver(envelope))
            await until(lambda: bool(ledger.turns(identity="w/1", statuses=("SUSPENDED",))))
            waiting.cancel()
        client = CountingReads(ledger)
        async with HostRuntime(name=f"b-{method}", ledger=client, snapshots=SnapshotStore(str(tmp_path)),
                               incarnation=f"b-{method}", wake_interval=0.05) as b:
            ledger.send_signal(identity="w/1", name="payment", signal_id=signal_id,
                               value=encode_signal("w/1", "payment", 3))
            turn_id = envelope.message_id
            await until(lambda: ledger.turn(identity="w/1", turn_id=turn_id).status == "COMPLETED")  # noqa: B023
            await b.delivery.streams.flush()
        assert client.last_event_reads == 0, method
    kinds = [kind for _, kind in persisted(ledger, envelope.message_id)]
    assert kinds == ["started", "status", "suspended", "resumed", "step", "completed"]


class StreamWritesDown(LocalLedgerClient):
    """A ledger client that cannot write stream events while ``down`` (as a ledger that stays
    down would refuse them); everything else passes."""

    down = True

    def append_turn_events(self, *, events):  # type: ignore[no-untyped-def]
        if self.down:
            raise ConnectionError("the ledger is down")
        return super().append_turn_events(events=events)


@pytest.mark.parametrize(("method", "kwargs", "value"), [
    ("many", {"count": 2}, 2),  # commits nothing: its end would go through the group commit
    ("write", {"words": ["a"]}, "a"),  # commits State: its end would go with the commit
    ("stepped", {}, 5),  # journaled: its end would go with the journal's end
])
async def test_a_stream_the_ledger_does_not_take_in_time_does_not_hold_the_outcome(
    ledger: Ledger, tmp_path: Path, method: str, kwargs: dict, value: object,
) -> None:
    client = StreamWritesDown(ledger)
    runtime = HostRuntime(name="a", ledger=client, snapshots=SnapshotStore(str(tmp_path)), incarnation="a",
                          wake_interval=0.05)
    async with runtime as a:
        a.delivery.streams.write_patience = 0.3
        envelope = rf.Envelope(target="w/1", method=method, kwargs=kwargs)
        watching = asyncio.ensure_future(a.delivery.watch_turn("w/1", envelope.message_id, None, 5.0))
        await until(lambda: envelope.message_id in a.delivery.streams._streams)
        assert (await asyncio.wait_for(a.delivery.deliver(envelope), 20)).value == value
        assert persisted(ledger, envelope.message_id) == []  # nothing of the stream could be written
        events, _, _ = await asyncio.wait_for(watching, 20)
        assert "completed" not in [event[2] for event in events]  # an end the ledger does not hold is never shown
        _, state, _ = await a.delivery.watch_turn("w/1", envelope.message_id, None, 0.05)
        assert state == "unknown"  # stopped here, as a cut-off turn's: a reader reads the ledger
        if method != "many":
            continuity = ledger.resolve(["w/1"])["w/1"].continuity
            assert continuity is not None and continuity.checkpoint_version == 1  # committed all the same
        client.down = False  # the ledger is back: what was queued is written, in order
        await until(lambda: len(persisted(ledger, envelope.message_id)) >= 2)
        kinds = [kind for _, kind in persisted(ledger, envelope.message_id)]
        assert kinds[0] == "started" and "completed" not in kinds  # the turn ended without its end event


async def test_a_failed_turn_whose_stream_the_ledger_does_not_take_fails_at_once(
    ledger: Ledger, tmp_path: Path,
) -> None:
    runtime = HostRuntime(name="a", ledger=StreamWritesDown(ledger), snapshots=SnapshotStore(str(tmp_path)),
                          incarnation="a", wake_interval=0.05)
    async with runtime as a:
        a.delivery.streams.write_patience = 0.3
        envelope = rf.Envelope(target="w/1", method="stepped_fails")
        watching = asyncio.ensure_future(a.delivery.watch_turn("w/1", envelope.message_id, None, 5.0))
        await until(lambda: envelope.message_id in a.delivery.streams._streams)
        with pytest.raises(rf.HandlerError, match="no stock"):
            await asyncio.wait_for(a.delivery.deliver(envelope), 20)
        await asyncio.wait_for(watching, 20)
    assert ledger.turn(identity="w/1", turn_id=envelope.message_id).status == "FAILED"  # ended all the same
