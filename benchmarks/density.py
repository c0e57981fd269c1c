"""B4 density: many live agents with a small State on this machine, and the memory each costs.

The fleet's agents are created with one ``spawn_many``, then activated by their first
call in ``rounds`` equal chunks; after each chunk the resident memory (RSS) of the host
processes is read with psutil, and the chunk's cost per agent is the RSS growth over
the chunk's size. The agents stay live (the idle timeout is set past the run), so at
the end every one of them is resident at once. Baseline: one plain Ray actor per agent,
``actors / rounds`` created per round, and the RSS of each actor's worker process read
the same way (then extrapolated to the fleet's size in the detail). Afterwards
``fleet.shutdown()`` is timed.

A host's process id comes from an agent handler that returns ``os.getpid()`` (the
state API needs the dashboard, which the benchmark Ray does not run).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import psutil

import rayfleet as rf

from ._agents import BenchAgent, plain_actor
from ._context import Context, Mode, Store, Unit, kill
from ._measure import in_flight, interleave_async, summarize
from ._report import Result, Target, measured

KIB = 1024.0
IDLE_TIMEOUT = 24 * 3600.0
"""Longer than any run, so no agent is deactivated while the fleet fills."""


@dataclass(frozen=True, slots=True)
class DensitySizes:
    rounds: int
    agents: int
    """Live agents at the end (``agents / rounds`` activated per round)."""
    actors: int
    """Plain actors measured in all (``actors / rounds`` per round)."""
    in_flight: int = 256


SIZES: dict[Mode, DensitySizes] = {
    "full": DensitySizes(rounds=5, agents=100_000, actors=50),
    "quick": DensitySizes(rounds=5, agents=5_000, actors=10),
    "smoke": DensitySizes(rounds=5, agents=200, actors=5),
}


def host_pids(fleet: rf.Fleet, *, probes: int = 64) -> dict[str, int]:
    """The process id of every host of ``fleet``, from agents placed on each (``b4/probe/<n>``)."""
    wanted = {host.name for host in fleet.hosts()}
    pids: dict[str, int] = {}
    for index in range(probes):
        ref = fleet.spawn(f"probe/{index}", BenchAgent)
        pid = ref.call("pid")
        host = fleet.status(ref.identity).host
        if host is not None:
            pids[host] = pid
        if wanted <= set(pids):
            return pids
    raise RuntimeError(f"no probe agent landed on hosts {sorted(wanted - set(pids))} after {probes} tries")


def resident(pids: dict[str, int]) -> int:
    """Bytes resident in the processes ``pids`` now."""
    return sum(psutil.Process(pid).memory_info().rss for pid in pids.values())


async def _rounds(fleet: rf.Fleet, refs: list[rf.AgentRef], pids: dict[str, int],
                  sizes: DensitySizes) -> dict[str, Any]:
    chunk = sizes.agents // sizes.rounds
    actors_per_round = max(1, sizes.actors // sizes.rounds)
    state = {"activated": 0, "resident": resident(pids)}
    answered: list[int] = []
    activation_seconds: list[float] = []

    async def activate() -> float:
        start = state["activated"]
        done = 0

        async def first(index: int) -> None:
            nonlocal done
            try:
                await refs[start + index].ask("ping")
                done += 1
            except rf.RayfleetError:
                pass  # counted as not answered

        activation_seconds.append(await in_flight(chunk, sizes.in_flight, first))
        answered.append(done)
        state["activated"] = start + chunk
        now = resident(pids)
        grown, state["resident"] = now - state["resident"], now
        return grown / chunk / KIB

    async def actors() -> float:
        handles = [plain_actor() for _ in range(actors_per_round)]
        try:
            worker_pids: list[int] = list(await asyncio.gather(*(handle.pid.remote() for handle in handles)))
            total: int = sum(psutil.Process(pid).memory_info().rss for pid in worker_pids)
            return total / len(worker_pids) / KIB
        finally:
            kill(handles)

    started = state["resident"]
    rounds = await interleave_async(sizes.rounds, {"rayfleet": activate, "baseline": actors})
    return {"rounds": rounds, "answered": answered, "activation_seconds": activation_seconds,
            "resident_before": started, "resident_after": state["resident"], "activated": state["activated"]}


def density(context: Context, store: Store) -> list[Result]:
    """B4: every agent of a large fleet answers a call; resident KiB per idle agent beside KiB per plain actor."""
    sizes = SIZES[context.mode]
    with context.fleet(store, idle_timeout=IDLE_TIMEOUT) as fleet:
        pids = host_pids(fleet)
        specs = [rf.AgentSpec(identity=f"b4/{index}", agent=BenchAgent) for index in range(sizes.agents)]
        started = time.perf_counter()
        refs = fleet.spawn_many(specs)
        spawn_seconds = time.perf_counter() - started
        figures = asyncio.run(_rounds(fleet, refs, pids, sizes))
        live = sum(statistics.active_agents for statistics in fleet.host_statistics())
        started = time.perf_counter()
        fleet.shutdown(stop_actors=True)
        shutdown_seconds = time.perf_counter() - started
    rounds, activated = figures["rounds"], figures["activated"]
    answered = sum(figures["answered"])
    overall = (figures["resident_after"] - figures["resident_before"]) / activated / KIB
    baseline = summarize(rounds["baseline"])
    detail = context.detail(
        sizes,
        hosts=len(pids),
        live_agents_at_end=live,
        answered=answered,
        spawn_many_seconds=round(spawn_seconds, 2),
        activation_per_second=round(activated / sum(figures["activation_seconds"]), 1),
        activation_per_second_by_round=[round(activated / sizes.rounds / seconds, 1)
                                        for seconds in figures["activation_seconds"]],
        host_rss_before_mib=round(figures["resident_before"] / 2**20, 1),
        host_rss_after_mib=round(figures["resident_after"] / 2**20, 1),
        kib_per_agent_overall=round(overall, 3),
        baseline="RSS of each plain Ray actor's worker process (one actor per agent), averaged",
        baseline_extrapolated_gib=round(baseline.median * sizes.agents / 2**20, 1),
        shutdown_seconds=round(shutdown_seconds, 2),
    )
    memory = measured(f"B4 memory per idle agent {store}", rayfleet=summarize(rounds["rayfleet"]),
                      baseline=baseline, unit="KiB", target=Target(text="<= 4 KiB", value_max=4.0), detail=detail)
    all_answer = measured(
        f"B4 live agents answered {store}", rayfleet=summarize([float(count) for count in figures["answered"]]),
        value=float(answered), baseline=None, unit="agents",
        target=Target(text=f"all {activated:,} answer", value_min=activated), detail=detail,
    )
    return [memory, all_answer]


UNITS = (Unit("B4", "density", density),)
