"""Identity names, agent definitions and specs are checked when they are made."""

from __future__ import annotations

import pytest

import rayfleet as rf
from rayfleet.identity._names import (
    format_runtime_id,
    parse_runtime_id,
    validate_identity,
)


class Counter(rf.Agent):
    class State(rf.State):
        total: int = 0

    @rf.handler
    async def add(self, n: int, note: str = "") -> int:
        self.state.total += n
        return self.state.total


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("", "empty"),
        ("../x", "'..'"),
        ("a..b", "'..'"),
        ("/abs", "starts with '/'"),
        ("x" * 201, "201 characters"),
        ("bad name!", "not allowed"),
        ("tab\there", "not allowed"),
    ],
)
def test_invalid_identities_are_refused_with_the_reason(name: str, problem: str) -> None:
    with pytest.raises(rf.InvalidSpecError, match=problem) as caught:
        validate_identity(name)
    assert isinstance(caught.value, ValueError)
    assert "e.g. 'orders/eu-1'" in str(caught.value)


@pytest.mark.parametrize("name", ["orders/eu-1", "a", "x" * 200, "team.a:planner_1/v-2"])
def test_valid_identities_pass(name: str) -> None:
    assert validate_identity(name) == name


def test_non_string_identity_is_refused() -> None:
    with pytest.raises(rf.InvalidSpecError, match="must be a string"):
        validate_identity(42)


def test_runtime_ids_round_trip() -> None:
    assert format_runtime_id("orders/eu-1", 3) == "rt:orders/eu-1:3"
    assert parse_runtime_id("rt:orders/eu-1:3") == ("orders/eu-1", 3)
    with pytest.raises(rf.InvalidSpecError, match="rt:"):
        parse_runtime_id("orders/eu-1")


def test_state_must_be_an_rf_state() -> None:
    with pytest.raises(rf.InvalidSpecError, match="must subclass rf.State"):
        class Bad(rf.Agent):
            class State:  # type: ignore[no-redef]
                total = 0


def test_state_without_defaults_is_refused_by_the_spec() -> None:
    class NeedsValue(rf.Agent):
        class State(rf.State):
            required: int

    with pytest.raises(rf.InvalidSpecError, match="give every State field a default"):
        rf.AgentSpec(identity="a", agent=NeedsValue)


def test_agent_must_be_an_agent_class() -> None:
    with pytest.raises(rf.InvalidSpecError, match="rf.Agent subclass"):
        rf.AgentSpec(identity="a", agent=dict)  # type: ignore[arg-type]
    with pytest.raises(rf.InvalidSpecError, match="cannot import module"):
        rf.AgentSpec(identity="a", agent="no_such_module_xyz:Agent")
    with pytest.raises(rf.InvalidSpecError, match="package.module:ClassName"):
        rf.AgentSpec(identity="a", agent="no-colon")


def test_agent_by_import_path() -> None:
    spec = rf.AgentSpec(identity="a", agent="rayfleet.demo.agents:Counter")
    assert spec.agent_class.__name__ == "Counter"
    assert spec.agent_class_path == "rayfleet.demo.agents:Counter"


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("durability", "SOMETIMES", "durability 'SOMETIMES' is not one of"),
        ("addressability", "PUBLIC", "addressability"),
        ("topology", "mesh", "topology"),
        ("labels", ["x"], "labels must be a mapping"),
        ("labels", {"": "x"}, "label"),
        ("peers", "b", "peers must be a list"),
        ("peers", ["a"], "its own peer"),
        ("peers", ["../x"], "invalid identity"),
        ("checkpoint_interval", 0, "checkpoint_interval"),
    ],
)
def test_bad_spec_fields_name_the_field(field: str, value: object, message: str) -> None:
    with pytest.raises(rf.InvalidSpecError, match=message):
        rf.AgentSpec(identity="a", agent=Counter, **{field: value})  # type: ignore[arg-type]


def test_spec_normalises_and_fingerprints() -> None:
    first = rf.AgentSpec(identity="a", agent=Counter, durability="PERIODIC", peers=["c", "b", "b"])
    second = rf.AgentSpec(identity="a", agent=Counter, durability=rf.Durability.PERIODIC, peers=("b", "c"))
    assert first.peers == ("b", "c") and first.durability is rf.Durability.PERIODIC
    assert first.fingerprint() == second.fingerprint()
    other = rf.AgentSpec(identity="b", agent=Counter, durability="PERIODIC", peers=["c"])
    assert other.fingerprint() != first.fingerprint()
    assert first.differences(first.with_changes(labels={"x": "y"})) == ["labels"]


def test_handler_arguments_are_validated_before_the_handler_runs() -> None:
    info = Counter.__rayfleet_handlers__["add"]
    assert info.bind("c/1", (), {"n": "3"}) == {"n": 3}
    assert info.bind("c/1", (2,), {}) == {"n": 2}
    with pytest.raises(rf.InvalidArgumentsError, match="n: Input should be a valid integer"):
        info.bind("c/1", (), {"n": "abc"})
    with pytest.raises(rf.InvalidArgumentsError, match="missing a required argument: 'n'"):
        info.bind("c/1", (), {})
    with pytest.raises(rf.InvalidArgumentsError, match="unexpected keyword argument 'm'"):
        info.bind("c/1", (), {"n": 1, "m": 2})


def test_handler_decorator_misuse_fails_at_definition() -> None:
    with pytest.raises(rf.InvalidSpecError, match="thread=True"):
        @rf.handler(thread=True)
        async def nope(self: object) -> None: ...


def test_agent_attributes_outside_a_host_say_how_to_fix_it() -> None:
    with pytest.raises(rf.NotInAgentContextError, match="fleet.spawn"):
        _ = Counter().identity


def test_state_assignment_is_validated() -> None:
    agent = Counter()
    with pytest.raises(Exception, match="valid integer"):
        agent.state.total = "lots"  # type: ignore[assignment]


def test_handler_name_accepts_a_name_or_the_handler_function() -> None:
    from rayfleet.identity._handlers import handler_name

    class Greeter(rf.Agent):
        @rf.handler
        async def greet(self, who: str) -> str:
            return f"hello {who}"

        async def helper(self) -> None:
            """Not a handler: messages cannot reach it."""

    assert handler_name("greet") == "greet"
    assert handler_name(Greeter.greet) == "greet"
    for wrong in (Greeter.helper, print, 42):
        with pytest.raises(rf.InvalidSpecError, match="handler name or a @rf.handler function") as caught:
            handler_name(wrong)  # type: ignore[arg-type]
        assert caught.value.field == "method"
