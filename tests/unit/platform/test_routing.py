"""Routing decisions without a cluster: rendezvous placement and redirects."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from ray.exceptions import ActorUnavailableError, ActorUnschedulableError

import rayfleet as rf
from rayfleet.ledger._values import LeaseView
from rayfleet.platform._replies import REDIRECT
from rayfleet.platform._routing import (
    MAX_HOPS,
    CallPlan,
    HostDirectory,
    next_probe,
    rendezvous_pick,
    routing_patience_for,
)


@dataclass
class HostRow:
    name: str
    holder: str
    draining: bool = False


def directory(*names: str, draining: tuple[str, ...] = ()) -> HostDirectory:
    hosts = HostDirectory("ns")
    hosts.update([HostRow(name, f"{name}@1", name in draining) for name in names])
    return hosts


def test_rendezvous_is_stable_and_moves_only_what_it_must() -> None:
    identities = [f"agent/{index}" for index in range(300)]
    before = {i: rendezvous_pick(i, ["h0", "h1", "h2"]) for i in identities}
    after = {i: rendezvous_pick(i, ["h0", "h1"]) for i in identities}
    moved = [i for i in identities if before[i] != after[i]]
    assert moved and all(before[i] == "h2" for i in moved)  # only h2's identities move
    assert {before[i] for i in identities} == {"h0", "h1", "h2"}
    assert rendezvous_pick("x", []) is None


def test_draining_and_dead_hosts_are_not_picked() -> None:
    hosts = directory("h0", "h1", draining=("h1",))
    assert {hosts.pick(f"a/{i}") for i in range(50)} == {"h0"}
    hosts.mark_dead("h0")
    assert hosts.candidates() == []


def test_redirect_to_an_unknown_host_refreshes_the_directory() -> None:
    plan = CallPlan(directory("h0"), "a/1")
    done, _ = plan.on_reply("h0", (REDIRECT, "h1"))
    assert not done and plan.needs_refresh
    known = CallPlan(directory("h0", "h1"), "a/1")
    known.on_reply("h0", (REDIRECT, "h1"))
    assert not known.needs_refresh and known.directory.pick("a/1") == "h1"


def test_a_lapse_seen_by_a_retry_fails_over_though_the_retry_never_saw_the_lease() -> None:
    # The chaos run's 8 s freezes: a caller's first attempt saw the frozen host hold the
    # lease and timed out (2 s) before the lease lapsed (3 s); its retry, a new plan, found
    # no lease and took the host for one still activating, so every retry waited out the
    # freeze instead of failing over.
    hosts = directory("h0", "h1")
    lease = LeaseView(holder="h0@1", fencing_token=4, ttl=3.0, expires_in=1.0)
    first = CallPlan(hosts, "a/1")
    assert first.on_probe("h0", lease, waited=0.75, patience=3.0)  # held: keep waiting
    retry = CallPlan(hosts, "a/1")
    assert not retry.on_probe("h0", None, waited=0.75, patience=3.0)  # lapsed: fail over now
    assert hosts.pick("a/1") == "h1"


def test_a_host_that_never_held_the_lease_gets_its_patience() -> None:
    hosts = directory("h0", "h1")
    plan = CallPlan(hosts, "a/2")
    assert plan.on_probe("h0", None, waited=0.75, patience=3.0)  # may still be activating
    assert not plan.on_probe("h0", None, waited=3.1, patience=3.0)
    # A reply from the host clears what was seen: a later activation there gets patience again.
    seen = CallPlan(hosts, "a/3")
    seen.on_probe("h1", LeaseView(holder="h1@1", fencing_token=1, ttl=3.0, expires_in=2.0), waited=0.75, patience=3.0)
    seen.on_reply("h1", ("ok", 1))
    assert CallPlan(hosts, "a/3").on_probe("h1", None, waited=0.75, patience=3.0)

def test_retries_that_find_no_lease_on_a_host_share_its_patience() -> None:
    # A host that never held the identity's lease gets one TTL of patience to activate it.
    # A caller whose timeout (2 s) is shorter retries with a new request, whose patience
    # began anew: an identity routed to a frozen host on which it held no lease (its route
    # cached, the host not suspected) waited out the whole freeze, retry after retry.
    clock = Clock()
    hosts = directory("h0", "h1")
    first = CallPlan(hosts, "a/4", clock=clock)
    clock.now += 1.5
    assert first.on_probe("h0", None, waited=1.5, patience=3.0)  # may still be activating
    clock.now += 0.7  # the caller gave up at 2 s and asks again
    retry = CallPlan(hosts, "a/4", clock=clock)
    clock.now += 0.75
    assert retry.on_probe("h0", None, waited=0.75, patience=3.0)  # 2.95 s since the first began
    clock.now += 0.1
    assert not retry.on_probe("h0", None, waited=0.85, patience=3.0)  # 3.05 s: the host looks frozen
    assert hosts.pick("a/4") == "h1"
    # Requests further apart than the patience are not one wait; nor is one at another host.
    clock.now += 10.0
    assert CallPlan(hosts, "a/4", clock=clock).on_probe("h1", None, waited=2.9, patience=3.0)
    clock.now += 3.5
    assert CallPlan(hosts, "a/4", clock=clock).on_probe("h1", None, waited=0.75, patience=3.0)
    # A reply ends the wait: the next activation there gets its patience again.
    answered = CallPlan(hosts, "a/4", clock=clock)
    clock.now += 0.75
    assert answered.on_probe("h1", None, waited=2.9, patience=3.0)
    answered.on_reply("h1", ("ok", 1))
    clock.now += 0.1
    assert CallPlan(hosts, "a/4", clock=clock).on_probe("h1", None, waited=0.5, patience=3.0)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_an_unreachable_owner_does_not_exhaust_a_request_before_its_lease_can_lapse() -> None:
    # The owner's node died; Ray restarts it elsewhere, and until then every send to it
    # fails at once as unavailable. Its leases hold for up to a TTL, so no other host can
    # take its identities sooner: quick hops must not use up the request meanwhile.
    clock = Clock()
    hosts = directory("h0")
    hosts._handles["h0"] = object()  # a handle needs a cluster; routing decisions do not
    plan = CallPlan(hosts, "a/1", patience=routing_patience_for(10.0), clock=clock)
    for _ in range(4 * MAX_HOPS):  # many more hops than MAX_HOPS, within 16 s
        name, _ = plan.target()
        plan.on_failure(name, ActorUnavailableError("connection lost", None))
        clock.now += 0.5
    assert name == "h0" and plan.needs_refresh
    clock.now += 5.0  # 21 s in: two TTLs have passed and the owner still cannot be reached
    with pytest.raises(rf.FleetUnavailableError, match="gave up routing 'a/1' after 32 hops in 21.0 s"):
        plan.target()


def test_a_request_gets_max_hops_however_fast_they_go() -> None:
    clock = Clock()
    hosts = directory("h0", "h1")
    hosts._handles.update({"h0": object(), "h1": object()})
    plan = CallPlan(hosts, "a/1", patience=0.0, clock=clock)
    for _ in range(MAX_HOPS):
        name, _ = plan.target()
        plan.on_reply(name, (REDIRECT, "h1" if name == "h0" else "h0"))  # two hosts that disagree
    with pytest.raises(rf.FleetUnavailableError, match=f"after {MAX_HOPS} hops"):
        plan.target()


def lease(holder: str) -> LeaseView:
    return LeaseView(holder=holder, fencing_token=3, ttl=10.0, expires_in=9.0)


def test_an_owner_that_lets_its_lease_lapse_is_failed_over_at_once() -> None:
    plan = CallPlan(directory("h0", "h1"), "a/1")
    assert plan.on_probe("h0", lease("h0@1"), waited=1.0, patience=10.0)
    assert plan.lapsed_while_held("h0", None)
    # Frozen: the same incarnation is still registered, and it let the lease lapse.
    assert not plan.on_probe("h0", None, waited=2.0, patience=10.0, holder_now="h0@1")
    assert plan.directory.pick("a/1") == "h1"  # passed over while suspect


def test_an_owner_that_ray_restarted_is_waited_for_like_a_host_activating() -> None:
    # Its node died; the new incarnation freed the old one's leases when it registered,
    # and Ray hands it the waiting request: no failover, and it gets a full patience.
    plan = CallPlan(directory("h0", "h1"), "a/1")
    assert plan.on_probe("h0", lease("h0@1"), waited=1.0, patience=10.0)
    assert plan.on_probe("h0", None, waited=2.0, patience=10.0, holder_now="h0@2")
    assert not plan.lapsed_while_held("h0", None)
    assert plan.on_probe("h0", None, waited=11.0, patience=10.0)  # 9 s since it was seen restarted
    assert plan.on_probe("h0", lease("h0@2"), waited=11.5, patience=10.0)  # activated: waited for
    assert not plan.on_probe("h0", None, waited=12.5, patience=10.0, holder_now="h0@2")  # then lapsed: frozen


def test_a_host_whose_node_is_gone_is_dead_and_reported_with_its_holder() -> None:
    # Hosts are pinned to their node; Ray answers "unschedulable" once that node is gone.
    hosts = directory("h0", "h1")
    plan = CallPlan(hosts, "a/1")
    plan.on_failure("h0", ActorUnschedulableError("the node specified via NodeAffinitySchedulingStrategy is gone"))
    assert plan.dead_hosts == [("h0", "h0@1")]  # removed from the ledger, which frees its leases
    assert plan.needs_refresh and hosts.candidates() == ["h1"]


def test_a_host_ray_is_restarting_is_failed_over_and_its_lease_freed() -> None:
    hosts = directory("h0", "h1")
    plan = CallPlan(hosts, "a/1")
    assert not plan.on_probe("h0", lease("h0@1"), waited=1.0, patience=10.0, restarting=True)
    assert plan.dead_hosts == [("h0", "h0@1")]
    assert plan.needs_refresh and hosts.pick("a/1") == "h1"
    # Restarting, but the lease is another host's: simply re-sent there.
    other = CallPlan(directory("h0", "h1"), "a/2")
    assert not other.on_probe("h0", lease("h1@1"), waited=1.0, patience=10.0, restarting=True)
    assert other.dead_hosts == [] and other.directory.pick("a/2") == "h1"


def test_no_registered_host_is_waited_for_within_the_routing_patience() -> None:
    # A one-host fleet whose host Ray is restarting: the router removed the dead
    # incarnation from the ledger before the new one registered, so for a moment no host
    # is registered. That moment must be waited out, not answered with "no live host".
    clock = Clock()
    plan = CallPlan(directory(), "a/1", patience=routing_patience_for(3.0), clock=clock)
    assert plan.target() is None and plan.needs_refresh
    clock.now += routing_patience_for(3.0)
    with pytest.raises(rf.FleetUnavailableError, match="no live rayfleet host"):
        plan.target()


def test_a_waiting_request_probes_again_as_its_hosts_lease_would_lapse_unrenewed() -> None:
    def lease(expires_in: float) -> LeaseView:
        return LeaseView(holder="h1@x", fencing_token=3, ttl=5.0, expires_in=expires_in)

    # A lease renewed lately lasts longer than the interval: the pace of a long turn's probes.
    assert next_probe(1.0, lease(4.2)) == 1.0
    # One about to lapse (its host stopped renewing: frozen): looked at again right after it would.
    assert next_probe(1.0, lease(0.3)) == pytest.approx(0.35)
    assert next_probe(1.0, lease(-0.1)) == pytest.approx(0.05)
    assert next_probe(1.0, None) == 1.0


async def test_requests_failing_over_together_share_the_host_reads_and_each_dead_host_is_removed_once() -> None:
    import asyncio

    from rayfleet.ledger._values import HostInfo
    from rayfleet.platform._routing import Courier

    class CountingLedger:
        """The two ledger calls a refresh makes, counted; each read takes a while, as under load."""

        def __init__(self) -> None:
            self.reads = 0
            self.removals: list[tuple[str, str | None]] = []

        async def hosts(self) -> list[HostInfo]:
            self.reads += 1
            await asyncio.sleep(0.01)
            return [HostInfo(name="h2", holder="h2@b", started_at=0.0, draining=False)]

        async def remove_host(self, *, name: str, holder: str | None = None) -> list[str]:
            self.removals.append((name, holder))
            await asyncio.sleep(0.01)  # a write: the others asking meanwhile must not write it again
            return []

    ledger = CountingLedger()
    courier = Courier(HostDirectory("ns"), ledger)  # type: ignore[arg-type]
    plans = []
    for index in range(200):
        plan = CallPlan(courier.directory, f"a/{index}")
        plan.dead_hosts.append(("h1", "h1@a"))
        plan.needs_refresh = True
        plans.append(plan)
    await asyncio.gather(*(courier.refresh_async(plan) for plan in plans))
    assert ledger.removals == [("h1", "h1@a")]
    assert 1 <= ledger.reads <= 2  # before: one read per request
    assert courier.directory.names == ["h2"] and not any(plan.needs_refresh for plan in plans)
    # A request asking after those reads ended gets a read of its own (it may be news to it).
    before = ledger.reads
    await courier.refresh_async()
    assert ledger.reads == before + 1


async def test_requests_waiting_on_one_host_ask_about_their_leases_together() -> None:
    # A frozen host with a thousand requests waiting on it had each ask the ledger about
    # its own lease once a probe interval: a thousand reads queued in the ledger, and the
    # last requests saw the lapse long after the first.
    import asyncio
    import time

    from rayfleet.platform._routing import _TIMED_OUT, Courier

    class CountingLedger:
        def __init__(self) -> None:
            self.reads: list[int] = []

        async def leases(self, identities: list[str]) -> dict[str, LeaseView | None]:
            self.reads.append(len(identities))
            await asyncio.sleep(0.005)
            # Held by the host and renewed: each request keeps waiting, probing every 0.1 s.
            return dict.fromkeys(identities, LeaseView(holder="h1@a", fencing_token=1, ttl=5.0, expires_in=4.0))

    ledger = CountingLedger()
    courier = Courier(HostDirectory("ns"), ledger, lease_ttl=0.4)  # type: ignore[arg-type]
    courier.directory._handles["h1"] = object()  # only asked whether Ray is restarting it: no
    loop = asyncio.get_running_loop()
    deadline = time.monotonic() + 1.0
    waits = [courier._wait_async(CallPlan(courier.directory, f"a/{index}"), "h1", loop.create_future(), None,
                                 deadline) for index in range(200)]
    assert await asyncio.gather(*waits) == [_TIMED_OUT] * 200
    assert sum(ledger.reads) >= 200  # every request probed
    assert sum(ledger.reads) >= 20 * len(ledger.reads)  # before: one identity per read


async def test_a_callers_timeout_longer_than_the_routing_patience_bounds_the_routing() -> None:
    # A one-host fleet whose host Ray restarts has no registered host until the new process
    # registers, which on a loaded machine took longer than two lease TTLs: a caller that
    # said it would wait 60 s got "gave up routing ... (hosts: none)" after 6.3 s.
    import ray

    from rayfleet.ledger._local import Completed
    from rayfleet.ledger._values import HostInfo
    from rayfleet.platform._routing import Courier, deliver_request

    class NoHosts:
        def hosts(self) -> Completed[list[HostInfo]]:
            return Completed([])

    class AsyncNoHosts:
        async def hosts(self) -> list[HostInfo]:
            return []

    envelope = rf.Envelope(target="a/1", method="add", kwargs={})
    courier = Courier(HostDirectory("ns"), NoHosts(), lease_ttl=0.02)  # type: ignore[arg-type]
    with pytest.raises(ray.exceptions.GetTimeoutError, match="within the timeout"):
        courier.route_sync("a/1", deliver_request(envelope), method="add", timeout=0.5)
    with pytest.raises(rf.FleetUnavailableError, match="gave up routing|no live rayfleet host"):
        courier.route_sync("a/1", deliver_request(envelope), method="add")  # no timeout: the patience

    waiting = Courier(HostDirectory("ns"), AsyncNoHosts(), lease_ttl=0.02)  # type: ignore[arg-type]
    with pytest.raises(rf.DeadlineExceededError):
        await waiting.route_async("a/1", deliver_request(envelope), method="add", timeout=0.5)
