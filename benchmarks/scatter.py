"""B5 scatter: one workflow step scattered to ``agents`` agents and gathered, beside plain async calls.

rayfleet side: ``fleet.run`` of a one-step workflow whose step scatters ``ping`` to
every agent labelled ``bench: b5`` and gathers all replies (``rf.AllOf()``): the whole
run, journal included, in milliseconds. Baseline: the same number of ``ping`` calls
spread over as many plain actors as the fleet has hosts, all in flight at once, and
waited for together.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import ray

import rayfleet as rf

from ._agents import BenchAgent
from ._context import Context, Mode, Store, Unit, plain_actors
from ._measure import interleave, summarize
from ._report import Result, at_most, measured

LABELS = {"bench": "b5"}


@dataclass(frozen=True, slots=True)
class ScatterSizes:
    rounds: int
    agents: int


SIZES: dict[Mode, ScatterSizes] = {
    "full": ScatterSizes(rounds=6, agents=1_000),
    "quick": ScatterSizes(rounds=5, agents=300),
    "smoke": ScatterSizes(rounds=5, agents=20),
}


def scatter(context: Context, store: Store) -> list[Result]:
    """B5: milliseconds for one scatter/gather step over ``agents`` agents, beside plain async calls."""
    sizes = SIZES[context.mode]
    with context.fleet(store) as fleet:
        hosts = len(fleet.hosts())
        fleet.spawn_many([rf.AgentSpec(identity=f"b5/{index}", agent=BenchAgent, labels=LABELS)
                          for index in range(sizes.agents)])
        workflow = rf.Workflow("b5-scatter")
        workflow.step("ping", scatter=rf.Select(labels=LABELS), call="ping", gather=rf.AllOf())
        with plain_actors(hosts) as actors:

            def rayfleet_side() -> float:
                started = time.perf_counter()
                outcome = fleet.run(workflow)
                milliseconds = (time.perf_counter() - started) * 1000.0
                outcome.raise_error()
                replies = outcome.outputs["ping"]
                if len(replies) != sizes.agents:
                    raise RuntimeError(f"the scatter gathered {len(replies)} replies, expected {sizes.agents}")
                return milliseconds

            def baseline_side() -> float:
                started = time.perf_counter()
                ray.get([actors[index % len(actors)].ping.remote() for index in range(sizes.agents)])
                return (time.perf_counter() - started) * 1000.0

            rayfleet_side()  # warm-up: activates every agent
            baseline_side()
            rounds = interleave(sizes.rounds, {"rayfleet": rayfleet_side, "baseline": baseline_side})
    detail = context.detail(
        sizes, rayfleet_work="fleet.run of a 1-step workflow: scatter=rf.Select(labels) call='ping' gather=AllOf()",
        baseline=f"{sizes.agents} actor.ping.remote() over {hosts} plain actors (as many as hosts), one ray.get",
    )
    return [measured(f"B5 scatter {sizes.agents:,} agents {store}", rayfleet=summarize(rounds["rayfleet"]),
                     baseline=summarize(rounds["baseline"]), unit="ms", target=at_most(1.5), detail=detail)]


UNITS = (Unit("B5", "scatter", scatter),)
