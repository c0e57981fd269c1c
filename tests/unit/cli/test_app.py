"""The command line without a fleet: parsing, help, completion, usage errors, exit codes, attach-only refusals.

tests/unit/conftest.py makes ``ray.init`` raise, so every command here that exits 2
also proves it gave up before reaching Ray.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

import rayfleet as rf
from rayfleet.cli import main
from rayfleet.cli._exit import CommandError, OperationFailed
from rayfleet.cli._main import cli
from rayfleet.roster import roster_json_schema

COMMANDS = {"demo", "apply", "status", "list", "send", "pause", "resume", "parked", "dead-letters", "runs",
            "topology", "hosts", "drain", "undrain", "export", "gc", "gateway", "bench", "roster", "signal",
            "approvals", "timers", "turns"}
SUBCOMMANDS = {"dead-letters": {"list", "replay", "purge"}, "runs": {"list", "show", "cancel", "pause", "resume"},
               "topology": {"export", "reconcile"}, "roster": {"schema"},
               "approvals": {"list", "show", "approve", "reject"}, "timers": {"list", "fire-now", "cancel"}}
# Every command that reads or changes an existing fleet, with arguments that parse.
ATTACHING = [
    ["status"], ["status", "a/b"], ["list"], ["list", "--label", "team=a"], ["parked", "a/b"],
    ["dead-letters", "list"], ["runs", "list"], ["runs", "show", "r-1"], ["topology", "export"], ["hosts"],
    ["send", "a/b", "m"], ["pause", "a/b"], ["resume", "a/b"], ["dead-letters", "replay", "1"],
    ["dead-letters", "purge", "--all"], ["runs", "cancel", "r-1"], ["runs", "pause", "r-1"], ["runs", "resume", "r-1"],
    ["topology", "reconcile"], ["drain", "rayfleet-host-0"], ["undrain", "rayfleet-host-0"], ["gc"],
    ["signal", "a/b", "paid"], ["approvals", "list"], ["approvals", "show", "ap-1"],
    ["approvals", "approve", "ap-1", "--by", "alice"], ["approvals", "reject", "ap-1", "--by", "bob"],
    ["timers", "list"], ["timers", "fire-now", "a/b", "t"], ["timers", "cancel", "a/b", "t"],
    ["turns", "a/b"], ["turns", "a/b", "--follow", "t-1"],
]


def invoke(*args: str, env: dict[str, str | None] | None = None) -> Result:
    # RAY_ADDRESS from the environment would point commands at a real cluster.
    return CliRunner().invoke(cli, list(args), env={"RAY_ADDRESS": None, **(env or {})}, prog_name="rayfleet")


@dataclass(frozen=True)
class Finished:
    """A ``rayfleet`` run in a process of its own, shaped like click's ``Result`` for :func:`assert_refused`."""

    exit_code: int
    stdout: str
    stderr: str
    exception: None = None

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def run_command(*args: str, env: dict[str, str] | None = None) -> Finished:
    """Run the command as a user does, in a fresh process: one whose Ray is not already started.

    (In the whole suite this process has the session's Ray, and ``connect`` uses the Ray
    a process is already connected to.)
    """
    environment = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | (env or {})
    done = subprocess.run([sys.executable, "-m", "rayfleet.cli", *args], env=environment, capture_output=True,
                          text=True, timeout=120)
    return Finished(done.returncode, done.stdout, done.stderr)


def assert_refused(result: Result | Finished, *words: str) -> None:
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    for word in words:
        assert word in result.stderr, result.stderr


def test_every_command_of_the_issue_is_listed_in_help() -> None:
    result = invoke("--help")
    assert result.exit_code == 0
    assert set(cli.commands) == COMMANDS
    for name in COMMANDS:
        assert name in result.stdout
    for group, names in SUBCOMMANDS.items():
        assert set(cli.commands[group].commands) == names  # type: ignore[attr-defined]


@pytest.mark.parametrize("path", [[name] for name in sorted(COMMANDS)]
                         + [[group, name] for group, names in sorted(SUBCOMMANDS.items()) for name in sorted(names)])
def test_every_command_has_help(path: list[str]) -> None:
    result = invoke(*path, "--help")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"Usage: rayfleet {' '.join(path)}")


def test_global_options_name_their_environment_variables() -> None:
    help_text = " ".join(invoke("--help").stdout.split())
    for variable in ("RAY_ADDRESS", "RAYFLEET_STORAGE", "RAYFLEET_LEDGER", "RAYFLEET_NAMESPACE"):
        assert variable in help_text


def test_roster_schema_prints_the_schema_without_ray() -> None:
    result = invoke("roster", "schema")
    assert result.exit_code == 0 and result.stderr == ""
    schema = json.loads(result.stdout)
    assert schema == roster_json_schema()
    assert "agents" in schema["properties"] and schema["required"] == ["agents"]


def test_main_returns_the_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["roster", "schema"]) == 0
    assert json.loads(capsys.readouterr().out) == roster_json_schema()
    assert main(["roster"]) == 2  # a group without its command
    assert main(["no-such-command"]) == 2
    assert "No such command" in capsys.readouterr().err


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_shell_completion_emits_a_script(shell: str) -> None:
    result = invoke(env={"_RAYFLEET_COMPLETE": f"{shell}_source"})
    assert result.exit_code == 0
    assert "_RAYFLEET_COMPLETE" in result.stdout and "rayfleet" in result.stdout
    assert f"{shell}_complete" in result.stdout


@pytest.mark.parametrize(("line", "expected"), [
    ("rayfleet dead", {"dead-letters"}),
    ("rayfleet runs ", SUBCOMMANDS["runs"]),
    ("rayfleet runs list --status ", {"PENDING", "RUNNING", "PAUSED", "COMPLETED", "COMPENSATED", "FAILED", "CANCELLED"}),
])
def test_bash_completion_completes_commands_and_choices(line: str, expected: set[str]) -> None:
    words = line.split(" ")
    result = invoke(env={"_RAYFLEET_COMPLETE": "bash_complete", "COMP_WORDS": line, "COMP_CWORD": str(len(words) - 1)})
    assert result.exit_code == 0
    offered = {row.split(",", 1)[1].casefold() for row in result.stdout.splitlines()}
    assert {word.casefold() for word in expected} <= offered


@pytest.mark.parametrize(("args", "words"), [
    (["send", "a/b", "m", "--json", "{not json"], ["--json", "not valid JSON", '{"n": 2}']),
    (["send", "a/b", "m", "--json", "[1, 2]"], ["--json", "JSON object", "not list"]),
    (["send", "a/b", "m", "--json", '"text"'], ["JSON object", "not str"]),
    (["send", "a/b", "m", "--json", '{"timeout": 3}'], ["timeout", "--timeout"]),
    (["send", "a/b", "m", "--timeout", "-1"], ["--timeout"]),
    (["send", "a/b"], ["Missing argument 'METHOD'"]),
    (["list", "--label", "team"], ["--label", "KEY=VALUE"]),
    (["list", "--label", "=a"], ["KEY=VALUE"]),
    (["apply", "/no/such/roster.yaml"], ["ROSTER", "does not exist"]),
    (["dead-letters", "replay", "seven"], ["LETTER_ID", "not a valid integer"]),
    (["dead-letters", "purge"], ["--all"]),
    (["runs", "list", "--status", "DONE"], ["--status"]),
    (["runs", "show"], ["Missing argument 'RUN_ID'"]),
    (["topology", "export", "--format", "png"], ["--format"]),
    (["drain"], ["Missing argument 'HOST'"]),
    (["gc", "--min-age", "-5"], ["--min-age"]),
    (["export"], ["Missing argument 'PATH'"]),
    (["gateway", "--port", "70000"], ["--port"]),
    (["status", "--bogus"], ["No such option"]),
    (["roster"], ["schema"]),
])
def test_usage_errors_exit_2_with_a_message(args: list[str], words: list[str]) -> None:
    assert_refused(invoke(*args), *words)


@pytest.mark.parametrize("args", ATTACHING, ids=" ".join)
def test_commands_refuse_a_storage_with_no_fleet_and_create_nothing(tmp_path: Path, args: list[str]) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    result = invoke("--storage", str(empty), *args)
    assert_refused(result, "no fleet to attach to", str(empty), "no fleet.json", "--storage")
    assert result.stderr.count("\n") == 1  # one line
    assert list(empty.iterdir()) == []
    missing = tmp_path / "missing"
    assert_refused(invoke("--storage", str(missing), *args), str(missing))
    assert not missing.exists()


def test_the_storage_comes_from_rayfleet_storage(tmp_path: Path) -> None:
    result = invoke("hosts", env={"RAYFLEET_STORAGE": str(tmp_path)})
    assert_refused(result, f"the storage {tmp_path} holds no fleet")


def test_no_cluster_exits_2_saying_to_start_one(tmp_path: Path) -> None:
    storage = tmp_path / "store"
    storage.mkdir()
    (storage / "fleet.json").write_text(json.dumps({"fleet_id": "fleet-unit", "format": 1}))
    # Ray finds a `ray start` cluster through the address file under its temp folder: none here.
    result = run_command("--storage", str(storage), "status", env={"RAY_TMPDIR": str(tmp_path / "ray-tmp")})
    assert_refused(result, "no running Ray cluster", "ray start --head", "--address")
    assert result.stderr.count("\n") == 1
    assert sorted(path.name for path in storage.iterdir()) == ["fleet.json"]


def test_an_address_where_nothing_listens_exits_2_at_once(tmp_path: Path) -> None:
    with socket.socket() as probe:  # a port that was free a moment ago, so nothing listens there
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    storage = tmp_path / "store"
    storage.mkdir()
    (storage / "fleet.json").write_text(json.dumps({"fleet_id": "fleet-unit", "format": 1}))
    for args in (["--storage", str(storage), "hosts"], ["--storage", str(tmp_path / "new"), "apply", __file__]):
        result = run_command("--address", f"127.0.0.1:{port}", *args)
        assert_refused(result, f"nothing answers at the Ray address '127.0.0.1:{port}'", "--address")
        assert result.stderr.count("\n") == 1
    assert not (tmp_path / "new").exists()  # apply gave up before creating anything


@pytest.mark.parametrize("ledger", ["", "mysql://x/y", "sqlite:///", "sqlite://relative.db", "postgresql:///nohost"])
def test_bad_ledger_urls_exit_2_before_connecting(ledger: str) -> None:
    for args in (["status"], ["apply", __file__], ["demo"]):
        result = invoke("--ledger", ledger, *args)
        assert_refused(result, "ledger")
        assert result.stderr.startswith("error:")


def test_bench_outside_a_checkout_says_where_to_run_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert_refused(invoke("bench", "--quick"), "benchmarks/", "repository's root")


def test_bench_passes_its_options_to_the_benchmarks_main(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A checkout whose benchmarks/__main__.py records what it was called with (no Ray involved).
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "__init__.py").write_text("")
    (tmp_path / "benchmarks" / "__main__.py").write_text(
        "import json, pathlib\n"
        "def main(argv=None):\n"
        "    pathlib.Path('called.json').write_text(json.dumps(argv))\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(__import__("sys").modules, "benchmarks", raising=False)
    monkeypatch.delitem(__import__("sys").modules, "benchmarks.__main__", raising=False)
    monkeypatch.setattr("sys.path", list(__import__("sys").path))
    result = invoke("bench", "--quick", "--out", "r.json")
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "called.json").read_text()) == ["--quick", "--out", "r.json"]


def test_rayfleet_errors_map_to_one_line_and_an_exit_code() -> None:
    failed = CommandError.from_error(rf.HandlerError(identity="a/b", method="m", remote_type="builtins.ValueError",
                                                     remote_message="no\nreally", remote_traceback="tb"))
    assert isinstance(failed, OperationFailed) and failed.exit_code == 1
    assert failed.format_message() == "handler 'm' of 'a/b' raised builtins.ValueError: no really"
    assert CommandError.from_error(rf.DeadlineExceededError(identity="a", method="m", timeout=1.0)).exit_code == 1
    for error in (rf.UnknownIdentityError(identity="a/b"), rf.UnknownHandlerError(identity="a", method="m", available=()),
                  rf.FleetNotFoundError(missing="x", remedy="y"), rf.LedgerUnavailableError(location="l", detail="d")):
        refused = CommandError.from_error(error)
        assert refused.exit_code == 2 and not isinstance(refused, OperationFailed)


def test_a_rayfleet_error_in_a_command_prints_no_traceback() -> None:
    @click.command()
    def boom() -> None:
        raise rf.UnknownRunError(run_id="r-9")

    cli.add_command(boom)
    try:
        result = invoke("boom")
    finally:
        del cli.commands["boom"]
    assert_refused(result, "error: there is no run 'r-9'")
