"""B13 turn streams, on both ledger stores, beside raw Ray.

B13 latency: how soon an event a handler emits reaches a driver reading the turn's
stream. The agent is :class:`StreamAgent`, whose handler ``relay(count, gap)`` emits
``count`` events, each carrying ``time.time()`` read on its host just before
``self.emit``, with an ``asyncio.sleep(gap)`` after each (so that each event is awaited
by a pending long poll, not collected with the next). The driver starts the turn with
``ref.start`` and reads ``handle.aevents()``; a sample is the driver's ``time.time()``
when the event arrives minus the time in the event (one machine, one wall clock). The
baseline is a raw Ray call, ``ray.get(actor.add.remote(1))`` on a plain async actor, in
the same rounds. The figure is the median over rounds of each round's p50, judged
absolutely (at most 2 ms), the ratio to the baseline shown beside it.

B13 SSE: the same, through the HTTP gateway (``build_app`` served on a loopback port of
the driver's process): the turn is started with ``POST .../turns/relay`` and its events
read from ``GET .../turns/{id}/events`` with aiohttp; a sample is the client's
``time.time()`` when an event's ``data:`` line arrives minus the time in the event.

B13 throughput: persisted events per host. ``burst(count)`` emits ``count`` events in
a loop (no await) and returns; the figure is ``count`` divided by the time from just
before ``ref.call("burst")`` to the moment the ledger's last event of the turn is its
``completed`` event (the host writes events in order, so every emitted event is then
in the ledger), polled every 2 ms. One host, so it is one host's rate. The baseline is
raw Ray calls per second: ``count`` ``actor.add.remote(1)``, 1,000 in flight at a time.
The figure is the median over rounds, judged absolutely (at least 20,000 events/s).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
import urllib.parse
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import ray
import ray.cloudpickle
from aiohttp import web

import rayfleet as rf
from rayfleet.gateway import build_app

from ._context import STORES, Context, Mode, Store, Unit, plain_actors, retries
from ._measure import interleave_async, latencies_ms, percentile, summarize
from ._report import Result, Target, measured

LATENCY_LIMIT_MS = 2.0
"""B13's bar for the p50 of emit to aevents (the issue's), absolute."""
RATE_FLOOR = 20_000.0
"""B13's bar for persisted events per host per second (the issue's), absolute."""
GAP = 0.005
"""Seconds between two events of the latency turn."""
BASELINE = "ray.get(actor.add.remote(1)) on a plain async actor (num_cpus=0), same process and rounds"
LATENCY_DEFINITION = ('per round: p50 of (driver time.time() when the event arrives in handle.aevents() - host '
                      'time.time() just before self.emit), one turn of ref.start("relay") emitting events '
                      f"{GAP * 1000:g} ms apart; median over rounds")
SSE_DEFINITION = ('per round: p50 of (client time.time() when the event\'s data line arrives - host time.time() '
                  'just before self.emit), the turn started with POST /v1/agents/{identity}/turns/relay and read '
                  "from GET .../events (server-sent events) of the gateway, which runs in the driver's process; "
                  "median over rounds")
RATE_DEFINITION = ('per round: events / seconds from just before ref.call("burst", count) (count self.emit in a '
                   "loop) until the ledger's last event of the turn is its completed event; one host; median over "
                   "rounds")
RATE_BASELINE = "count actor.add.remote(1) on a plain async actor, 1,000 in flight at a time, per second"


class StreamAgent(rf.Agent):
    """Emits events for B13."""

    @rf.handler
    async def relay(self, count: int, gap: float) -> int:
        for index in range(count):
            self.emit("tick", {"i": index, "t": time.time()})
            await asyncio.sleep(gap)
        return count

    @rf.handler
    async def burst(self, count: int) -> int:
        for index in range(count):
            self.emit("tick", index)
        return count


@dataclass(frozen=True, slots=True)
class StreamSizes:
    rounds: int
    events: int
    """Events per latency turn (per round)."""
    burst: int
    """Events per throughput turn (per round)."""
    calls: int
    """Raw Ray calls per round for the latency baseline."""


SIZES: dict[Mode, StreamSizes] = {
    "full": StreamSizes(rounds=5, events=300, burst=50_000, calls=300),
    "quick": StreamSizes(rounds=5, events=100, burst=20_000, calls=100),
    "smoke": StreamSizes(rounds=3, events=10, burst=500, calls=10),
}


async def _latencies(ref: rf.AgentRef, count: int) -> list[float]:
    handle = ref.start("relay", count=count, gap=GAP)
    samples = []
    async for event in handle.aevents():
        if event.kind == "tick":
            samples.append((time.time() - event.data["t"]) * 1000.0)
    await handle.wait()
    if len(samples) != count:
        raise AssertionError(f"the stream carried {len(samples)} of {count} events")
    return samples


async def _sse_latencies(http: aiohttp.ClientSession, identity: str, count: int) -> list[float]:
    """:func:`_latencies` through the gateway: the turn started over HTTP, its events read as server-sent events."""
    path = f"/v1/agents/{urllib.parse.quote(identity, safe='')}/turns/relay"
    async with http.post(path, json={"count": count, "gap": GAP}) as started:
        started.raise_for_status()
        events = (await started.json())["events"]
    samples = []
    async with http.get(events) as stream:
        stream.raise_for_status()
        kind = ""
        async for line in stream.content:
            text = line.decode().rstrip("\n")
            if text.startswith("event: "):
                kind = text[7:]
            elif text.startswith("data: ") and kind == "tick":
                arrived = time.time()
                samples.append((arrived - json.loads(text[6:])["data"]["t"]) * 1000.0)
    if len(samples) != count:
        raise AssertionError(f"the event stream carried {len(samples)} of {count} events")
    return samples


@contextlib.asynccontextmanager
async def _gateway(fleet: rf.Fleet) -> AsyncIterator[aiohttp.ClientSession]:
    """The HTTP gateway over ``fleet`` on a loopback port of this process (no token), and a client of it."""
    runner = web.AppRunner(build_app(fleet, token=None))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with aiohttp.ClientSession(f"http://127.0.0.1:{port}") as http:
            yield http
    finally:
        await runner.cleanup()


async def _rate(fleet: rf.Fleet, ref: rf.AgentRef, count: int) -> list[float]:
    ledger = fleet._ledger  # private, on purpose: the figure ends when the ledger holds the events
    started = time.perf_counter()
    handle = ref.start("burst", count=count)
    while True:
        last = await ledger.last_turn_event(identity=ref.identity, turn_id=handle.id)
        if last is not None and last.kind == "completed":
            break
        await asyncio.sleep(0.002)
    seconds = time.perf_counter() - started
    await handle.wait()
    return [count / seconds]


RAW_WINDOW = 1000
"""Raw Ray calls in flight at once for the throughput baseline (Ray warns past 10,000 pending on one actor)."""


async def _raw_rate(plain: ray.actor.ActorHandle, count: int) -> list[float]:
    started = time.perf_counter()
    for sent in range(0, count, RAW_WINDOW):
        await asyncio.gather(*[plain.add.remote(1) for _ in range(min(RAW_WINDOW, count - sent))])
    return [count / (time.perf_counter() - started)]


async def _baseline(plain: ray.actor.ActorHandle, count: int) -> list[float]:
    return latencies_ms(lambda: ray.get(plain.add.remote(1)), count)


def streams(context: Context, store: Store) -> list[Result]:
    """B13: emit to ``aevents`` latency (beside a raw Ray call), and persisted events per host per second."""
    sizes = SIZES[context.mode]
    retried = retries()
    with context.fleet(store, hosts=1) as fleet, plain_actors(1) as (plain,):
        ref = fleet.spawn("b13/stream", StreamAgent)

        async def run() -> dict[str, list[list[float]]]:
            async with _gateway(fleet) as http:
                await _latencies(ref, min(10, sizes.events))  # warm-up: activation, first polls
                await _sse_latencies(http, ref.identity, min(10, sizes.events))
                await _rate(fleet, ref, min(500, sizes.burst))
                return await interleave_async(sizes.rounds, {
                    "latency": lambda: _latencies(ref, sizes.events),
                    "sse": lambda: _sse_latencies(http, ref.identity, sizes.events),
                    "baseline": lambda: _baseline(plain, sizes.calls),
                    "rate": lambda: _rate(fleet, ref, sizes.burst),
                    "raw_rate": lambda: _raw_rate(plain, sizes.burst),
                })

        rounds = asyncio.run(run())

    def per_round(name: str, fraction: float) -> list[float]:
        return [percentile(samples, fraction) for samples in rounds[name]]

    latency = summarize(per_round("latency", 0.5))
    sse = summarize(per_round("sse", 0.5))
    pooled_sse = [sample for samples in rounds["sse"] for sample in samples]
    baseline = summarize(per_round("baseline", 0.5))
    rate = summarize([samples[0] for samples in rounds["rate"]])
    raw_rate = summarize([samples[0] for samples in rounds["raw_rate"]])
    pooled = [sample for samples in rounds["latency"] for sample in samples]
    return [
        measured(
            f"B13 emit to aevents {store}", rayfleet=latency, baseline=baseline, unit="ms",
            target=Target(text=f"<= {LATENCY_LIMIT_MS:g} ms", value_max=LATENCY_LIMIT_MS),
            detail=context.detail(sizes, baseline=BASELINE, rayfleet_figure=LATENCY_DEFINITION,
                                  p99_ms=summarize(per_round("latency", 0.99)).as_dict(),
                                  pooled_p50_ms=percentile(pooled, 0.5), pooled_p99_ms=percentile(pooled, 0.99),
                                  retried=retried.as_dict()),
        ),
        measured(
            f"B13 emit to SSE client {store}", rayfleet=sse, baseline=baseline, unit="ms",
            target=Target(text=f"<= {LATENCY_LIMIT_MS:g} ms", value_max=LATENCY_LIMIT_MS),
            detail=context.detail(sizes, baseline=BASELINE, rayfleet_figure=SSE_DEFINITION,
                                  p99_ms=summarize(per_round("sse", 0.99)).as_dict(),
                                  pooled_p50_ms=percentile(pooled_sse, 0.5),
                                  pooled_p99_ms=percentile(pooled_sse, 0.99)),
        ),
        measured(
            f"B13 persisted events per host {store}", rayfleet=rate, baseline=raw_rate, unit="events/s",
            target=Target(text=f">= {RATE_FLOOR:,.0f} events/s", value_min=RATE_FLOOR),
            detail=context.detail(sizes, baseline=RATE_BASELINE, rayfleet_figure=RATE_DEFINITION, hosts=1),
        ),
    ]


UNITS = tuple(Unit("B13", "turn streams", streams, store) for store in STORES)

# Ray workers need not have this checkout on their path: the agent class travels by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
