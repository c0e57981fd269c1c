"""``Delivery`` on its own: a fake ActivationPort stands in for the runtime, time is moved by hand."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from delivery import deliver

import rayfleet as rf
from rayfleet.host._delivery import Delivery
from rayfleet.host._hosted import HostedAgent
from rayfleet.identity._values import ContinuityRecord, EventKind, LeaseGrant
from rayfleet.ledger._ledger import Ledger
from rayfleet.ledger._local import LocalLedgerClient
from rayfleet.testing import ManualClock

T = TypeVar("T")


class Tally(rf.Agent):
    class State(rf.State):
        total: int = 0

    @rf.handler
    async def add(self, n: int) -> int:
        self.state.total += n
        return self.state.total


class FakeActivations:
    """The runtime's side of delivery, reduced to what a test needs to see."""

    def __init__(self, *, refuse: rf.InvalidStateError | None = None, internal_only: bool = False) -> None:
        self.entries: dict[str, HostedAgent] = {}
        self.refuse = refuse
        self.internal_only = internal_only
        self.calls: list[str] = []
        self.events: list[tuple[str, EventKind]] = []

    async def activate(self, identity: str) -> HostedAgent:
        self.calls.append(f"activate {identity}")
        if self.refuse is not None:
            raise self.refuse
        spec = rf.AgentSpec(identity=identity, agent=Tally)
        entry = HostedAgent(
            spec=spec, agent=Tally(), installed_at=0.0, checkpoint_version=0,
            record=ContinuityRecord(identity=identity, runtime_id=f"rt:{identity}:0", session_id="s",
                                    generation=0, checkpoint_version=0, fencing_token=1),
            grant=LeaseGrant(identity=identity, holder="fake", fencing_token=1, ttl=10.0),
        )
        self.entries[identity] = entry
        return entry

    def is_internal_only(self, identity: str) -> bool:
        return self.internal_only

    async def ensure_healthy_lease(self, entry: HostedAgent) -> None:
        self.calls.append("lease")

    async def commit(self, entry: HostedAgent) -> int:
        self.calls.append("commit")
        entry.checkpoint_version += 1
        entry.dirty = False
        # As the runtime does: committed keys join the dedup window.
        for key, reply in entry.pending_dedup:
            entry.dedup.insert(key, reply)
        entry.pending_dedup.clear()
        return entry.checkpoint_version

    async def fenced_write(self, entry: HostedAgent, what: str, write: Callable[[int], Awaitable[T]]) -> T:
        return await write(entry.grant.fencing_token)

    def emit(self, identity: str, kind: EventKind, **details: Any) -> None:
        self.events.append((identity, kind))


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(tmp_path / "ledger.sqlite")


def delivery(ledger: Ledger, activations: FakeActivations, wall_clock: ManualClock | None = None) -> Delivery:
    return Delivery(entries=activations.entries, ledger=LocalLedgerClient(ledger), activations=activations,
                    clock=ManualClock(), wall_clock=wall_clock or ManualClock())


async def test_a_turn_activates_checks_the_lease_runs_and_commits_through_the_port(ledger: Ledger) -> None:
    activations = FakeActivations()
    path = delivery(ledger, activations)
    first = await deliver(path, "t/1", "add", (), {"n": 2})
    second = await deliver(path, "t/1", "add", (), {"n": 3})
    assert (first.value, first.checkpoint_version) == (2, 1)
    assert (second.value, second.checkpoint_version) == (5, 2)
    # Activated once: the second message finds the entry the port put in the shared map.
    assert activations.calls == ["activate t/1", "lease", "commit", "lease", "commit"]
    assert path.counters.turns == 2 and path.counters.dead_letters == 0


async def test_deadline_and_sequence_ages_follow_the_injected_wall_clock(ledger: Ledger) -> None:
    activations = FakeActivations()
    wall = ManualClock(start=5_000.0)
    path = delivery(ledger, activations, wall)
    # Far in the past by the real clock, still ahead by the injected one: the turn runs.
    assert (await deliver(path, "t/1", "add", (), {"n": 1}, deadline=5_000.5, conversation="c", sequence=1)).value == 1
    assert activations.entries["t/1"].sequences.export() == {"c": (1, 5_000.0)}
    wall.advance(1.0)
    with pytest.raises(rf.DeadlineExceededError):
        await deliver(path, "t/1", "add", (), {"n": 1}, deadline=5_000.5)
    assert [letter.reason for letter in ledger.dead_letters()] == ["DEADLINE_EXCEEDED"]
    assert path.counters.turns == 1  # the late message never reached the handler


async def test_an_outside_caller_learns_only_not_addressable_about_a_refused_internal_agent(ledger: Ledger) -> None:
    refused = rf.InvalidStateError(identity="t/inner", state="RETIRING", operation="call")
    activations = FakeActivations(refuse=refused, internal_only=True)
    path = delivery(ledger, activations)
    with pytest.raises(rf.NotAddressableError):
        await deliver(path, "t/inner", "add", (), {"n": 1})
    with pytest.raises(rf.InvalidStateError, match="RETIRING"):
        await deliver(path, "t/inner", "add", (), {"n": 1}, sender="t/peer")
    assert ledger.dead_letters() == []
