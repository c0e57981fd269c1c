"""Asks sent together to one host travel as one batch; each still behaves as a call of its own.

One host, so every ask of a test goes to the same place and rides the same batch.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

import rayfleet as rf

WAIT = 60.0


class Counter(rf.Agent):
    class State(rf.State):
        count: int = 0

    @rf.handler
    def bump(self) -> dict[str, object]:
        self.state.count += 1
        return {"by": self.identity, "count": self.state.count}

    @rf.handler
    async def bump_when(self, release: str) -> dict[str, object]:
        """Waits for the file ``release`` (the test creates it), then bumps."""
        deadline = time.monotonic() + WAIT
        while not Path(release).exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{release} never appeared")
            await asyncio.sleep(0.02)
        return self.bump()

    @rf.handler
    def echo(self, value: object = None) -> str:
        return f"{self.identity} got {type(value).__name__}"


@pytest.fixture
def one_host(make_fleet: object) -> rf.Fleet:
    return make_fleet(hosts=1)  # type: ignore[operator]


@pytest.mark.timeout(180)
def test_asks_sent_together_each_get_their_own_reply(one_host: rf.Fleet) -> None:
    refs = [one_host.spawn(f"c/{index}", Counter) for index in range(50)]

    async def ask_all() -> list[dict[str, object]]:
        # Four rounds of one ask per agent, all in flight together.
        return await asyncio.gather(*[ref.ask("bump", timeout=WAIT) for _ in range(4) for ref in refs])

    replies = asyncio.run(ask_all())
    assert len(replies) == 200
    for ref in refs:
        mine = [reply["count"] for reply in replies if reply["by"] == ref.identity]
        assert sorted(mine) == [1, 2, 3, 4]
        assert ref.call("bump", timeout=WAIT)["count"] == 5


@pytest.mark.timeout(180)
def test_a_slow_turn_does_not_hold_the_replies_of_the_asks_sent_with_it(one_host: rf.Fleet, tmp_path: Path) -> None:
    slow = one_host.spawn("slow", Counter)
    fast = [one_host.spawn(f"fast/{index}", Counter) for index in range(10)]
    release = tmp_path / "release"

    async def scenario() -> dict[str, object]:
        held = asyncio.ensure_future(slow.ask("bump_when", release=str(release), timeout=WAIT))
        quick = await asyncio.wait_for(asyncio.gather(*[ref.ask("bump", timeout=WAIT) for ref in fast]), WAIT / 2)
        # The fast replies came back while the slow turn, sent in the same batch, still waits.
        assert [reply["by"] for reply in quick] == [ref.identity for ref in fast]
        assert not held.done()
        release.touch()
        return await held

    try:
        assert asyncio.run(scenario()) == {"by": "slow", "count": 1}
    finally:
        release.touch()


@pytest.mark.timeout(180)
def test_an_ask_whose_arguments_cannot_be_sent_fails_alone(one_host: rf.Fleet) -> None:
    refs = [one_host.spawn(f"e/{index}", Counter) for index in range(5)]
    for ref in refs:  # active, so their host renews their leases: a lost reply is waited for, not failed over
        ref.call("echo", timeout=WAIT)

    async def ask_all() -> list[object]:
        asks = [ref.ask("echo", value=index, timeout=WAIT) for index, ref in enumerate(refs)]
        asks.insert(2, refs[0].ask("echo", value=threading.Lock(), timeout=WAIT))  # cannot be pickled
        return await asyncio.gather(*asks, return_exceptions=True)

    replies = asyncio.run(ask_all())
    error = replies.pop(2)
    assert isinstance(error, rf.InvalidArgumentsError), error
    assert "serialized" in str(error) and "e/0" in str(error)
    assert replies == [f"e/{index} got int" for index in range(5)]
