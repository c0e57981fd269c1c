"""An agent whose lease is lost stops serving: its in-flight handler is cancelled and never replies.

Real in-process ledger and snapshot files, no Ray. A revoked holder stands for "another
host took the identity over while this one was frozen"; a manual clock moved past the
TTL stands for a host that could not renew in time.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import cloudpickle
import pytest
from delivery import deliver

import rayfleet as rf
from rayfleet.checkpoints._store import SnapshotStore
from rayfleet.host._hosted import HostDraining
from rayfleet.host._runtime import HostRuntime
from rayfleet.ledger._ledger import Ledger
from rayfleet.ledger._local import LocalLedgerClient
from rayfleet.ledger._values import SpecRecord
from rayfleet.testing import ManualClock

RELEASE = threading.Event()


class Worker(rf.Agent):
    class State(rf.State):
        total: int = 0
        started: int = 0

    @rf.handler
    async def add(self, n: int) -> int:
        self.state.total += n
        return self.state.total

    @rf.handler
    async def add_after(self, n: int, gate: str) -> int:
        # Changes State, then waits: a stop here must leave State as it was before the turn.
        self.state.total += n
        await asyncio.Event().wait() if gate == "forever" else await asyncio.sleep(0)
        return self.state.total

    @rf.handler
    async def flaky(self) -> None:
        self.state.started += 1
        raise rf.RetryableError("try again")

    @rf.handler(thread=True)
    def blocking_add(self, n: int) -> int:
        self.state.total += n
        RELEASE.wait(30)
        return self.state.total


def register(ledger: Ledger, identity: str) -> None:
    spec = rf.AgentSpec(identity=identity, agent=Worker)
    ledger.register(SpecRecord(
        identity=identity, spec=cloudpickle.dumps(spec), fingerprint=spec.fingerprint(),
        agent_class=spec.agent_class_path, labels=dict(spec.labels), addressability=spec.addressability.value,
    ))


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(tmp_path / "ledger.sqlite")


def runtime(ledger: Ledger, tmp_path: Path, name: str, **options: object) -> HostRuntime:
    return HostRuntime(
        name=name, ledger=LocalLedgerClient(ledger), snapshots=SnapshotStore(str(tmp_path)), incarnation=name,
        **options,  # type: ignore[arg-type]
    )


async def _until(condition: object, what: str) -> None:
    for _ in range(2_000):
        if condition():  # type: ignore[operator]
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"timed out waiting until {what}")


async def test_a_lost_lease_stops_the_running_handler_and_discards_its_state(ledger: Ledger, tmp_path: Path) -> None:
    register(ledger, "w/1")
    async with runtime(ledger, tmp_path, "host-a") as host:
        await deliver(host, "w/1", "add", (), {"n": 1})
        turn = asyncio.ensure_future(deliver(host, "w/1", "add_after", (), {"n": 100, "gate": "forever"}))
        await _until(lambda: host.statistics().turns == 2, "the second turn runs")
        ledger.revoke_holder(host.holder)  # another owner took over
        await host.renew_once()
        with pytest.raises(rf.LeaseLostError, match="stopped at its next await"):
            await asyncio.wait_for(turn, 30)
        assert host.active_identities() == []
    async with runtime(ledger, tmp_path, "host-b") as heir:
        # The heir sees the committed State only: the stopped turn's +100 never happened.
        assert (await deliver(heir, "w/1", "add", (), {"n": 0})).value == 1


async def test_a_lease_expired_by_the_hosts_own_clock_stops_serving(ledger: Ledger, tmp_path: Path) -> None:
    register(ledger, "w/1")
    clock = ManualClock()
    async with runtime(ledger, tmp_path, "host-a", clock=clock, lease_ttl=10.0) as host:
        await deliver(host, "w/1", "add", (), {"n": 1})
        turn = asyncio.ensure_future(deliver(host, "w/1", "add_after", (), {"n": 100, "gate": "forever"}))
        await _until(lambda: host.statistics().turns == 2, "the second turn runs")
        clock.advance(10.0)  # no renewal reached the ledger for a whole TTL (frozen, or the ledger out of reach)
        with pytest.raises(rf.LeaseLostError):
            await asyncio.wait_for(turn, 30)
        assert host.active_identities() == []
        assert host.statistics().leases_lost == 1


async def test_a_thread_handler_that_outlives_its_lease_does_not_reply(ledger: Ledger, tmp_path: Path) -> None:
    register(ledger, "w/1")
    RELEASE.clear()
    async with runtime(ledger, tmp_path, "host-a") as host:
        turn = asyncio.ensure_future(deliver(host, "w/1", "blocking_add", (), {"n": 5}))
        await _until(lambda: host.statistics().turns == 1, "the turn runs")
        ledger.revoke_holder(host.holder)
        await host.renew_once()
        with pytest.raises(rf.LeaseLostError):
            await asyncio.wait_for(turn, 30)
        RELEASE.set()  # the thread finishes later; its result goes nowhere
    async with runtime(ledger, tmp_path, "host-b") as heir:
        assert (await deliver(heir, "w/1", "add", (), {"n": 0})).value == 0


async def test_a_lease_lost_between_retries_ends_the_turn_without_another_attempt(
    ledger: Ledger, tmp_path: Path
) -> None:
    register(ledger, "w/1")
    async with runtime(ledger, tmp_path, "host-a") as host:
        turn = asyncio.ensure_future(deliver(host, "w/1", "flaky", (), {}))
        # The first attempt failed and the turn sleeps before the next one: lose the lease now.
        await _until(lambda: host.statistics().handler_errors == 1, "the first attempt fails")
        ledger.revoke_holder(host.holder)
        await host.renew_once()
        with pytest.raises(rf.LeaseLostError):
            await asyncio.wait_for(turn, 30)
        assert host.statistics().turns == 1


async def test_a_drain_past_its_deadline_releases_busy_agents_and_checkpoints_the_rest(
    ledger: Ledger, tmp_path: Path
) -> None:
    for identity in ("w/idle-1", "w/idle-2", "w/busy"):
        register(ledger, identity)
    async with runtime(ledger, tmp_path, "host-a") as host:
        await deliver(host, "w/idle-1", "add", (), {"n": 1})
        await deliver(host, "w/idle-2", "add", (), {"n": 2})
        await deliver(host, "w/busy", "add", (), {"n": 3})
        stuck = asyncio.ensure_future(deliver(host, "w/busy", "add_after", (), {"n": 100, "gate": "forever"}))
        await _until(lambda: host.statistics().turns == 4, "the long turn runs")

        report = await host.drain(0.2)

        assert report == rf.DrainReport(host="host-a", checkpointed=2, released_unsaved=1, timed_out=True,
                                        seconds=report.seconds)
        with pytest.raises(rf.LeaseLostError):
            await asyncio.wait_for(stuck, 30)
        assert host.active_identities() == []
        # Released, not left to lapse: every lease is free now, not after a TTL.
        assert ledger.leases(["w/idle-1", "w/idle-2", "w/busy"]) == {"w/idle-1": None, "w/idle-2": None, "w/busy": None}
    async with runtime(ledger, tmp_path, "host-b") as heir:
        assert (await deliver(heir, "w/busy", "add", (), {"n": 0})).value == 3  # the stopped turn left no trace
        assert (await deliver(heir, "w/idle-2", "add", (), {"n": 0})).value == 2


async def test_a_drain_within_its_deadline_checkpoints_everything(ledger: Ledger, tmp_path: Path) -> None:
    register(ledger, "w/1")
    async with runtime(ledger, tmp_path, "host-a") as host:
        await deliver(host, "w/1", "add", (), {"n": 1})
        report = await host.drain(30)
        assert report == rf.DrainReport(host="host-a", checkpointed=1, released_unsaved=0, timed_out=False,
                                        seconds=report.seconds)
        with pytest.raises(HostDraining):  # new work goes to another host
            await deliver(host, "w/1", "add", (), {"n": 1})
