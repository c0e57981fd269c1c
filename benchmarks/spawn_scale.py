"""Spawn cost as the fleet grows, on both ledger stores: ``python -m benchmarks.spawn_scale [--quick]``.

For each store, the fleet is filled in bulk (``fleet.spawn_many``) to 1,000, 10,000 and
100,000 identities; at each size, ``fleet.spawn`` creates a sample of new identities one
at a time and the median cost per spawn is recorded. The per-spawn cost at the largest
size divided by the cost at the smallest is the figure that must stay flat (target: at
most 1.5x). The bulk rate (identities created per second by ``spawn_many``) is recorded
too (target: 100,000 in under a minute). Results go to ``benchmarks/results/spawn_scale.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import ray

import rayfleet as rf

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))


class Counter(rf.Agent):
    class State(rf.State):
        total: int = 0

    @rf.handler
    async def add(self, n: int) -> int:
        self.state.total += n
        total: int = self.state.total
        return total


def _specs(start: int, stop: int, prefix: str) -> list[rf.AgentSpec]:
    return [rf.AgentSpec(identity=f"{prefix}/{index}", agent=Counter, labels={"shard": str(index % 16)})
            for index in range(start, stop)]


def measure(ledger: str | None, sizes: list[int], sample: int) -> dict[str, Any]:
    storage = tempfile.mkdtemp(prefix="rayfleet-spawn-bench-")
    fleet = rf.connect(storage=storage, ledger=ledger, namespace=f"bench-{uuid.uuid4().hex[:8]}", hosts=1)
    try:
        filled, bulk_seconds, per_spawn = 0, 0.0, {}
        for size in sizes:
            started = time.perf_counter()
            fleet.spawn_many(_specs(filled, size - sample, "bulk"))
            bulk_seconds += time.perf_counter() - started
            costs = []
            for index in range(sample):
                spec = _specs(size - sample + index, size - sample + index + 1, "bulk")[0]
                started = time.perf_counter()
                fleet.spawn(spec)
                costs.append((time.perf_counter() - started) * 1000)
            filled = size
            per_spawn[size] = statistics.median(costs)
        bulk_created = sizes[-1] - sample * len(sizes)
        return {
            "per_spawn_ms": per_spawn,
            "flatness": per_spawn[sizes[-1]] / per_spawn[sizes[0]],
            "bulk_created": bulk_created,
            "bulk_seconds": bulk_seconds,
            "bulk_per_second": bulk_created / bulk_seconds,
        }
    finally:
        fleet.shutdown(stop_actors=True)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.spawn_scale")
    parser.add_argument("--quick", action="store_true", help="up to 20,000 identities instead of 100,000")
    parser.add_argument("--postgres", default=None, help="PostgreSQL server URL for a fresh database "
                        "(default: RAYFLEET_TEST_POSTGRES or postgresql://postgres@127.0.0.1:5432/postgres)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "spawn_scale.json"))
    arguments = parser.parse_args()
    sizes = [1_000, 5_000, 20_000] if arguments.quick else [1_000, 10_000, 100_000]
    sample = 200
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    import pg_support  # the tests' helper: a fresh database on the PostgreSQL server

    if arguments.postgres:
        pg_support.SERVER_URL = arguments.postgres
    backends: dict[str, str | None] = {"sqlite": None}
    if pg_support.unavailable() is None:
        backends["postgresql"] = pg_support.create_database()
    else:
        print(f"PostgreSQL not reachable at {pg_support.SERVER_URL}: measuring SQLite only", file=sys.stderr)
    results = []
    try:
        for name, ledger in backends.items():
            figures = measure(ledger, sizes, sample)
            results.append({
                "name": f"spawn cost flatness {name}", "rayfleet": figures["flatness"], "baseline": 1.0,
                "ratio": figures["flatness"], "unit": f"x (ms per spawn at {sizes[-1]:,} / at {sizes[0]:,})",
                "target": "<= 1.5", "pass": figures["flatness"] <= 1.5, "detail": figures,
            })
            seconds_for_100k = 100_000 / figures["bulk_per_second"]
            results.append({
                "name": f"bulk spawn {name}", "rayfleet": figures["bulk_per_second"], "baseline": 100_000 / 60,
                "ratio": figures["bulk_per_second"] / (100_000 / 60), "unit": "identities/s",
                "target": "100,000 in under 60 s", "pass": seconds_for_100k < 60, "detail": figures,
            })
            print(json.dumps(results[-2:], indent=2, default=str))
    finally:
        for name, ledger in backends.items():
            if name == "postgresql" and ledger:
                pg_support.drop_database(ledger)
        ray.shutdown()
    Path(arguments.out).parent.mkdir(parents=True, exist_ok=True)
    Path(arguments.out).write_text(json.dumps({
        "machine": {"python": platform.python_version(), "cpus": 2, "platform": platform.platform()},
        "sizes": sizes, "sample": sample, "results": results,
    }, indent=2, default=str))
    for row in results:
        print(f"{row['name']:<32} {row['rayfleet']:>10.2f} {row['unit']:<42} pass={row['pass']}")


if __name__ == "__main__":
    main()
