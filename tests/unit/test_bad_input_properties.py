"""Bad input at every boundary, generated: refusals are typed and explained, valid input is accepted.

For each boundary (identity names, AgentSpec, Envelope, roster files, workflow
definitions, handler arguments, States the codec must store, the CLI) hypothesis
feeds garbage and valid values. The property: nothing crashes; every refusal is a
RayfleetError subclass with a non-empty message (the CLI: exit code 2 and a message
on stderr); whatever is accepted is usable afterwards (fingerprints, pickles, plans,
validates, encodes and decodes).
"""

from __future__ import annotations

import contextlib
import io
import math
import threading
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import rayfleet as rf
from rayfleet.checkpoints._store import SnapshotRow, SnapshotStore
from rayfleet.cli import main as cli_main
from rayfleet.identity._names import MAX_IDENTITY_LENGTH, validate_identity
from rayfleet.roster import load_roster, plan_roster, validate_roster

SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


class Counter(rf.Agent):
    class State(rf.State):
        total: int = 0
        anything: Any = None

    @rf.handler
    def add(self, n: int, note: str = "") -> int:
        self.state.total += n
        return self.state.total


def refused(error: BaseException) -> None:
    """A refusal must be a RayfleetError that says something."""
    assert isinstance(error, rf.RayfleetError), f"{type(error).__name__}: {error}"
    assert str(error).strip() and error.message.strip()


# Garbage of every shape; hashable and unhashable, huge and empty, NaN and infinities.
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=30), st.binary(max_size=10),
    st.sampled_from(["", " ", "..", "/", "a..b", "x" * 300, "\x00", "é", "a b", "EVERY_TURN", "enforced"]),
)
garbage = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.tuples(inner, inner),
                            st.dictionaries(st.one_of(st.text(max_size=8), st.integers()), inner, max_size=4),
                            st.sets(st.integers(), max_size=3), st.builds(object)),
    max_leaves=8,
)
identity_chars = st.sampled_from("abcXYZ019._:/-")
valid_identities = st.text(identity_chars, min_size=1, max_size=MAX_IDENTITY_LENGTH).filter(
    lambda name: not name.startswith("/") and ".." not in name
)


# --------------------------------------------------------------------------- identity names


@SETTINGS
@given(name=st.one_of(garbage, st.text(max_size=250)))
def test_identity_names_are_accepted_or_refused_with_the_reason(name: object) -> None:
    try:
        assert validate_identity(name) == name
    except Exception as error:
        refused(error)
        assert isinstance(error, rf.InvalidSpecError) and error.field == "identity"


@SETTINGS
@given(name=valid_identities)
def test_every_valid_identity_is_accepted(name: str) -> None:
    assert validate_identity(name) == name
    assert rf.AgentSpec(identity=name, agent=Counter).identity == name


# --------------------------------------------------------------------------- AgentSpec

SPEC_FIELDS = ["identity", "agent", "addressability", "labels", "peers", "topology", "durability",
               "checkpoint_interval", "display_name", "context", "retry", "dedup_capacity"]


def usable_spec(spec: rf.AgentSpec) -> None:
    assert len(spec.fingerprint()) == 32
    copy = cloudpickle.loads(cloudpickle.dumps(spec))
    assert len(copy.fingerprint()) == 32  # equal only for plain-data context: a repr may hold an id()
    assert copy.differences(copy) == []
    assert math.isfinite(spec.checkpoint_interval) and spec.checkpoint_interval > 0
    assert type(spec.dedup_capacity) is int and spec.dedup_capacity >= 1


@SETTINGS
@given(changes=st.dictionaries(st.sampled_from(SPEC_FIELDS), garbage, min_size=1, max_size=3))
@example(changes={"checkpoint_interval": math.nan})
@example(changes={"checkpoint_interval": math.inf})
@example(changes={"checkpoint_interval": True})
@example(changes={"dedup_capacity": True})
@example(changes={"context": {"a": 1, 2: "b"}})
def test_agent_spec_fields_are_validated(changes: dict[str, Any]) -> None:
    options: dict[str, Any] = {"identity": "spec/under-test", "agent": Counter, **changes}
    try:
        spec = rf.AgentSpec(**options)
    except Exception as error:
        refused(error)
        assert isinstance(error, rf.InvalidSpecError) and error.field
        return
    usable_spec(spec)


@SETTINGS
@given(
    labels=st.dictionaries(st.text(min_size=1, max_size=8), st.text(max_size=8), max_size=3),
    peers=st.lists(valid_identities.filter(lambda p: p != "spec/ok"), max_size=3),
    interval=st.floats(min_value=0.001, max_value=1e6),
    capacity=st.integers(min_value=1, max_value=10**6),
    context=st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
    durability=st.sampled_from(list(rf.Durability)),
)
def test_valid_agent_specs_are_accepted(labels: dict, peers: list, interval: float, capacity: int, context: dict,
                                        durability: rf.Durability) -> None:
    spec = rf.AgentSpec(identity="spec/ok", agent=Counter, labels=labels, peers=peers, checkpoint_interval=interval,
                        dedup_capacity=capacity, context=context, durability=durability.value)
    usable_spec(spec)
    assert spec.durability is durability and spec.peers == tuple(sorted(set(peers)))


# --------------------------------------------------------------------------- envelopes

ENVELOPE_FIELDS = ["target", "method", "args", "kwargs", "sender", "idempotency_key", "deadline", "conversation",
                   "sequence", "message_id", "sent_at"]


@SETTINGS
@given(changes=st.dictionaries(st.sampled_from(ENVELOPE_FIELDS), garbage, min_size=1, max_size=3))
@example(changes={"sent_at": "yesterday"})
@example(changes={"message_id": None})
@example(changes={"deadline": math.nan})
def test_envelopes_are_validated_where_they_are_built(changes: dict[str, Any]) -> None:
    options: dict[str, Any] = {"target": "env/t", "method": "add", **changes}
    try:
        envelope = rf.Envelope(**options)
    except Exception as error:
        refused(error)
        assert isinstance(error, rf.InvalidSpecError) and error.field == "envelope"
        return
    # An accepted envelope is one a host can gate: every field has the type the gates use.
    assert isinstance(envelope.message_id, str) and envelope.message_id
    assert isinstance(envelope.sent_at, (int, float)) and not isinstance(envelope.sent_at, bool)
    assert math.isfinite(envelope.sent_at)
    assert envelope.deadline is None or not math.isnan(envelope.deadline)
    key = envelope.dedup_key()
    assert key is None or isinstance(key, str)
    cloudpickle.loads(cloudpickle.dumps(envelope))


# --------------------------------------------------------------------------- rosters

roster_items = st.fixed_dictionaries(
    {"identity": st.one_of(valid_identities, garbage), "agent": st.sampled_from(
        ["rayfleet.demo.agents:Counter", "no.such.module:Thing", "rayfleet.demo.agents:Nope", "bad", ""])},
    optional=dict.fromkeys(("labels", "peers", "topology", "durability", "checkpoint_interval", "display_name", "context", "retry", "dedup_capacity", "addressability", "unknown_key"), garbage),
)


def yaml_text(value: object) -> str:
    try:
        return yaml.safe_dump(value)
    except yaml.YAMLError:
        return yaml.safe_dump(repr(value))


@SETTINGS
@given(document=st.one_of(
    st.fixed_dictionaries({"agents": st.lists(roster_items, max_size=3)}),
    st.fixed_dictionaries({"agents": garbage}),
    garbage,
))
@example(document={"agents": {0}})
def test_roster_documents_load_or_name_the_problem(document: object) -> None:
    text = yaml_text(document)
    if "\n" not in text:
        text += "\n"
    try:
        specs = load_roster(text)
    except Exception as error:
        refused(error)
        assert isinstance(error, rf.InvalidSpecError)
        return
    for spec in specs:
        usable_spec(spec)
    try:
        validate_roster(specs)
    except Exception as error:
        refused(error)
    change = plan_roster(specs, {}, prune=True)
    assert sorted(spec.identity for spec in change.create) == sorted(spec.identity for spec in specs)


@SETTINGS
@given(text=st.text(max_size=200))
@example(text="\x1f")
def test_roster_text_that_is_not_yaml_is_refused_clearly(text: str) -> None:
    try:
        load_roster(text + "\n")
    except Exception as error:
        refused(error)


# --------------------------------------------------------------------------- workflow definitions

STEP_OPTIONS = ["to", "call", "payload", "after", "gather", "timeout", "per_agent_timeout", "retry"]


@SETTINGS
@given(
    name=st.one_of(st.just("wf/ok"), garbage),
    parallelism=st.one_of(st.just(4), garbage),
    label=st.one_of(st.just("s1"), garbage),
    step=st.dictionaries(st.sampled_from(STEP_OPTIONS), garbage, max_size=3),
)
@example(name="wf/ok", parallelism=4, label="s1", step={"after": None})
@example(name="wf/ok", parallelism=4, label=[], step={})
def test_workflow_definitions_are_validated_before_anything_runs(
    name: object, parallelism: object, label: object, step: dict[str, Any]
) -> None:
    try:
        workflow = rf.Workflow(name, parallelism=parallelism)  # type: ignore[arg-type]
        workflow.step(label, **{"to": "agent/x", "call": "add", **step})  # type: ignore[arg-type]
        workflow.step("s2", to="agent/y", call="add", after=[label])  # type: ignore[list-item]
        workflow.validate(for_submit=True)
    except Exception as error:
        refused(error)
        assert isinstance(error, rf.InvalidSpecError)


# --------------------------------------------------------------------------- handler arguments and States


@SETTINGS
@given(args=st.lists(garbage, max_size=3), kwargs=st.dictionaries(st.sampled_from(["n", "note", "x"]), garbage,
                                                                   max_size=3))
def test_handler_arguments_bind_or_are_refused_as_invalid_arguments(args: list, kwargs: dict) -> None:
    info = Counter.__rayfleet_handlers__["add"]
    try:
        bound = info.bind("c/1", tuple(args), kwargs)
    except Exception as error:
        refused(error)
        assert isinstance(error, rf.InvalidArgumentsError)
        return
    assert isinstance(bound["n"], int)


class Unpicklable:
    def __init__(self) -> None:
        self.lock = threading.Lock()


@SETTINGS
@given(value=st.one_of(garbage, st.builds(threading.Lock), st.builds(Unpicklable),
                       st.just(i for i in range(3)), st.just(lambda: 1)))
def test_a_state_the_codec_cannot_store_is_refused_and_a_storable_one_round_trips(
    tmp_path: Path, value: object
) -> None:
    store = SnapshotStore(str(tmp_path))
    state = Counter.State(total=1, anything=value)
    try:
        path = store.write_batch(group="g", writer="w", rows=[SnapshotRow(identity="c/1", version=1, state=state)])
    except Exception as error:
        refused(error)
        assert isinstance(error, rf.InvalidSpecError) and "anything" in error.message
        return
    back, _ = SnapshotStore(str(tmp_path)).read_row(path, 0, Counter.State, identity="c/1", version=1)
    assert back.total == 1 and type(back.anything) is type(value)


# --------------------------------------------------------------------------- the command line

words = st.one_of(st.text(max_size=12), st.sampled_from(
    ["status", "send", "pause", "resume", "parked", "dead-letters", "list", "replay", "apply", "roster", "schema",
     "topology", "export", "reconcile", "runs", "show", "cancel", "hosts", "gc", "--json", "--timeout",
     "--min-age", "--format", "--ledger", "--storage", "--prune", "--dry-run", "--bogus", "-x", "nan", "1"]))


def run_cli(argv: list[str]) -> tuple[int, str]:
    stderr, stdout = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(stdout):
        try:
            code = cli_main(argv)
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else 2
    return code, stderr.getvalue()


@SETTINGS
@given(argv=st.lists(words, max_size=5))
def test_cli_arguments_that_do_not_parse_exit_2_with_a_message(argv: list[str]) -> None:
    # A command that would reach a fleet is refused for the ledger URL first (before Ray), so
    # whatever the words, the answer is help or the schema (0), or one clear refusal (2).
    argv = ["--ledger", "not-a-ledger-url", *argv]
    code, stderr = run_cli(argv)
    assert code in (0, 2), (argv, code, stderr)
    if code == 2:
        assert stderr.strip()
        assert "Traceback" not in stderr


@pytest.mark.parametrize("ledger", ["", "mysql://x/y", "sqlite:///", "sqlite://relative.db", "postgresql:///nohost"])
def test_cli_bad_ledger_urls_exit_2_before_connecting(ledger: str) -> None:
    code, stderr = run_cli(["--ledger", ledger, "status"])
    assert code == 2 and stderr.startswith("error:") and "ledger" in stderr
