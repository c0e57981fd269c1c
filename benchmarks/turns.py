"""B10 durable steps and B11 signals and sleeps, on both ledger stores, beside raw Ray.

B10: the marginal cost of one ``self.step`` in a turn, beside a raw Ray call.

The agent is :class:`~benchmarks._agents.BenchAgent` (``EVERY_TURN`` durability, the
default) and its handler ``steps(n)``, which awaits ``self.step(f"s{i}", noop)`` for
``i`` in ``range(n)`` with a module-level no-op function and changes no State. Three
sides run in interleaved rounds, ``calls`` one-at-a-time calls per side per round:

- ``ref.call("steps", n=10)``: a durable turn of 10 steps;
- ``ref.call("steps", n=0)``: the same call with no step, an ordinary turn;
- the baseline, ``ray.get(actor.add.remote(1))`` on a plain async actor.

A round's figure is ``(p50 of the n=10 turns - p50 of the n=0 turns) / 10`` in
milliseconds: what one step adds to a turn, the call path itself taken out. It
includes each step's share of what only a journaled turn pays (the first step's read of
the journal, and the checkpoint commit that ends a durable turn even when its State is
unchanged), spread over the 10 steps. The rayfleet figure is the median over rounds,
the baseline the median of the rounds' p50, and the target is the ratio of the two
(at most 0.5). The row's detail has the whole-turn p50 of both turn sides
(``turn_p50_ms`` for n=10, ``empty_turn_p50_ms`` for n=0, over rounds) and the
n=10 turn's ratio to the baseline.

B11: how soon a suspended turn ends once it is woken. Four sides run in interleaved
rounds on one asyncio loop, ``calls`` samples per side per round:

- signal: ``await ref.ask("wait_go")`` to an agent whose handler awaits
  ``self.wait_signal("go")``; the driver waits until the ledger lists the turn as
  ``SUSPENDED`` (polling ``turns(identity, statuses=("SUSPENDED",))``), then times from
  just before ``fleet.signal(identity, "go", i)`` to the moment the ask returns. That is
  the signal's ledger write, the wake's delivery to the owner host, the replay, the
  turn's commit and the reply. One identity, one turn after another (each ask a new turn);
- its baseline, ``ray.get(actor.add.remote(1))`` on a plain async actor, as in B1 and B10;
- sleep: ``await ref.ask("nap", seconds=0.2)``, whose handler awaits ``self.sleep(0.2)``
  and answers ``time.time()`` read on its host after the sleep. Lateness is that
  answer - (t0 + 0.2), t0 being ``time.time()`` in the driver just before the ask. The
  exact instant the turn suspended is inside the host, so this is an upper bound: it
  also counts the ask's way in and the turn's first run up to its suspension (both on
  one machine, so one wall clock). It ends when the handler runs again after the sleep,
  before the turn's commit and reply reach the caller;
- its baseline, the same measurement of ``nap`` on the plain actor, an in-memory
  ``asyncio.sleep(0.2)``: a raw Ray call's way in plus the event loop's timer lateness.

The signal row's figure is the median over rounds of each round's p50 (ms), its target
at most 3x the baseline's; its detail has the p99 and, pooled, how long ``fleet.signal``
itself took (``pooled_signal_call_p50_ms``: the signal recorded and the wake handed to the
owner), the rest being the resumed turn and its reply. The sleep row's figure is the median over rounds of each
round's p99 lateness (ms), judged absolutely (at most 100 ms); its detail has the p50
and the pooled percentiles of both sleep sides.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import ray

import rayfleet as rf

from ._agents import BenchAgent
from ._context import STORES, Context, Mode, Store, Unit, plain_actors, retries
from ._measure import Retries, interleave, interleave_async, latencies_ms, percentile, summarize
from ._report import Result, Target, at_most, measured

STEPS = 10
"""Steps in the measured turn (the issue's)."""
BASELINE = "ray.get(actor.add.remote(1)) on a plain async actor (num_cpus=0), same process and rounds"
DEFINITION = (f'per round: (p50 of ref.call("steps", n={STEPS}) - p50 of ref.call("steps", n=0)) / {STEPS}, '
              "each step self.step(name, noop) with the retry policy; median over rounds")


@dataclass(frozen=True, slots=True)
class StepSizes:
    rounds: int
    calls: int
    """Calls per side per round."""
    warmup: int
    """Calls per side before the first round."""


SIZES: dict[Mode, StepSizes] = {
    "full": StepSizes(rounds=5, calls=200, warmup=50),
    "quick": StepSizes(rounds=5, calls=60, warmup=15),
    "smoke": StepSizes(rounds=3, calls=5, warmup=2),
}


def _turn(ref: rf.AgentRef, retried: Retries, n: int) -> Callable[[], object]:
    return lambda: retried.call(lambda: ref.call("steps", n=n))


def steps(context: Context, store: Store) -> list[Result]:
    """B10: milliseconds one ``self.step`` adds to a turn, beside a raw Ray call's latency."""
    sizes = SIZES[context.mode]
    retried = retries()
    with context.fleet(store) as fleet, plain_actors(1) as (plain,):
        ref = fleet.spawn("b10/steps", BenchAgent)
        calls: dict[str, Callable[[], object]] = {
            "baseline": lambda: ray.get(plain.add.remote(1)),
            "steps": _turn(ref, retried, STEPS),
            "none": _turn(ref, retried, 0),
        }
        for call in calls.values():
            latencies_ms(call, sizes.warmup)
        rounds = interleave(sizes.rounds, {name: functools.partial(latencies_ms, call, sizes.calls)
                                           for name, call in calls.items()})
    p50 = {name: [percentile(samples, 0.5) for samples in per_round] for name, per_round in rounds.items()}
    per_step = [(full - empty) / STEPS for full, empty in zip(p50["steps"], p50["none"], strict=True)]
    turn = summarize(p50["steps"])
    empty = summarize(p50["none"])
    baseline = summarize(p50["baseline"])
    return [measured(
        f"B10 step {store}", rayfleet=summarize(per_step), baseline=baseline, unit="ms/step", target=at_most(0.5),
        detail=context.detail(
            sizes, baseline=BASELINE, rayfleet_figure=DEFINITION, durability="EVERY_TURN",
            steps_per_turn=STEPS, turn_p50_ms=turn.as_dict(), empty_turn_p50_ms=empty.as_dict(),
            turn_to_baseline=turn.median / baseline.median if baseline.median else None,
            retried=retried.as_dict(),
        ),
    )]


SLEEP = 0.2
"""Seconds of B11's durable sleep (the issue's)."""
LATENESS_LIMIT_MS = 100.0
"""B11's bar for the p99 lateness of a woken sleep (the issue's), absolute."""
SUSPENSION_POLL = 0.005
"""Seconds between the driver's reads of the ledger while a B11 turn is on its way to suspending.

Short enough not to leave the rounds idle, long enough that the polling does not load the
ledger and the hosts the measured wake then shares the 2 CPUs with."""
SUSPENSION_PATIENCE = 60.0
"""Seconds a B11 turn may take to suspend before the sample is given up (the row then shows the error)."""
SIGNAL_DEFINITION = ('per round: p50 of the time from just before fleet.signal(identity, "go", i) to the return of '
                     'the pending ref.ask("wait_go") (handler: await self.wait_signal("go")), the turn known to be '
                     "SUSPENDED in the ledger before the signal; median over rounds")
SLEEP_DEFINITION = (f'per round: p99 of the lateness of ref.ask("nap", seconds={SLEEP:g}) (handler: await '
                    f"self.sleep({SLEEP:g}); return time.time()), lateness = the answer - (t0 + {SLEEP:g}) with "
                    "t0 = time.time() in the driver just before the ask: an upper bound, since it also counts the "
                    "ask's way in and the turn's first run up to its suspension; median over rounds")
SLEEP_BASELINE = (f"the same lateness for await actor.nap.remote({SLEEP:g}) on a plain async actor "
                  f"(asyncio.sleep({SLEEP:g}); return time.time()), same process and rounds")


@dataclass(frozen=True, slots=True)
class WakeSizes:
    rounds: int
    calls: int
    """Samples per side per round (a sleep sample takes at least ``SLEEP`` seconds)."""
    warmup: int
    """Samples per side before the first round."""


WAKE_SIZES: dict[Mode, WakeSizes] = {
    "full": WakeSizes(rounds=5, calls=50, warmup=10),
    "quick": WakeSizes(rounds=5, calls=20, warmup=5),
    "smoke": WakeSizes(rounds=3, calls=3, warmup=1),
}


async def _suspended(fleet: rf.Fleet, identity: str) -> None:
    """Return once the ledger lists a suspended turn of ``identity``.

    The previous sample's turn completed before its ask returned, so a suspended turn
    listed now is the one just asked for.
    """
    ledger = fleet._ledger  # private, on purpose: the benchmark must know the turn waits before it signals
    give_up = time.monotonic() + SUSPENSION_PATIENCE
    while not await ledger.turns(identity=identity, statuses=("SUSPENDED",), limit=1):
        if time.monotonic() > give_up:
            raise TimeoutError(f"no turn of {identity!r} suspended within {SUSPENSION_PATIENCE:g} s")
        await asyncio.sleep(SUSPENSION_POLL)


async def _signalled_ms(fleet: rf.Fleet, ref: rf.AgentRef, retried: Retries, count: int,
                        signal_returned: list[float] | None = None) -> list[float]:
    """Milliseconds from ``fleet.signal`` to the end of the turn it wakes, ``count`` turns one after another.

    ``signal_returned`` (when given) gets the milliseconds ``fleet.signal`` itself took
    (the signal recorded and the wake handed to the owner host): the rest of a sample
    is the resumed turn and its reply.
    """
    samples = []
    for index in range(count):
        pending = asyncio.ensure_future(retried.ask(lambda: ref.ask("wait_go")))
        await _suspended(fleet, ref.identity)
        started = time.perf_counter()
        # Called on the loop on purpose (no thread hop in the figure): the ask's reply is
        # taken up as soon as the signal's wake was handed to the owner host.
        fleet.signal(ref.identity, "go", index)
        if signal_returned is not None:
            signal_returned.append((time.perf_counter() - started) * 1000.0)
        value = await pending
        samples.append((time.perf_counter() - started) * 1000.0)
        if value != index:
            raise AssertionError(f"the turn answered {value!r}, not the signal's value {index}")
    return samples


async def _lateness_ms(nap: Callable[[], Awaitable[float]], count: int) -> list[float]:
    """Milliseconds by which each of ``count`` sleeps of ``SLEEP`` seconds ended late (see the module docstring)."""
    samples = []
    for _ in range(count):
        asked = time.time()  # wall clock, as the answer is: both are read on this machine
        woke = await nap()
        samples.append((woke - (asked + SLEEP)) * 1000.0)
    return samples


async def _sync_ms(call: Callable[[], object], count: int) -> list[float]:
    """:func:`latencies_ms` as a side of :func:`interleave_async` (the loop is blocked meanwhile, as a driver is)."""
    return latencies_ms(call, count)


async def _wake_rounds(
    fleet: rf.Fleet, signal_ref: rf.AgentRef, sleep_ref: rf.AgentRef, plain: ray.actor.ActorHandle, sizes: WakeSizes,
    retried: Retries,
) -> dict[str, list[list[float]]]:
    async def plain_nap() -> float:
        woke: float = await plain.nap.remote(SLEEP)
        return woke

    async def agent_nap() -> float:
        woke: float = await retried.ask(lambda: sleep_ref.ask("nap", seconds=SLEEP))
        return woke

    sides: dict[str, Callable[[int], Awaitable[list[float]]]] = {
        "baseline": functools.partial(_sync_ms, lambda: ray.get(plain.add.remote(1))),
        "signal": functools.partial(_signalled_ms, fleet, signal_ref, retried),
        "sleep": functools.partial(_lateness_ms, agent_nap),
        "sleep_baseline": functools.partial(_lateness_ms, plain_nap),
    }
    for side in sides.values():
        await side(sizes.warmup)
    signal_returned: list[float] = []
    sides["signal"] = functools.partial(_signalled_ms, fleet, signal_ref, retried,
                                        signal_returned=signal_returned)
    rounds = await interleave_async(sizes.rounds, {name: functools.partial(side, sizes.calls)
                                                   for name, side in sides.items()})
    # Not a side of its own: every sample of the signal side, pooled (a detail of its row).
    rounds["signal_returned"] = [signal_returned]
    return rounds


def wakes(context: Context, store: Store) -> list[Result]:
    """B11: ``fleet.signal`` to the end of the waiting turn (beside a raw Ray call), and a woken sleep's lateness."""
    sizes = WAKE_SIZES[context.mode]
    retried = retries()
    with context.fleet(store) as fleet, plain_actors(1) as (plain,):
        signal_ref = fleet.spawn("b11/signal", BenchAgent)
        sleep_ref = fleet.spawn("b11/sleep", BenchAgent)
        rounds = asyncio.run(_wake_rounds(fleet, signal_ref, sleep_ref, plain, sizes, retried))

    def per_round(name: str, fraction: float) -> list[float]:
        return [percentile(samples, fraction) for samples in rounds[name]]

    def pooled(name: str, fraction: float) -> float:
        return percentile([sample for samples in rounds[name] for sample in samples], fraction)

    signal = summarize(per_round("signal", 0.5))
    baseline = summarize(per_round("baseline", 0.5))
    late_p99 = summarize(per_round("sleep", 0.99))
    late_p99_baseline = summarize(per_round("sleep_baseline", 0.99))
    return [
        measured(
            f"B11 signal {store}", rayfleet=signal, baseline=baseline, unit="ms", target=at_most(3.0),
            detail=context.detail(
                sizes, baseline=BASELINE, rayfleet_figure=SIGNAL_DEFINITION, durability="EVERY_TURN",
                p99_ms=summarize(per_round("signal", 0.99)).as_dict(),
                pooled_rayfleet_p50_ms=pooled("signal", 0.5), pooled_rayfleet_p99_ms=pooled("signal", 0.99),
                pooled_baseline_p50_ms=pooled("baseline", 0.5),
                pooled_signal_call_p50_ms=pooled("signal_returned", 0.5), retried=retried.as_dict(),
            ),
        ),
        measured(
            f"B11 sleep lateness p99 {store}", rayfleet=late_p99, baseline=late_p99_baseline, unit="ms",
            target=Target(text=f"<= {LATENESS_LIMIT_MS:g} ms", value_max=LATENESS_LIMIT_MS),
            detail=context.detail(
                sizes, baseline=SLEEP_BASELINE, rayfleet_figure=SLEEP_DEFINITION, sleep_s=SLEEP,
                durability="EVERY_TURN", p50_ms=summarize(per_round("sleep", 0.5)).as_dict(),
                baseline_p50_ms=summarize(per_round("sleep_baseline", 0.5)).as_dict(),
                pooled_rayfleet_p50_ms=pooled("sleep", 0.5), pooled_rayfleet_p99_ms=pooled("sleep", 0.99),
                pooled_baseline_p50_ms=pooled("sleep_baseline", 0.5),
                pooled_baseline_p99_ms=pooled("sleep_baseline", 0.99), retried=retried.as_dict(),
            ),
        ),
    ]


UNITS = (
    *(Unit("B10", "durable steps", steps, store) for store in STORES),
    *(Unit("B11", "signals and sleeps", wakes, store) for store in STORES),
)
