"""``within``: a time limit on an awaitable, without a task of its own."""

from __future__ import annotations

import asyncio

import pytest

from rayfleet._deadlines import within


async def test_an_awaitable_that_finishes_in_time_gives_its_value() -> None:
    assert await within(asyncio.sleep(0, result=7), 5.0) == 7


async def test_an_awaitable_past_its_limit_is_cancelled_and_timeout_error_raised() -> None:
    cancelled = asyncio.Event()

    async def slow() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    with pytest.raises(TimeoutError):
        await within(slow(), 0.01)
    assert cancelled.is_set()


async def test_an_error_of_the_awaitable_passes_through_unchanged() -> None:
    async def fails() -> None:
        raise KeyError("mine")

    with pytest.raises(KeyError, match="mine"):
        await within(fails(), 5.0)


async def test_it_runs_in_the_awaiting_task_rather_than_a_task_of_its_own() -> None:
    async def whose_task() -> asyncio.Task[object] | None:
        return asyncio.current_task()

    assert await within(whose_task(), 5.0) is asyncio.current_task()
