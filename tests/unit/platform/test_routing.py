"""Routing decisions without a cluster: rendezvous placement and redirects."""

from __future__ import annotations

from dataclasses import dataclass

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
