"""Roster loading, validation and planning."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from rayfleet.errors import InvalidSpecError
from rayfleet.identity._spec import AgentSpec
from rayfleet.identity._values import Addressability, Durability, TopologyPolicy
from rayfleet.roster._roster import (
    RosterChange,
    load_roster,
    plan_roster,
    validate_roster,
)

COUNTER = "rayfleet.demo.agents:Counter"

GOOD = f"""\
agents:
  - identity: team/planner
    agent: {COUNTER}
    labels: {{role: planner}}
    peers: [team/researcher-1]
    topology: enforced
    addressability: INTERNAL_ONLY
    durability: PERIODIC
    checkpoint_interval: 2.5
    display_name: Planner
    context: {{anything: here}}
    retry: {{max_attempts: 2}}
  - identity: team/researcher-1
    agent: {COUNTER}
"""


def write(tmp_path: Path, text: str, name: str = "roster.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_load_roster_from_file_text_and_list(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    specs = load_roster(path)
    assert [spec.identity for spec in specs] == ["team/planner", "team/researcher-1"]
    planner = specs[0]
    assert planner.agent == COUNTER and planner.labels == {"role": "planner"}
    assert planner.peers == ("team/researcher-1",)
    assert planner.topology is TopologyPolicy.ENFORCED
    assert planner.addressability is Addressability.INTERNAL_ONLY
    assert planner.durability is Durability.PERIODIC
    assert planner.checkpoint_interval == 2.5 and planner.display_name == "Planner"
    assert planner.context == {"anything": "here"} and planner.retry.max_attempts == 2
    assert specs[1].topology is TopologyPolicy.OPEN
    validate_roster(specs)
    assert [s.fingerprint() for s in load_roster(str(path))] == [s.fingerprint() for s in specs]
    assert [s.fingerprint() for s in load_roster(GOOD)] == [s.fingerprint() for s in specs]
    from_list = load_roster([specs[0], {"identity": "team/researcher-1", "agent": COUNTER}])
    assert [s.fingerprint() for s in from_list] == [s.fingerprint() for s in specs]


def test_duplicate_identity_names_identity_and_both_lines(tmp_path: Path) -> None:
    path = write(tmp_path, f"""\
        agents:
          - identity: a
            agent: {COUNTER}
          - identity: b
            agent: {COUNTER}
          - identity: a
            agent: {COUNTER}
        """)
    with pytest.raises(InvalidSpecError) as caught:
        load_roster(path)
    message = str(caught.value)
    assert "'a'" in message and "line 2" in message and "line 6" in message and str(path) in message


def test_unknown_agent_class_keeps_import_message_and_adds_line(tmp_path: Path) -> None:
    path = write(tmp_path, f"""\
        agents:
          - identity: ok
            agent: {COUNTER}
          - identity: broken
            agent: no_such_pkg.mod:Thing
        """)
    with pytest.raises(InvalidSpecError, match=r"line 4 \(identity 'broken'\).*cannot import module 'no_such_pkg.mod'"):
        load_roster(path)
    with pytest.raises(InvalidSpecError, match="has no 'Nope'"):
        load_roster([{"identity": "x", "agent": "rayfleet.demo.agents:Nope"}])


def test_self_edge_in_peers(tmp_path: Path) -> None:
    path = write(tmp_path, f"agents:\n  - identity: a\n    agent: {COUNTER}\n    peers: [a]\n")
    with pytest.raises(InvalidSpecError, match=r"roster.yaml line 2 \(identity 'a'\).*own peer"):
        load_roster(path)


def test_missing_peer_is_reported_by_validate_roster(tmp_path: Path) -> None:
    specs = load_roster(write(tmp_path, f"agents:\n  - identity: a\n    agent: {COUNTER}\n    peers: [ghost]\n"))
    with pytest.raises(InvalidSpecError, match="'a'.*'ghost'.*Add 'ghost' to the roster or spawn it first"):
        validate_roster(specs)
    validate_roster(specs, existing={"ghost"})


def test_validate_roster_duplicates() -> None:
    spec = AgentSpec(identity="dup", agent=COUNTER)
    with pytest.raises(InvalidSpecError, match="duplicate identity in roster: 'dup'"):
        validate_roster([spec, spec])


def test_invalid_yaml_names_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, f"agents:\n  - identity: a\n    agent: {COUNTER}\n    peers: [b\n  - x: y\n")
    with pytest.raises(InvalidSpecError, match=r"roster\.yaml line \d+, column \d+: invalid YAML") as caught:
        load_roster(path)
    assert str(path) in str(caught.value)
    with pytest.raises(InvalidSpecError, match=r"<roster text> line 3, column 1: invalid YAML \(found character"):
        load_roster("agents:\n  - identity: a\n\tagent: x\n")


def test_unknown_key_lists_allowed_keys(tmp_path: Path) -> None:
    path = write(tmp_path, f"agents:\n  - identity: a\n    agent: {COUNTER}\n  - identity: b\n    agent: {COUNTER}\n"
                           f"    peerz: [a]\n")
    with pytest.raises(InvalidSpecError, match=r"line 4 \(identity 'b'\): unknown key\(s\) peerz.*Allowed keys: "
                                               r"identity, agent, addressability"):
        load_roster(path)


@pytest.mark.parametrize("text", ["- identity: a\n", "agents: {a: 1}\n", "other: []\n", "\n"])
def test_wrong_top_level_shape(tmp_path: Path, text: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(InvalidSpecError, match=r"roster\.yaml: the top level must be a mapping with an 'agents' list"):
        load_roster(path)


def test_item_not_a_mapping_and_missing_keys(tmp_path: Path) -> None:
    with pytest.raises(InvalidSpecError, match=r"line 2: each agent must be a mapping"):
        load_roster(write(tmp_path, "agents:\n  - just-a-name\n"))
    with pytest.raises(InvalidSpecError, match=r"line 2 \(identity 'a'\): missing required key\(s\) agent"):
        load_roster(write(tmp_path, "agents:\n  - identity: a\n"))


def test_bad_field_value_is_wrapped(tmp_path: Path) -> None:
    path = write(tmp_path, f"agents:\n  - identity: a\n    agent: {COUNTER}\n    durability: SOMETIMES\n")
    with pytest.raises(InvalidSpecError, match=r"line 2 \(identity 'a'\).*durability 'SOMETIMES'") as caught:
        load_roster(path)
    assert getattr(caught.value, "subject", None) == "durability"


def test_missing_file_and_bad_source(tmp_path: Path) -> None:
    with pytest.raises(InvalidSpecError, match="cannot read roster file"):
        load_roster(str(tmp_path / "absent.yaml"))
    with pytest.raises(InvalidSpecError, match="does not exist"):
        load_roster("absent-roster")


def test_plan_roster_create_update_unchanged_prune() -> None:
    a = AgentSpec(identity="a", agent=COUNTER)
    b = AgentSpec(identity="b", agent=COUNTER, labels={"role": "x"})
    b2 = b.with_changes(labels={"role": "y"}, display_name="B")
    c = AgentSpec(identity="c", agent=COUNTER)
    current = {"a": a, "b": b, "old": AgentSpec(identity="old", agent=COUNTER)}
    change = plan_roster([a, b2, c], current, prune=True)
    assert change == RosterChange(create=(c,), update=((b2, ["labels", "display_name"]),), unchanged=("a",),
                                  prune=("old",))
    assert plan_roster([a, b2, c], current, prune=False).prune == ()
    assert plan_roster([a, b], {"a": a, "b": b}, prune=True).is_empty
    with pytest.raises(InvalidSpecError, match="duplicate identity in roster: 'a'"):
        plan_roster([a, a], {}, prune=False)
