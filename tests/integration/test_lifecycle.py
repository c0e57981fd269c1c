"""Lifecycle of an identity on a live fleet: retire, respawn, reset, delete, idle
deactivation, durability modes, drain and event subscriptions."""

import asyncio
from pathlib import Path
from typing import TypeVar

import pytest
from polling import eventually
from ray_helpers import kill_actor

import rayfleet as rf

T = TypeVar("T")


class Counter(rf.Agent):
    class State(rf.State):
        value: int = 0

    @rf.handler
    def add(self, n: int) -> int:
        self.state.value += n
        return self.state.value

    @rf.handler
    def get(self) -> int:
        return self.state.value


def kill_owner(fleet: rf.Fleet, identity: str) -> str:
    owner = fleet.status(identity).host
    assert owner is not None, f"{identity} has no owner to kill"
    kill_actor(owner, fleet.config.namespace)
    return owner


def snapshot_files(root: Path) -> set[Path]:
    return set((root / "snapshots").glob("**/*.arrow"))


def token(status: rf.IdentityStatus) -> int:
    assert status.lease is not None, status
    return status.lease.fencing_token


@pytest.mark.timeout(120)
def test_retire_respawn_reset_delete(fleet: rf.Fleet, storage: Path) -> None:
    identity = "life/one"
    ref = fleet.spawn(identity, Counter)
    assert ref.call("add", n=5) == 5
    assert ref.call("add", n=2) == 7
    live = fleet.status(identity)
    assert live.state is rf.LifecycleState.ACTIVE
    assert live.generation == 0 and live.checkpoint_version == 2
    assert live.runtime_id == f"rt:{identity}:0"
    assert live.session_id

    # retire: RETIRING, no owner, calls refused; the record is kept.
    retired_with = fleet.retire(identity)
    assert retired_with > token(live)
    retired = fleet.status(identity)
    assert retired.state is rf.LifecycleState.RETIRING
    assert retired.lease is None and retired.host is None
    assert (retired.generation, retired.checkpoint_version) == (0, 2)
    with pytest.raises(rf.InvalidStateError) as refused:
        ref.call("add", n=1)
    assert refused.value.state == "RETIRING" and identity in str(refused.value)
    assert "respawn" in str(refused.value)
    with pytest.raises(rf.InvalidStateError):
        ref.call("get")
    assert fleet.status(identity).state is rf.LifecycleState.RETIRING

    # respawn: ACTIVE again, same generation, runtime and session, last State.
    respawned = fleet.respawn(identity)
    assert respawned.state is rf.LifecycleState.ACTIVE
    assert respawned.generation == 0
    assert respawned.runtime_id == live.runtime_id and respawned.session_id == live.session_id
    assert token(respawned) > retired_with
    assert respawned.checkpoint_version == 2
    # A read-only turn leaves State unchanged, so it commits nothing: no new version, no new file.
    files = snapshot_files(storage)
    assert ref.call("get") == 7
    assert fleet.status(identity).checkpoint_version == 2
    assert snapshot_files(storage) == files
    assert ref.call("add", n=1) == 8
    before_reset = fleet.status(identity)
    assert before_reset.checkpoint_version == 3

    # reset: generation + 1, new runtime id and session, fresh State.
    reset = fleet.reset(identity)
    assert reset.state is rf.LifecycleState.ACTIVE
    assert reset.generation == 1
    assert reset.runtime_id == f"rt:{identity}:1"
    assert reset.session_id and reset.session_id != live.session_id
    assert reset.checkpoint_version is None
    assert token(reset) > token(before_reset)
    assert ref.call("get") == 0
    assert ref.call("add", n=3) == 3
    after_reset = fleet.status(identity)
    assert after_reset.generation == 1 and after_reset.checkpoint_version == 1  # the read did not commit

    # delete: the identity is gone for every API.
    fleet.delete(identity)
    with pytest.raises(rf.UnknownIdentityError) as unknown:
        fleet.status(identity)
    assert isinstance(unknown.value, KeyError) and identity in str(unknown.value)
    with pytest.raises(rf.UnknownIdentityError):
        ref.call("get")
    with pytest.raises(rf.UnknownIdentityError):
        fleet.agent(identity).call("add", n=1)
    for operation in (fleet.retire, fleet.respawn, fleet.reset, fleet.delete):
        with pytest.raises(rf.UnknownIdentityError):
            operation(identity)
    assert identity not in [status.identity for status in fleet.list_agents()]


@pytest.mark.timeout(120)
def test_delete_then_collect_garbage_removes_only_that_identitys_files(make_fleet, tmp_path: Path) -> None:
    root = tmp_path / "gc-store"
    fleet: rf.Fleet = make_fleet(storage=root, inline_state_bytes=0)  # every State in a snapshot file
    keeper = fleet.spawn("gc/keeper", Counter)
    doomed = fleet.spawn("gc/doomed", Counter)

    # Calls are sequential, so every commit writes its own file and the owner of each
    # new file is known from the listing before and after the call.
    assert keeper.call("add", n=1) == 1
    keeper_files = snapshot_files(root)
    assert len(keeper_files) == 1

    doomed_files: list[Path] = []
    for expected in (10, 20, 30):
        before = snapshot_files(root)
        assert doomed.call("add", n=10) == expected
        (new_file,) = snapshot_files(root) - before
        doomed_files.append(new_file)
    assert snapshot_files(root) == keeper_files | set(doomed_files)

    # Older versions are unreferenced already: GC removes them, keeps every referenced file.
    removed = {root / path for path in fleet.collect_garbage(min_age=0)}
    assert removed == set(doomed_files[:2])
    assert snapshot_files(root) == keeper_files | {doomed_files[2]}
    assert fleet.deactivate("gc/doomed") is True
    assert doomed.call("get") == 30  # reloaded from the one file it still references
    assert doomed.call("add", n=1) == 31
    assert fleet.status("gc/doomed").checkpoint_version == 4
    # The add (not the read) committed version 4 into a new file; the one before became garbage.
    (latest,) = snapshot_files(root) - keeper_files - {doomed_files[2]}

    fleet.delete("gc/doomed")
    removed = {root / path for path in fleet.collect_garbage(min_age=0)}
    assert removed == {doomed_files[2], latest}
    assert snapshot_files(root) == keeper_files
    assert fleet.collect_garbage(min_age=0) == []
    assert keeper.call("get") == 1


@pytest.mark.timeout(120)
def test_idle_agent_is_deactivated_and_keeps_its_state(make_fleet) -> None:
    fleet: rf.Fleet = make_fleet(idle_timeout=0.5)
    identity = "life/idle"
    ref = fleet.spawn(identity, Counter)
    # (No ACTIVE assertions between calls: with a 0.5 s timeout the agent may already
    # be idle by the time a slow machine reads its status.)
    assert ref.call("add", n=4) == 4

    dormant = eventually(
        lambda: (s := fleet.status(identity)).state is rf.LifecycleState.DORMANT and s, "idle deactivation", timeout=20.0
    )
    assert dormant.lease is None and dormant.host is None
    assert dormant.generation == 0 and dormant.checkpoint_version == 1

    assert ref.call("get") == 4  # reactivated from the checkpoint
    assert ref.call("add", n=1) == 5
    again = eventually(
        lambda: (s := fleet.status(identity)).state is rf.LifecycleState.DORMANT and s, "second idle deactivation", timeout=20.0
    )
    assert again.checkpoint_version == 2  # only the add committed; the read did not
    assert ref.call("get") == 5
    assert sum(stat.deactivations for stat in fleet.host_statistics()) >= 2


@pytest.mark.timeout(120)
def test_periodic_durability_commits_in_the_background(fleet: rf.Fleet) -> None:
    identity = "life/periodic"
    ref = fleet.spawn(identity, Counter, durability="PERIODIC", checkpoint_interval=0.2)
    assert fleet.spec(identity).durability is rf.Durability.PERIODIC

    # Nothing is committed before the first turn; the turn's State is committed afterwards.
    assert ref.call("add", n=5) == 5
    first = eventually(lambda: fleet.status(identity).checkpoint_version, "the first periodic checkpoint",
                       timeout=20.0)
    # No turn ran since `first` was observed, so any later commit must include the next turn.
    assert ref.call("add", n=7) == 12
    eventually(lambda: (fleet.status(identity).checkpoint_version or 0) > first, "a checkpoint after the 2nd turn",
               timeout=20.0)

    killed = kill_owner(fleet, identity)
    assert ref.call("get") == 12
    assert fleet.status(identity).host != killed


@pytest.mark.timeout(120)
def test_on_deactivate_durability_commits_only_on_deactivation(fleet: rf.Fleet) -> None:
    identity = "life/lazy"
    ref = fleet.spawn(identity, Counter, durability="ON_DEACTIVATE")
    assert ref.call("add", n=3) == 3
    assert ref.call("add", n=4) == 7
    active = fleet.status(identity)
    assert active.state is rf.LifecycleState.ACTIVE
    assert active.checkpoint_version is None

    assert fleet.deactivate(identity) is True
    dormant = fleet.status(identity)
    assert dormant.state is rf.LifecycleState.DORMANT
    assert dormant.checkpoint_version == 1
    assert fleet.deactivate(identity) is False  # nothing active to deactivate

    assert ref.call("get") == 7  # reactivated from the checkpoint
    # Turns since then are not committed: a crash falls back to the last checkpoint.
    assert ref.call("add", n=100) == 107
    assert fleet.status(identity).checkpoint_version == 1
    kill_owner(fleet, identity)
    assert ref.call("get") == 7


@pytest.mark.timeout(120)
def test_drain_moves_agents_to_the_other_host(fleet: rf.Fleet) -> None:
    # Half of them commit only on deactivation: their State survives only if drain checkpoints.
    refs = [
        fleet.spawn(f"drain/{k}", Counter, durability="ON_DEACTIVATE" if k % 2 else "EVERY_TURN")
        for k in range(8)
    ]
    for k, ref in enumerate(refs):
        assert ref.call("add", n=k + 1) == k + 1
    before = {status.identity: status for status in fleet.list_agents()}
    by_host: dict[str, list[str]] = {}
    for identity, status in before.items():
        assert status.host is not None
        by_host.setdefault(status.host, []).append(identity)
    drained = max(by_host, key=lambda name: len(by_host[name]))
    (other,) = {host.name for host in fleet.hosts()} - {drained}
    moving = sorted(by_host[drained])
    staying = sorted(by_host.get(other, []))

    report = fleet.drain(drained)
    assert report == rf.DrainReport(host=drained, checkpointed=len(moving), released_unsaved=0, timed_out=False,
                                    seconds=report.seconds)
    for identity in moving:
        status = fleet.status(identity)
        assert status.state is rf.LifecycleState.DORMANT
        assert status.checkpoint_version == 1  # ON_DEACTIVATE agents were checkpointed by the drain
    assert {host.name: host.draining for host in fleet.hosts()} == {drained: True, other: False}

    for k, ref in enumerate(refs):
        assert ref.call("get") == k + 1
    for identity in moving:
        status = fleet.status(identity)
        assert status.host == other
        assert token(status) > token(before[identity])
    for identity in staying:  # untouched: same owner, same lease
        status = fleet.status(identity)
        assert status.host == other and token(status) == token(before[identity])

    # New work avoids the draining host too.
    newcomer = fleet.spawn("drain/new", Counter)
    assert newcomer.call("add", n=1) == 1
    assert fleet.status("drain/new").host == other



@pytest.mark.timeout(120)
def test_deactivate_reaches_the_owner_through_a_cold_route(make_fleet, storage: Path) -> None:
    fleet: rf.Fleet = make_fleet()
    identity = "life/moved"
    ref = fleet.spawn(identity, Counter)
    assert ref.call("add", n=1) == 1
    placed = fleet.status(identity).host  # the identity's placement (rendezvous) host
    assert placed is not None
    # Move the agent off its placement host, then let that host take work again.
    assert fleet.drain(placed).checkpointed == 1
    assert ref.call("add", n=1) == 2
    owner = fleet.status(identity).host
    assert owner is not None and owner != placed
    fleet.undrain(placed)

    # A second driver handle on the same fleet (e.g. another process) has no cached
    # route, so its request lands on the placement host, which does not hold the agent.
    # Not added to make_fleet: the fixture's shutdown of the first handle stops the actors.
    other_driver = rf.connect(storage=storage, namespace=fleet.config.namespace, hosts=2)
    assert other_driver.status(identity).host == owner
    assert other_driver.deactivate(identity) is True
    assert fleet.status(identity).state is rf.LifecycleState.DORMANT
    assert ref.call("get") == 2


async def _watch(fleet: rf.Fleet, identity: str) -> tuple[list[rf.IdentityEvent], int]:
    """Subscribe, drive the identity through its lifecycle; returns the events and the probe count."""
    ref = fleet.agent(identity)
    events: list[rf.IdentityEvent] = []
    arrived = asyncio.Event()

    async def consume() -> None:
        async for event in fleet.subscribe(identity, poll_interval=0.2):
            events.append(event)
            if event.kind is not rf.EventKind.LEASE_UPDATED:  # renewals come whenever they are due
                arrived.set()

    consumer = asyncio.create_task(consume())
    # The subscription opens asynchronously and only sees later events: make turns that
    # change State (each commits, so each emits CHECKPOINT_COMPLETED) until one is delivered.
    probes = 0
    for _ in range(40):
        probes += 1
        assert await ref.ask("add", n=1, timeout=30) == 1 + probes
        try:
            await asyncio.wait_for(arrived.wait(), 0.5)
            break
        except asyncio.TimeoutError:
            assert not consumer.done(), consumer
    else:
        raise AssertionError("the subscription delivered no event")
    assert await ref.ask("get", timeout=30) == 1 + probes  # a read: no checkpoint, no event

    await asyncio.to_thread(fleet.deactivate, identity)
    assert await ref.ask("add", n=1, timeout=30) == 2 + probes
    await asyncio.to_thread(fleet.retire, identity)
    await asyncio.to_thread(fleet.respawn, identity)
    await asyncio.to_thread(fleet.reset, identity)
    assert await ref.ask("add", n=5, timeout=30) == 5
    await asyncio.to_thread(fleet.delete, identity)
    await asyncio.wait_for(consumer, 30)  # the stream ends after DELETED
    return events, probes


@pytest.mark.timeout(120)
def test_subscribe_reports_state_changes_checkpoints_and_deletion(fleet: rf.Fleet) -> None:
    identity = "life/watched"
    ref = fleet.spawn(identity, Counter)
    assert ref.call("add", n=1) == 1
    first = fleet.status(identity)
    owner = first.host

    received, probes = asyncio.run(_watch(fleet, identity))

    assert all(event.identity == identity for event in received)
    assert all(event.host == owner for event in received)  # every operation ran on the owner
    # The renewal loop emits LEASE_UPDATED whenever it renews (every lease_ttl/3), so those
    # may be interleaved anywhere; a renewal keeps the lease's fencing token.
    renewals = [e for e in received if e.kind is rf.EventKind.LEASE_UPDATED]
    events = [e for e in received if e.kind is not rf.EventKind.LEASE_UPDATED]
    assert events[-1].kind is rf.EventKind.DELETED
    assert events[-1].fencing_token is not None
    # Before the deactivation: only the probe turns' checkpoints, in version order, up to
    # the last probe's (version 1 was the add before subscribing; the read made none).
    start = next(i for i, e in enumerate(events) if e.kind is rf.EventKind.STATE_CHANGED)
    checkpoints = events[:start]
    assert checkpoints and all(e.kind is rf.EventKind.CHECKPOINT_COMPLETED for e in checkpoints)
    versions = [e.checkpoint_version for e in checkpoints]
    assert versions == list(range(versions[0], versions[0] + len(versions)))
    assert versions[-1] == 1 + probes

    tail = [(e.kind, e.state, e.checkpoint_version) for e in events[start:]]
    changed, checkpoint = rf.EventKind.STATE_CHANGED, rf.EventKind.CHECKPOINT_COMPLETED
    state = rf.LifecycleState
    assert tail == [
        (changed, state.DORMANT, None),                 # deactivate
        (changed, state.ACTIVE, None),                  # reactivated by add
        (checkpoint, None, versions[-1] + 1),           # add committed
        (changed, state.RETIRING, None),                # retire
        (changed, state.ACTIVE, None),                  # respawn
        (changed, state.ACTIVE, None),                  # reset: new generation
        (checkpoint, None, 1),                          # first checkpoint of generation 1
        (rf.EventKind.DELETED, None, None),
    ]
    fenced = [e.fencing_token for e in events[start:] if e.fencing_token is not None]
    assert len(fenced) == 5  # ACTIVE, RETIRING, ACTIVE, ACTIVE, DELETED
    assert fenced == sorted(set(fenced)), fenced  # strictly increasing
    assert all(e.fencing_token in {token(first), *fenced} for e in renewals), renewals


@pytest.mark.timeout(120)
def test_a_keyed_call_has_its_effect_once_across_respawn(fleet: rf.Fleet) -> None:
    # The reproduction: add(n=5, key k1), respawn, the same call again used to total 10.
    ref = fleet.spawn("respawn/keyed", Counter)
    assert ref.call("add", n=5, idempotency_key="k1") == 5
    fleet.respawn("respawn/keyed")
    assert ref.call("add", n=5, idempotency_key="k1") == 5
    assert ref.call("add", n=0) == 5


@pytest.mark.timeout(120)
def test_respawn_of_a_never_activated_identity(fleet: rf.Fleet) -> None:
    fleet.spawn("respawn/never", Counter)
    status = fleet.respawn("respawn/never")  # used to fail with an internal AssertionError
    assert status.state is rf.LifecycleState.ACTIVE and status.generation == 0
    assert fleet.agent("respawn/never").call("add", n=2) == 2
