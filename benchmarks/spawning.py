"""B9 spawn cost as the fleet grows, and bulk creation, on both ledger stores.

The fleet is filled in bulk (``fleet.spawn_many``) to each size in turn (1,000, 10,000
and 100,000 identities in the full run); at each size ``sample`` new identities are
created one ``fleet.spawn`` at a time (after a few warm-up spawns at the start), in
``rounds`` groups, and a round's figure is the
median cost of its spawns. The per-spawn cost at the largest size beside the cost at
the smallest is the flatness figure (target: at most 1.5x). The bulk figure is the
seconds ``spawn_many`` needs for 100,000 identities (measured over every bulk fill,
scaled to 100,000 where the run's sizes are smaller; target: under 60 s).

The baseline (the cost at the smallest size) cannot be interleaved with the figure at
the largest: the fleet only grows. The spread shows the rounds at each size.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import rayfleet as rf

from ._agents import BenchAgent
from ._context import STORES, Context, Mode, Store, Unit
from ._measure import summarize
from ._report import Result, Target, at_most, measured

BULK_TARGET = 100_000


@dataclass(frozen=True, slots=True)
class SpawnSizes:
    sizes: tuple[int, ...]
    sample: int
    """Single spawns at each size (``sample / rounds`` per round)."""
    rounds: int


SIZES: dict[Mode, SpawnSizes] = {
    "full": SpawnSizes(sizes=(1_000, 10_000, 100_000), sample=200, rounds=5),
    "quick": SpawnSizes(sizes=(1_000, 3_000, 10_000), sample=100, rounds=5),
    "smoke": SpawnSizes(sizes=(50, 100, 200), sample=10, rounds=5),
}


def _spec(index: int) -> rf.AgentSpec:
    return rf.AgentSpec(identity=f"b9/{index}", agent=BenchAgent, labels={"shard": str(index % 16)})


def spawning(context: Context, store: Store) -> list[Result]:
    """B9: milliseconds per ``fleet.spawn`` at the largest size beside the smallest; bulk seconds for 100,000."""
    sizes = SIZES[context.mode]
    per_round = max(1, sizes.sample // sizes.rounds)
    costs: dict[int, list[float]] = {}
    bulk: list[tuple[int, float]] = []
    with context.fleet(store, hosts=1) as fleet:
        for index in range(per_round):  # warm-up: the ledger's connections, statements and pages
            fleet.spawn(_spec(index))
        filled = per_round
        for size in sizes.sizes:
            bulk_end = size - per_round * sizes.rounds
            started = time.perf_counter()
            fleet.spawn_many([_spec(index) for index in range(filled, bulk_end)])
            bulk.append((bulk_end - filled, time.perf_counter() - started))
            filled = bulk_end
            medians = []
            for _ in range(sizes.rounds):
                samples = []
                for _ in range(per_round):
                    spec = _spec(filled)
                    started = time.perf_counter()
                    fleet.spawn(spec)
                    samples.append((time.perf_counter() - started) * 1000.0)
                    filled += 1
                medians.append(statistics.median(samples))
            costs[size] = medians
    smallest, largest = sizes.sizes[0], sizes.sizes[-1]
    created = sum(count for count, _ in bulk)
    bulk_seconds = sum(seconds for _, seconds in bulk)
    detail = context.detail(
        sizes, hosts=1,
        per_spawn_ms={f"{size:,}": round(statistics.median(medians), 3) for size, medians in costs.items()},
        bulk_phases=[{"created": count, "seconds": round(seconds, 2)} for count, seconds in bulk],
        bulk_per_second=round(created / bulk_seconds, 1),
    )
    flatness = measured(
        f"B9 spawn cost flatness {store}", rayfleet=summarize(costs[largest]), baseline=summarize(costs[smallest]),
        unit=f"ms/spawn at {largest:,} vs {smallest:,}", target=at_most(1.5), detail=detail,
    )
    scaled = [BULK_TARGET * seconds / count for count, seconds in bulk if count > 0]
    bulk_row = measured(
        f"B9 bulk spawn {BULK_TARGET:,} {store}", rayfleet=summarize(scaled),
        value=BULK_TARGET * bulk_seconds / created, baseline=None, unit="s",
        target=Target(text="< 60 s", value_below=60.0),
        detail={**detail, "bulk_note": f"{created:,} created by spawn_many in {bulk_seconds:.1f} s, scaled to "
                                       f"{BULK_TARGET:,}; spread over the bulk phases"},
    )
    return [flatness, bulk_row]


UNITS = tuple(Unit("B9", "spawning", spawning, store) for store in STORES)
