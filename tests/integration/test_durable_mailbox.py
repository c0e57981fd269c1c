"""The mailbox behind a running durable turn, through a real fleet on both ledger stores.

A turn that has journaled (a step, a wait, a steering read) may run for minutes: a
message queued behind it is parked in the ledger at once, and runs after it, in order.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import rayfleet as rf


def outline(topic: str) -> str:
    return f"outline of {topic}"


class Writer(rf.Agent):
    class State(rf.State):
        log: list[str] = []

    @rf.handler
    async def draft(self, topic: str, gate: str) -> str:
        plan = await self.step("outline", outline, topic)  # journaled: a durable turn from here on
        while not Path(gate).exists():  # the test opens the gate (the host is another process)
            await asyncio.sleep(0.02)
        self.state.log.append("draft")
        return plan

    @rf.handler
    async def note(self, text: str) -> list[str]:
        self.state.log.append(text)
        return list(self.state.log)


def test_messages_queued_behind_a_running_durable_turn_are_parked_and_run_after_it_in_order(
    make_any_fleet: Any, tmp_path: Path,
) -> None:
    fleet = make_any_fleet(hosts=1)
    ref = fleet.spawn("writer/1", Writer)
    gate = tmp_path / "gate"

    async def scenario() -> tuple[str, list[list[str]]]:
        drafting = asyncio.ensure_future(ref.ask("draft", topic="ray", gate=str(gate)))
        notes = []
        try:
            give_up = time.monotonic() + 60
            while not fleet.turns("writer/1"):  # the turn journaled its step
                assert time.monotonic() < give_up, "the durable turn never showed"
                await asyncio.sleep(0.05)
            for count, text in enumerate(("first", "second"), start=1):
                notes.append(asyncio.ensure_future(ref.ask("note", text=text)))
                while len(fleet.parked("writer/1")) < count:
                    assert time.monotonic() < give_up, "the queued message was not parked"
                    await asyncio.sleep(0.05)
            assert not drafting.done() and not any(note.done() for note in notes)
        finally:
            gate.touch()  # a failed check must not leave the turn running for the fleet's shutdown
        return await drafting, [await note for note in notes]

    plan, (first, second) = asyncio.run(scenario())
    assert plan == "outline of ray"
    assert first == ["draft", "first"] and second == ["draft", "first", "second"]
    assert fleet.parked("writer/1") == []
