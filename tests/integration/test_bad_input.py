"""Bad input gets a clear, typed error that names the problem, and breaks nothing else."""

import asyncio
from pathlib import Path

import pytest
from ray_helpers import kill_actor

import rayfleet as rf


class Account(rf.Agent):
    class State(rf.State):
        total: int = 0
        notes: list[str] = []

    @rf.handler
    def add(self, n: int) -> int:
        self.state.total += n
        return self.state.total

    @rf.handler
    def note(self, text: str, times: int = 1) -> int:
        self.state.notes.extend([text] * times)
        return len(self.state.notes)

    @rf.handler
    def get(self) -> dict:
        return {"total": self.state.total, "notes": list(self.state.notes)}

    @rf.handler
    def explode_after_add(self, n: int) -> None:
        self.state.total += n
        self.state.notes.append("half-done")
        raise ValueError(f"refusing to add {n}")

    @rf.handler
    async def slow(self, seconds: float) -> str:
        await asyncio.sleep(seconds)
        return "done"

    @rf.handler
    def corrupt_total(self) -> None:
        self.state.notes.append("before the bad assignment")
        self.state.total = "not a number"


class NotAnAgent:
    def add(self, n: int) -> int:
        return n


class NoDefaults(rf.Agent):
    class State(rf.State):
        count: int

    @rf.handler
    def get(self) -> int:
        return self.state.count


BAD_IDENTITIES = [
    pytest.param("", "empty", id="empty"),
    pytest.param("../x", "'..'", id="dotdot-prefix"),
    pytest.param("a..b", "'..'", id="dotdot-inside"),
    pytest.param("/abs", "starts with '/'", id="absolute"),
    pytest.param("a" * 201, "201 characters", id="too-long"),
    pytest.param("bad name!", "not allowed: ' !'", id="bad-chars"),
]


@pytest.mark.parametrize(("identity", "problem"), BAD_IDENTITIES)
def test_invalid_identity_is_refused_with_the_reason(fleet: rf.Fleet, identity: str, problem: str) -> None:
    with pytest.raises(rf.InvalidSpecError) as spawned:
        fleet.spawn(identity, Account)
    with pytest.raises(rf.InvalidSpecError) as referenced:
        fleet.agent(identity)
    for error in (spawned.value, referenced.value):
        assert isinstance(error, ValueError)
        assert error.field == "identity"
        assert problem in str(error), str(error)
        assert "orders/eu-1" in str(error)  # shows what a valid name looks like
    assert fleet.list_agents() == []  # nothing was written


def test_agent_class_must_be_an_rf_agent(fleet: rf.Fleet) -> None:
    with pytest.raises(rf.InvalidSpecError, match="rf.Agent") as error:
        fleet.spawn("bad/class", NotAnAgent)  # type: ignore[arg-type]
    assert error.value.field == "agent" and "NotAnAgent" in str(error.value)
    with pytest.raises(rf.InvalidSpecError, match="rf.Agent"):
        fleet.spawn("bad/base", rf.Agent)
    with pytest.raises(rf.InvalidSpecError, match="cannot import module 'no_such_module_xyz'"):
        fleet.spawn("bad/path", "no_such_module_xyz:Agent")
    with pytest.raises(rf.InvalidSpecError, match="needs an agent class"):
        fleet.spawn("bad/none")
    assert fleet.list_agents() == []



@pytest.mark.parametrize(
    ("options", "field", "named"),
    [
        pytest.param({"durability": "SOMETIMES"}, "durability", "EVERY_TURN, PERIODIC, ON_DEACTIVATE", id="durability"),
        pytest.param({"checkpoint_interval": 0}, "checkpoint_interval", "positive number", id="interval"),
        pytest.param({"labels": {"team": None}}, "labels", "'team'", id="labels"),
        pytest.param({"peers": ["bad/spec"]}, "peers", "own peer", id="self-peer"),
        pytest.param({"peers": ["ok/peer", "../up"]}, "identity", "'..'", id="bad-peer"),
        pytest.param({"addressability": "PUBLIC"}, "addressability", "INTERNAL_ONLY", id="addressability"),
    ],
)
def test_bad_spec_options_name_the_field(fleet: rf.Fleet, options: dict, field: str, named: str) -> None:
    with pytest.raises(rf.InvalidSpecError) as error:
        fleet.spawn("bad/spec", Account, **options)
    assert error.value.field == field
    assert named in str(error.value), str(error.value)
    assert fleet.list_agents() == []


@pytest.mark.parametrize(
    ("options", "named"),
    [
        pytest.param({"hosts": 0}, "hosts", id="hosts"),
        pytest.param({"lease_ttl": -1.0}, "lease_ttl", id="lease-ttl"),
        pytest.param({"idle_timeout": 0}, "idle_timeout", id="idle-timeout"),
        pytest.param({"namespace": ""}, "namespace", id="namespace"),
        pytest.param({"inline_state_bytes": -1}, "inline_state_bytes", id="inline-state-bytes"),
    ],
)
def test_bad_connect_options_name_the_option(storage: Path, options: dict, named: str) -> None:
    with pytest.raises(rf.InvalidSpecError) as error:
        rf.connect(storage=storage, **options)
    assert error.value.field == named and named in str(error.value)

def test_state_without_defaults_is_refused_at_spawn(fleet: rf.Fleet) -> None:
    with pytest.raises(rf.InvalidSpecError) as error:
        fleet.spawn("bad/state", NoDefaults)
    message = str(error.value)
    assert "NoDefaults.State" in message and "count" in message and "default" in message
    with pytest.raises(rf.UnknownIdentityError):
        fleet.status("bad/state")


def test_spawn_is_idempotent_only_for_the_same_spec(fleet: rf.Fleet) -> None:
    ref = fleet.spawn("spec/one", Account, labels={"team": "red"})
    assert ref.call("add", n=3) == 3

    again = fleet.spawn("spec/one", Account, labels={"team": "red"})
    assert again.identity == "spec/one"
    assert again.call("get") == {"total": 3, "notes": []}  # same agent, State kept

    conflicts = [
        {"labels": {"team": "blue"}},
        {"labels": {}},
        {"labels": {"team": "red"}, "durability": "PERIODIC"},
    ]
    for options in conflicts:
        with pytest.raises(rf.InvalidSpecError, match="already exists with a different spec") as error:
            fleet.spawn("spec/one", Account, **options)
        assert "spec/one" in str(error.value)
    status = fleet.status("spec/one")
    assert status.labels == {"team": "red"}
    assert [s.identity for s in fleet.list_agents(labels={"team": "red"})] == ["spec/one"]
    assert fleet.list_agents(labels={"team": "blue"}) == []
    assert fleet.spec("spec/one").durability is rf.Durability.EVERY_TURN
    assert ref.call("get") == {"total": 3, "notes": []}


def test_unknown_handler_lists_the_available_ones(fleet: rf.Fleet) -> None:
    ref = fleet.spawn("bad/handler", Account)
    with pytest.raises(rf.UnknownHandlerError) as error:
        ref.call("withdraw", n=1)
    assert isinstance(error.value, AttributeError)
    assert error.value.method == "withdraw"
    assert set(error.value.available) == {"add", "note", "get", "explode_after_add", "corrupt_total", "slow"}
    assert "'withdraw'" in str(error.value) and "add, corrupt_total, explode_after_add, get, note, slow" in str(error.value)
    assert ref.call("get") == {"total": 0, "notes": []}


@pytest.mark.parametrize(
    ("args", "kwargs", "named"),
    [
        pytest.param((), {}, "'n'", id="missing"),
        pytest.param((), {"n": 1, "m": 2}, "'m'", id="extra"),
        pytest.param((), {"n": "abc"}, "n:", id="wrong-type"),
        pytest.param((1, 2), {}, "too many positional", id="too-many-positional"),
    ],
)
def test_wrong_handler_arguments_name_the_argument(fleet: rf.Fleet, args, kwargs, named: str) -> None:
    ref = fleet.spawn("bad/args", Account)
    assert ref.call("add", n=2) == 2
    with pytest.raises(rf.InvalidArgumentsError) as error:
        ref.call("add", *args, **kwargs)
    assert isinstance(error.value, TypeError)
    assert error.value.method == "add" and error.value.identity == "bad/args"
    assert named in str(error.value), str(error.value)
    assert ref.call("add", n=1) == 3  # nothing ran; the agent keeps serving
    assert fleet.status("bad/args").checkpoint_version == 2


def test_wrong_type_for_a_second_argument(fleet: rf.Fleet) -> None:
    ref = fleet.spawn("bad/args2", Account)
    with pytest.raises(rf.InvalidArgumentsError, match="times") as error:
        ref.call("note", text="hi", times="many")
    assert "text" not in error.value.detail
    assert ref.call("note", text="hi", times="2") == 2  # lax coercion of a numeric string is fine


def test_handler_exception_reaches_the_caller_and_state_is_unchanged(fleet: rf.Fleet) -> None:
    ref = fleet.spawn("bad/raises", Account)
    assert ref.call("add", n=5) == 5
    committed = fleet.status("bad/raises").checkpoint_version

    with pytest.raises(rf.HandlerError) as error:
        ref.call("explode_after_add", n=7)
    failure = error.value
    assert failure.remote_type.endswith("ValueError")
    assert failure.remote_message == "refusing to add 7"
    assert "explode_after_add" in failure.remote_traceback
    assert "refusing to add 7" in failure.remote_traceback
    assert "explode_after_add" in str(failure) and "refusing to add 7" in str(failure)

    # The failed turn left State as it was, and committed nothing.
    assert fleet.status("bad/raises").checkpoint_version == committed
    assert ref.call("get") == {"total": 5, "notes": []}
    assert ref.call("add", n=1) == 6
    # ...also in the committed snapshot, not just in memory.
    fleet.deactivate("bad/raises")
    assert ref.call("get") == {"total": 6, "notes": []}


def test_invalid_state_assignment_is_a_handler_error_and_state_is_unchanged(fleet: rf.Fleet) -> None:
    ref = fleet.spawn("bad/assign", Account)
    assert ref.call("note", text="kept") == 1
    with pytest.raises(rf.HandlerError) as error:
        ref.call("corrupt_total")
    assert "ValidationError" in error.value.remote_type
    assert "total" in error.value.remote_message
    assert ref.call("get") == {"total": 0, "notes": ["kept"]}
    fleet.deactivate("bad/assign")
    assert ref.call("get") == {"total": 0, "notes": ["kept"]}


def test_call_past_its_timeout_raises_deadline_exceeded(fleet: rf.Fleet) -> None:
    ref = fleet.spawn("bad/slow", Account)
    with pytest.raises(rf.DeadlineExceededError) as error:
        ref.call("slow", seconds=1.0, timeout=0.2)
    assert isinstance(error.value, TimeoutError)
    assert error.value.method == "slow" and "bad/slow" in str(error.value)
    with pytest.raises(rf.DeadlineExceededError):
        asyncio.run(ref.ask("slow", seconds=1.0, timeout=0.2))
    # The agent is still there and serves the next call once its earlier turns finish.
    assert ref.call("slow", seconds=0.0, timeout=60) == "done"


def test_unknown_identity(fleet: rf.Fleet) -> None:
    ghost = fleet.agent("nobody/here")
    with pytest.raises(rf.UnknownIdentityError) as error:
        ghost.call("get")
    assert error.value.identity == "nobody/here"
    assert "fleet.spawn('nobody/here'" in str(error.value)
    with pytest.raises(rf.UnknownIdentityError):
        fleet.status("nobody/here")
    with pytest.raises(rf.UnknownIdentityError):
        fleet.retire("nobody/here")
    assert fleet.list_agents() == []


def _break_snapshots(fleet: rf.Fleet, storage: Path, identity: str, how: str) -> list[Path]:
    """Kill the owner (so nothing holds the State in memory), then damage every snapshot file."""
    owner = fleet.status(identity).host
    assert owner is not None
    kill_actor(owner, fleet.config.namespace)
    return _damage_files(storage, how)


def _damage_files(storage: Path, how: str) -> list[Path]:
    files = sorted((storage / "snapshots").glob("**/*.arrow"))
    assert files
    for path in files:
        if how == "corrupt":
            path.write_bytes(b"this is not an arrow file" * 40)
        else:
            path.unlink()
    return files


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["corrupt", "missing"])
def test_damaged_snapshot_marks_identity_broken_until_reset(
    make_fleet, storage: Path, tmp_path: Path, how: str
) -> None:
    fleet: rf.Fleet = make_fleet(inline_state_bytes=0)  # every State in a snapshot file
    bystanders: rf.Fleet = make_fleet(storage=tmp_path / "elsewhere")
    bystander = bystanders.spawn("other/fine", Account)
    assert bystander.call("add", n=9) == 9

    identity = "fragile/one"
    ref = fleet.spawn(identity, Account)
    assert ref.call("add", n=4) == 4
    (original,) = sorted((storage / "snapshots").glob("**/*.arrow"))  # one commit, one file
    good_bytes = original.read_bytes()
    files = _break_snapshots(fleet, storage, identity, how)
    (damaged,) = files
    assert damaged == original
    relative = damaged.relative_to(storage).as_posix()

    with pytest.raises(rf.SnapshotError) as error:
        ref.call("get")
    assert error.value.identity == identity
    assert error.value.location == f"{relative}#0"
    expected = "not a valid Arrow IPC file" if how == "corrupt" else "the file is missing"
    assert expected in error.value.detail, error.value.detail

    broken = fleet.status(identity)
    assert broken.state is rf.LifecycleState.BROKEN
    assert relative in broken.broken_reason
    assert broken.lease is None and broken.host is None
    with pytest.raises(rf.InvalidStateError) as refused:
        ref.call("add", n=1)
    assert refused.value.state == "BROKEN" and relative in str(refused.value)

    # Respawning from the same damaged storage fails the same way and stays BROKEN.
    with pytest.raises(rf.SnapshotError):
        fleet.respawn(identity)
    assert fleet.status(identity).state is rf.LifecycleState.BROKEN

    # Other identities, in another fleet and storage, are unaffected.
    assert bystander.call("add", n=1) == 10
    assert bystanders.status("other/fine").state is rf.LifecycleState.ACTIVE

    # Restoring the file and respawning brings it back with its State...
    damaged.write_bytes(good_bytes)
    restored = fleet.respawn(identity)
    assert restored.state is rf.LifecycleState.ACTIVE and restored.broken_reason == ""
    assert restored.generation == 0 and restored.checkpoint_version == 1
    assert ref.call("get") == {"total": 4, "notes": []}

    # ...and reset starts over with a fresh State in a new generation. (Break it again
    # through a new checkpoint file: the surviving host has the restored one cached.)
    assert ref.call("add", n=1) == 5
    assert fleet.deactivate(identity) is True
    _damage_files(storage, how)
    with pytest.raises(rf.SnapshotError):
        ref.call("get")
    assert fleet.status(identity).state is rf.LifecycleState.BROKEN
    recovered = fleet.reset(identity)
    assert recovered.state is rf.LifecycleState.ACTIVE
    assert recovered.generation == 1 and recovered.checkpoint_version is None
    assert recovered.broken_reason == ""
    assert ref.call("get") == {"total": 0, "notes": []}
    assert ref.call("add", n=2) == 2
    assert fleet.status(identity).checkpoint_version == 1  # the add is generation 1's first commit
