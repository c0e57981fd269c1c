"""Teams on a real fleet: peer wiring from specs and rosters, enforcement, reconcile, export."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ray_helpers import kill_actor

import rayfleet as rf
from rayfleet.demo import Planner, Researcher

ROSTER = Path(__file__).resolve().parents[2] / "examples" / "team.yaml"
TEAM = ["team/planner", "team/researcher-history", "team/researcher-physics"]


@pytest.mark.timeout(120)
def test_planner_calls_its_peers_and_enforced_topology_refuses_others(fleet: rf.Fleet) -> None:
    # The planner is spawned before its peers: the edges wait, then wire when the peers arrive.
    planner = fleet.spawn("team/planner", Planner, peers=["team/r1", "team/r2"], topology="enforced")
    fleet.spawn("team/r1", Researcher, labels={"topic": "history"}, addressability="INTERNAL_ONLY")
    fleet.spawn("team/r2", Researcher, labels={"topic": "physics"}, addressability="INTERNAL_ONLY")
    fleet.spawn("team/outsider", Researcher)
    findings = planner.call("plan", question="q")
    assert sorted(findings) == ["team/r1", "team/r2"]
    assert "(history)" in findings["team/r1"] and "(physics)" in findings["team/r2"]
    refused = planner.call("ask_peer", peer="team/outsider", question="q")
    assert refused.startswith("refused:") and "not wired" in refused

    report = fleet.topology.wire("team/planner", "team/outsider")
    assert [str(edge) for edge in report.wired] == ["team/outsider -- team/planner"]
    assert "finding #1" in planner.call("ask_peer", peer="team/outsider", question="q")
    fleet.topology.unwire("team/planner", "team/outsider")
    assert planner.call("ask_peer", peer="team/outsider", question="q").startswith("refused:")
    managed = {str(live.edge) for live in fleet.topology.edges() if live.managed}
    assert managed == {"team/planner -- team/r1", "team/planner -- team/r2"}


@pytest.mark.timeout(120)
def test_wiring_survives_reset_and_host_failover(fleet: rf.Fleet) -> None:
    planner = fleet.spawn("team/planner", Planner, peers=["team/r1"], topology="enforced")
    fleet.spawn("team/r1", Researcher)
    assert list(planner.call("plan", question="a")) == ["team/r1"]
    fleet.reset("team/planner")
    assert list(planner.call("plan", question="b")) == ["team/r1"]
    owner = fleet.status("team/planner").host
    assert owner is not None
    kill_actor(owner, fleet.config.namespace)
    assert list(planner.call("plan", question="c")) == ["team/r1"]
    # Retiring a peer unwires its managed edge; respawning wires it again.
    fleet.retire("team/r1")
    assert planner.call("plan", question="d") == {}
    fleet.respawn("team/r1")
    assert list(planner.call("plan", question="e")) == ["team/r1"]


@pytest.mark.timeout(120)
def test_roster_applies_idempotently_and_prunes(fleet: rf.Fleet, tmp_path: Path) -> None:
    preview = fleet.apply(ROSTER, dry_run=True)
    assert preview.dry_run and sorted(preview.created) == TEAM and fleet.list_agents() == []
    first = fleet.apply(ROSTER)
    assert sorted(first.created) == TEAM and first.topology is not None and len(first.topology.wired) == 2
    second = fleet.apply(ROSTER)
    assert not second.changed and sorted(second.unchanged) == TEAM
    findings = fleet.agent("team/planner").call("plan", question="why?")
    assert sorted(findings) == TEAM[1:]
    with pytest.raises(rf.NotAddressableError):
        fleet.agent("team/researcher-history").call("research", question="direct?")

    smaller = tmp_path / "smaller.yaml"
    smaller.write_text(ROSTER.read_text().replace("peers: [team/researcher-history, team/researcher-physics]",
                                                   "peers: [team/researcher-history]")
                       .split("  - identity: team/researcher-physics")[0])
    changed = fleet.apply(smaller, prune=True)
    assert changed.updated == {"team/planner": ["peers"]} and changed.retired == ("team/researcher-physics",)
    assert fleet.status("team/researcher-physics").state is rf.LifecycleState.RETIRING
    assert sorted(fleet.agent("team/planner").call("plan", question="again")) == ["team/researcher-history"]
    assert not fleet.apply(smaller, prune=True).changed


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("agents:\n  - identity: a/1\n    agent: rayfleet.demo.agents:Counter\n"
         "  - identity: a/1\n    agent: rayfleet.demo.agents:Counter\n", "a/1"),
        ("agents:\n  - identity: a/1\n    agent: rayfleet.demo.agents:Nope\n", "Nope"),
        ("agents:\n  - identity: a/1\n    agent: rayfleet.demo.agents:Counter\n    peers: [a/1]\n", "own peer"),
        ("agents:\n  - identity: a/1\n    agent: rayfleet.demo.agents:Counter\n    peers: [a/ghost]\n", "a/ghost"),
        ("agents:\n  - identity: a/1\n    agent: [unclosed\n", "line"),
    ],
)
def test_bad_rosters_are_refused_whole(fleet: rf.Fleet, tmp_path: Path, body: str, message: str) -> None:
    fleet.spawn("keep/me", "rayfleet.demo.agents:Counter")
    roster = tmp_path / "bad.yaml"
    roster.write_text("agents:\n  - identity: fine/one\n    agent: rayfleet.demo.agents:Counter\n"
                      + body.removeprefix("agents:\n"))
    with pytest.raises(rf.InvalidSpecError, match=message) as caught:
        fleet.apply(roster)
    assert "bad.yaml" in str(caught.value) or message in ("a/ghost",)
    assert [status.identity for status in fleet.list_agents()] == ["keep/me"]  # nothing half-applied


@pytest.mark.timeout(120)
def test_topology_exports(fleet: rf.Fleet) -> None:
    fleet.apply(ROSTER)
    dot = fleet.topology.export("dot")
    assert "team/planner" in dot and "--" in dot
    assert "graph LR" in fleet.topology.export("mermaid")
    exported = json.loads(fleet.topology.export("json"))
    assert sorted(node["identity"] for node in exported["nodes"]) == TEAM
    assert len(exported["edges"]) == 2 and all(edge["managed"] for edge in exported["edges"])
    with pytest.raises(rf.InvalidSpecError, match="dot"):
        fleet.topology.export("png")


@pytest.mark.timeout(60)
def test_labels_select_capable_agents(fleet: rf.Fleet) -> None:
    fleet.apply(ROSTER)
    researchers = fleet.list_agents(labels={"role": "researcher"})
    assert [status.identity for status in researchers] == TEAM[1:]
    assert [status.identity for status in fleet.list_agents(labels={"topic": "physics"})] == ["team/researcher-physics"]
