"""Where a workflow step is journaled: ``python -m benchmarks.step_journal [--steps 100] [--rounds 7]``.

An A/B in one fleet per ledger store, rounds interleaved (the order alternating): the
B6 chain on one ``EVERY_TURN`` agent, its outputs journaled by the agent's host in the
turn's checkpoint transaction (the engine's default for a step without a verifier),
against the same chain where every step has a verifier that accepts everything, which
makes the engine journal each output itself after the turn (the path every step took
before). The verifier's own cost is a Python call per step. Results go to
``benchmarks/results/step_journal.json``: milliseconds per step of each side (median
over rounds, and every round) and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import ray

import rayfleet as rf

from ._agents import BenchAgent
from ._context import STORES, Context, Store
from ._report import write_figures

AGENT = "journal/step"
SIDES = ("with the turn", "by the engine")


def chain(steps: int, *, verified: bool) -> rf.Workflow:
    """``steps`` steps of ``add(n=1)`` on :data:`AGENT`, each after the one before; ``verified`` adds a verifier."""
    workflow = rf.Workflow(f"step-journal-{'verified' if verified else 'plain'}-{steps}")
    for index in range(steps):
        step = workflow.step(f"s{index}", to=AGENT, call="add", payload={"n": 1},
                             after=[f"s{index - 1}"] if index else ())
        if verified:
            step.verify(lambda output: True)
    return workflow


def measure(context: Context, store: Store, *, steps: int, rounds: int) -> dict[str, Any]:
    """Both sides on ``store``: milliseconds per step per round, and the medians' ratio."""
    workflows = {SIDES[0]: chain(steps, verified=False), SIDES[1]: chain(steps, verified=True)}
    per_round: dict[str, list[float]] = {side: [] for side in SIDES}
    with context.fleet(store) as fleet:
        fleet.spawn(AGENT, BenchAgent)
        for workflow in workflows.values():
            fleet.run(workflow).raise_error()  # warm-up
        for index in range(rounds):
            for side in SIDES if index % 2 == 0 else SIDES[::-1]:
                started = time.perf_counter()
                outcome = fleet.run(workflows[side])
                outcome.raise_error()
                per_round[side].append(round((time.perf_counter() - started) * 1000 / steps, 3))
    medians = {side: statistics.median(values) for side, values in per_round.items()}
    return {"store": store, "ms_per_step": medians, "rounds": per_round,
            "ratio_with_turn_to_by_engine": round(medians[SIDES[0]] / medians[SIDES[1]], 3)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.step_journal")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "step_journal.json"))
    options = parser.parse_args(argv)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    context = Context("full")
    results = []
    try:
        for store in STORES:
            problem = context.postgres.problem() if store == "postgresql" else None
            if problem:
                print(f"skipped {store}: {problem}")
                continue
            result = measure(context, store, steps=options.steps, rounds=options.rounds)
            results.append(result)
            medians = result["ms_per_step"]
            print(f"{store}: journaled with the turn {medians[SIDES[0]]:.2f} ms/step, by the engine "
                  f"{medians[SIDES[1]]:.2f} ms/step: {result['ratio_with_turn_to_by_engine']:.3f}x")
    finally:
        context.postgres.close()
        ray.shutdown()
    write_figures(Path(options.out), {"steps": options.steps, "results": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
