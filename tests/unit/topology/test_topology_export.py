"""Topology exports: DOT, Mermaid, JSON."""

from __future__ import annotations

import json

import pytest

from rayfleet.errors import InvalidSpecError
from rayfleet.topology import Edge, export_topology

NODES = {"team/planner": "ACTIVE", "team/researcher-1": "DORMANT", "svc:x.y": "ACTIVE"}
MANAGED = Edge.of("team/planner", "team/researcher-1")
UNMANAGED = Edge.of("svc:x.y", "team/planner")


def test_dot() -> None:
    text = export_topology(NODES, [MANAGED, UNMANAGED], managed={MANAGED}, fmt="dot")
    assert text.startswith("graph rayfleet {")
    assert text.rstrip().endswith("}")
    assert '"team/planner" [label="team/planner\\nACTIVE"];' in text
    assert '"team/planner" -- "team/researcher-1";' in text
    assert '"svc:x.y" -- "team/planner" [style=dashed];' in text


def test_mermaid() -> None:
    text = export_topology(NODES, [MANAGED, UNMANAGED], managed={MANAGED}, fmt="mermaid")
    lines = text.splitlines()
    assert lines[0] == "graph LR"
    ids = {}
    for line in lines[1:]:
        if "[" in line:
            node_id, label = line.strip().split("[", 1)
            assert node_id.isidentifier()
            ids[label.split("<br/>")[0].strip('"')] = node_id
    assert set(ids) == set(NODES)
    assert f"  {ids['team/planner']} --- {ids['team/researcher-1']}" in lines
    assert f"  {ids['svc:x.y']} -.- {ids['team/planner']}" in lines
    assert '"team/researcher-1<br/>DORMANT"' in text


def test_json_is_sorted_and_stable() -> None:
    text = export_topology(NODES, [UNMANAGED, MANAGED, MANAGED], managed={MANAGED}, fmt="json")
    document = json.loads(text)
    assert [node["identity"] for node in document["nodes"]] == sorted(NODES)
    assert document["nodes"][0] == {"identity": "svc:x.y", "state": "ACTIVE"}
    assert document["edges"] == [
        {"a": "svc:x.y", "b": "team/planner", "managed": False},
        {"a": "team/planner", "b": "team/researcher-1", "managed": True},
    ]
    assert text == export_topology(dict(reversed(list(NODES.items()))), [MANAGED, UNMANAGED],
                                   managed=[MANAGED], fmt="json")


def test_edge_endpoint_without_node_is_unknown() -> None:
    document = json.loads(export_topology({}, [Edge.of("a", "b")], fmt="json"))
    assert document["nodes"] == [{"identity": "a", "state": "UNKNOWN"}, {"identity": "b", "state": "UNKNOWN"}]


def test_unknown_format_lists_formats() -> None:
    with pytest.raises(InvalidSpecError, match="'svg'.*dot, json, mermaid"):
        export_topology(NODES, [], fmt="svg")
