"""A host's side of batched requests, without a cluster: finishing order, stragglers, collection."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Awaitable, Callable

import pytest

from rayfleet.platform import _batching
from rayfleet.platform._batching import BatchServer
from rayfleet.platform._replies import OK, RETRY, Reply


def turn(gate: asyncio.Event | None, value: str, *, after: asyncio.Event | None = None,
         started: list[str] | None = None) -> Callable[[], Awaitable[Reply]]:
    async def run() -> Reply:
        if started is not None:
            started.append(value)
        if after is not None:
            await after.wait()
        if gate is not None:
            await gate.wait()
        return OK, value
    return run


def test_replies_are_listed_in_the_order_the_turns_finished() -> None:
    async def main() -> None:
        first, second = asyncio.Event(), asyncio.Event()
        server = BatchServer()
        # Turn 0 finishes last, turn 2 first.
        answer = asyncio.ensure_future(server.serve([turn(first, "a", after=second), turn(first, "b"),
                                                     turn(None, "c")]))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        first.set()
        await asyncio.sleep(0.001)
        second.set()
        assert await answer == [(2, (OK, "c"), None), (1, (OK, "b"), None), (0, (OK, "a"), None)]

    asyncio.run(main())


def test_a_stalled_turn_is_answered_later_by_collect_and_does_not_hold_the_others() -> None:
    async def main() -> None:
        slow = asyncio.Event()
        server = BatchServer()
        answer = await asyncio.wait_for(server.serve([turn(slow, "slow"), turn(None, "fast")]), 5.0)
        assert answer[0] == (1, (OK, "fast"), None)
        index, reply, token = answer[1]
        assert (index, reply) == (0, None) and token is not None
        collected = asyncio.ensure_future(server.collect(token))
        await asyncio.sleep(0.01)
        assert not collected.done()  # waits for the straggler
        slow.set()
        assert await collected == (OK, "slow")
        # Collected once: the same token again is unknown, which answers "route it again".
        assert await server.collect(token) == (RETRY, None)

    asyncio.run(main())


def test_a_batch_with_nothing_finished_waits_past_the_stall() -> None:
    async def main() -> None:
        gate = asyncio.Event()
        server = BatchServer()
        answer = asyncio.ensure_future(server.serve([turn(gate, "a"), turn(gate, "b")]))
        await asyncio.sleep(_batching.BATCH_STALL * 4)
        assert not answer.done()  # nothing to report yet: answering now would only cost a collect per turn
        gate.set()
        assert sorted(await answer) == [(0, (OK, "a"), None), (1, (OK, "b"), None)]

    asyncio.run(main())


def test_an_uncollected_reply_is_dropped_after_it_was_held_long_enough(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_batching, "HELD_FOR", 0.01)

    async def main() -> None:
        gate = asyncio.Event()
        server = BatchServer()
        answer = await server.serve([turn(gate, "slow"), turn(None, "fast")])
        token = answer[1][2]
        assert token is not None
        gate.set()
        await asyncio.sleep(0.05)
        assert await server.collect(token) == (RETRY, None)

    asyncio.run(main())


class _Sent:
    """Stands in for a host's actor handle: records each ``serve_batch`` and answers every turn ``OK``."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.serve_batch = self

    def remote(self, envelopes: list[tuple[object, ...]]) -> _Sent:
        self.batches.append([str(wire[0]) for wire in envelopes])
        self._answer = [(index, (OK, index), None) for index in range(len(envelopes))]
        return self

    def future(self) -> concurrent.futures.Future[object]:
        done: concurrent.futures.Future[object] = concurrent.futures.Future()
        done.set_result(self._answer)
        return done


def test_a_batch_holds_at_most_the_message_window_of_one_identity() -> None:
    from rayfleet.host._messages import RECENT_MESSAGES, Envelope
    from rayfleet.platform._batching import Batcher, EnvelopeRequest

    async def main() -> None:
        host, batcher = _Sent(), Batcher()
        requests = [*(["a/1"] * (2 * RECENT_MESSAGES + 8)), *(["b/1"] * 3)]
        replies = [batcher.submit("h", host, EnvelopeRequest(Envelope(target=target, method="m")))  # type: ignore[arg-type]
                   for target in requests]
        await asyncio.gather(*replies)
        # The host answers a batch once all its turns are done: no more of one identity's turns may be
        # committed and unanswered at once than a new owner's message-id window remembers.
        assert [len(batch) for batch in host.batches] == [RECENT_MESSAGES, RECENT_MESSAGES, 8 + 3]
        assert all(batch.count("a/1") <= RECENT_MESSAGES for batch in host.batches)
        assert sorted(target for batch in host.batches for target in batch) == sorted(requests)

    asyncio.run(main())
