"""What the benchmarks run: a trivial rayfleet agent and the plain Ray actor it is compared with.

Both do the same work per call (add to a counter, answer a ping, tell their process id),
so a ratio between them is the cost rayfleet adds: routing, fencing, leases, durability.
This module imports little on purpose: the agent class travels to the hosts by value
(the benchmarks folder is not an installed package), and so does the plain actor class.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Any

import ray
import ray.cloudpickle

import rayfleet as rf


def noop() -> None:
    """The function B10's steps run: nothing, so a step's cost is rayfleet's alone (journal and fencing)."""


class BenchAgent(rf.Agent):
    """A counter agent with a small State (one int)."""

    class State(rf.State):
        total: int = 0

    @rf.handler
    async def add(self, n: int) -> int:
        self.state.total += n
        total: int = self.state.total
        return total

    @rf.handler
    async def ping(self) -> int:
        """A turn that changes nothing."""
        return 1

    @rf.handler
    async def pid(self) -> int:
        """The process id of the host actor this agent runs in."""
        return os.getpid()

    @rf.handler
    async def steps(self, n: int) -> int:
        """A turn of ``n`` durable steps of :func:`noop` (B10); changes no State."""
        for index in range(n):
            await self.step(f"s{index}", noop)
        return n

    @rf.handler
    async def wait_go(self) -> Any:
        """A turn that suspends until signal ``go`` arrives and answers its value (B11)."""
        return await self.wait_signal("go")

    @rf.handler
    async def nap(self, seconds: float) -> float:
        """A durable ``self.sleep(seconds)``; answers the host's wall clock after it (B11).

        The clock is read after the sleep, so only the resumed run's reading is the answer:
        the first run suspends at the sleep and never gets there.
        """
        await self.sleep(seconds)
        return time.time()


class TimerAgent(rf.Agent):
    """B12's agent: it sets reminders, and each firing notes how late it ran."""

    class State(rf.State):
        lateness: list[float] = []
        """Seconds each firing ran after its scheduled time, in firing order."""
        last_fired: float = 0.0
        """The wall clock of the latest firing."""

    @rf.handler
    async def arm(self, prefix: str, dues: list[float]) -> int:
        """Set one reminder per due time (``<prefix><index>``), each calling :meth:`tick` with its time."""
        for index, due in enumerate(dues):
            await self.remind(f"{prefix}{index}", at=due, method="tick", due=due)
        return len(dues)

    @rf.handler
    async def tick(self, due: float) -> None:
        """A reminder's firing: a turn that records its lateness (and commits, as any turn changing State does)."""
        now = time.time()
        self.state.lateness.append(now - due)
        self.state.last_fired = now

    @rf.handler
    async def take(self) -> tuple[list[float], float]:
        """The lateness recorded so far and the latest firing's time; clears them."""
        taken = (list(self.state.lateness), self.state.last_fired)
        self.state.lateness = []
        self.state.last_fired = 0.0
        return taken


@ray.remote(num_cpus=0)
class PlainActor:
    """The raw-Ray baseline: an async actor with the same methods as :class:`BenchAgent`."""

    def __init__(self) -> None:
        self.total = 0

    async def add(self, n: int) -> int:
        self.total += n
        return self.total

    async def ping(self) -> int:
        return 1

    async def pid(self) -> int:
        return os.getpid()

    async def nap(self, seconds: float) -> float:
        """B11's baseline: an in-memory ``asyncio.sleep`` and the wall clock after it."""
        await asyncio.sleep(seconds)
        return time.time()

    async def fire_at(self, dues: list[float]) -> list[float]:
        """B12's baseline: in-memory event-loop timers at ``dues`` (wall clock); each one's lateness in seconds."""
        loop = asyncio.get_running_loop()
        lateness: list[float] = []
        done: asyncio.Future[None] = loop.create_future()

        def fire(due: float) -> None:
            lateness.append(time.time() - due)
            if len(lateness) == len(dues) and not done.done():
                done.set_result(None)

        for due in dues:
            loop.call_later(max(0.0, due - time.time()), fire, due)
        if dues:
            await done
        return lateness


def plain_actor() -> ray.actor.ActorHandle:
    """Start one :class:`PlainActor` (creation returns at once; its first call waits for the process)."""
    remote: Any = PlainActor  # ray.remote's class wrapper, which the type checker sees as the class itself
    handle: ray.actor.ActorHandle = remote.remote()
    return handle


# Ray workers need not have this checkout on their path (`rayfleet bench`, a test
# session's Ray): the actor class travels by value, as the agent class does.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
