"""B4 density: many live agents with a small State on this machine, and the memory each costs.

The fleet's agents are created with one ``spawn_many``, then activated by their first
call in ``rounds`` equal chunks; after each chunk the resident memory (RSS) of the host
processes is read with psutil, and the hosts' statistics say how many agents are live.
The idle timeout is set past the run, so every agent should still be live at the end:
the live row counts those that are, and the memory figure is the hosts' RSS growth
over the whole fill divided by them (a round's: its growth over the live agents it
added). An agent whose lease lapsed under load is not live and not counted. Baseline: one plain Ray actor per agent,
``actors / rounds`` created per round, and the RSS of each actor's worker process read
the same way (then extrapolated to the fleet's size in the detail). Afterwards
``fleet.shutdown()`` is timed.

A host's process id comes from an agent handler that returns ``os.getpid()`` (the
state API needs the dashboard, which the benchmark Ray does not run).
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass
from typing import Any

import psutil

import rayfleet as rf

from ._agents import BenchAgent, plain_actor
from ._context import Context, Mode, Store, Unit, kill, retries
from ._measure import Retries, in_flight, interleave_async, summarize
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
    """The process id of every host of ``fleet``, from agents placed on each (``probe/<n>``)."""
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


def _live(fleet: rf.Fleet) -> tuple[int, int]:
    """Agents live on the fleet's hosts now, and the leases the hosts lost so far."""
    statistics = fleet.host_statistics()
    return sum(host.active_agents for host in statistics), sum(host.leases_lost for host in statistics)


async def _rounds(fleet: rf.Fleet, refs: list[rf.AgentRef], pids: dict[str, int],
                  sizes: DensitySizes, retried: Retries) -> dict[str, Any]:
    chunk = sizes.agents // sizes.rounds
    actors_per_round = max(1, sizes.actors // sizes.rounds)
    live, _ = _live(fleet)
    state = {"activated": 0, "resident": resident(pids), "live": live}
    before = dict(state)
    answered: list[int] = []
    grown_live: list[int] = []
    activation_seconds: list[float] = []

    async def activate() -> float:
        start = state["activated"]
        done = 0

        async def first(index: int) -> None:
            nonlocal done
            try:
                await retried.ask(lambda: refs[start + index].ask("ping"))
                done += 1
            except rf.RayfleetError:
                pass  # counted as not answered

        activation_seconds.append(await in_flight(chunk, sizes.in_flight, first))
        answered.append(done)
        state["activated"] = start + chunk
        now, (live, _) = resident(pids), _live(fleet)
        grown, more = now - state["resident"], live - state["live"]
        state["resident"], state["live"] = now, live
        grown_live.append(more)
        # Per agent that is resident now: agents whose leases lapsed meanwhile are not counted.
        return grown / more / KIB if more > 0 else math.inf

    async def actors() -> float:
        handles = [plain_actor() for _ in range(actors_per_round)]
        try:
            worker_pids: list[int] = list(await asyncio.gather(*(handle.pid.remote() for handle in handles)))
            total: int = sum(psutil.Process(pid).memory_info().rss for pid in worker_pids)
            return total / len(worker_pids) / KIB
        finally:
            kill(handles)

    rounds = await interleave_async(sizes.rounds, {"rayfleet": activate, "baseline": actors})
    return {"rounds": rounds, "answered": answered, "grown_live": grown_live,
            "activation_seconds": activation_seconds, "before": before, "after": dict(state)}


def density(context: Context, store: Store) -> list[Result]:
    """B4: every agent of a large fleet live and answering; resident KiB per idle agent beside KiB per plain actor."""
    sizes = SIZES[context.mode]
    retried = retries()
    with context.fleet(store, idle_timeout=IDLE_TIMEOUT) as fleet:
        pids = host_pids(fleet)
        specs = [rf.AgentSpec(identity=f"b4/{index}", agent=BenchAgent) for index in range(sizes.agents)]
        started = time.perf_counter()
        refs = fleet.spawn_many(specs)
        spawn_seconds = time.perf_counter() - started
        figures = asyncio.run(_rounds(fleet, refs, pids, sizes, retried))
        _, leases_lost = _live(fleet)
        started = time.perf_counter()
        fleet.shutdown(stop_actors=True)
        shutdown_seconds = time.perf_counter() - started
    rounds, before, after = figures["rounds"], figures["before"], figures["after"]
    activated, live = after["activated"], after["live"] - before["live"]
    overall = (after["resident"] - before["resident"]) / live / KIB if live > 0 else math.inf
    baseline = summarize(rounds["baseline"])
    detail = context.detail(
        sizes,
        hosts=len(pids),
        answered_first_call=sum(figures["answered"]),
        live_at_end=live,
        live_added_by_round=figures["grown_live"],
        leases_lost=leases_lost,
        spawn_many_seconds=round(spawn_seconds, 2),
        activation_per_second=round(activated / sum(figures["activation_seconds"]), 1),
        activation_per_second_by_round=[round(activated / sizes.rounds / seconds, 1)
                                        for seconds in figures["activation_seconds"]],
        host_rss_before_mib=round(before["resident"] / 2**20, 1),
        host_rss_after_mib=round(after["resident"] / 2**20, 1),
        memory_figure="host RSS growth over the whole fill / agents live at the end (rounds: growth over the "
                      "round / agents it added that are live)",
        baseline="RSS of each plain Ray actor's worker process (one actor per agent), averaged",
        baseline_extrapolated_gib=round(baseline.median * sizes.agents / 2**20, 1),
        shutdown_seconds=round(shutdown_seconds, 2),
        retried=retried.as_dict(),
    )
    memory = measured(f"B4 memory per idle agent {store}", rayfleet=summarize(rounds["rayfleet"]), value=overall,
                      baseline=baseline, unit="KiB", target=Target(text="<= 4 KiB", value_max=4.0), detail=detail)
    resident_agents = measured(
        f"B4 live agents {store}", rayfleet=summarize([float(count) for count in figures["grown_live"]]),
        value=float(live), baseline=None, unit="agents",
        target=Target(text=f"all {activated:,} live and answered", value_min=activated), detail=detail,
    )
    return [memory, resident_agents]


UNITS = (Unit("B4", "density", density),)
