"""A zombie host (partitioned, but alive with the agent in memory) cannot commit stale State."""

import pytest
import ray
from ray_helpers import host_reply

import rayfleet as rf


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


@pytest.mark.timeout(120)
def test_zombie_host_commit_is_refused_after_another_host_takes_over(make_any_fleet) -> None:
    # A long TTL keeps the zombie's background renewal (every TTL/3 = 20 s) from noticing
    # the revocation during the test: the zombie must believe its in-memory lease is healthy.
    fleet: rf.Fleet = make_any_fleet(lease_ttl=60.0)
    identity = "zombie/counter"
    ref = fleet.spawn(identity, Counter)
    assert ref.call("add", n=1) == 1

    first = fleet.status(identity)
    assert first.state is rf.LifecycleState.ACTIVE and first.checkpoint_version == 1
    assert first.lease is not None
    hosts = {view.name: view for view in fleet.hosts()}
    assert len(hosts) == 2 and first.host in hosts
    name_a = first.host
    (name_b,) = set(hosts) - {name_a}
    host_a = ray.get_actor(name_a, namespace=fleet.config.namespace)
    host_b = ray.get_actor(name_b, namespace=fleet.config.namespace)

    # Simulate a partition: the ledger forgets A's leases while A keeps running.
    # fleet._ledger is the typed ledger client (the one private hook this suite uses):
    # revoke_holder is what the fleet does for a host it believes dead.
    freed = fleet._ledger.revoke_holder(hosts[name_a].holder).result()
    assert identity in freed

    # B takes over: a new, larger token, loading the committed State (1).
    kind, value = host_reply(ray.get(host_b.deliver.remote(identity, rf.Envelope(target=identity, method="add", kwargs={"n": 10}))))
    assert (kind, value) == ("ok", 11)
    taken = fleet.status(identity)
    assert taken.host == name_b
    assert taken.lease is not None and taken.lease.fencing_token > first.lease.fencing_token
    assert taken.checkpoint_version == 2

    # A still has the agent (State 1) in memory and runs the turn, but its commit
    # presents the superseded token and must be refused.
    kind, error = host_reply(ray.get(host_a.deliver.remote(identity, rf.Envelope(target=identity, method="add", kwargs={"n": 100}))))
    assert kind == "error"
    assert isinstance(error, rf.LeaseLostError), error
    assert error.identity == identity
    assert "stale" in str(error)

    # A counted the refusal and dropped the agent.
    stats = {stat.host: stat for stat in fleet.host_statistics()}
    assert stats[name_a].stale_refusals == 1 and stats[name_a].leases_lost == 1
    assert stats[name_a].active_agents == 0 and stats[name_b].stale_refusals == 0

    # The committed record is B's write, not A's.
    committed = fleet.status(identity)
    assert committed.checkpoint_version == 2
    assert committed.host == name_b
    assert committed.lease is not None and committed.lease.fencing_token == taken.lease.fencing_token

    # A dropped the agent when its commit was refused; it now points callers at B.
    assert host_reply(ray.get(host_a.deliver.remote(identity, rf.Envelope(target=identity, method="get", kwargs={})))) == ("redirect", name_b)
    assert host_reply(ray.get(host_a.deliver.remote(identity, rf.Envelope(target=identity, method="add", kwargs={"n": 1000})))) == ("redirect", name_b)

    # Through the fleet (whose cached route still names A): A redirects, B answers.
    assert ref.call("get") == 11
    # Reload from storage to check the committed snapshot itself, not B's memory.
    assert fleet.deactivate(identity) is True
    assert fleet.status(identity).state is rf.LifecycleState.DORMANT
    assert ref.call("get") == 11

