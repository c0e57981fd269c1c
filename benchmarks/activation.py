"""B3 activations: the first call to new identities, beside creating one plain Ray actor per agent.

rayfleet side, per round: ``fleet.spawn_many`` of ``identities`` new specs, then the
first ``ask`` to each (``in_flight`` at a time): identities per second, spawn included.
Baseline, per round: create ``actors`` plain Ray actors and call each once (all at once,
as Ray allows), then kill them outside the timed part: actors per second. With the
full sizes that is 10,000 identities and 200 actors over the five rounds.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import rayfleet as rf

from ._agents import BenchAgent, plain_actor
from ._context import Context, Mode, Store, Unit, kill, retries
from ._measure import Retries, in_flight, interleave_async, summarize
from ._report import Result, at_least, measured


@dataclass(frozen=True, slots=True)
class ActivationSizes:
    rounds: int
    identities: int
    """New identities per round."""
    actors: int
    """New plain actors per round."""
    in_flight: int = 256
    """First asks outstanding at once."""


SIZES: dict[Mode, ActivationSizes] = {
    "full": ActivationSizes(rounds=5, identities=2_000, actors=40),
    "quick": ActivationSizes(rounds=5, identities=200, actors=2),
    "smoke": ActivationSizes(rounds=5, identities=4, actors=1),
}


async def _rounds(fleet: rf.Fleet, sizes: ActivationSizes, retried: Retries) -> dict[str, list[float]]:
    made = 0

    async def activate(count: int) -> float:
        nonlocal made
        specs = [rf.AgentSpec(identity=f"b3/{made + index}", agent=BenchAgent) for index in range(count)]
        made += count
        started = time.perf_counter()
        refs = fleet.spawn_many(specs)

        async def first(index: int) -> object:
            return await retried.ask(lambda: refs[index].ask("ping"))

        await in_flight(count, sizes.in_flight, first)
        return count / (time.perf_counter() - started)

    async def create(count: int) -> float:
        started = time.perf_counter()
        handles = [plain_actor() for _ in range(count)]
        await asyncio.gather(*(handle.ping.remote() for handle in handles))
        seconds = time.perf_counter() - started
        kill(handles)
        return count / seconds

    await activate(max(1, sizes.identities // 4))  # warm-up: the hosts' code paths, the class shipped
    await create(1)

    async def rayfleet_side() -> float:
        return await activate(sizes.identities)

    async def baseline_side() -> float:
        return await create(sizes.actors)

    return await interleave_async(sizes.rounds, {"rayfleet": rayfleet_side, "baseline": baseline_side})


def activations(context: Context, store: Store) -> list[Result]:
    """B3: new identities per second (spawn_many + first ask) against new plain actors per second."""
    sizes = SIZES[context.mode]
    retried = retries()
    with context.fleet(store) as fleet:
        rounds = asyncio.run(_rounds(fleet, sizes, retried))
    detail = context.detail(
        sizes, total_identities=sizes.rounds * sizes.identities, total_actors=sizes.rounds * sizes.actors,
        rayfleet_work=f"fleet.spawn_many of new specs, then the first ask to each ({sizes.in_flight} in flight)",
        baseline="one plain Ray actor per agent, created and called once, all at once; killed outside the timing",
        retried=retried.as_dict(),
    )
    return [measured(f"B3 activations {store}", rayfleet=summarize(rounds["rayfleet"]),
                     baseline=summarize(rounds["baseline"]), unit="1/s", target=at_least(50.0), detail=detail)]


UNITS = (Unit("B3", "activations", activations),)
