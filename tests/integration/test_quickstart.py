"""The README quickstart, end to end: a Counter survives the death of its host."""

import asyncio
import time

import pytest
from agents import Counter
from ray_helpers import kill_actor

import rayfleet as rf


@pytest.mark.timeout(120)
def test_counter_survives_killing_its_host(any_fleet: rf.Fleet) -> None:
    fleet = any_fleet
    alice = fleet.spawn("counter/alice", Counter)
    assert fleet.status("counter/alice").state is rf.LifecycleState.UNINITIALIZED

    assert alice.call("add", n=2) == 2

    before = fleet.status("counter/alice")
    assert before.state is rf.LifecycleState.ACTIVE
    assert before.generation == 0
    assert before.checkpoint_version == 1  # EVERY_TURN: committed before the reply
    assert before.lease is not None and before.host is not None
    assert before.host in {host.name for host in fleet.hosts()}

    kill_actor(before.host, fleet.config.namespace)

    # The next call re-routes to the surviving host, which loads the last snapshot.
    assert alice.call("add", n=3) == 5

    after = fleet.status("counter/alice")
    assert after.state is rf.LifecycleState.ACTIVE
    assert after.generation == 0
    assert after.checkpoint_version == 2
    assert after.lease is not None
    assert after.lease.fencing_token > before.lease.fencing_token
    assert after.host is not None and after.host != before.host
    assert after.runtime_id == before.runtime_id == "rt:counter/alice:0"
    assert after.session_id == before.session_id
    # The dead host is gone from the fleet's host list.
    assert [host.name for host in fleet.hosts()] == [after.host]


def test_ask_and_tell(fleet: rf.Fleet) -> None:
    ref = fleet.spawn("counter/bob", Counter)
    assert asyncio.run(ref.ask("add", n=2)) == 2
    ref.tell("add", n=5)  # returns at once; the turn runs on the owner
    deadline = time.monotonic() + 20
    while (checkpoint := fleet.status("counter/bob").checkpoint_version) != 2:
        assert time.monotonic() < deadline, f"the told turn was not committed (version {checkpoint})"
        time.sleep(0.05)
    assert ref.call("add", n=0) == 7


@pytest.mark.timeout(60)
def test_a_handler_can_be_named_by_the_function_itself(fleet: rf.Fleet) -> None:
    ref = fleet.spawn("counter/typed", Counter)
    assert ref.call(Counter.add, n=2) == 2
    assert asyncio.run(ref.ask(Counter.add, n=3)) == 5
    with pytest.raises(rf.InvalidSpecError, match="handler name or a @rf.handler function") as caught:
        ref.call(print, n=1)
    assert caught.value.field == "method"
    assert ref.call("add", n=0) == 5  # the refused call changed nothing
