"""Agents reach each other from inside handlers; INTERNAL_ONLY agents only from peers."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

import rayfleet as rf


class Worker(rf.Agent):
    class State(rf.State):
        jobs: int = 0

    @rf.handler
    async def work(self, size: int) -> int:
        self.state.jobs += 1
        return size * 10


class Planner(rf.Agent):
    class State(rf.State):
        plans: int = 0

    @rf.handler
    async def plan(self, size: int) -> dict[str, object]:
        results = [await self.send(peer, "work", size=size) for peer in self.peers]
        self.state.plans += 1
        return {"peers": list(self.peers), "results": results}

    @rf.handler
    async def talk_to_self(self) -> None:
        await self.send(self.identity, "plan", size=1)


@pytest.mark.timeout(120)
def test_planner_calls_internal_workers_from_its_handler(fleet: rf.Fleet) -> None:
    for name in ("team/worker-a", "team/worker-b"):
        fleet.spawn(name, Worker, addressability=rf.Addressability.INTERNAL_ONLY)
    planner = fleet.spawn("team/planner", Planner, peers=["team/worker-b", "team/worker-a"])

    reply = planner.call("plan", size=3)
    assert reply == {"peers": ["team/worker-a", "team/worker-b"], "results": [30, 30]}
    assert fleet.status("team/worker-a").state is rf.LifecycleState.ACTIVE

    with pytest.raises(rf.NotAddressableError, match="INTERNAL_ONLY"):
        fleet.agent("team/worker-a").call("work", size=1)

    # Workers' state is durable like any other agent's.
    assert fleet.status("team/worker-b").checkpoint_version == 1


@pytest.mark.timeout(120)
def test_a_handler_cannot_wait_on_its_own_turn(fleet: rf.Fleet) -> None:
    planner = fleet.spawn("team/solo", Planner)
    with pytest.raises(rf.HandlerError, match="itself"):
        planner.call("talk_to_self")


class Bouncer(rf.Agent):
    class State(rf.State):
        bounces: int = 0

    @rf.handler
    async def bounce(self, to: str, hops: int) -> int:
        """Sends ``hops`` more bounces back and forth with ``to``, each waiting for the next."""
        self.state.bounces += 1
        if hops == 0:
            return 0
        return 1 + int(await self.send(to, "bounce", to=self.identity, hops=hops - 1))

    @rf.handler
    async def wait_for(self, to: str, flag: str) -> str:
        try:
            await self.send(to, "hold", flag=flag)
        except rf.DeadlineExceededError as error:
            return f"gave up: {error.method}"
        return "answered"

    @rf.handler
    async def hold(self, flag: str) -> str:
        while not Path(flag).exists():
            await asyncio.sleep(0.05)
        return "released"

    @rf.handler
    async def count(self) -> int:
        return self.state.bounces


@pytest.mark.timeout(120)
def test_a_send_back_into_a_waiting_caller_is_refused_and_both_keep_serving(fleet: rf.Fleet) -> None:
    a = fleet.spawn("loop/a", Bouncer)
    b = fleet.spawn("loop/b", Bouncer)
    assert a.call("bounce", to="loop/b", hops=1, timeout=60) == 1  # a -> b and back: no cycle
    # a -> b -> a: a's turn waits on b, whose handler would wait on a's next turn forever.
    with pytest.raises(rf.HandlerError) as refused:
        a.call("bounce", to="loop/b", hops=2, timeout=60)
    assert "PeerCycleError" in refused.value.remote_message
    assert "loop/a -> loop/b -> loop/a" in refused.value.remote_message
    # Both failed turns rolled back; both agents serve again.
    assert a.call("count", timeout=60) == 1 and b.call("count", timeout=60) == 1


@pytest.mark.timeout(120)
def test_a_peer_send_gives_up_at_the_calling_turns_deadline(fleet: rf.Fleet, tmp_path: Path) -> None:
    a = fleet.spawn("slow/a", Bouncer)
    b = fleet.spawn("slow/b", Bouncer)
    flag = tmp_path / "release.flag"
    reply = a.call("wait_for", to="slow/b", flag=str(flag), deadline=time.time() + 2, timeout=60)
    assert reply == "gave up: hold"
    flag.write_text("go")
    assert b.call("hold", flag=str(flag), timeout=60) == "released"
    assert a.call("count", timeout=60) == 0


@pytest.mark.timeout(120)
def test_a_send_to_a_peer_active_on_the_same_host_returns_the_handlers_value(make_fleet: Any) -> None:
    # One host: once the worker is active, the planner's send takes the in-process path, not Ray.
    fleet = make_fleet(hosts=1)
    fleet.spawn("team/near-worker", Worker)
    planner = fleet.spawn("team/near-planner", Planner, peers=["team/near-worker"])
    fleet.agent("team/near-worker").call("work", size=1)  # active before the planner sends

    assert planner.call("plan", size=4) == {"peers": ["team/near-worker"], "results": [40]}
