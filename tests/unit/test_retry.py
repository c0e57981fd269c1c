"""RetryPolicy's schedule and the one retry loop, retry_async; and the schedules rayfleet's own retries keep."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Awaitable, Callable

import pytest

import rayfleet as rf
from rayfleet.host._leases import RENEWAL_RETRY
from rayfleet.llm._chat import CHAT_RETRY
from rayfleet.platform._routing import ROUTING_RETRY, _backoff
from rayfleet.platform._runner import RUNNER_START_RETRY
from rayfleet.platform._topology_client import NOTIFY_RETRY
from rayfleet.retry import RetryPolicy, retry_async


class FakeSleep:
    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


def flaky(failures: list[BaseException], result: str = "done") -> tuple[list[int], Callable[[], Awaitable[str]]]:
    """An async callable raising ``failures`` in order, then returning ``result``; and its call counter."""
    calls = [0]

    async def attempt() -> str:
        calls[0] += 1
        if failures:
            raise failures.pop(0)
        return result

    return calls, attempt


# --------------------------------------------------------------------------- delays()


def test_delays_are_capped_doublings_one_fewer_than_attempts() -> None:
    assert list(RetryPolicy(max_attempts=1, jitter=0).delays()) == []
    assert list(RetryPolicy(max_attempts=5, base_delay=0.5, max_delay=2.0, jitter=0).delays()) == [0.5, 1.0, 2.0, 2.0]
    assert list(RetryPolicy(max_attempts=4, base_delay=0.05, max_delay=2.0, jitter=0).delays()) == pytest.approx(
        [0.05, 0.1, 0.2])
    assert list(RetryPolicy(max_attempts=3, base_delay=0.0, max_delay=0.0, jitter=0).delays()) == [0.0, 0.0]


def test_delays_agree_with_delay_for_and_jitter_stays_in_bounds() -> None:
    policy = RetryPolicy(max_attempts=8, base_delay=0.2, max_delay=1.0, jitter=0.2)
    drawn = list(policy.delays(rng=random.Random(3)))
    again = random.Random(3)
    assert drawn == [policy.delay_for(attempt, rng=again) for attempt in range(7)]
    for attempt, delay in enumerate(drawn):
        raw = min(0.2 * 2**attempt, 1.0)
        assert raw * 0.8 <= delay <= min(raw * 1.2, 1.0)


def test_delay_for_is_capped_for_any_attempt_without_overflowing() -> None:
    policy = RetryPolicy(base_delay=1.0, max_delay=64.0, jitter=0)
    assert policy.delay_for(6) == 64.0
    assert policy.delay_for(10_000) == 64.0  # 2.0 ** 10_000 would overflow a float


# --------------------------------------------------------------------------- retry_async


async def test_retry_async_retries_retryable_errors_with_the_policy_waits() -> None:
    sleep = FakeSleep()
    seen: list[tuple[int, str, float]] = []
    calls, attempt = flaky([rf.RetryableError("busy"), ConnectionResetError("reset")])
    policy = RetryPolicy(max_attempts=3, base_delay=0.1, max_delay=1.0, jitter=0)
    result = await retry_async(attempt, policy, sleep=sleep,
                               on_retry=lambda n, error, delay: seen.append((n, type(error).__name__, delay)))
    assert result == "done" and calls == [3]
    assert sleep.waits == [0.1, 0.2]
    assert seen == [(0, "RetryableError", 0.1), (1, "ConnectionResetError", 0.2)]


async def test_a_retryable_errors_retry_after_lengthens_the_wait_but_never_shortens_it() -> None:
    sleep = FakeSleep()
    calls, attempt = flaky([rf.RetryableError("rate limited", retry_after=3.0),
                            rf.RetryableError("busy", retry_after=0.01), rf.RetryableError("busy")])
    policy = RetryPolicy(max_attempts=4, base_delay=0.1, max_delay=1.0, jitter=0)
    assert await retry_async(attempt, policy, sleep=sleep) == "done" and calls == [4]
    # 3.0 is past max_delay and still honoured; 0.01 is shorter than the policy's 0.2, which wins.
    assert sleep.waits == [3.0, 0.2, 0.4]


@pytest.mark.parametrize("retry_after", [-1.0, float("nan"), float("inf"), True, "soon"])
def test_retry_after_must_be_a_non_negative_number(retry_after: object) -> None:
    with pytest.raises(rf.InvalidSpecError, match="retry_after") as refused:
        rf.RetryableError("busy", retry_after=retry_after)  # type: ignore[arg-type]
    assert refused.value.field == "retry_after"


async def test_retry_async_raises_the_last_error_unchanged_when_attempts_run_out() -> None:
    sleep = FakeSleep()
    last = TimeoutError("third")
    calls, attempt = flaky([TimeoutError("first"), TimeoutError("second"), last])
    with pytest.raises(TimeoutError) as caught:
        await retry_async(attempt, RetryPolicy(max_attempts=3, jitter=0), sleep=sleep)
    assert caught.value is last and calls == [3] and len(sleep.waits) == 2


async def test_retry_async_does_not_retry_what_retry_on_refuses() -> None:
    sleep = FakeSleep()
    calls, attempt = flaky([ValueError("final")])
    with pytest.raises(ValueError, match="final"):
        await retry_async(attempt, RetryPolicy(max_attempts=5), sleep=sleep)
    assert calls == [1] and sleep.waits == []
    calls, attempt = flaky([ValueError("now retried")])
    assert await retry_async(attempt, RetryPolicy(max_attempts=2, jitter=0), retry_on=lambda error: True,
                             sleep=sleep) == "done"
    assert calls == [2]


async def test_retry_async_never_retries_base_exceptions() -> None:
    calls, attempt = flaky([KeyboardInterrupt()])
    with pytest.raises(KeyboardInterrupt):
        await retry_async(attempt, RetryPolicy(max_attempts=5), retry_on=lambda error: True,
                          sleep=FakeSleep())
    assert calls == [1]


async def test_retry_async_draws_jitter_only_when_it_retries() -> None:
    # A seeded rng then yields the same waits as a loop calling delay_for before each retry.
    policy = RetryPolicy(max_attempts=4, base_delay=0.1, max_delay=1.0, jitter=0.5)
    sleep = FakeSleep()
    rng = random.Random(11)
    _, attempt = flaky([rf.RetryableError(), rf.RetryableError(), ValueError("final")])
    with pytest.raises(ValueError):
        await retry_async(attempt, policy, sleep=sleep, rng=rng)
    expected = random.Random(11)
    assert sleep.waits == [policy.delay_for(0, rng=expected), policy.delay_for(1, rng=expected)]
    assert rng.random() == expected.random()


# --------------------------------------------------------------------------- rayfleet's own schedules


def test_rayfleets_own_schedules_are_the_ones_they_replaced() -> None:
    # Each constant reproduces the hand-written formula it replaced, without jitter.
    assert all(policy.jitter == 0 for policy in (RENEWAL_RETRY, ROUTING_RETRY, NOTIFY_RETRY, RUNNER_START_RETRY,
                                                 CHAT_RETRY))
    assert [_backoff(hops) for hops in range(8)] == [0.0, 0.0, 0.05, 0.1, 0.2, 0.4, 0.8, 1.0]
    assert list(NOTIFY_RETRY.delays()) == pytest.approx([0.05, 0.1, 0.2])
    assert [RUNNER_START_RETRY.delay_for(n) for n in range(7)] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert [RENEWAL_RETRY.delay_for(n) for n in (0, 1, 6, 7, 99)] == [1.0, 2.0, 64.0, 64.0, 64.0]
    chat = dataclasses.replace(CHAT_RETRY, max_attempts=7)
    assert list(chat.delays()) == [0.25, 0.5, 1.0, 2.0, 4.0, 4.0]
    assert CHAT_RETRY.max_attempts == 3  # ChatClient's default max_retries=2, plus the first attempt
