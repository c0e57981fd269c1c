"""A frozen host (SIGSTOP: a long GC pause, a blocked event loop, a half-dead node) loses its agents.

The router asks the ledger about a request its host has not answered; once the owner's
lease has lapsed the identity is activated on another live host under a larger token.
When the frozen host wakes, it drops those agents without committing or replying.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

import pytest
import ray
from polling import eventually
from processes import ended

import rayfleet as rf

TTL = 3.0


class Counter(rf.Agent):
    class State(rf.State):
        value: int = 0

    @rf.handler
    def add(self, n: int) -> int:
        self.state.value += n
        return self.state.value


def _pid(fleet: rf.Fleet, host: str) -> int:
    handle = ray.get_actor(host, namespace=fleet.config.namespace)
    return int(ray.get(handle.__ray_call__.remote(lambda actor: os.getpid())))


def _statistics(fleet: rf.Fleet, host: str) -> rf.HostStatistics:
    (found,) = [stats for stats in fleet.host_statistics() if stats.host == host]
    return found


def _counted_once(
    fleet: rf.Fleet, prefix: str,
) -> tuple[list[rf.AgentRef], dict[str, rf.IdentityStatus], str, list[rf.AgentRef]]:
    """Twelve counters added to once (key "first"); their statuses; the first one's host and the refs it serves."""
    refs = [fleet.spawn(f"{prefix}/{i}", Counter) for i in range(12)]
    for ref in refs:
        assert ref.call("add", n=1, idempotency_key="first") == 1
    before = {ref.identity: fleet.status(ref.identity) for ref in refs}
    host = before[refs[0].identity].host
    assert host is not None
    return refs, before, host, [ref for ref in refs if before[ref.identity].host == host]


@pytest.mark.timeout(180)
def test_a_frozen_hosts_identities_answer_from_another_host_while_it_is_still_frozen(make_any_fleet) -> None:
    fleet: rf.Fleet = make_any_fleet(hosts=2, lease_ttl=TTL)
    refs, before, frozen, victims = _counted_once(fleet, "freeze")
    pid = _pid(fleet, frozen)

    os.kill(pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        answers = [ref.call("add", n=1, idempotency_key="second") for ref in victims]
        waited = time.monotonic() - started
        after = {ref.identity: fleet.status(ref.identity) for ref in victims}
        # Checked while the owner is still stopped: it cannot have served these.
        assert answers == [2] * len(victims)
        for ref in victims:
            moved = after[ref.identity]
            assert moved.host not in (None, frozen)
            assert moved.lease is not None and moved.lease.fencing_token > before[ref.identity].lease.fencing_token
    finally:
        os.kill(pid, signal.SIGCONT)
    print(f"\nfailover of {len(victims)} identities off a frozen host: {waited:.2f} s (lease TTL {TTL} s)")

    # Awake again, the old owner's requests (the first tries of those calls) are refused or
    # redirected; nothing it held in memory is committed, and nobody got a second answer.
    for ref in victims:
        assert ref.call("add", n=0) == 2
    for _ in range(100):
        if _statistics(fleet, frozen).active_agents == 0:
            break
        time.sleep(0.1)
    stats = _statistics(fleet, frozen)
    assert stats.active_agents == 0 and stats.leases_lost >= len(victims)
    for ref in refs:
        assert ref.call("add", n=1, idempotency_key="second") == 2  # still exactly once


@pytest.mark.timeout(180)
def test_a_host_frozen_holding_the_sqlite_ledgers_write_lock_is_ended_and_its_identities_move(
    make_fleet, storage,
) -> None:
    """A host stopped inside its commit keeps the SQLite file's write lock (a POSIX lock of its process):
    no other host can write, so none could take its identities over for as long as it stays stopped."""
    fleet: rf.Fleet = make_fleet(hosts=2, lease_ttl=TTL)
    refs, before, frozen, victims = _counted_once(fleet, "locked")
    pid = _pid(fleet, frozen)
    ledger_file = str(storage / "ledger.sqlite")

    def take_the_write_lock(actor: object) -> None:
        import sqlite3

        connection = sqlite3.connect(ledger_file, isolation_level=None, check_same_thread=False)
        connection.execute("BEGIN IMMEDIATE")  # as inside a commit: the lock taken, nothing committed yet
        actor._test_write_lock = connection  # type: ignore[attr-defined]

    ray.get(ray.get_actor(frozen, namespace=fleet.config.namespace).__ray_call__.remote(take_the_write_lock))
    os.kill(pid, signal.SIGSTOP)
    try:
        # Without the other host's stall watch these wait until the frozen host wakes (or time out).
        answers = [ref.call("add", n=1, idempotency_key="second", timeout=60) for ref in victims]
        assert answers == [2] * len(victims)
        assert eventually(lambda: ended(pid), "the stopped host ended, not woken", 60.0)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    for ref in victims:
        moved = fleet.status(ref.identity)
        assert moved.lease is not None and moved.lease.fencing_token > before[ref.identity].lease.fencing_token
    for ref in refs:
        assert ref.call("add", n=1, idempotency_key="second") == 2  # still exactly once


class Notebook(rf.Agent):
    """Commits only when deactivated: State that a host dying without a drain would lose."""

    class State(rf.State):
        lines: list[str] = []

    @rf.handler
    def write(self, line: str) -> int:
        self.state.lines.append(line)
        return len(self.state.lines)


@pytest.mark.timeout(180)
def test_a_host_that_gets_sigterm_drains_before_it_exits(make_fleet) -> None:
    # A long TTL: had the leases been left to lapse, they would still be held when checked.
    fleet: rf.Fleet = make_fleet(hosts=2, lease_ttl=120.0)
    refs = [fleet.spawn(f"term/{i}", Notebook, durability=rf.Durability.ON_DEACTIVATE) for i in range(6)]
    for ref in refs:
        assert ref.call("write", line="kept") == 1
    owners = {ref.identity: fleet.status(ref.identity).host for ref in refs}
    victim = owners[refs[0].identity]
    assert victim is not None
    moving = [ref for ref in refs if owners[ref.identity] == victim]
    committed = {ref.identity: fleet.status(ref.identity).checkpoint_version for ref in moving}
    assert set(committed.values()) <= {None, 0}, committed  # nothing committed yet
    pid = _pid(fleet, victim)

    os.kill(pid, signal.SIGTERM)
    for _ in range(600):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        raise AssertionError("the host did not exit after SIGTERM")

    for ref in moving:
        status = fleet.status(ref.identity)
        assert status.checkpoint_version == 1  # checkpointed by the drain on the way out
        assert status.lease is None  # released, not left to lapse
    for ref in refs:
        assert ref.call("write", line="again") == 2  # the unsaved line survived the host's exit


@pytest.mark.timeout(180)
def test_failover_reaches_a_host_another_driver_undrained(make_fleet, storage) -> None:
    # Driver B last saw host X draining; driver A has since undrained it. When the only other
    # host freezes, B must find X again rather than wait on the frozen host (found by the chaos suite).
    control: rf.Fleet = make_fleet(hosts=2, lease_ttl=TTL)
    client = rf.connect(storage=storage, namespace=control.config.namespace, hosts=2, lease_ttl=TTL)
    refs = [client.agent(control.spawn(f"undrained/{i}", Counter).identity) for i in range(6)]
    for ref in refs:
        assert ref.call("add", n=1, idempotency_key="1") == 1
    drained = control.status(refs[0].identity).host
    assert drained is not None
    control.drain(drained)
    for ref in refs:  # B learns that X drains, and its agents move to the other host
        assert ref.call("add", n=1, idempotency_key="2") == 2
    (other,) = {info.name for info in control.hosts()} - {drained}
    assert {control.status(ref.identity).host for ref in refs} == {other}
    control.undrain(drained)

    pid = _pid(control, other)
    os.kill(pid, signal.SIGSTOP)
    try:
        answers = [ref.call("add", n=1, idempotency_key="3") for ref in refs]
        assert answers == [3] * len(refs)
        assert {control.status(ref.identity).host for ref in refs} == {drained}  # while the other is stopped
    finally:
        os.kill(pid, signal.SIGCONT)
