"""Routing decisions without a cluster: rendezvous placement and redirects."""

from __future__ import annotations

from dataclasses import dataclass

from rayfleet.ledger._values import LeaseView
from rayfleet.platform._routing import (
    REDIRECT,
    CallPlan,
    HostDirectory,
    rendezvous_pick,
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
