"""The host runtime against a real in-process ledger and real snapshot files (no Ray)."""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path

import cloudpickle
import pytest
from delivery import deliver

import rayfleet as rf
from rayfleet.checkpoints._store import SnapshotStore
from rayfleet.host import _leases as leases_module
from rayfleet.host._hosted import HostDraining
from rayfleet.host._runtime import HostRuntime, OwnedElsewhere
from rayfleet.ledger._ledger import Ledger
from rayfleet.ledger._local import LocalLedgerClient
from rayfleet.ledger._values import SpecRecord
from rayfleet.testing import ManualClock


class Counter(rf.Agent):
    class State(rf.State):
        total: int = 0
        history: list[int] = []

    @rf.handler
    async def add(self, n: int) -> int:
        self.state.total += n
        self.state.history.append(n)
        return self.state.total

    @rf.handler
    async def slow_add(self, n: int, pause: float) -> int:
        before = self.state.total
        await asyncio.sleep(pause)
        self.state.total = before + n
        return self.state.total

    @rf.handler
    def boom(self) -> None:
        self.state.total = 999
        raise ValueError("kaboom")

    @rf.handler
    async def who(self) -> dict[str, object]:
        return {"identity": self.identity, "generation": self.generation, "fencing_token": self.fencing_token}


def register(ledger: Ledger, identity: str, **options: object) -> rf.AgentSpec:
    spec = rf.AgentSpec(identity=identity, agent=Counter, **options)  # type: ignore[arg-type]
    ledger.register(SpecRecord(
        identity=identity, spec=cloudpickle.dumps(spec), fingerprint=spec.fingerprint(),
        agent_class=spec.agent_class_path, labels=dict(spec.labels), addressability=spec.addressability.value,
    ))
    return spec


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(tmp_path / "ledger.sqlite")


def runtime(ledger: Ledger, tmp_path: Path, name: str = "host-a", **options: object) -> HostRuntime:
    return HostRuntime(
        name=name, ledger=LocalLedgerClient(ledger), snapshots=SnapshotStore(str(tmp_path)),
        incarnation=name, **options,  # type: ignore[arg-type]
    )


async def test_turns_commit_and_state_survives_a_new_host(ledger: Ledger, tmp_path: Path) -> None:
    register(ledger, "c/1")
    async with runtime(ledger, tmp_path) as host:
        assert (await deliver(host, "c/1", "add", (), {"n": 2})).value == 2
        result = await deliver(host, "c/1", "add", (), {"n": 3})
        assert result.value == 5 and result.checkpoint_version == 2
    # The first host shut down (checkpointed, released); a second one resumes the State.
    async with runtime(ledger, tmp_path, "host-b") as other:
        assert (await deliver(other, "c/1", "add", (), {"n": 1})).value == 6
        view = ledger.resolve(["c/1"])["c/1"]
        assert view.continuity is not None and view.continuity.checkpoint_version == 3


async def test_one_turn_at_a_time_per_identity_concurrent_across(ledger: Ledger, tmp_path: Path) -> None:
    register(ledger, "c/1")
    register(ledger, "c/2")
    async with runtime(ledger, tmp_path) as host:
        # Read-modify-write across an await: interleaved turns would lose updates.
        results = await asyncio.gather(*(deliver(host, "c/1", "slow_add", (), {"n": 1, "pause": 0.01}) for _ in range(10)))
        assert sorted(r.value for r in results) == list(range(1, 11))
        # Different identities overlap: both slow turns finish within one pause of each other.
        both = await asyncio.gather(
            deliver(host, "c/1", "slow_add", (), {"n": 1, "pause": 0.05}),
            deliver(host, "c/2", "slow_add", (), {"n": 1, "pause": 0.05}),
        )
        assert [r.value for r in both] == [11, 1]


async def test_concurrent_first_messages_activate_once_in_one_batch(ledger: Ledger, tmp_path: Path) -> None:
    for index in range(20):
        register(ledger, f"c/{index}")
    async with runtime(ledger, tmp_path) as host:
        await asyncio.gather(*(deliver(host, f"c/{i % 20}", "add", (), {"n": 1}) for i in range(60)))
        stats = host.statistics()
        assert stats.activations == 20
        assert stats.commit_batches < 60  # group commit shared files and ledger calls
        assert all(ledger.high_water(f"c/{i}") == 1 for i in range(20))


async def test_failed_turn_leaves_state_unchanged(ledger: Ledger, tmp_path: Path) -> None:
    register(ledger, "c/1")
    async with runtime(ledger, tmp_path) as host:
        await deliver(host, "c/1", "add", (), {"n": 4})
        with pytest.raises(rf.HandlerError) as caught:
            await deliver(host, "c/1", "boom", (), {})
        assert caught.value.remote_type == "builtins.ValueError"
        assert caught.value.remote_message == "kaboom"
        assert "boom" in caught.value.remote_traceback
        assert (await deliver(host, "c/1", "add", (), {"n": 1})).value == 5


async def test_zombie_owner_cannot_commit_after_takeover(ledger: Ledger, tmp_path: Path) -> None:
    register(ledger, "c/1")
    async with runtime(ledger, tmp_path, "host-a") as zombie, runtime(ledger, tmp_path, "host-b") as heir:
        await deliver(zombie, "c/1", "add", (), {"n": 1})
        with pytest.raises(OwnedElsewhere):
            await deliver(heir, "c/1", "add", (), {"n": 1})
        ledger.revoke_holder(zombie.holder)  # e.g. Ray reported host-a dead while it still runs
        assert (await deliver(heir, "c/1", "add", (), {"n": 10})).value == 11
        with pytest.raises(rf.LeaseLostError):
            await deliver(zombie, "c/1", "add", (), {"n": 100})
        assert "c/1" not in zombie.active_identities()
        # The zombie's next attempt is redirected to the new owner.
        with pytest.raises(OwnedElsewhere) as redirect:
            await deliver(zombie, "c/1", "add", (), {"n": 100})
        assert redirect.value.holder == heir.holder
        assert (await deliver(heir, "c/1", "add", (), {"n": 0})).value == 11


async def test_lost_lease_at_renewal_drops_the_agent(ledger: Ledger, tmp_path: Path) -> None:
    register(ledger, "c/1")
    async with runtime(ledger, tmp_path) as host:
        await deliver(host, "c/1", "add", (), {"n": 1})
        ledger.revoke_holder(host.holder)
        assert await host.renew_once() == 0
        assert host.active_identities() == []
        assert host.statistics().leases_lost == 1


async def test_a_renewal_goes_to_the_ledger_in_chunks(
    ledger: Ledger, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # One transaction renewing every lease of a host holding tens of thousands held a
    # SQLite file's write lock for seconds, and the other host's renewal timed out
    # behind it. Chunks let other writers in between.
    monkeypatch.setattr(leases_module, "RENEWAL_CHUNK", 3)
    for index in range(7):
        register(ledger, f"c/{index}")
    async with runtime(ledger, tmp_path) as host:
        await asyncio.gather(*(deliver(host, f"c/{index}", "add", (), {"n": 1}) for index in range(7)))
        sizes: list[int] = []
        renew = host._ledger.renew

        def counted(*, holder: str, tokens: dict[str, int]):  # type: ignore[no-untyped-def]
            sizes.append(len(tokens))
            return renew(holder=holder, tokens=tokens)

        monkeypatch.setattr(host._ledger, "renew", counted)
        ledger.release(holder=host.holder, tokens={"c/4": ledger.resolve(["c/4"])["c/4"].lease.fencing_token})
        assert await host.renew_once() == 6
        assert sorted(sizes) == [1, 3, 3]
        assert sorted(host.active_identities()) == [f"c/{index}" for index in range(7) if index != 4]


async def test_lifecycle_retire_respawn_reset_delete(ledger: Ledger, tmp_path: Path) -> None:
    register(ledger, "c/1")
    async with runtime(ledger, tmp_path) as host:
        await deliver(host, "c/1", "add", (), {"n": 7})
        retire_token = await host.retire("c/1")
        with pytest.raises(rf.InvalidStateError, match="RETIRING"):
            await deliver(host, "c/1", "add", (), {"n": 1})
        record = await host.respawn("c/1")
        assert record.generation == 0
        assert (await deliver(host, "c/1", "add", (), {"n": 1})).value == 8
        assert ledger.high_water("c/1") > retire_token
        fresh = await host.reset("c/1")
        assert fresh.generation == 1 and fresh.runtime_id == "rt:c/1:1" and fresh.session_id != record.session_id
        assert (await deliver(host, "c/1", "add", (), {"n": 1})).value == 1
        who = (await deliver(host, "c/1", "who", (), {})).value
        assert who["generation"] == 1 and who["fencing_token"] == ledger.high_water("c/1")
        await host.delete("c/1")
        with pytest.raises(rf.UnknownIdentityError):
            await deliver(host, "c/1", "add", (), {"n": 1})


async def test_corrupt_snapshot_breaks_only_that_identity(ledger: Ledger, tmp_path: Path) -> None:
    register(ledger, "c/1")
    register(ledger, "c/2")
    async with runtime(ledger, tmp_path, inline_limit=0) as host:
        await deliver(host, "c/1", "add", (), {"n": 1})
    pointer = ledger.resolve(["c/1"])["c/1"].snapshot
    assert pointer is not None and not pointer.in_ledger
    (tmp_path / pointer.file).write_bytes(b"not arrow at all")
    async with runtime(ledger, tmp_path, "host-b") as host:
        with pytest.raises(rf.SnapshotError, match=pointer.file):
            await deliver(host, "c/1", "add", (), {"n": 1})
        view = ledger.resolve(["c/1"])["c/1"]
        assert view.lifecycle == "broken" and pointer.file in view.reason
        with pytest.raises(rf.InvalidStateError, match="BROKEN"):
            await deliver(host, "c/1", "add", (), {"n": 1})
        assert (await deliver(host, "c/2", "add", (), {"n": 2})).value == 2
        await host.reset("c/1")
        assert (await deliver(host, "c/1", "add", (), {"n": 1})).value == 1


async def test_events_reach_subscribers(ledger: Ledger, tmp_path: Path) -> None:
    register(ledger, "c/1")
    async with runtime(ledger, tmp_path) as host:
        subscription = host.subscribe("c/1")
        await deliver(host, "c/1", "add", (), {"n": 1})
        await host.delete("c/1")
        kinds = [event.kind for event in subscription.drain()]
        assert kinds == [rf.EventKind.STATE_CHANGED, rf.EventKind.CHECKPOINT_COMPLETED, rf.EventKind.DELETED]
        assert subscription.closed


async def test_periodic_durability_commits_in_the_background(ledger: Ledger, tmp_path: Path) -> None:
    register(ledger, "c/1", durability=rf.Durability.PERIODIC, checkpoint_interval=0.05)
    async with runtime(ledger, tmp_path) as host:
        result = await deliver(host, "c/1", "add", (), {"n": 3})
        assert result.checkpoint_version == 0  # replied before any commit
        for _ in range(100):
            view = ledger.resolve(["c/1"])["c/1"]
            if view.continuity is not None and view.continuity.checkpoint_version >= 1:
                break
            await asyncio.sleep(0.02)
        assert view.continuity is not None and view.continuity.checkpoint_version == 1


async def test_idle_agents_are_checkpointed_and_released(ledger: Ledger, tmp_path: Path) -> None:
    register(ledger, "c/1", durability=rf.Durability.ON_DEACTIVATE)
    async with runtime(ledger, tmp_path, idle_timeout=0.1) as host:
        await deliver(host, "c/1", "add", (), {"n": 3})
        for _ in range(100):
            if not host.active_identities():
                break
            await asyncio.sleep(0.02)
        assert host.active_identities() == []
        view = ledger.resolve(["c/1"])["c/1"]
        assert view.lease is None and view.continuity is not None and view.continuity.checkpoint_version == 1


class SlowLedgerClient(LocalLedgerClient):
    """A real ledger reached with a network-like delay, so batches overlap."""

    async def acquire(self, **kwargs: object) -> dict:  # type: ignore[override]
        await asyncio.sleep(0.01)
        return await super().acquire(**kwargs)  # type: ignore[arg-type]


async def test_activations_arriving_during_a_batch_go_out_in_the_next(ledger: Ledger, tmp_path: Path) -> None:
    for index in range(30):
        register(ledger, f"c/{index}")
    host = HostRuntime(name="h", ledger=SlowLedgerClient(ledger), snapshots=SnapshotStore(str(tmp_path)))
    async with host:
        async def staggered(index: int) -> int:
            await asyncio.sleep(index * 0.002)
            return (await deliver(host, f"c/{index}", "add", (), {"n": index})).value

        values = await asyncio.wait_for(asyncio.gather(*(staggered(i) for i in range(30))), timeout=20)
        assert values == list(range(30))


class CountingLedgerClient(LocalLedgerClient):
    """A real ledger that records how many identities each acquire call carried."""

    def __init__(self, ledger: Ledger) -> None:
        super().__init__(ledger)
        self.acquired: list[int] = []

    async def acquire(self, **kwargs: object) -> dict:  # type: ignore[override]
        self.acquired.append(len(kwargs["identities"]))  # type: ignore[arg-type]
        return await super().acquire(**kwargs)  # type: ignore[arg-type]


async def test_many_activations_at_once_go_out_in_acquire_calls_of_bounded_size(
    ledger: Ledger, tmp_path: Path,
) -> None:
    # One transaction of thousands of acquisitions held a SQLite file's write lock long
    # enough to starve other hosts' lease renewals (B4 lost 60,000 leases).
    from rayfleet.host._runtime import ACQUIRE_BATCH

    count = 2 * ACQUIRE_BATCH + 30
    for index in range(count):
        register(ledger, f"c/{index}")
    client = CountingLedgerClient(ledger)
    host = HostRuntime(name="h", ledger=client, snapshots=SnapshotStore(str(tmp_path)))
    async with host:
        values = await asyncio.gather(*(deliver(host, f"c/{i}", "add", (), {"n": i}) for i in range(count)))
        assert [result.value for result in values] == list(range(count))
    assert sum(client.acquired) == count and max(client.acquired) <= ACQUIRE_BATCH, client.acquired


async def test_internal_only_agents_refuse_outside_callers(ledger: Ledger, tmp_path: Path) -> None:
    register(ledger, "c/inner", addressability=rf.Addressability.INTERNAL_ONLY)
    async with runtime(ledger, tmp_path) as host:
        with pytest.raises(rf.NotAddressableError, match="INTERNAL_ONLY"):
            await deliver(host, "c/inner", "add", (), {"n": 1})
        assert (await deliver(host, "c/inner", "add", (), {"n": 1}, sender="c/peer")).value == 1


class SlowCommitLedgerClient(LocalLedgerClient):
    """A real ledger whose checkpoint commits take a while, so one is in flight at shutdown."""

    def __init__(self, ledger: Ledger) -> None:
        super().__init__(ledger)
        self.committing = asyncio.Event()

    async def commit_checkpoints(self, commits: list) -> list:  # type: ignore[override]
        self.committing.set()
        await asyncio.sleep(0.5)
        return await super().commit_checkpoints(commits)


async def test_shutdown_leaves_no_background_task_running(ledger: Ledger, tmp_path: Path) -> None:
    register(ledger, "c/1", durability=rf.Durability.PERIODIC, checkpoint_interval=0.01)
    client = SlowCommitLedgerClient(ledger)
    host = HostRuntime(name="h", ledger=client, snapshots=SnapshotStore(str(tmp_path)))
    await host.start()
    await deliver(host, "c/1", "add", (), {"n": 1})
    await client.committing.wait()  # housekeeping is checkpointing in a task of its own
    await host.shutdown(checkpoint=False)
    assert asyncio.all_tasks() == {asyncio.current_task()}


class StuckLedgerClient(LocalLedgerClient):
    """A ledger whose acquire never answers, as if the ledger actor were unreachable."""

    def __init__(self, ledger: Ledger) -> None:
        super().__init__(ledger)
        self.acquiring = asyncio.Event()

    async def acquire(self, **kwargs: object) -> dict:  # type: ignore[override]
        self.acquiring.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def test_an_activation_waiting_at_shutdown_is_sent_elsewhere(ledger: Ledger, tmp_path: Path) -> None:
    register(ledger, "c/1")
    client = StuckLedgerClient(ledger)
    host = HostRuntime(name="h", ledger=client, snapshots=SnapshotStore(str(tmp_path)))
    await host.start()
    call = asyncio.create_task(deliver(host, "c/1", "add", (), {"n": 1}))
    await client.acquiring.wait()
    await host.shutdown()
    with pytest.raises(HostDraining):
        await asyncio.wait_for(call, timeout=5)


async def test_a_keyed_call_has_its_effect_once_across_respawn(ledger: Ledger, tmp_path: Path) -> None:
    register(ledger, "c/1")
    async with runtime(ledger, tmp_path) as host:
        first = await deliver(host, "c/1", "add", (), {"n": 5}, idempotency_key="k1")
        assert first.value == 5
        await host.respawn("c/1")
        again = await deliver(host, "c/1", "add", (), {"n": 5}, idempotency_key="k1")
        assert again.value == 5  # the original reply; the effect did not run twice
        assert (await deliver(host, "c/1", "add", (), {"n": 0})).value == 5


async def test_respawn_of_a_never_activated_identity_brings_it_up(ledger: Ledger, tmp_path: Path) -> None:
    register(ledger, "c/never")
    async with runtime(ledger, tmp_path) as host:
        record = await host.respawn("c/never")
        assert record.generation == 0 and record.checkpoint_version == 0
        assert (await deliver(host, "c/never", "add", (), {"n": 2})).value == 2


async def test_the_spec_cache_is_bounded_however_many_identities_pass_through(
    ledger: Ledger, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # One spec per identity (the identity is part of the fingerprint): a host that served
    # a churn of short-lived identities kept every one of their specs, forever.
    monkeypatch.setattr("rayfleet.host._runtime.SPEC_CACHE_SIZE", 8)
    async with runtime(ledger, tmp_path) as host:
        for n in range(30):
            register(ledger, f"churn/{n}")
            assert (await deliver(host, f"churn/{n}", "add", (), {"n": n})).value == n
            await host.deactivate(f"churn/{n}")
        assert len(host._spec_cache) <= 8
        # An identity whose spec left the cache still activates (the ledger has the spec).
        assert (await deliver(host, "churn/0", "add", (), {"n": 1})).value == 1


async def test_deactivating_all_commits_the_idle_in_one_group_and_waits_for_a_turn_in_flight(
    ledger: Ledger, tmp_path: Path,
) -> None:
    names = [f"c/{index}" for index in range(30)]
    for name in names:
        register(ledger, name, durability=rf.Durability.ON_DEACTIVATE)
    async with runtime(ledger, tmp_path) as host:
        for index, name in enumerate(names):
            await deliver(host, name, "add", (), {"n": index})
        # c/0 was taken over behind this host's back: its checkpoint must be refused, not written.
        ledger.release(holder=host.holder, tokens={"c/0": ledger.high_water("c/0")})
        ledger.acquire(holder="usurper", identities=["c/0"], ttl=60.0)
        busy = asyncio.create_task(deliver(host, "c/1", "slow_add", (), {"n": 100, "pause": 0.2}))
        await asyncio.sleep(0.05)  # c/1 is in its turn now
        batches_before = host.statistics().commit_batches
        done = await host.deactivate_all()
        assert (await busy).value == 101  # the turn finished first, then c/1 was retired with it
        assert done == 29 and host.active_identities() == []
        # The 28 idle agents in one group commit, c/1 after its turn in one more.
        assert host.statistics().commit_batches - batches_before == 2
    views = ledger.resolve(names)
    assert views["c/0"].continuity.checkpoint_version == 0 and views["c/0"].lease.holder == "usurper"
    assert views["c/1"].continuity.checkpoint_version == 1
    for name in names[2:]:
        assert views[name].continuity.checkpoint_version == 1 and views[name].lease is None
    async with runtime(ledger, tmp_path, "host-b") as other:
        assert (await deliver(other, "c/7", "add", (), {"n": 0})).value == 7
        assert (await deliver(other, "c/1", "add", (), {"n": 0})).value == 101


async def test_a_lease_expiring_by_the_hosts_clock_is_dropped_between_scans(ledger: Ledger, tmp_path: Path) -> None:
    """Scans of every agent are spaced out by their cost, but a lease's expiry brings the next one forward."""
    clock = ManualClock()
    register(ledger, "c/1")
    async with runtime(ledger, tmp_path, clock=clock, lease_ttl=10.0) as host:
        real_scan = host._scan_entries
        scans: list[float] = []

        async def costly_scan(now: float) -> None:
            scans.append(now)
            clock.advance(2.0)  # the scan took 2 s: the next is due 20 s later
            await real_scan(now)

        host._scan_entries = costly_scan  # type: ignore[method-assign]
        while not scans:
            await asyncio.sleep(0.01)  # the first scan ran, before any agent was hosted
        await deliver(host, "c/1", "add", (), {"n": 1})
        await asyncio.sleep(0.2)  # several ticks: no scan is due
        assert host.active_identities() == ["c/1"] and len(scans) == 1
        clock.advance(10.0)  # past the lease, before the renewal loop (asleep for TTL/3 of real time) wakes
        for _ in range(100):
            if not host.active_identities():
                break
            await asyncio.sleep(0.02)
        assert host.active_identities() == [] and len(scans) == 2
        assert host.statistics().leases_lost == 1


async def test_costly_scans_take_a_bounded_share_of_the_event_loop(ledger: Ledger, tmp_path: Path) -> None:
    """A scan that took 50 ms is followed by the next one no sooner than 0.5 s later (HOUSEKEEPING_SHARE)."""
    slowed = [0.0]

    def clock() -> float:
        return time.monotonic() + slowed[0]

    register(ledger, "c/1")
    async with runtime(ledger, tmp_path, clock=clock) as host:
        await deliver(host, "c/1", "add", (), {"n": 1})
        scans: list[float] = []
        real_scan = host._scan_entries

        async def costly_scan(now: float) -> None:
            scans.append(now)
            slowed[0] += 0.05  # the clock says the scan took 50 ms
            await real_scan(now)

        host._scan_entries = costly_scan  # type: ignore[method-assign]
        await asyncio.sleep(1.2)  # 24 ticks
        assert 1 <= len(scans) <= 4, scans
        assert all(later - earlier >= 0.5 for earlier, later in itertools.pairwise(scans)), scans
        assert host.active_identities() == ["c/1"]
