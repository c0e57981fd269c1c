"""Awaiting with a time limit, without a task of its own.

``asyncio.wait_for`` on Python 3.11 wraps the awaited coroutine in a task: one more task
and three more event-loop turns per call, which on a workflow step or a peer send on the
same host cost about as much as the work itself. ``asyncio.timeout`` (3.11 and newer)
cancels the awaiting task in place instead; on 3.10 :func:`within` falls back to
``wait_for``.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def within(awaitable: Awaitable[T], seconds: float) -> T:
    """Await ``awaitable`` for at most ``seconds``.

    On expiry the awaitable is cancelled (as ``wait_for`` does) and the builtin
    ``TimeoutError`` is raised; any error the awaitable raises passes through unchanged.
    """
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(seconds):
            return await awaitable
    try:
        return await asyncio.wait_for(awaitable, seconds)
    except asyncio.TimeoutError as expired:  # a class of its own before 3.11
        raise TimeoutError(str(expired)) from expired
