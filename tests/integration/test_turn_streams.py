"""Turn streams through a real fleet on both ledger stores: ``ref.start``, ``TurnHandle``, ``ref.stream``, ``fleet.turns``."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import rayfleet as rf


class Narrator(rf.Agent):
    class State(rf.State):
        told: int = 0

    @rf.handler
    async def tell(self, words: list[str], wait: bool = False) -> str:
        self.emit("status", {"phase": "start"})
        if wait:
            await self.wait_signal("go")
        for word in words:
            self.emit_delta(word)
        self.emit("status", {"phase": "end"})
        self.state.told += 1
        return " ".join(words)

    @rf.handler
    async def hang(self) -> None:
        self.emit("status", "hanging")
        await asyncio.sleep(3600)

    @rf.handler
    async def quick(self) -> str:
        return "done"

    @rf.handler
    async def think(self) -> None:
        await asyncio.sleep(3600)  # journals nothing and streams nothing


def test_a_started_turn_streams_its_events_and_a_client_resumes_after_its_last_id(make_any_fleet: Any) -> None:
    fleet = make_any_fleet(hosts=1)
    ref = fleet.spawn("narrator/1", Narrator)
    handle = ref.start("tell", words=["Hel", "lo"], wait=True)  # the reader is there before the live deltas
    assert isinstance(handle, rf.TurnHandle) and handle.id
    events = []
    for event in handle.events():
        events.append(event)
        if event.kind == "suspended":
            fleet.signal("narrator/1", "go", True)
    assert handle.result(timeout=60) == "Hel lo"
    assert [event.kind for event in events] == ["started", "status", "suspended", "resumed", "delta", "delta",
                                                "status", "completed"]
    assert [event.data for event in events if event.kind == "delta"] == ["Hel", "lo"]
    assert events[-1].data == {"value": "Hel lo"} and events[-1].final
    assert all(isinstance(event, rf.TurnEvent) and event.turn_id == handle.id for event in events)
    persisted = [event for event in events if event.persisted]
    # Resuming after an id gets every persisted event after it, once (and the deltas the owner still holds,
    # which a reader cannot count on).
    again = [event for event in handle.events(after=persisted[1].id) if event.persisted]
    assert [event.id for event in again] == [event.id for event in persisted[2:]]
    # Resuming after a delta's id goes on from the persisted event before it.
    delta = next(event for event in events if event.kind == "delta")
    assert [event.kind for event in handle.events(after=delta.id) if event.persisted] == ["status", "completed"]
    assert [event.id for event in handle.events() if event.persisted] == [event.id for event in persisted]
    # An id of another turn, or no id at all, is refused with what to do.
    other = ref.start("tell", words=["x"])
    other_events = list(other.events())
    with pytest.raises(rf.UnknownTurnEventError, match="event of turn"):
        list(handle.events(after=other_events[0].id))
    with pytest.raises(rf.UnknownTurnEventError, match="not an event id"):
        list(handle.events(after="yesterday"))


def test_stream_and_wait_and_a_suspended_turn_listed_by_fleet_turns(make_any_fleet: Any) -> None:
    fleet = make_any_fleet(hosts=1)
    ref = fleet.spawn("narrator/2", Narrator)

    async def streamed() -> list[rf.TurnEvent]:
        return [event async for event in ref.stream("tell", words=["a", "b"])]

    events = asyncio.run(streamed())
    # Deltas are live only: a reader that comes after them does not get them.
    assert [event.kind for event in events if event.persisted] == ["started", "status", "status", "completed"]

    handle = ref.start("tell", words=["waits"], wait=True)
    seen: list[rf.TurnEvent] = []
    for event in handle.events():
        seen.append(event)
        if event.kind == "suspended":
            (info,) = fleet.turns("narrator/2")
            assert isinstance(info, rf.TurnInfo)
            assert info.id == handle.id and info.status is rf.TurnStatus.SUSPENDED
            assert info.waiting_for == "signal:go" and info.method == "tell" and info.steps == 1
            fleet.signal("narrator/2", "go", True)
    # The resumed turn's replay does not emit again what it emitted before its wait.
    assert [event.kind for event in seen if event.persisted] == ["started", "status", "suspended", "resumed",
                                                                 "status", "completed"]
    assert asyncio.run(handle.wait()) == "waits"
    assert fleet.turns("narrator/2") == []


def test_a_turn_that_journals_and_streams_nothing_is_listed_while_it_runs(make_any_fleet: Any) -> None:
    import time

    fleet = make_any_fleet(hosts=1)
    ref = fleet.spawn("narrator/4", Narrator)
    assert fleet.turns("narrator/4") == []
    handle = ref.start("think")
    deadline = time.monotonic() + 60
    while not (listed := fleet.turns("narrator/4")):
        assert time.monotonic() < deadline, "the running turn was never listed"
        time.sleep(0.05)
    (info,) = listed
    assert (info.id, info.method, info.status) == (handle.id, "think", rf.TurnStatus.RUNNING)
    assert fleet.turn("narrator/4", handle.id) == info
    assert fleet.turn("narrator/4", "no-such-turn") is None
    assert handle.cancel()
    with pytest.raises(rf.TurnInterruptedError):
        handle.result(timeout=60)
    # Ended, it is not listed as in progress; its owner host still knows how it ended.
    assert fleet.turns("narrator/4") == []
    ended = fleet.turn("narrator/4", handle.id)
    assert ended is not None and (ended.id, ended.method, ended.status) == (handle.id, "think",
                                                                          rf.TurnStatus.INTERRUPTED)


def test_a_plain_turn_that_ended_is_known_to_its_owner_host(make_any_fleet: Any) -> None:
    # It journaled and streamed nothing, so only the host that ran it knows it (while it holds the identity).
    fleet = make_any_fleet(hosts=1)
    ref = fleet.spawn("narrator/5", Narrator)
    handle = ref.start("quick")
    assert handle.result(timeout=60) == "done"
    info = fleet.turn("narrator/5", handle.id)
    assert info is not None and (info.method, info.status) == ("quick", rf.TurnStatus.COMPLETED)
    other = fleet.spawn("narrator/6", Narrator)
    assert other.call("quick") == "done"
    assert fleet.turn("narrator/6", handle.id) is None  # on the same host, but another identity's turn


def test_cancel_interrupts_the_turn_and_ends_its_stream(make_any_fleet: Any) -> None:
    fleet = make_any_fleet(hosts=1)
    ref = fleet.spawn("narrator/3", Narrator)
    handle = ref.start("hang")
    events = handle.events()
    assert next(events).kind == "started"
    assert next(events).kind == "status"
    assert handle.cancel()
    assert [event.kind for event in events] == ["interrupted"]
    with pytest.raises(rf.TurnInterruptedError):
        handle.result(timeout=60)
    assert not handle.cancel()
    assert ref.call("tell", words=["after"]) == "after"


class Scribe(rf.Agent):
    @rf.handler
    async def write(self, lines: int) -> int:
        for index in range(lines):
            self.emit("line", index)
            self.emit_delta(f"part {index}")
            await asyncio.sleep(0.05)
        return lines


@pytest.mark.timeout(180)
def test_a_reader_across_a_failover_misses_and_repeats_no_persisted_event_and_sees_one_reset(make_fleet: Any) -> None:
    import os
    import signal
    import threading

    import ray

    fleet = make_fleet(hosts=2, lease_ttl=3.0)
    ref = fleet.spawn("scribe/1", Scribe)
    handle = ref.start("write", lines=80)
    seen: list[rf.TurnEvent] = []
    half_way = threading.Event()

    def read() -> None:
        for event in handle.events():
            seen.append(event)
            if event.kind == "line" and event.data == 10:
                half_way.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert half_way.wait(60)
    owner = fleet.status("scribe/1").host
    assert owner is not None
    actor = ray.get_actor(owner, namespace=fleet.config.namespace)
    os.kill(int(ray.get(actor.__ray_call__.remote(lambda _: os.getpid()))), signal.SIGKILL)
    assert handle.result(timeout=120) == 80  # the caller's re-send ran the turn again on the other host
    reader.join(120)
    assert not reader.is_alive() and seen[-1].kind == "completed"

    ledger = [f"{row.epoch}.{row.seq}" for row in fleet._ledger.turn_events(identity="scribe/1", turn_id=handle.id,
                                                                             limit=10_000).result()]
    persisted = [event.id for event in seen if event.persisted]
    assert len(persisted) == len(set(persisted))  # nothing repeated
    assert set(ledger) <= set(persisted)  # nothing persisted missed (a dead host's last live events may be extra)
    assert [event.kind for event in seen].count("reset") == 1
    keys = [tuple(int(part) for part in event.id.split(".")) for event in seen]
    assert keys == sorted(keys)
    epochs = {key[0] for key in keys}
    assert len(epochs) == 2
    first_of_new = next(event for event in seen if int(event.id.split(".")[0]) == max(epochs))
    assert first_of_new.kind == "reset"  # before any of the new owner's events, deltas included
    assert [event.data for event in seen if event.kind == "line" and int(event.id.split(".")[0]) == max(epochs)] \
        == list(range(80))
