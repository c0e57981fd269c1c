"""Soak: steady mixed load for a while, watching memory and tail latency: ``python -m benchmarks.soak [--minutes 10]``.

The load mixes keyed ``call`` turns (``EVERY_TURN``), ``tell`` turns, explicit
checkpoints of ``ON_DEACTIVATE`` agents, and churn (spawn a new identity, call it once,
delete it) from a few concurrent clients. Every ``--sample`` seconds (default 10) it
records the resident memory (RSS, from ``/proc``) of each rayfleet process (the driver,
every host actor, the SQLite ledger actor) and the p50/p99 latency of the calls of that
window. At the end it fits a least-squares line to each process's RSS over time (after
the first fifth of the run, the warm-up) and flags a process whose memory grows faster
than ``--max-slope`` MB per minute (judged only with at least 10 samples after the warm-up;
``--minutes 1`` reports the slope without judging it). Results go to ``benchmarks/results/soak.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import ray

import rayfleet as rf

LEDGER_ACTOR = "rayfleet-ledger"


class SoakCounter(rf.Agent):
    class State(rf.State):
        total: int = 0
        last: str = ""

    @rf.handler
    async def add(self, n: int, key: str = "") -> int:
        self.state.total += n
        self.state.last = key
        total: int = self.state.total
        return total

    @rf.handler
    async def save(self) -> int:
        """Change the State and checkpoint it now (for ON_DEACTIVATE agents)."""
        self.state.total += 1
        return await self.checkpoint()


def rss_mb(pid: int) -> float | None:
    """Resident set size of a process in MB (Linux ``/proc``), or ``None`` if it is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def actor_pid(name: str, namespace: str) -> int:
    handle = ray.get_actor(name, namespace=namespace)
    return int(ray.get(handle.__ray_call__.remote(lambda actor: os.getpid()), timeout=10))


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (x, y) points (0 for fewer than two distinct x)."""
    if len(points) < 2:
        return 0.0
    mean_x = statistics.fmean(x for x, _ in points)
    mean_y = statistics.fmean(y for _, y in points)
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    if spread == 0:
        return 0.0
    return sum((x - mean_x) * (y - mean_y) for x, y in points) / spread


def percentile(samples: list[float], fraction: float) -> float | None:
    if not samples:
        return None
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


class Soak:
    def __init__(self, fleet: rf.Fleet, churn_fleet: rf.Fleet, tell_fleet: rf.Fleet, *, agents: int,
                 clients: int, dedup_capacity: int = 10_000) -> None:
        self.fleet = fleet
        self.churn_fleet = churn_fleet
        self.tell_fleet = tell_fleet
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.latencies: list[float] = []
        self.counts: dict[str, int] = {"call": 0, "tell": 0, "checkpoint": 0, "spawn": 0, "delete": 0, "error": 0}
        self.errors: dict[str, int] = {}
        self.clients = clients
        # Keyed calls fill each agent's dedup window (up to dedup_capacity keys): host memory grows
        # until the windows are full; a small capacity shows the plateau within minutes.
        self.every = [fleet.spawn(f"soak/every/{i}", SoakCounter, dedup_capacity=dedup_capacity)
                      for i in range(agents)]
        self.deferred = [fleet.spawn(f"soak/deferred/{i}", SoakCounter, durability=rf.Durability.ON_DEACTIVATE)
                         for i in range(max(1, agents // 10))]

    def _count(self, kind: str) -> None:
        with self.lock:
            self.counts[kind] += 1

    def _error(self, error: BaseException) -> None:
        with self.lock:
            self.counts["error"] += 1
            self.errors[type(error).__name__] = self.errors.get(type(error).__name__, 0) + 1

    async def _client(self, index: int) -> None:
        rng = random.Random(index)
        seq = 0
        while not self.stop.is_set():
            seq += 1
            roll = rng.random()
            try:
                if roll < 0.88:
                    ref = rng.choice(self.every)
                    started = time.perf_counter()
                    await ref.ask("add", n=1, key=f"{index}-{seq}", idempotency_key=f"{index}-{seq}", timeout=30)
                    with self.lock:
                        self.latencies.append((time.perf_counter() - started) * 1000)
                    self._count("call")
                else:
                    await rng.choice(self.deferred).ask("save", timeout=30)
                    self._count("checkpoint")
            except Exception as error:  # noqa: BLE001 - counted; a soak keeps going
                self._error(error)
                await asyncio.sleep(0.1)

    def _teller(self) -> None:
        """Fire-and-forget turns at about 25 per second, from their own thread and driver handle."""
        refs = [self.tell_fleet.agent(ref.identity) for ref in self.every]
        rng = random.Random(-1)
        while not self.stop.wait(0.04):
            try:
                rng.choice(refs).tell("add", n=1)
                self._count("tell")
            except Exception as error:  # noqa: BLE001 - counted; a soak keeps going
                self._error(error)

    def _churn(self) -> None:
        """Spawn a new identity, call it once, delete it: steady churn at about 5 per second."""
        fleet = self.churn_fleet
        index = 0
        while not self.stop.wait(0.2):
            index += 1
            identity = f"soak/churn/{index}"
            try:
                ref = fleet.spawn(identity, SoakCounter)
                self._count("spawn")
                ref.call("add", n=1, timeout=30)
                fleet.delete(identity)
                self._count("delete")
            except Exception as error:  # noqa: BLE001 - counted; a soak keeps going
                self._error(error)

    def _load(self) -> None:
        async def main() -> None:
            await asyncio.gather(*(self._client(index) for index in range(self.clients)))

        asyncio.run(main())

    def processes(self) -> dict[str, int]:
        pids = {"driver": os.getpid()}
        for host in self.fleet.hosts():
            pids[host.name] = actor_pid(host.name, self.fleet.config.namespace)
        if self.fleet.ledger_location.kind == "sqlite":
            pids[LEDGER_ACTOR] = actor_pid(LEDGER_ACTOR, self.fleet.config.namespace)
        return pids

    def run(self, *, seconds: float, every: float) -> dict[str, Any]:
        pids = self.processes()
        threads = [threading.Thread(target=target, daemon=True) for target in (self._load, self._churn, self._teller)]
        for thread in threads:
            thread.start()
        started = time.monotonic()
        samples: list[dict[str, Any]] = []
        while time.monotonic() - started < seconds:
            time.sleep(min(every, max(0.0, seconds - (time.monotonic() - started))))
            with self.lock:
                window, self.latencies = self.latencies, []
                counts = dict(self.counts)
            sample: dict[str, Any] = {
                "t": round(time.monotonic() - started, 1),
                "rss_mb": {name: rss_mb(pid) for name, pid in pids.items()},
                "calls": len(window),
                "p50_ms": percentile(window, 0.5),
                "p99_ms": percentile(window, 0.99),
                "totals": counts,
            }
            samples.append(sample)
            print(f"t={sample['t']:>6}s calls={len(window):>5} p99={sample['p99_ms'] or 0:7.1f} ms "
                  + " ".join(f"{name}={value:.0f}MB" for name, value in sample["rss_mb"].items() if value))
        self.stop.set()
        for thread in threads:
            thread.join(timeout=60)
        return {"pids": pids, "samples": samples, "errors": dict(self.errors)}


def growth(samples: list[dict[str, Any]], max_slope: float) -> dict[str, Any]:
    """Per process: least-squares RSS slope (MB per minute) after the warm-up fifth, and whether it is flat."""
    steady = samples[len(samples) // 5:] if len(samples) >= 5 else samples
    report: dict[str, Any] = {}
    for name in steady[0]["rss_mb"] if steady else []:
        points = [(sample["t"] / 60, sample["rss_mb"][name]) for sample in steady if sample["rss_mb"][name]]
        per_minute = slope(points)
        report[name] = {
            "slope_mb_per_min": round(per_minute, 3),
            "first_mb": round(points[0][1], 1) if points else None,
            "last_mb": round(points[-1][1], 1) if points else None,
            "flat": per_minute <= max_slope,
            "conclusive": len(points) >= 10,
        }
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="how long to run the load (default 10)")
    parser.add_argument("--sample", type=float, default=10.0, help="seconds between samples (default 10)")
    parser.add_argument("--agents", type=int, default=200)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--dedup-capacity", type=int, default=10_000,
                        help="idempotency keys each agent remembers (default 10,000, the spawn default)")
    parser.add_argument("--ledger", default=None, help="a postgresql:// URL (default: the SQLite ledger)")
    parser.add_argument("--max-slope", type=float, default=1.0, help="MB per minute a process may grow (default 1)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "soak.json"))
    args = parser.parse_args(argv)

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    with tempfile.TemporaryDirectory(prefix="rayfleet-soak-") as folder:
        options: dict[str, Any] = {"namespace": "rayfleet-soak", "hosts": 2, "idle_timeout": 30.0}
        if args.ledger:
            options["ledger"] = args.ledger
        fleet = rf.connect(storage=Path(folder) / "store", **options)
        # One driver handle per thread that sends: the load's event loop, the churn and the tells.
        churn_fleet = rf.connect(storage=Path(folder) / "store", **options)
        tell_fleet = rf.connect(storage=Path(folder) / "store", **options)
        try:
            soak = Soak(fleet, churn_fleet, tell_fleet, agents=args.agents, clients=args.clients,
                        dedup_capacity=args.dedup_capacity)
            outcome = soak.run(seconds=args.minutes * 60, every=args.sample)
            statistics_ = fleet.host_statistics()
        finally:
            churn_fleet.shutdown(stop_actors=False)
            tell_fleet.shutdown(stop_actors=False)
            fleet.shutdown(stop_actors=True)
    ray.shutdown()
    memory = growth(outcome["samples"], args.max_slope)
    p99s = [sample["p99_ms"] for sample in outcome["samples"] if sample["p99_ms"] is not None]
    document = {
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "ray": ray.__version__},
        "minutes": args.minutes,
        "sample_seconds": args.sample,
        "ledger": "postgresql" if args.ledger else "sqlite",
        "dedup_capacity": args.dedup_capacity,
        "memory": memory,
        "p99_ms": {"min": min(p99s, default=None), "max": max(p99s, default=None),
                   "median": statistics.median(p99s) if p99s else None},
        "totals": outcome["samples"][-1]["totals"] if outcome["samples"] else {},
        "errors": outcome["errors"],
        "hosts": [{"host": s.host, "turns": s.turns, "checkpoints": s.checkpoints, "active_agents": s.active_agents}
                  for s in statistics_],
        "samples": outcome["samples"],
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(document, indent=2))
    for name, figures in memory.items():
        print(f"{name:<20} {figures['first_mb']} -> {figures['last_mb']} MB, slope {figures['slope_mb_per_min']} MB/min"
              f"{'' if figures['flat'] else '  GROWING'}{'' if figures['conclusive'] else ' (inconclusive)'}")
    print(f"p99 per window: {document['p99_ms']}; totals {document['totals']}; errors {document['errors']}")
    print(f"written to {args.out}")
    growing = [name for name, figures in memory.items() if figures["conclusive"] and not figures["flat"]]
    if any(not figures["conclusive"] for figures in memory.values()):
        print("fewer than 10 samples after the warm-up: the memory slope is reported, not judged")
    return 1 if growing else 0


if __name__ == "__main__":
    raise SystemExit(main())
