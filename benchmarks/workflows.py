"""B6 durable workflow steps: a sequential workflow of trivial steps, per step, on both ledger stores.

rayfleet side: ``fleet.run`` of a chain of ``steps`` steps (each ``after`` the one
before), every step ``add(n=1)`` on one EVERY_TURN agent; each step's output is
journaled in the ledger before the next starts. The figure is the run's time divided
by the number of steps. Baseline: the same calls as plain sequential
``ray.get(actor.add.remote(1))``, per call.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import ray

import rayfleet as rf

from ._agents import BenchAgent
from ._context import STORES, Context, Mode, Store, Unit, plain_actors
from ._measure import interleave, summarize
from ._report import Result, at_most, measured

AGENT = "b6/step"


@dataclass(frozen=True, slots=True)
class ChainSizes:
    rounds: int
    steps: int


SIZES: dict[Mode, ChainSizes] = {
    "full": ChainSizes(rounds=6, steps=100),
    "quick": ChainSizes(rounds=5, steps=30),
    "smoke": ChainSizes(rounds=5, steps=2),
}


def chain(steps: int) -> rf.Workflow:
    """A workflow of ``steps`` steps, each after the one before, each ``add(n=1)`` on :data:`AGENT`."""
    workflow = rf.Workflow(f"b6-chain-{steps}")
    for index in range(steps):
        workflow.step(f"s{index}", to=AGENT, call="add", payload={"n": 1},
                      after=[f"s{index - 1}"] if index else ())
    return workflow


def steps(context: Context, store: Store) -> list[Result]:
    """B6: milliseconds per durable workflow step, beside a plain sequential actor call."""
    sizes = SIZES[context.mode]
    workflow = chain(sizes.steps)
    with context.fleet(store) as fleet, plain_actors(1) as (plain,):
        fleet.spawn(AGENT, BenchAgent)

        def rayfleet_side() -> float:
            started = time.perf_counter()
            outcome = fleet.run(workflow)
            seconds = time.perf_counter() - started
            outcome.raise_error()
            if not outcome.ok or len(outcome.outputs) != sizes.steps:
                raise RuntimeError(f"the chain ended {outcome.status.value} with {len(outcome.outputs)} outputs")
            return seconds * 1000.0 / sizes.steps

        def baseline_side() -> float:
            started = time.perf_counter()
            for _ in range(sizes.steps):
                ray.get(plain.add.remote(1))
            return (time.perf_counter() - started) * 1000.0 / sizes.steps

        rayfleet_side()  # warm-up
        baseline_side()
        rounds = interleave(sizes.rounds, {"rayfleet": rayfleet_side, "baseline": baseline_side})
    detail = context.detail(
        sizes, rayfleet_work=f"fleet.run of a {sizes.steps}-step chain (each step after the previous), "
                             "add(n=1) on one EVERY_TURN agent, every output journaled",
        baseline="the same calls as sequential ray.get(actor.add.remote(1)) on a plain async actor",
    )
    return [measured(f"B6 workflow step {store}", rayfleet=summarize(rounds["rayfleet"]),
                     baseline=summarize(rounds["baseline"]), unit="ms/step", target=at_most(2.5), detail=detail)]


UNITS = tuple(Unit("B6", "workflow steps", steps, store) for store in STORES)
