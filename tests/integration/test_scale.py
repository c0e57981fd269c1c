"""1,000 agents across 2 hosts, each keeping its own State; concurrent first activations."""

import asyncio
import sqlite3
import time

import pytest
import ray
from ray_helpers import host_reply

import rayfleet as rf

AGENTS = 1000
CHUNK = 200
# Bounds every call so a stuck activation fails the test instead of hanging it. A
# healthy chunk of 200 first calls takes well under a second on a 2-CPU machine.
CALL_DEADLINE = 30.0


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


def number(ref: rf.AgentRef) -> int:
    return int(ref.identity.rsplit("/", 1)[1])


async def ask_in_chunks(refs: list[rf.AgentRef], method: str, *, with_n: bool) -> list[object]:
    """``ref.ask`` every ref, CHUNK at a time; stops after the first chunk with a failure.

    Failures (including timeouts) come back as values so the assertion can report them.
    """
    results: list[object] = []
    for start in range(0, len(refs), CHUNK):
        chunk = refs[start:start + CHUNK]
        calls = [
            ref.ask(method, n=number(ref), timeout=CALL_DEADLINE) if with_n
            else ref.ask(method, timeout=CALL_DEADLINE)
            for ref in chunk
        ]
        results.extend(await asyncio.gather(*calls, return_exceptions=True))
        if any(isinstance(result, BaseException) for result in results):
            break
    return results


def failures(refs: list[rf.AgentRef], results: list[object]) -> dict[str, str]:
    return {ref.identity: repr(result) for ref, result in zip(refs, results, strict=True) if isinstance(result, BaseException)}


@pytest.mark.timeout(180)
def test_thousand_agents_on_two_hosts_keep_their_own_state(any_fleet: rf.Fleet) -> None:
    fleet = any_fleet
    refs = [fleet.spawn(f"scale/{i}", Counter) for i in range(AGENTS)]
    assert all(status.state is rf.LifecycleState.UNINITIALIZED for status in fleet.list_agents())

    # Concurrent first calls: every one activates its agent (batched lease acquisition).
    added = asyncio.run(ask_in_chunks(refs, "add", with_n=True))
    failed = failures(refs, added)
    assert not failed, f"{len(failed)} of {len(added)} add calls failed, e.g. {sorted(failed.items())[:3]}"
    assert added == [number(ref) for ref in refs]

    read = asyncio.run(ask_in_chunks(refs, "get", with_n=False))
    failed = failures(refs, read)
    assert not failed, f"{len(failed)} of {len(read)} get calls failed, e.g. {sorted(failed.items())[:3]}"
    wrong = {ref.identity: value for ref, value in zip(refs, read, strict=True) if value != number(ref)}
    assert not wrong, f"{len(wrong)} agents read back another value, e.g. {sorted(wrong.items())[:3]}"

    statuses = fleet.list_agents()
    assert [status.identity for status in statuses] == sorted(ref.identity for ref in refs)
    assert all(status.state is rf.LifecycleState.ACTIVE for status in statuses)
    # Only turns that change State commit: each add once (except scale/0's, which adds 0),
    # the read-only gets never.
    versions = {status.identity: status.checkpoint_version for status in statuses}
    assert versions == {ref.identity: 1 if number(ref) else None for ref in refs}
    per_host: dict[str, int] = {}
    for status in statuses:
        assert status.host is not None
        per_host[status.host] = per_host.get(status.host, 0) + 1
    assert set(per_host) == {host.name for host in fleet.hosts()}
    assert len(per_host) == 2 and all(count > 0 for count in per_host.values()), per_host
    assert sum(stat.active_agents for stat in fleet.host_statistics()) == AGENTS


@pytest.mark.timeout(120)
def test_activation_arriving_while_a_lease_batch_is_in_flight_is_not_stranded(fleet: rf.Fleet) -> None:
    """Regression for the acquire batcher stall (fixed in 0a41c45).

    At scale the stall is timing-dependent; this makes it deterministic. Holding the
    SQLite write lock on the ledger file (the documented ``<storage>/ledger.sqlite``,
    ``fleet.ledger_location.path``) keeps the host's first batched lease acquisition in flight
    while a second activation arrives at the same host; that one must still be served
    once the ledger frees up, without any further activation to "nudge" it.
    """
    for name in ("burst/first", "burst/second", "burst/nudge"):
        fleet.spawn(name, Counter)
    host = ray.get_actor(fleet.hosts()[0].name, namespace=fleet.config.namespace)

    blocker = sqlite3.connect(fleet.ledger_location.path, isolation_level=None)
    try:
        # The ledger waits (SQLite busy timeout: 5 s) for this lock before every write.
        blocker.execute("BEGIN IMMEDIATE")
        first = host.deliver.remote("burst/first", rf.Envelope(target="burst/first", method="add", kwargs={"n": 1}))
        time.sleep(1.0)  # the first activation's lease batch is now waiting on the ledger
        assert ray.wait([first], timeout=0)[0] == []
        second = host.deliver.remote("burst/second", rf.Envelope(target="burst/second", method="add", kwargs={"n": 2}))
        time.sleep(0.5)  # ...and the second activation has queued behind it on the host
        assert ray.wait([second], timeout=0)[0] == []
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()

    assert host_reply(ray.get(first, timeout=CALL_DEADLINE)) == ("ok", 1)
    served, _ = ray.wait([second], timeout=CALL_DEADLINE)
    if not served:
        # Diagnose: a later activation on the host flushes the stranded one.
        assert host_reply(ray.get(host.deliver.remote("burst/nudge", rf.Envelope(target="burst/nudge", method="add", kwargs={"n": 3})), timeout=CALL_DEADLINE)) == ("ok", 3)
        assert host_reply(ray.get(second, timeout=CALL_DEADLINE)) == ("ok", 2)
    assert served, "the activation queued during an in-flight lease batch was only served after another activation"
    assert host_reply(ray.get(second)) == ("ok", 2)
    assert fleet.status("burst/second").state is rf.LifecycleState.ACTIVE


BULK = 3000


@pytest.mark.timeout(300)
def test_deactivate_all_drain_and_shutdown_of_thousands_report_progress_and_keep_every_state(make_fleet) -> None:
    fleet: rf.Fleet = make_fleet(hosts=2)
    refs = fleet.spawn_many(rf.AgentSpec(identity=f"bulk/{index}", agent=Counter,
                                         durability=rf.Durability.PERIODIC) for index in range(BULK))
    results = asyncio.run(ask_in_chunks(refs, "add", with_n=True))
    assert failures(refs, results) == {}
    assert sum(stats.active_agents for stats in fleet.host_statistics()) == BULK

    heard: list[tuple[int, int]] = []
    report = fleet.deactivate_all(progress=lambda done, total: heard.append((done, total)))
    assert (report.hosts, report.deactivated, report.remaining) == (2, BULK, 0)
    assert heard and heard[-1] == (BULK, BULK) and [d for d, _ in heard] == sorted(d for d, _ in heard)
    assert sum(stats.active_agents for stats in fleet.host_statistics()) == 0
    # PERIODIC State that was never committed before is committed by the deactivation: nothing lost.
    results = asyncio.run(ask_in_chunks(refs, "get", with_n=False))
    assert results == [number(ref) for ref in refs]

    busiest = max(fleet.host_statistics(), key=lambda stats: stats.active_agents)
    moved: list[tuple[int, int]] = []
    drained = fleet.drain(busiest.host, progress=lambda done, total: moved.append((done, total)))
    assert drained.checkpointed == busiest.active_agents and drained.released_unsaved == 0
    assert not drained.timed_out and moved[-1] == (busiest.active_agents,) * 2
    fleet.undrain(busiest.host)

    results = asyncio.run(ask_in_chunks(refs, "add", with_n=True))
    assert results == [2 * number(ref) for ref in refs]
    stopped = fleet.shutdown(stop_actors=True, progress=lambda done, total: None)
    assert stopped is not None and stopped.deactivated == BULK and stopped.remaining == 0
