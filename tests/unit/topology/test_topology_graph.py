"""Edges, the desired graph and peer lookups."""

from __future__ import annotations

import pytest

from rayfleet.errors import InvalidSpecError
from rayfleet.identity._agent import AgentSpec
from rayfleet.topology import Edge, desired_edges, peers_of

COUNTER = "rayfleet.demo.agents:Counter"


def test_edge_of_is_canonical_and_order_free() -> None:
    assert Edge.of("team/b", "team/a") == Edge.of("team/a", "team/b") == Edge(a="team/a", b="team/b")
    assert str(Edge.of("x:1", "a.b-c")) == "a.b-c -- x:1"


def test_edge_refuses_self_edge_naming_identity() -> None:
    with pytest.raises(InvalidSpecError, match="'team/a'.*itself"):
        Edge.of("team/a", "team/a")


def test_edge_refuses_non_canonical_and_invalid_identities() -> None:
    with pytest.raises(InvalidSpecError, match="Edge.of"):
        Edge(a="z", b="a")
    with pytest.raises(InvalidSpecError, match="invalid identity"):
        Edge.of("ok", "bad name")
    with pytest.raises(InvalidSpecError):
        Edge.of("ok", 3)  # type: ignore[arg-type]


def test_edge_other() -> None:
    edge = Edge.of("a", "b")
    assert edge.other("a") == "b" and edge.other("b") == "a"
    with pytest.raises(ValueError, match="not an endpoint"):
        edge.other("c")


def test_desired_edges_unions_peers_and_explicit() -> None:
    specs = [
        AgentSpec(identity="a", agent=COUNTER, peers=("b", "c")),
        AgentSpec(identity="b", agent=COUNTER, peers=("a",)),
    ]
    edges = desired_edges(specs, [Edge.of("d", "c"), ("e", "a")])  # type: ignore[list-item]
    assert edges == {Edge.of("a", "b"), Edge.of("a", "c"), Edge.of("c", "d"), Edge.of("a", "e")}
    assert desired_edges([]) == frozenset()
    with pytest.raises(InvalidSpecError, match="explicit edge"):
        desired_edges([], ["a--b"])  # type: ignore[list-item]


def test_peers_of_sorted() -> None:
    edges = [Edge.of("m", "z"), Edge.of("a", "m"), Edge.of("b", "c")]
    assert peers_of("m", edges) == ("a", "z")
    assert peers_of("q", edges) == ()
