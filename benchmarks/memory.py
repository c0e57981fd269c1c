"""Host memory over many messages: ``python -m benchmarks.memory [--messages 1000000] [--agents 1000]``.

Sends keyed asks (each with its own idempotency key, so every agent's dedup window fills
to its capacity and then only turns over) to ``--agents`` agents, ``--in-flight`` at a
time, and samples the resident memory of every host process every ``--sample-every``
messages. The figure is the least-squares slope of the hosts' total RSS against messages
after the first fifth (warm-up: agents activating, windows filling), in MB per 100,000
messages, beside the RSS at the start and the end of that stretch. Results go to
``benchmarks/results/memory.json``.
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
from .soak import actor_pid, rss_mb, slope

DEDUP_CAPACITY = 200
"""Per-agent idempotency window: small, so that every window is full long before the run ends."""


async def run(fleet: rf.Fleet, *, agents: int, messages: int, in_flight: int, sample_every: int) -> dict[str, Any]:
    refs = fleet.spawn_many(
        rf.AgentSpec(identity=f"memory/{index}", agent=BenchAgent, durability=rf.Durability.PERIODIC,
                     dedup_capacity=DEDUP_CAPACITY)
        for index in range(agents)
    )
    pids = {info.name: actor_pid(info.name, fleet.config.namespace) for info in fleet.hosts()}
    samples: list[dict[str, Any]] = []
    sent = 0
    started = time.monotonic()

    def sample() -> None:
        rss = {name: rss_mb(pid) for name, pid in pids.items()}
        samples.append({"messages": sent, "t": round(time.monotonic() - started, 1), "rss_mb": rss,
                        "total_mb": round(sum(value or 0.0 for value in rss.values()), 1)})

    async def worker(number: int) -> None:
        nonlocal sent
        while sent < messages:
            index = sent
            sent += 1
            ref = refs[index % agents]
            await ref.ask("add", n=1, idempotency_key=f"m-{index}")
            if index % sample_every == 0:
                sample()

    sample()
    await asyncio.gather(*(worker(number) for number in range(in_flight)))
    sample()
    elapsed = time.monotonic() - started
    steady = samples[len(samples) // 5:]
    points = [(entry["messages"] / 100_000, entry["total_mb"]) for entry in steady]
    totals = await asyncio.gather(*(ref.ask("add", n=0) for ref in refs))
    return {
        "agents": agents, "messages": messages, "in_flight": in_flight, "dedup_capacity": DEDUP_CAPACITY,
        "seconds": round(elapsed, 1), "messages_per_second": round(messages / elapsed, 1),
        "hosts_rss_first_mb": steady[0]["total_mb"] if steady else None,
        "hosts_rss_last_mb": steady[-1]["total_mb"] if steady else None,
        "slope_mb_per_100k_messages": round(slope(points), 3),
        "every_message_counted": sum(totals) == messages,
        "samples": samples,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.memory")
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--in-flight", type=int, default=128)
    parser.add_argument("--sample-every", type=int, default=20_000)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "memory.json"))
    options = parser.parse_args(argv)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    fleet = rf.connect(storage=tempfile.mkdtemp(prefix="rayfleet-memory-"), namespace=f"memory-{uuid.uuid4().hex[:6]}",
                       hosts=2)
    try:
        result = asyncio.run(run(fleet, agents=options.agents, messages=options.messages,
                                 in_flight=options.in_flight, sample_every=options.sample_every))
    finally:
        fleet.shutdown(stop_actors=True)
        ray.shutdown()
    report = {"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "machine": {"cpus": 2, "python": platform.python_version(), "ray": ray.__version__}, **result}
    Path(options.out).parent.mkdir(parents=True, exist_ok=True)
    Path(options.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"{result['messages']:,} messages to {result['agents']:,} agents in {result['seconds']} s "
          f"({result['messages_per_second']:,}/s); hosts' RSS {result['hosts_rss_first_mb']} -> "
          f"{result['hosts_rss_last_mb']} MB after warm-up, slope {result['slope_mb_per_100k_messages']} MB per "
          f"100,000 messages; every message counted: {result['every_message_counted']}")
    print(f"wrote {options.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
