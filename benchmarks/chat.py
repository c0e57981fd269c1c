"""B14: what one iteration of ``rf.ChatAgent``'s loop adds to the model and tool calls it makes, on both stores.

The model is :class:`rayfleet.testing.ScriptedModelServer` on 127.0.0.1 (in this process,
on its own thread); the agent (``stream = False``, ``remember = False``) has one tool,
``noop``, that returns ``"ok"``. A message ``"loop K"`` makes the server answer with one
``noop`` tool call until the request holds K tool results, then with ``"done"``: a turn
of K iterations (K + 1 model calls, K tool calls), each model call and tool call a
journaled step. Three sides run in interleaved rounds on one asyncio loop, ``calls``
samples per side per round:

- ``await ref.ask("chat", message="loop K")``: a turn of K iterations;
- ``await ref.ask("chat", message="loop 0")``: a turn of one model call and no tool;
- the baseline, ``await client.chat(...)`` with an ``rf.ChatClient`` of the same settings
  from this process, then the tool's function called directly: one iteration without rayfleet.

A round's figure is ``(p50 of the K turns - p50 of the empty turns) / K - p50 of the
baseline`` in milliseconds: what the loop adds to each iteration beyond the model call
and the tool themselves (the two steps' journal writes, the tool call's bookkeeping, the
host's share of the HTTP work). The rayfleet figure is the median over rounds, judged
absolutely (at most 3 ms); the baseline column is the baseline's median p50.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import rayfleet as rf
from rayfleet.testing import ScriptedModelServer, ScriptedReply

from ._context import STORES, Context, Mode, Store, Unit, retries
from ._measure import Retries, interleave_async, percentile, summarize
from ._report import Result, Target, measured

ITERATIONS = 5
"""Iterations in the measured turn."""
ADDED_LIMIT_MS = 3.0
"""B14's bar: milliseconds the loop may add per iteration (the issue's)."""
DEFINITION = (f'per round: (p50 of ref.ask("chat", message="loop {ITERATIONS}") - p50 of ref.ask("chat", '
              f'message="loop 0")) / {ITERATIONS} - p50 of the baseline; median over rounds')
BASELINE = ("await rf.ChatClient(...).chat(messages) from the driver against the same scripted server, then the "
            "tool's function called directly: one model call and one tool call without rayfleet")


@dataclass(frozen=True, slots=True)
class ChatSizes:
    rounds: int
    calls: int
    """Samples per side per round."""
    warmup: int
    """Samples per side before the first round."""


SIZES: dict[Mode, ChatSizes] = {
    "full": ChatSizes(rounds=5, calls=40, warmup=10),
    "quick": ChatSizes(rounds=5, calls=15, warmup=5),
    "smoke": ChatSizes(rounds=3, calls=3, warmup=1),
}


def noop() -> str:
    return "ok"


def script(body: dict[str, Any]) -> str | ScriptedReply:
    """``"loop K"``: a ``noop`` call until the request holds K tool results, then ``"done"``."""
    messages = body["messages"]
    asked = next(m["content"] for m in reversed(messages) if m["role"] == "user")
    wanted = int(asked.split()[-1])
    done = sum(1 for m in messages if m["role"] == "tool")
    if done >= wanted:
        return "done"
    return ScriptedReply(tool_calls=[rf.ToolCall(f"c{done}", "noop", "{}")])


def agent_class(url: str) -> type[rf.ChatAgent]:
    class Looper(rf.ChatAgent):
        model = rf.Model("scripted", base_url=url, timeout=60)
        stream = False
        remember = False
        max_iterations = ITERATIONS + 1

        @rf.tool(idempotent=True)
        def noop(self) -> str:
            """Do nothing."""
            return noop()

    return Looper


async def _samples_ms(call: Callable[[], Awaitable[object]], count: int) -> list[float]:
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        await call()
        samples.append((time.perf_counter() - started) * 1000.0)
    return samples


async def _rounds(ref: rf.AgentRef, client: rf.ChatClient, sizes: ChatSizes,
                  retried: Retries) -> dict[str, list[list[float]]]:
    async def turn(iterations: int) -> object:
        return await retried.ask(lambda: ref.ask("chat", message=f"loop {iterations}"))

    async def direct() -> object:
        reply = await client.chat([{"role": "user", "content": "loop 0"}])
        return reply.text, noop()

    sides: dict[str, Callable[[int], Awaitable[list[float]]]] = {
        "loop": functools.partial(_samples_ms, functools.partial(turn, ITERATIONS)),
        "empty": functools.partial(_samples_ms, functools.partial(turn, 0)),
        "baseline": functools.partial(_samples_ms, direct),
    }
    for side in sides.values():
        await side(sizes.warmup)
    try:
        return await interleave_async(sizes.rounds, {name: functools.partial(side, sizes.calls)
                                                     for name, side in sides.items()})
    finally:
        await client.close()


def iterations(context: Context, store: Store) -> list[Result]:
    """B14: milliseconds one loop iteration adds beyond its model call and tool call, beside the direct calls."""
    sizes = SIZES[context.mode]
    retried = retries()
    with ScriptedModelServer(script) as server, context.fleet(store) as fleet:
        ref = fleet.spawn("b14/loop", agent_class(server.url))
        client = rf.ChatClient(server.url, model="scripted", timeout=60)
        rounds = asyncio.run(_rounds(ref, client, sizes, retried))
        served = server.served
    p50 = {name: [percentile(samples, 0.5) for samples in per_round] for name, per_round in rounds.items()}
    added = [(full - empty) / ITERATIONS - direct
             for full, empty, direct in zip(p50["loop"], p50["empty"], p50["baseline"], strict=True)]
    return [measured(
        f"B14 iteration {store}", rayfleet=summarize(added), baseline=summarize(p50["baseline"]), unit="ms",
        target=Target(text=f"<= {ADDED_LIMIT_MS:g} ms added", value_max=ADDED_LIMIT_MS),
        detail=context.detail(
            sizes, baseline=BASELINE, rayfleet_figure=DEFINITION, iterations_per_turn=ITERATIONS,
            turn_p50_ms=summarize(p50["loop"]).as_dict(), empty_turn_p50_ms=summarize(p50["empty"]).as_dict(),
            model_requests_served=served, retried=retried.as_dict(),
        ),
    )]


UNITS = tuple(Unit("B14", "model-agent loop iteration", iterations, store) for store in STORES)
