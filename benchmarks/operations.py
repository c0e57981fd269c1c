"""Operating a large fleet: ``python -m benchmarks.operations [--agents 100000]``.

Fills a fleet with ``--agents`` live ``PERIODIC`` agents (each with State changed since its
last checkpoint, so deactivating it commits), then times, each with its progress
callback counted: ``fleet.drain()`` of one host, ``fleet.deactivate_all()`` of the rest,
the first call to every agent again (each reactivates from its checkpoint and must
answer with its State), and ``fleet.shutdown(stop_actors=True)`` of them all. Results,
with each operation's report, go to ``benchmarks/results/operations.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import ray

import rayfleet as rf

from ._agents import BenchAgent
from ._measure import in_flight

IN_FLIGHT = 256


class _Progress:
    """A progress callback that remembers how often it was called and the last ``(done, total)``."""

    def __init__(self) -> None:
        self.calls = 0
        self.last: tuple[int, int] | None = None

    def __call__(self, done: int, total: int) -> None:
        self.calls += 1
        self.last = (done, total)


def _timed(operation: Any, **options: Any) -> tuple[Any, float, _Progress]:
    progress = _Progress()
    started = time.perf_counter()
    report = operation(progress=progress, **options)
    return report, round(time.perf_counter() - started, 2), progress


def run(fleet: rf.Fleet, agents: int) -> dict[str, Any]:
    refs = fleet.spawn_many(rf.AgentSpec(identity=f"ops/{index}", agent=BenchAgent,
                                         durability=rf.Durability.PERIODIC) for index in range(agents))
    fill = asyncio.run(in_flight(agents, IN_FLIGHT, lambda index: refs[index].ask("add", n=index)))
    live = sum(stats.active_agents for stats in fleet.host_statistics())
    busiest = max(fleet.host_statistics(), key=lambda stats: stats.active_agents)
    drained, drain_seconds, drain_progress = _timed(fleet.drain, host=busiest.host, timeout=300.0)
    fleet.undrain(busiest.host)
    deactivated, deactivate_seconds, deactivate_progress = _timed(fleet.deactivate_all)
    answers: list[object] = [None] * agents

    async def again(index: int) -> None:
        answers[index] = await refs[index].ask("add", n=0)

    refill = asyncio.run(in_flight(agents, IN_FLIGHT, again))
    kept = sum(1 for index, answer in enumerate(answers) if answer == index)
    stopped, shutdown_seconds, shutdown_progress = _timed(fleet.shutdown, stop_actors=True)
    return {
        "agents": agents, "live_after_fill": live, "fill_seconds": round(fill, 1),
        "drain": {"host": busiest.host, "agents": busiest.active_agents, "seconds": drain_seconds,
                  "report": _plain(drained), "progress_calls": drain_progress.calls, "last": drain_progress.last},
        "deactivate_all": {"seconds": deactivate_seconds, "report": _plain(deactivated),
                           "progress_calls": deactivate_progress.calls, "last": deactivate_progress.last},
        "reactivate": {"seconds": round(refill, 1), "answered_with_state": kept},
        "shutdown": {"seconds": shutdown_seconds, "report": _plain(stopped),
                     "progress_calls": shutdown_progress.calls, "last": shutdown_progress.last},
    }


def _plain(report: Any) -> Any:
    fields = getattr(report, "__dataclass_fields__", None)
    return report if fields is None else {name: getattr(report, name) for name in fields}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.operations")
    parser.add_argument("--agents", type=int, default=100_000)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "operations.json"))
    options = parser.parse_args(argv)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    fleet = rf.connect(storage=tempfile.mkdtemp(prefix="rayfleet-ops-"), namespace=f"ops-{uuid.uuid4().hex[:6]}",
                       hosts=2, idle_timeout=24 * 3600.0)
    try:
        result = run(fleet, options.agents)
    finally:
        fleet.shutdown(stop_actors=True)  # a no-op after the timed shutdown; stops the actors if run() raised
        ray.shutdown()
    report = {"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "machine": {"cpus": 2, "python": platform.python_version(), "ray": ray.__version__}, **result}
    Path(options.out).parent.mkdir(parents=True, exist_ok=True)
    Path(options.out).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({key: value for key, value in report.items() if key != "machine"}, indent=1))
    print(f"wrote {options.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
