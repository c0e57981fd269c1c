"""How figures are taken: interleaved rounds, percentiles, and the median and spread over rounds.

Every benchmark runs rayfleet and its baseline in alternating rounds in one process, the
order rotating from round to round, so drift on a shared machine (another job, a
thermal change, a compaction) hits both sides alike. A figure is the median over the
rounds; its spread is the lowest and highest round and the interquartile range.
"""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Spread:
    """A figure over rounds: the median, the lowest and highest round, and the quartiles."""

    median: float
    low: float
    high: float
    q1: float
    q3: float
    rounds: int

    def as_dict(self) -> dict[str, float | int]:
        return {"median": self.median, "min": self.low, "max": self.high, "q1": self.q1, "q3": self.q3,
                "rounds": self.rounds}


def summarize(values: Sequence[float]) -> Spread:
    """The median and spread of per-round ``values`` (at least one).

    Raises:
        ValueError: ``values`` is empty.
    """
    if not values:
        raise ValueError("no rounds to summarize")
    ordered = sorted(values)
    return Spread(median=statistics.median(ordered), low=ordered[0], high=ordered[-1],
                  q1=percentile(ordered, 0.25), q3=percentile(ordered, 0.75), rounds=len(ordered))


def percentile(samples: Sequence[float], fraction: float) -> float:
    """The ``fraction`` quantile of ``samples``, interpolated linearly between the nearest ranks.

    Raises:
        ValueError: ``samples`` is empty or ``fraction`` is outside [0, 1].
    """
    if not samples:
        raise ValueError("no samples")
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must be within [0, 1], got {fraction}")
    ordered = sorted(samples)
    position = fraction * (len(ordered) - 1)
    below, above = math.floor(position), math.ceil(position)
    return ordered[below] + (ordered[above] - ordered[below]) * (position - below)


def _orders(names: Sequence[str], rounds: int) -> list[list[str]]:
    """The order of the sides in each round: rotated by one each round."""
    return [[names[(start + offset) % len(names)] for offset in range(len(names))]
            for start in range(rounds)]


def interleave(rounds: int, sides: Mapping[str, Callable[[], T]]) -> dict[str, list[T]]:
    """Run every side once per round, in an order rotating each round; each side's results by round."""
    results: dict[str, list[T]] = {name: [] for name in sides}
    for order in _orders(list(sides), rounds):
        for name in order:
            results[name].append(sides[name]())
    return results


async def interleave_async(rounds: int, sides: Mapping[str, Callable[[], Awaitable[T]]]) -> dict[str, list[T]]:
    """:func:`interleave` for sides that are coroutines (each awaited alone, never two at once)."""
    results: dict[str, list[T]] = {name: [] for name in sides}
    for order in _orders(list(sides), rounds):
        for name in order:
            results[name].append(await sides[name]())
    return results


def latencies_ms(call: Callable[[], object], count: int) -> list[float]:
    """Milliseconds of each of ``count`` calls made one after another."""
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        call()
        samples.append((time.perf_counter() - started) * 1000.0)
    return samples


def seconds_of(work: Callable[[], object]) -> float:
    """Wall-clock seconds ``work()`` takes."""
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


async def in_flight(count: int, concurrency: int, call: Callable[[int], Awaitable[object]]) -> float:
    """Make ``count`` calls ``call(0..count-1)`` keeping ``concurrency`` in flight; the seconds it took.

    Each of ``concurrency`` workers takes the next index as soon as its previous call
    answered, so exactly that many calls are outstanding until the last ones drain.
    """
    indexes = iter(range(count))

    async def worker() -> None:
        for index in indexes:
            await call(index)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(min(concurrency, count))))
    return time.perf_counter() - started


class Retries:
    """Makes calls, retrying those that fail with one of ``errors``; counts every retry by error type.

    For the errors a system asks its callers to retry (a lease that moved mid-call, say):
    one of them on a loaded machine should cost a retry, which the figure then includes,
    not the whole benchmark. The counts go into the row's detail.
    """

    def __init__(self, errors: tuple[type[BaseException], ...], *, attempts: int = 5) -> None:
        self.errors = errors
        self.attempts = attempts
        self.counts: Counter[str] = Counter()

    def call(self, work: Callable[[], T]) -> T:
        for attempt in range(1, self.attempts + 1):
            try:
                return work()
            except self.errors as error:
                if attempt == self.attempts:
                    raise
                self.counts[type(error).__name__] += 1
        raise AssertionError("unreachable")

    async def ask(self, work: Callable[[], Awaitable[T]]) -> T:
        for attempt in range(1, self.attempts + 1):
            try:
                return await work()
            except self.errors as error:
                if attempt == self.attempts:
                    raise
                self.counts[type(error).__name__] += 1
        raise AssertionError("unreachable")

    def as_dict(self) -> dict[str, int]:
        return dict(self.counts)
