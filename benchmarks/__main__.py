"""Run the benchmarks: ``python -m benchmarks [--quick] [--out PATH]``.

Every figure is measured in the same run as its raw-Ray baseline, on the same local
Ray, and written as JSON (name, rayfleet figure, baseline figure, ratio, unit, target).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import ray

import rayfleet as rf


class BenchCounter(rf.Agent):
    class State(rf.State):
        total: int = 0

    @rf.handler
    async def add(self, n: int) -> int:
        self.state.total += n
        return self.state.total


@ray.remote(num_cpus=0)
class PlainCounter:
    def __init__(self) -> None:
        self.total = 0

    async def add(self, n: int) -> int:
        self.total += n
        return self.total


def _percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def _latencies(call: Any, count: int, warmup: int = 30) -> list[float]:
    for _ in range(warmup):
        call()
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        call()
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def bench_call_latency(fleet: rf.Fleet, count: int) -> list[dict[str, Any]]:
    plain = PlainCounter.remote()
    every = fleet.spawn("bench/every-turn", BenchCounter)
    periodic = fleet.spawn("bench/periodic", BenchCounter, durability=rf.Durability.PERIODIC)
    results = []
    # Interleave rounds so drift on a shared machine hits both sides alike.
    plain_samples: list[float] = []
    every_samples: list[float] = []
    periodic_samples: list[float] = []
    for _ in range(3):
        plain_samples += _latencies(lambda: ray.get(plain.add.remote(1)), count // 3)
        every_samples += _latencies(lambda: every.call("add", n=1), count // 3)
        periodic_samples += _latencies(lambda: periodic.call("add", n=1), count // 3)
    for name, samples, target in (
        ("call_p50_every_turn_ms", every_samples, 3.0),
        ("call_p50_periodic_ms", periodic_samples, 1.5),
    ):
        rayfleet_p50, baseline_p50 = statistics.median(samples), statistics.median(plain_samples)
        results.append(_row(name, rayfleet_p50, baseline_p50, "ms", f"ratio <= {target}"))
    for name, samples in (("call_p99_every_turn_ms", every_samples), ("call_p99_periodic_ms", periodic_samples)):
        results.append(_row(name, _percentile(samples, 0.99), _percentile(plain_samples, 0.99), "ms", "report"))
    return results


def bench_activation(fleet: rf.Fleet, agents: int, actors: int) -> list[dict[str, Any]]:
    """New identities per second (spawn + first call) against new Ray actors per second (create + first call)."""
    names = [f"bench/activate-{index}" for index in range(agents)]

    async def activate_all() -> None:
        refs = [fleet.spawn(name, BenchCounter) for name in names]
        await asyncio.gather(*(ref.ask("add", n=1) for ref in refs))

    started = time.perf_counter()
    asyncio.run(activate_all())
    rayfleet_rate = agents / (time.perf_counter() - started)

    started = time.perf_counter()
    handles = [PlainCounter.remote() for _ in range(actors)]
    ray.get([handle.add.remote(1) for handle in handles])
    baseline_rate = actors / (time.perf_counter() - started)
    for handle in handles:
        ray.kill(handle)
    return [_row("activations_per_second", rayfleet_rate, baseline_rate, "1/s", "ratio >= 10")]


def _row(name: str, rayfleet_value: float, baseline: float, unit: str, target: str) -> dict[str, Any]:
    return {
        "name": name,
        "rayfleet": round(rayfleet_value, 4),
        "baseline_raw_ray": round(baseline, 4),
        "ratio": round(rayfleet_value / baseline, 3) if baseline else None,
        "unit": unit,
        "target": target,
    }


def main(argv: list[str] | None = None) -> None:
    """Run every benchmark; ``argv`` as on the command line (``None``: ``sys.argv``; ``rayfleet bench`` passes one)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks")
    parser.add_argument("--quick", action="store_true", help="fewer samples (about a minute)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "latest.json"))
    options = parser.parse_args(argv)
    calls, agents, actors = (600, 500, 20) if options.quick else (3000, 2000, 50)

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    storage = tempfile.mkdtemp(prefix="rayfleet-bench-")
    fleet = rf.connect(storage=storage, namespace="rayfleet-bench", hosts=2)
    try:
        results = bench_call_latency(fleet, calls) + bench_activation(fleet, agents, actors)
    finally:
        fleet.shutdown(stop_actors=True)
        ray.shutdown()
    report = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "mode": "quick" if options.quick else "full",
        "machine": {"cpus": 2, "python": platform.python_version(), "ray": ray.__version__},
        "results": results,
    }
    Path(options.out).parent.mkdir(parents=True, exist_ok=True)
    Path(options.out).write_text(json.dumps(report, indent=2) + "\n")
    for row in results:
        print(f"{row['name']:<28} rayfleet {row['rayfleet']:>10} {row['unit']:<4} raw Ray {row['baseline_raw_ray']:>10}"
              f"  ratio {row['ratio']}  (target {row['target']})")
    print(f"wrote {options.out}")


if __name__ == "__main__":
    main()
