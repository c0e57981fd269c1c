"""B1 call latency and B2 call throughput, on both ledger stores, beside plain Ray actor calls.

B1: one caller, one call at a time: ``ref.call("add", n=1)`` to an agent with PERIODIC
durability and to one with EVERY_TURN, against ``ray.get(actor.add.remote(1))`` on a
plain async actor. Each round takes ``calls`` latencies per side; a round's p50 and
p99 are its percentiles, and the figure is the median over rounds.

B2: ``await ref.ask("add", n=1)`` over ``identities`` agents (round robin) with 64 in
flight, against the same number of ``await actor.add.remote(1)`` spread over as many
plain actors as the fleet has hosts, also 64 in flight. The figure is asks per second.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import ray

import rayfleet as rf

from ._agents import BenchAgent
from ._context import STORES, Context, Mode, Store, Unit, plain_actors, retries
from ._measure import Retries, in_flight, interleave, interleave_async, latencies_ms, percentile, summarize
from ._report import Result, at_least, at_most, measured

DURABILITIES = {"periodic": rf.Durability.PERIODIC, "every_turn": rf.Durability.EVERY_TURN}
LATENCY_BASELINE = "ray.get(actor.add.remote(1)) on a plain async actor (num_cpus=0), same process and rounds"


@dataclass(frozen=True, slots=True)
class LatencySizes:
    rounds: int
    calls: int
    """Calls per side per round."""
    warmup: int
    """Calls per side before the first round."""


LATENCY: dict[Mode, LatencySizes] = {
    "full": LatencySizes(rounds=5, calls=400, warmup=100),
    "quick": LatencySizes(rounds=5, calls=100, warmup=30),
    "smoke": LatencySizes(rounds=5, calls=8, warmup=3),
}


def _caller(ref: rf.AgentRef, retried: Retries) -> Callable[[], object]:
    return lambda: retried.call(lambda: ref.call("add", n=1))


def latency(context: Context, store: Store) -> list[Result]:
    """B1: p50 and p99 of one caller's ``ref.call`` (PERIODIC and EVERY_TURN) beside a plain actor call."""
    sizes = LATENCY[context.mode]
    retried = retries()
    with context.fleet(store) as fleet, plain_actors(1) as (plain,):
        refs = {name: fleet.spawn(f"b1/{name.replace('_', '-')}", BenchAgent, durability=durability)
                for name, durability in DURABILITIES.items()}
        calls: dict[str, Callable[[], object]] = {"baseline": lambda: ray.get(plain.add.remote(1))}
        calls.update({name: _caller(ref, retried) for name, ref in refs.items()})
        for call in calls.values():
            latencies_ms(call, sizes.warmup)
        rounds = interleave(sizes.rounds, {name: functools.partial(latencies_ms, call, sizes.calls)
                                           for name, call in calls.items()})
    rows = []
    for label, fraction in (("p50", 0.5), ("p99", 0.99)):
        baseline = summarize([percentile(samples, fraction) for samples in rounds["baseline"]])
        for name in DURABILITIES:
            limit = 3.0 if label == "p99" else (1.3 if name == "periodic" else 2.0)
            pooled = [sample for samples in rounds[name] for sample in samples]
            pooled_baseline = [sample for samples in rounds["baseline"] for sample in samples]
            rows.append(measured(
                f"B1 call {label} {name} {store}",
                rayfleet=summarize([percentile(samples, fraction) for samples in rounds[name]]),
                baseline=baseline, unit="ms", target=at_most(limit),
                detail=context.detail(sizes, baseline=LATENCY_BASELINE,
                                      rayfleet_call=f'ref.call("add", n=1), {name.upper()} durability',
                                      pooled_rayfleet_ms=percentile(pooled, fraction),
                                      pooled_baseline_ms=percentile(pooled_baseline, fraction),
                                      retried=retried.as_dict()),
            ))
    return rows


@dataclass(frozen=True, slots=True)
class ThroughputSizes:
    rounds: int
    identities: int
    """Agents per durability, asked round robin."""
    asks: int
    """Asks per side per round."""
    in_flight: int = 64


THROUGHPUT: dict[Mode, ThroughputSizes] = {
    "full": ThroughputSizes(rounds=5, identities=1_000, asks=2_000),
    "quick": ThroughputSizes(rounds=5, identities=500, asks=300),
    "smoke": ThroughputSizes(rounds=5, identities=20, asks=40),
}


async def _ask_rounds(
    groups: dict[str, list[rf.AgentRef]], actors: Sequence[ray.actor.ActorHandle], sizes: ThroughputSizes,
    retried: Retries,
) -> dict[str, list[float]]:
    async def plain(index: int) -> object:
        return await actors[index % len(actors)].add.remote(1)

    def asker(refs: list[rf.AgentRef]) -> Callable[[int], Awaitable[object]]:
        async def ask(index: int) -> object:
            ref = refs[index % len(refs)]
            return await retried.ask(lambda: ref.ask("add", n=1))
        return ask

    calls: dict[str, Callable[[int], Awaitable[object]]] = {"baseline": plain}
    calls.update({name: asker(refs) for name, refs in groups.items()})
    # Warm-up: every agent activated (its first ask), every path exercised.
    for name, call in calls.items():
        await in_flight(max(sizes.identities if name != "baseline" else 0, sizes.asks // 4), sizes.in_flight, call)

    def side(call: Callable[[int], Awaitable[object]]) -> Callable[[], Awaitable[float]]:
        async def rate() -> float:
            return sizes.asks / await in_flight(sizes.asks, sizes.in_flight, call)
        return rate

    return await interleave_async(sizes.rounds, {name: side(call) for name, call in calls.items()})


def throughput(context: Context, store: Store) -> list[Result]:
    """B2: asks per second over ``identities`` agents with 64 in flight, beside plain actors (one per host)."""
    sizes = THROUGHPUT[context.mode]
    retried = retries()
    with context.fleet(store) as fleet:
        hosts = len(fleet.hosts())
        groups = {
            name: fleet.spawn_many([rf.AgentSpec(identity=f"b2/{name.replace('_', '-')}/{index}", agent=BenchAgent,
                                                 durability=durability) for index in range(sizes.identities)])
            for name, durability in DURABILITIES.items()
        }
        with plain_actors(hosts) as actors:
            rounds = asyncio.run(_ask_rounds(groups, actors, sizes, retried))
    baseline = summarize(rounds["baseline"])
    rows = []
    for name in DURABILITIES:
        detail: dict[str, Any] = context.detail(
            sizes, baseline=f"await actor.add.remote(1) over {hosts} plain async actors (as many as hosts), "
                            f"{sizes.in_flight} in flight",
            rayfleet_call=f'await ref.ask("add", n=1) round robin over {sizes.identities} agents, '
                          f"{name.upper()} durability, {sizes.in_flight} in flight",
            retried=retried.as_dict(),
        )
        rows.append(measured(f"B2 throughput {name} {store}", rayfleet=summarize(rounds[name]), baseline=baseline,
                             unit="asks/s", target=at_least(0.8 if name == "periodic" else 0.6), detail=detail))
    return rows


UNITS = (
    *(Unit("B1", "call latency", latency, store) for store in STORES),
    *(Unit("B2", "throughput", throughput, store) for store in STORES),
)
