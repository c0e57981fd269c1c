"""Lease holder ids: minted in one place, read back to the host that routes an identity's messages."""

from __future__ import annotations

from rayfleet.ledger._values import holder_host, holder_id


def test_a_holder_id_names_its_host_and_incarnation() -> None:
    holder = holder_id("rayfleet-host-3", "1a2b3c4d")
    assert holder == "rayfleet-host-3@1a2b3c4d"
    assert holder_host(holder) == "rayfleet-host-3"


def test_two_incarnations_of_one_host_differ_but_route_to_it() -> None:
    before, after = holder_id("rayfleet-host-0", "00000001"), holder_id("rayfleet-host-0", "00000002")
    assert before != after  # a restarted host never passes for the one before it
    assert holder_host(before) == holder_host(after) == "rayfleet-host-0"


def test_an_incarnation_containing_the_separator_keeps_the_host_name() -> None:
    assert holder_host(holder_id("rayfleet-host-1", "a@b")) == "rayfleet-host-1"
