"""What the host runtime and delivery report through the ``HostMetrics`` port (no Ray)."""

from __future__ import annotations

from collections import Counter as Tally
from pathlib import Path

import cloudpickle
import pytest
from delivery import deliver

import rayfleet as rf
from rayfleet.checkpoints._store import SnapshotStore
from rayfleet.host._ports import NO_METRICS, HostMetrics, MessageOutcome
from rayfleet.host._runtime import HostRuntime
from rayfleet.ledger._ledger import Ledger
from rayfleet.ledger._local import LocalLedgerClient
from rayfleet.ledger._values import SpecRecord


class Probe(rf.Agent):
    class State(rf.State):
        total: int = 0

    @rf.handler
    async def add(self, n: int) -> int:
        self.state.total += n
        return self.state.total

    @rf.handler
    async def boom(self) -> None:
        raise ValueError("no")


PROBE = f"{Probe.__module__}:{Probe.__qualname__}"


class RecordingMetrics:
    """A ``HostMetrics`` that keeps what it was told, for assertions."""

    def __init__(self) -> None:
        self.messages: Tally[tuple[str, MessageOutcome]] = Tally()
        self.latencies: list[float] = []
        self.dead_letters: Tally[tuple[str, str]] = Tally()
        self.parked_by: Tally[str] = Tally()
        self.active: Tally[str] = Tally()
        self.renewals = 0
        self.lost = 0
        self.stale: Tally[str] = Tally()
        self.checkpoints: Tally[str] = Tally()
        self.batches: list[int] = []
        self.turn_events: Tally[tuple[str, str]] = Tally()

    def message(self, agent_class: str, outcome: MessageOutcome, seconds: float) -> None:
        self.messages[agent_class, outcome] += 1
        self.latencies.append(seconds)

    def dead_letter(self, agent_class: str, reason: str) -> None:
        self.dead_letters[agent_class, reason] += 1

    def parked(self, agent_class: str) -> None:
        self.parked_by[agent_class] += 1

    def activated(self, agent_class: str) -> None:
        self.active[agent_class] += 1

    def deactivated(self, agent_class: str) -> None:
        self.active[agent_class] -= 1

    def lease_renewals(self, count: int) -> None:
        self.renewals += count

    def lease_lost(self) -> None:
        self.lost += 1

    def stale_refusal(self, reason: str) -> None:
        self.stale[reason] += 1

    def turn_event(self, agent_class: str, event: str, count: int = 1) -> None:
        self.turn_events[agent_class, event] += count

    def checkpoint(self, agent_class: str) -> None:
        self.checkpoints[agent_class] += 1

    def commit_batch(self, size: int) -> None:
        self.batches.append(size)


def test_the_recorder_and_the_default_implement_the_port() -> None:
    ports: list[HostMetrics] = [RecordingMetrics(), NO_METRICS]
    assert all(callable(port.message) for port in ports)


def register(ledger: Ledger, identity: str) -> None:
    spec = rf.AgentSpec(identity=identity, agent=Probe)
    ledger.register(SpecRecord(identity=identity, spec=cloudpickle.dumps(spec), fingerprint=spec.fingerprint(),
                               agent_class=spec.agent_class_path))


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(tmp_path / "ledger.sqlite")


def host(ledger: Ledger, tmp_path: Path, metrics: RecordingMetrics, name: str = "h") -> HostRuntime:
    return HostRuntime(name=name, ledger=LocalLedgerClient(ledger), snapshots=SnapshotStore(str(tmp_path)),
                       incarnation=name, metrics=metrics)


async def test_messages_checkpoints_dead_letters_and_active_agents_are_reported(ledger: Ledger, tmp_path: Path) -> None:
    register(ledger, "p/1")
    register(ledger, "p/2")
    metrics = RecordingMetrics()
    async with host(ledger, tmp_path, metrics) as runtime:
        for n in (1, 2, 3):
            await deliver(runtime, "p/1", "add", kwargs={"n": n})
        await deliver(runtime, "p/2", "add", kwargs={"n": 5}, sender="s", idempotency_key="k")
        assert (await deliver(runtime, "p/2", "add", kwargs={"n": 5}, sender="s", idempotency_key="k")).duplicate
        with pytest.raises(rf.HandlerError):
            await deliver(runtime, "p/2", "boom")
        with pytest.raises(rf.UnknownHandlerError):
            await deliver(runtime, "p/2", "nope")
        with pytest.raises(rf.DeadlineExceededError):
            await deliver(runtime, "p/2", "add", kwargs={"n": 1}, deadline=1.0)
        assert metrics.active[PROBE] == 2
        assert await runtime.renew_once() == 2
    assert metrics.messages == {
        (PROBE, MessageOutcome.OK): 4, (PROBE, MessageOutcome.DUPLICATE): 1,
        (PROBE, MessageOutcome.HANDLER_ERROR): 1, (PROBE, MessageOutcome.REFUSED): 2,
    }
    assert len(metrics.latencies) == 8  # one turn latency per message; their values are for benchmarks/
    assert metrics.dead_letters == {(PROBE, "REJECTED"): 1, (PROBE, "DEADLINE_EXCEEDED"): 1}
    # Four turns changed State; each was committed (EVERY_TURN), one pointer per ledger call here.
    assert metrics.checkpoints[PROBE] == 4 and sum(metrics.batches) == 4
    assert metrics.renewals == 2
    assert metrics.active[PROBE] == 0  # shutdown deactivated both


async def test_a_zombie_commit_is_reported_as_a_stale_refusal_and_a_lost_lease(ledger: Ledger, tmp_path: Path) -> None:
    register(ledger, "p/z")
    old_metrics, new_metrics = RecordingMetrics(), RecordingMetrics()
    async with host(ledger, tmp_path, old_metrics, "old") as old:
        await deliver(old, "p/z", "add", kwargs={"n": 1})
        ledger.revoke_holder(old.holder)
        async with host(ledger, tmp_path, new_metrics, "new") as new:
            await deliver(new, "p/z", "add", kwargs={"n": 1})
            with pytest.raises(rf.LeaseLostError):
                await deliver(old, "p/z", "add", kwargs={"n": 1})
    assert old_metrics.stale == {"StaleFencingTokenError": 1}
    assert old_metrics.lost == 1
    assert old_metrics.messages[PROBE, MessageOutcome.LEASE_LOST] == 1
    assert new_metrics.messages[PROBE, MessageOutcome.OK] == 1


async def test_paused_messages_are_reported_as_parked(ledger: Ledger, tmp_path: Path) -> None:
    import asyncio

    register(ledger, "p/p")
    metrics = RecordingMetrics()
    async with host(ledger, tmp_path, metrics) as runtime:
        await runtime.delivery.pause("p/p")
        waiting = asyncio.ensure_future(deliver(runtime, "p/p", "add", kwargs={"n": 2}))
        while not metrics.parked_by:
            await asyncio.sleep(0.01)
        assert await runtime.delivery.resume("p/p") == 1
        assert (await waiting).value == 2
    assert metrics.parked_by == {PROBE: 1}
    assert metrics.messages[PROBE, MessageOutcome.OK] == 1
