"""Retry policy: the one description of how rayfleet backs off and tries again.

:class:`RetryPolicy` is the only backoff value in rayfleet; every retry loop takes
its waits from :meth:`RetryPolicy.delay_for` or :meth:`RetryPolicy.delays`, and
:func:`retry_async` is the loop itself for code that retries one awaitable call.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from .errors import InvalidSpecError, RetryableError, is_retryable

T = TypeVar("T")

_MAX_DOUBLINGS = 1000
"""Doublings after which a delay is the cap anyway; larger exponents would overflow a float."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """How many times to try, and how long to wait between tries.

    The wait after failed attempt ``n`` (0-based) is ``base_delay`` doubled ``n`` times,
    capped at ``max_delay``, then spread by ``jitter``. A host retries a handler that raised a
    retryable error with the policy of the agent's spec; rayfleet's own retries use
    policies defined next to the code that retries.
    """

    max_attempts: int = 5
    """Attempts in all, the first included (at least 1)."""
    base_delay: float = 0.2
    """Seconds before the second attempt; doubles after each attempt."""
    max_delay: float = 5.0
    """Cap on any one delay."""
    jitter: float = 0.2
    """Each delay is multiplied by a random factor in [1 - jitter, 1 + jitter]."""

    def __post_init__(self) -> None:
        if not isinstance(self.max_attempts, int) or self.max_attempts < 1:
            raise InvalidSpecError(f"retry max_attempts must be an integer >= 1, got {self.max_attempts!r}",
                                   field="retry")
        if self.base_delay < 0 or self.max_delay < self.base_delay:
            raise InvalidSpecError(
                f"retry delays must satisfy 0 <= base_delay <= max_delay, got {self.base_delay!r}, {self.max_delay!r}",
                field="retry",
            )
        if not 0 <= self.jitter < 1:
            raise InvalidSpecError(f"retry jitter must be in [0, 1), got {self.jitter!r}", field="retry")

    def delay_for(self, attempt: int, *, rng: random.Random | None = None) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (0-based); never more than ``max_delay``.

        Defined for any ``attempt >= 0``, also past ``max_attempts``, so loops that retry
        until a deadline rather than a count use it too.
        """
        raw = min(self.base_delay * 2 ** min(attempt, _MAX_DOUBLINGS), self.max_delay)
        spread = (rng or random).uniform(1 - self.jitter, 1 + self.jitter) if self.jitter else 1.0
        return float(min(raw * spread, self.max_delay))

    def delay_after(self, error: BaseException, attempt: int, *, rng: random.Random | None = None) -> float:
        """Seconds to wait after failed attempt ``attempt`` raised ``error``.

        The policy's :meth:`delay_for`, or the error's ``retry_after`` when it is a
        :class:`~rayfleet.errors.RetryableError` asking for longer: a server that said
        when to come back is not asked earlier. ``retry_after`` is not capped by
        ``max_delay``.
        """
        delay = self.delay_for(attempt, rng=rng)
        if isinstance(error, RetryableError) and error.retry_after is not None:
            return max(delay, float(error.retry_after))
        return delay

    def delays(self, *, rng: random.Random | None = None) -> Iterator[float]:
        """The waits between attempts, in order: ``max_attempts - 1`` of them.

        With ``jitter`` 0 the schedule is the same every time; otherwise each wait is
        drawn when the iterator reaches it.
        """
        for attempt in range(self.max_attempts - 1):
            yield self.delay_for(attempt, rng=rng)


async def retry_async(
    fn: Callable[[], Awaitable[T]],
    policy: RetryPolicy,
    *,
    retry_on: Callable[[Exception], bool] = is_retryable,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    on_retry: Callable[[int, Exception, float], None] | None = None,
    rng: random.Random | None = None,
) -> T:
    """Await ``fn()`` until it returns, up to ``policy.max_attempts`` times; return its result.

    An attempt that raises an ``Exception`` for which ``retry_on`` is true is followed,
    after the policy's next delay, by another. The error of the last attempt, or the
    first error ``retry_on`` refuses, propagates unchanged. ``BaseException``\\ s such as
    ``asyncio.CancelledError`` are never retried.

    Args:
        fn: starts one attempt; called anew for each.
        policy: how many attempts and how long to wait between them.
        retry_on: whether an attempt's error is worth another attempt
            (default :func:`rayfleet.errors.is_retryable`).
        sleep: waits the given seconds (tests pass a fake clock's sleep).
        on_retry: told ``(attempt, error, delay)`` before each wait, ``attempt`` 0-based,
            e.g. to log the failure.
        rng: the source of jitter (default: the ``random`` module).
    """
    attempt = 0
    while True:
        try:
            return await fn()
        except Exception as error:
            if attempt + 1 >= policy.max_attempts or not retry_on(error):
                raise
            # Drawn only when retrying, so a seeded rng gives the same waits as a hand-written loop.
            delay = policy.delay_after(error, attempt, rng=rng)
            if on_retry is not None:
                on_retry(attempt, error, delay)
        await sleep(delay)
        attempt += 1
