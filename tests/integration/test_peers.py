"""Agents reach each other from inside handlers; INTERNAL_ONLY agents only from peers."""

from __future__ import annotations

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
