"""The group of calls that shares one ledger round trip among the items submitted meanwhile."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import pytest

from rayfleet.host._grouping import CallGroup


class Stopped(Exception):
    pass


class SlowCall:
    """Answers each batch with its items doubled, once released; remembers every batch; ``fail`` fails the next one."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.release = asyncio.Event()
        self.fail: Exception | None = None

    async def __call__(self, items: list[int]) -> list[int]:
        self.batches.append(items)
        await self.release.wait()
        if self.fail is not None:
            error, self.fail = self.fail, None
            raise error
        return [item * 2 for item in items]


def group(call: SlowCall, tasks: set[asyncio.Task[None]], limit: int = 100) -> CallGroup[int, int]:
    def spawn(work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(work)
        tasks.add(task)
        return task
    return CallGroup(call, limit=limit, spawn=spawn, stopped=Stopped)


async def test_items_submitted_while_a_call_is_in_flight_share_the_next_call() -> None:
    call, tasks = SlowCall(), set[asyncio.Task[None]]()
    calls = group(call, tasks)
    first = asyncio.ensure_future(calls.submit(1))
    await asyncio.sleep(0.01)
    assert call.batches == [[1]]  # an idle group sends the first item at once
    rest = [asyncio.ensure_future(calls.submit(item)) for item in (2, 3, 4)]
    await asyncio.sleep(0.01)
    call.release.set()
    assert await first == 2 and await asyncio.gather(*rest) == [4, 6, 8]
    assert call.batches == [[1], [2, 3, 4]]


async def test_a_batch_holds_at_most_limit_items_and_each_gets_its_own_result() -> None:
    call, tasks = SlowCall(), set[asyncio.Task[None]]()
    call.release.set()
    calls = group(call, tasks, limit=2)
    assert await asyncio.gather(*(calls.submit(item) for item in range(5))) == [0, 2, 4, 6, 8]
    assert call.batches == [[0, 1], [2, 3], [4]]


async def test_every_item_of_a_failed_call_gets_its_error_and_the_next_batch_goes_on() -> None:
    call, tasks = SlowCall(), set[asyncio.Task[None]]()
    calls = group(call, tasks)
    call.fail = ConnectionError("ledger down")
    failing = [asyncio.ensure_future(calls.submit(item)) for item in (1, 2)]
    await asyncio.sleep(0.01)
    later = asyncio.ensure_future(calls.submit(3))
    call.release.set()
    for future in failing:
        with pytest.raises(ConnectionError, match="ledger down"):
            await future
    assert await later == 6
    assert call.batches == [[1, 2], [3]]


async def test_items_left_when_the_flush_is_cancelled_get_the_stopped_error() -> None:
    call, tasks = SlowCall(), set[asyncio.Task[None]]()
    calls = group(call, tasks)
    waiting = [asyncio.ensure_future(calls.submit(item)) for item in (1, 2)]
    await asyncio.sleep(0.01)
    for task in tasks:
        task.cancel()
    for future in waiting:
        with pytest.raises(Stopped):
            await future
