"""Roster loading, validation and planning."""

from __future__ import annotations

import json
import textwrap
from dataclasses import MISSING, fields
from pathlib import Path

import pytest
import yaml

from rayfleet.demo import Counter
from rayfleet.errors import InvalidSpecError
from rayfleet.identity._agent import AgentSpec
from rayfleet.identity._values import Addressability, Durability, TopologyPolicy
from rayfleet.retry import RetryPolicy
from rayfleet.roster import RosterAgent, RosterFile, roster_json_schema
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
    assert caught.value.field == "durability"


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


def test_roster_agent_carries_exactly_the_spec_fields_with_the_spec_defaults() -> None:
    spec_fields = fields(AgentSpec)
    assert list(RosterAgent.model_fields) == [item.name for item in spec_fields]
    plain = AgentSpec(identity="a", agent=COUNTER)
    for item in spec_fields:
        if item.default is MISSING and item.default_factory is MISSING:
            assert RosterAgent.model_fields[item.name].is_required()
        elif item.name == "retry":
            assert RosterAgent.model_fields["retry"].default.to_policy() == plain.retry
        else:
            assert RosterAgent.model_fields[item.name].default == getattr(plain, item.name)


def test_json_schema_is_json_and_a_roster_validated_by_the_model_gives_the_same_specs() -> None:
    schema = json.loads(json.dumps(roster_json_schema()))
    assert schema["$schema"].startswith("https://json-schema.org/") and "agents" in schema["properties"]
    assert schema == {"$schema": schema["$schema"], **RosterFile.model_json_schema()}
    agent = schema["$defs"]["RosterAgent"]
    assert agent["required"] == ["identity", "agent"] and agent["additionalProperties"] is False
    assert all(field.get("description") for field in agent["properties"].values())
    assert schema["$defs"]["Durability"]["enum"] == [member.value for member in Durability]
    roster = RosterFile.model_validate(yaml.safe_load(GOOD))
    assert [s.fingerprint() for s in roster.to_specs()] == [s.fingerprint() for s in load_roster(GOOD)]
    assert [a.to_spec().fingerprint() for a in roster.agents] == [s.fingerprint() for s in load_roster(GOOD)]


def test_the_json_schema_accepts_a_good_roster_and_refuses_an_unknown_key() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = roster_json_schema()
    jsonschema.validate(yaml.safe_load(GOOD), schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"agents": [{"identity": "a", "agent": COUNTER, "peerz": []}]}, schema)


def test_numbers_reach_the_spec_as_written() -> None:
    # 2 and 2.0 give different fingerprints; a roster must not turn one into the other.
    [spec] = load_roster(f"agents:\n  - identity: a\n    agent: {COUNTER}\n    checkpoint_interval: 2\n"
                         f"    retry: {{base_delay: 1}}\n")
    assert spec.fingerprint() == AgentSpec(identity="a", agent=COUNTER, checkpoint_interval=2,
                                           retry=RetryPolicy(base_delay=1)).fingerprint()
    assert type(spec.checkpoint_interval) is int and type(spec.retry.base_delay) is int
    with pytest.raises(InvalidSpecError, match=r"line 2 \(identity 'a'\): dedup_capacity '5': "
                                               r"Input should be a valid integer") as caught:
        load_roster(f"agents:\n  - identity: a\n    agent: {COUNTER}\n    dedup_capacity: '5'\n")
    assert caught.value.field == "dedup_capacity"


def test_wrong_types_and_nested_unknown_keys_name_the_field(tmp_path: Path) -> None:
    path = write(tmp_path, f"agents:\n  - identity: a\n    agent: {COUNTER}\n    peers: b\n"
                           f"    retry: {{tries: 3}}\n")
    with pytest.raises(InvalidSpecError) as caught:
        load_roster(path)
    message = str(caught.value)
    assert str(path) in message and "line 2 (identity 'a')" in message
    assert "unknown key(s) retry.tries. Allowed keys for retry: max_attempts, base_delay" in message
    assert "peers 'b': Input should be a list" in message
    with pytest.raises(InvalidSpecError, match=r"retry delays must satisfy"):
        load_roster(f"agents:\n  - identity: a\n    agent: {COUNTER}\n    retry: {{base_delay: 3, max_delay: 1}}\n")


def test_unknown_top_level_key(tmp_path: Path) -> None:
    path = write(tmp_path, f"version: 1\nagents:\n  - identity: a\n    agent: {COUNTER}\n")
    with pytest.raises(InvalidSpecError, match=r"roster\.yaml: unknown top-level key\(s\) version\. "
                                               r"A roster has a single top-level key, 'agents'"):
        load_roster(path)


def test_list_items_may_carry_classes_and_retry_policies() -> None:
    [spec] = load_roster([{"identity": "a", "agent": Counter, "retry": RetryPolicy(max_attempts=2), "peers": {"b"}}])
    assert spec.agent is Counter and spec.retry == RetryPolicy(max_attempts=2) and spec.peers == ("b",)
    with pytest.raises(InvalidSpecError, match=r"roster list item 0 \(identity 'a'\).*must be an rf.Agent subclass"):
        load_roster([{"identity": "a", "agent": int}])
    with pytest.raises(InvalidSpecError, match=r"roster list item 1: each agent must be a mapping"):
        load_roster([spec, "b"])
