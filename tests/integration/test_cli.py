"""The rayfleet command line against live fleets in the test session's Ray (in-process, through click's runner).

One fleet is shared by the module; every command attaches to it the way an operator's
shell would, by ``--storage`` and ``--namespace``, and must leave it running.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import ray
from click.testing import CliRunner, Result

import rayfleet as rf
from rayfleet.cli._main import cli

ROSTER = str(Path(__file__).resolve().parents[2] / "examples" / "team.yaml")


class Greeter(rf.Agent):
    class State(rf.State):
        greeted: list[str] = []
        closed: bool = False

    @rf.handler
    async def greet(self, name: str) -> str:
        if self.state.closed:
            raise ValueError(f"closed to {name}")
        self.state.greeted = [*self.state.greeted, name]
        return f"hello {name} #{len(self.state.greeted)}"

    @rf.handler
    async def wait_for(self, name: str) -> object:
        return await self.wait_signal(name)

    @rf.handler
    async def ask(self, subject: str) -> str:
        decision = await self.approval(subject, data={"subject": subject}, approvers=["alice", "bob"])
        return f"{subject}: {'approved' if decision.approved else 'rejected'} by {decision.by} ({decision.comment})"

    @rf.handler
    async def plan(self, every: float) -> None:
        await self.remind("nudge", every=every, method="greet", name="timer")

    @rf.handler
    async def close(self, closed: bool) -> bool:
        self.state.closed = closed
        return closed


@dataclass(frozen=True)
class CliFleet:
    fleet: rf.Fleet
    storage: Path
    namespace: str

    def run(self, *args: str, ledger: str | None = None) -> Result:
        where = ["--storage", str(self.storage), "--namespace", self.namespace]
        return invoke(*where, *(["--ledger", ledger] if ledger else []), *args)

    def data(self, *args: str) -> Any:
        result = self.run(*args)
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), prog_name="rayfleet", env={"RAY_ADDRESS": None})


def refused(result: Result, code: int, *words: str) -> None:
    assert result.exit_code == code, (result.exit_code, result.output)
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    for word in words:
        assert word in result.stderr, result.stderr


@pytest.fixture(scope="module")
def shared(ray_session: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[CliFleet]:
    storage = tmp_path_factory.mktemp("cli") / "store"
    namespace = f"cli-{uuid.uuid4().hex[:8]}"
    fleet = rf.connect(storage=storage, namespace=namespace, hosts=1)
    for index in (1, 2, 3):
        fleet.spawn(f"greeter/{index}", Greeter, labels={"team": "a" if index < 3 else "b"})
    try:
        yield CliFleet(fleet, storage, namespace)
    finally:
        fleet.shutdown(stop_actors=True)


@pytest.mark.timeout(120)
def test_send_status_and_list(shared: CliFleet) -> None:
    assert shared.data("send", "greeter/1", "greet", "--json", '{"name": "ada"}') == "hello ada #1"
    keyed = ("send", "greeter/1", "greet", "--json", '{"name": "bob"}', "--idempotency-key", "k-1", "--timeout", "30")
    assert shared.data(*keyed) == shared.data(*keyed) == "hello bob #2"  # the effect happened once

    refused(shared.run("send", "nobody/here", "greet"), 2, "unknown identity 'nobody/here'")
    refused(shared.run("send", "greeter/1", "shout"), 2, "has no handler 'shout'", "greet")
    refused(shared.run("send", "greeter/1", "greet", "--json", "{not json"), 2, "not valid JSON")
    refused(shared.run("send", "greeter/1", "greet", "--json", "[]"), 2, "JSON object")
    refused(shared.run("send", "greeter/1", "greet", "--json", '{"name": 3.5}'), 2, "are not valid")

    status = shared.data("status", "greeter/1", "--json")
    assert (status["identity"], status["state"], status["host"]) == ("greeter/1", "ACTIVE", "rayfleet-host-0")
    assert status["lease"]["fencing_token"] >= 1 and status["labels"] == {"team": "a"}
    table = shared.run("status", "greeter/1")
    assert table.exit_code == 0 and "greeter/1" in table.stdout and "ACTIVE" in table.stdout
    refused(shared.run("status", "nobody/here"), 2, "unknown identity")

    summary = shared.data("status", "--json")
    assert summary["hosts"] == 1 and summary["namespace"] == shared.namespace
    assert summary["identities"] >= 3 and summary["states"]["ACTIVE"] >= 1

    listed = shared.data("list", "--json")
    assert [agent["identity"] for agent in listed if agent["identity"].startswith("greeter/")] == \
        ["greeter/1", "greeter/2", "greeter/3"]
    team_a = shared.data("list", "--label", "team=a", "--json")
    assert [agent["identity"] for agent in team_a] == ["greeter/1", "greeter/2"]
    table = shared.run("list", "--label", "team=b")
    assert table.exit_code == 0 and "greeter/3" in table.stdout and "greeter/1" not in table.stdout
    refused(shared.run("list", "--label", "team"), 2, "KEY=VALUE")


@pytest.mark.timeout(120)
def test_pause_parked_resume_and_dead_letters(shared: CliFleet) -> None:
    assert shared.data("pause", "greeter/2", "--json") == {"paused": "greeter/2"}
    assert shared.fleet.status("greeter/2").paused
    # A send to a paused identity is parked; its caller gives up after --timeout: exit 1, not 2.
    refused(shared.run("send", "greeter/2", "greet", "--json", '{"name": "cy"}', "--timeout", "1"), 1,
            "did not finish within 1s")
    parked = shared.data("parked", "greeter/2", "--json")
    assert [message["envelope"]["method"] for message in parked] == ["greet"]
    assert "greet" in shared.run("parked", "greeter/2").stdout
    assert shared.data("resume", "greeter/2", "--json") == {"resumed": "greeter/2", "replayed": 1}
    assert shared.data("parked", "greeter/2", "--json") == []
    refused(shared.run("parked", "nobody/here"), 2, "unknown identity")

    # A handler that raises: exit 1, and its message waits in the dead-letter log.
    assert shared.data("send", "greeter/2", "close", "--json", '{"closed": true}') is True
    refused(shared.run("send", "greeter/2", "greet", "--json", '{"name": "dee"}'), 1,
            "raised builtins.ValueError: closed to dee")
    letters = shared.data("dead-letters", "list", "--identity", "greeter/2", "--json")
    assert [(letter["reason"], letter["envelope"]["kwargs"]) for letter in letters] == [("REJECTED", {"name": "dee"})]
    letter_id = letters[0]["id"]
    assert "REJECTED" in shared.run("dead-letters", "list").stdout
    assert shared.data("send", "greeter/2", "close", "--json", '{"closed": false}') is False
    assert shared.data("dead-letters", "replay", str(letter_id)) == "hello dee #2"
    assert shared.data("dead-letters", "list", "--identity", "greeter/2", "--json") == []
    refused(shared.run("dead-letters", "replay", str(letter_id)), 2, f"there is no dead letter {letter_id}")

    refused(shared.run("send", "greeter/3", "greet", "--json", '{"name": 1.5}'), 2, "are not valid")
    (decode_failed,) = shared.data("dead-letters", "list", "--identity", "greeter/3", "--json")
    assert decode_failed["reason"] == "DECODE_FAILED"
    assert shared.data("dead-letters", "purge", "--id", str(decode_failed["id"]), "--json") == {"purged": 1}
    assert shared.data("dead-letters", "list", "--identity", "greeter/3", "--json") == []


@pytest.mark.timeout(180)
def test_apply_topology_runs_hosts_gc_and_drain(shared: CliFleet) -> None:
    steps: list[tuple[int, int]] = []
    shared.fleet.apply([rf.AgentSpec(identity="greeter/4", agent=Greeter)],
                       progress=lambda done, total: steps.append((done, total)))
    assert steps == [(1, 2), (2, 2)]  # the ledger write, the reconcile: what the apply progress bar shows
    preview = shared.data("apply", ROSTER, "--dry-run", "--json")
    assert preview["dry_run"] and len(preview["created"]) == 3 and preview["topology"] is None
    applied = shared.data("apply", ROSTER, "--json")
    assert len(applied["created"]) == 3 and len(applied["topology"]["wired"]) == 2
    again = shared.run("apply", ROSTER)
    assert again.exit_code == 0 and "unchanged" in again.stdout and "team/planner" in again.stdout
    # Applying to a running fleet attaches to it: its one host stays one (no host per CPU).
    assert shared.data("hosts", "--json") == [
        {"name": "rayfleet-host-0", "holder": shared.fleet.hosts()[0].holder,
         "started_at": shared.fleet.hosts()[0].started_at, "draining": False,
         "node": socket.gethostname(), "pid": shared.fleet.hosts()[0].pid, "process": shared.fleet.hosts()[0].process}
    ]
    assert isinstance(shared.fleet.hosts()[0].pid, int) and shared.fleet.hosts()[0].process
    table = shared.run("hosts").stdout
    assert "rayfleet-host-0" in table and "pid" in table

    mermaid = shared.run("topology", "export", "--format", "mermaid")
    assert mermaid.exit_code == 0 and "team/planner" in mermaid.stdout
    assert json.loads(shared.run("topology", "export", "--format", "json").stdout)
    reconciled = shared.data("topology", "reconcile", "--json")
    assert reconciled["wired"] == [] and reconciled["failures"] == []

    workflow = rf.Workflow("cli-wf")
    workflow.step("hello", to="greeter/1", call="greet", payload={"name": "runs"})
    outcome = shared.fleet.run(workflow)
    assert outcome.status is rf.RunStatus.COMPLETED, str(outcome.error)
    assert [run["run_id"] for run in shared.data("runs", "list", "--json")] == [outcome.run_id]
    assert shared.data("runs", "list", "--status", "failed", "--json") == []
    assert shared.data("runs", "show", outcome.run_id, "--json")["status"] == "COMPLETED"
    assert outcome.run_id in shared.run("runs", "show", outcome.run_id).stdout
    for verb in ("pause", "resume", "cancel"):
        assert shared.data("runs", verb, outcome.run_id, "--json")["run_id"] == outcome.run_id
    refused(shared.run("runs", "show", "no-such-run"), 2, "there is no run 'no-such-run'")
    refused(shared.run("runs", "cancel", "no-such-run"), 2, "there is no run")

    stray = shared.storage / "snapshots" / "Greeter" / "rayfleet-host-9-stray.arrow"
    stray.parent.mkdir(parents=True, exist_ok=True)
    stray.write_bytes(b"not referenced by any identity")
    os.utime(stray, (1_000_000_000, 1_000_000_000))
    deleted = shared.data("gc", "--min-age", "0", "--json")["deleted"]
    assert "snapshots/Greeter/rayfleet-host-9-stray.arrow" in deleted and not stray.exists()

    refused(shared.run("drain", "rayfleet-host-7"), 2, "has no host 'rayfleet-host-7'", "rayfleet-host-0")
    drained = shared.data("drain", "rayfleet-host-0", "--timeout", "20", "--json")
    assert drained["host"] == "rayfleet-host-0" and drained["checkpointed"] >= 1 and not drained["timed_out"]
    assert shared.data("hosts", "--json")[0]["draining"] is True
    assert shared.run("undrain", "rayfleet-host-0").exit_code == 0
    assert shared.data("send", "greeter/1", "greet", "--json", '{"name": "after"}').startswith("hello after")


@pytest.mark.timeout(120)
def test_export_writes_a_parquet_dataset_of_the_committed_states(shared: CliFleet, tmp_path: Path) -> None:
    shared.data("send", "greeter/3", "greet", "--json", '{"name": "eve"}')
    out = tmp_path / "export"
    report = shared.data("export", str(out), "--json")
    [greeters] = [name for name in report["tables"] if name.endswith(".Greeter")]
    assert report["path"] == str(out) and report["tables"][greeters] >= 1
    rows = {row["identity"]: row for row in pq.read_table(out / greeters).to_pylist()}
    assert "eve" in rows["greeter/3"]["greeted"]
    assert rows["greeter/3"]["fencing_token"] >= 1 and rows["greeter/3"]["checkpoint_version"] >= 1
    table = shared.run("export", str(tmp_path / "again"))
    assert table.exit_code == 0 and greeters in table.stdout
    refused(shared.run("export", str(tmp_path / "again" / greeters)), 2)  # a folder holding other data


@pytest.mark.timeout(120)
def test_no_fleet_here_creates_nothing_and_apply_starts_one(shared: CliFleet, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    namespace = f"cli-none-{uuid.uuid4().hex[:8]}"
    where = ("--storage", str(empty), "--namespace", namespace)
    for args in (["status"], ["list"], ["parked", "a/b"], ["dead-letters", "list"], ["runs", "list"],
                 ["runs", "show", "r"], ["topology", "export"], ["hosts"], ["send", "a/b", "m"]):
        refused(invoke(*where, *args), 2, "no fleet to attach to", "no fleet.json")
    assert list(empty.iterdir()) == []
    # The shared fleet's storage, but a namespace it does not run in: refused, and no ledger actor appears.
    refused(invoke("--storage", str(shared.storage), "--namespace", namespace, "hosts"), 2,
            f"does not run in Ray namespace {namespace!r}")
    with pytest.raises(ValueError, match="Failed to look up actor"):
        ray.get_actor("rayfleet-ledger", namespace=namespace)

    # apply is the command that starts a fleet where there is none.
    created = invoke(*where, "apply", ROSTER, "--hosts", "1", "--json")
    try:
        assert created.exit_code == 0, created.output
        assert (empty / "fleet.json").is_file()
        assert [host["name"] for host in json.loads(invoke(*where, "hosts", "--json").stdout)] == ["rayfleet-host-0"]
        listed = json.loads(invoke(*where, "list", "--json").stdout)
        assert [agent["identity"] for agent in listed] == ["team/planner", "team/researcher-history",
                                                           "team/researcher-physics"]
    finally:
        rf.connect(storage=empty, namespace=namespace, create=False).shutdown(stop_actors=True)

    # Every command above attached to the shared fleet and left it running.
    assert shared.fleet.agent("greeter/3").call("greet", name="still").startswith("hello still")


@pytest.mark.timeout(180)
def test_job_entrypoint_runs_the_demo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    from rayfleet.jobs.demo import main as job_main

    monkeypatch.setenv("RAYFLEET_STORAGE", str(tmp_path / "job-store"))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert job_main() == 0
    assert "Demo passed" in capsys.readouterr().out


@pytest.mark.timeout(120)
def test_cli_reaches_a_postgresql_ledger_and_refuses_a_bad_ledger_url(postgres_ledger: str, storage: Path) -> None:
    namespace = f"cli-{uuid.uuid4().hex[:8]}"
    fleet = rf.connect(storage=storage, ledger=postgres_ledger, namespace=namespace, hosts=1)
    try:
        fleet.spawn("greeter/pg", Greeter)
        pg = CliFleet(fleet, storage, namespace)
        result = pg.run("send", "greeter/pg", "greet", "--json", '{"name": "pg"}', ledger=postgres_ledger)
        assert result.exit_code == 0 and json.loads(result.stdout) == "hello pg #1"
        refused(pg.run("status", ledger="mysql://db/x"), 2, "sqlite:///", "postgresql://")
    finally:
        fleet.shutdown(stop_actors=True)


@pytest.mark.timeout(180)
def test_demo_command_runs_the_demo(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["demo"], prog_name="rayfleet",
                                env={"RAY_ADDRESS": None, "RAYFLEET_STORAGE": str(tmp_path / "demo-store")})
    assert result.exit_code == 0, result.output
    assert "Demo passed" in result.stdout
    assert (tmp_path / "demo-store" / "fleet.json").is_file()  # the storage came from RAYFLEET_STORAGE


@pytest.mark.timeout(300)
def test_read_only_commands_read_a_stopped_embedded_fleet_without_a_cluster(tmp_path: Path) -> None:
    """After `rayfleet demo` exited, its storage is read directly: export, list, status, dead letters, runs."""
    store = tmp_path / "demo-store"
    result = CliRunner().invoke(cli, ["demo"], prog_name="rayfleet",
                                env={"RAY_ADDRESS": None, "RAYFLEET_STORAGE": str(store)})
    assert result.exit_code == 0, result.output
    before = sorted(path.relative_to(store) for path in store.rglob("*"))
    ledger_bytes = (store / "ledger.sqlite").read_bytes()

    # A separate process with no RAY_ADDRESS: it finds no fleet running in any cluster, as after the demo on a laptop.
    def rayfleet(*args: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "RAYFLEET_STORAGE": str(store)}
        env.pop("RAY_ADDRESS", None)
        return subprocess.run([sys.executable, "-m", "rayfleet.cli", *args], env=env, capture_output=True,
                              text=True, timeout=120, check=False)

    listed = rayfleet("list", "--json")
    assert listed.returncode == 0, listed.stderr
    identities = {agent["identity"]: agent for agent in json.loads(listed.stdout)}
    assert {"counter/alice", "counter/bob", "notes/ops"} <= set(identities), sorted(identities)
    assert all(agent["host"] is None for agent in identities.values())  # nothing runs them now

    exported = rayfleet("export", str(tmp_path / "out"), "--json")
    assert exported.returncode == 0, exported.stderr
    report = json.loads(exported.stdout)
    assert sum(report["tables"].values()) == len(identities) - report["uncheckpointed"] >= 3
    counters = pq.read_table(tmp_path / "out" / "rayfleet.demo.agents.Counter").to_pylist()
    assert {row["identity"]: row["total"] for row in counters}["counter/alice"] == 6  # 2 + 3, then 1 after the kill

    summary = rayfleet("status", "--json")
    assert summary.returncode == 0, summary.stderr
    assert json.loads(summary.stdout)["hosts"] == 0
    assert json.loads(summary.stdout)["identities"] == len(identities)
    for args in (["dead-letters", "list", "--json"], ["runs", "list", "--json"], ["topology", "export"]):
        assert rayfleet(*args).returncode == 0, args

    # Read only: the storage and the ledger are as the demo left them.
    after = sorted(path.relative_to(store) for path in store.rglob("*"))
    assert after == before
    assert (store / "ledger.sqlite").read_bytes() == ledger_bytes
    # A command that needs a running fleet still says there is none.
    refused_send = rayfleet("send", "counter/alice", "add", "--json", "{\"n\": 1}")
    assert refused_send.returncode == 2 and "no fleet to attach to" in refused_send.stderr


@pytest.mark.timeout(180)
def test_signal_and_approvals_list_show_approve_reject(shared: CliFleet) -> None:
    import time
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        waiting = pool.submit(shared.fleet.agent("greeter/3").call, "wait_for", name="go")
        sent = shared.data("signal", "greeter/3", "go", "--value", '{"eur": 30}', "--id", "sig-1", "--json")
        assert sent["identity"] == "greeter/3" and sent["woken"] in (0, 1)
        assert waiting.result(timeout=60) == {"eur": 30}
        kept = shared.run("signal", "greeter/3", "later")
        assert kept.exit_code == 0 and "kept until a turn waits" in kept.stdout
        refused(shared.run("signal", "nobody/here", "go"), 2, "unknown identity")
        refused(shared.run("signal", "greeter/3", "go", "--value", "{nope"), 2, "not valid JSON")

        asked = pool.submit(shared.fleet.agent("greeter/1").call, "ask", subject="refund")
        deadline = time.monotonic() + 60
        while not (pending := shared.data("approvals", "list", "--identity", "greeter/*", "--json")):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        (approval,) = pending
        assert (approval["subject"], approval["status"], approval["data"]) == ("refund", "PENDING",
                                                                              {"subject": "refund"})
        assert shared.data("approvals", "list", "--run", "no-such-run", "--json") == []
        shown = shared.run("approvals", "show", approval["id"])
        assert shown.exit_code == 0 and "refund" in shown.stdout and "alice, bob" in shown.stdout
        refused(shared.run("approvals", "approve", approval["id"], "--by", "mallory"), 2, "approvers")
        refused(shared.run("approvals", "approve", approval["id"], "--by", "alice", "--expect-version", "9"), 2,
                "changed since you read it")
        decided = shared.data("approvals", "approve", approval["id"], "--by", "alice", "--comment", "ok", "--json")
        assert (decided["status"], decided["decided_by"]) == ("APPROVED", "alice")
        assert asked.result(timeout=60) == "refund: approved by alice (ok)"
    refused(shared.run("approvals", "reject", approval["id"], "--by", "bob"), 2, "already approved by alice")
    refused(shared.run("approvals", "show", "no-such"), 2, "there is no approval")
    assert shared.data("approvals", "list", "--json") == []
    everything = shared.data("approvals", "list", "--status", "all", "--json")
    assert [item["id"] for item in everything] == [approval["id"]]


@pytest.mark.timeout(120)
def test_turns_lists_turns_in_progress_and_follows_one_turns_events(shared: CliFleet) -> None:
    import time
    from concurrent.futures import ThreadPoolExecutor

    assert shared.data("turns", "greeter/2", "--json") == []
    assert "no turns in progress" in shared.run("turns", "greeter/2").stdout
    handle = shared.fleet.agent("greeter/2").start("wait_for", name="tick")
    deadline = time.monotonic() + 60
    while not (listed := shared.data("turns", "greeter/2", "--json")):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    (turn,) = listed
    assert (turn["id"], turn["method"], turn["status"], turn["waiting_for"]) == (
        handle.id, "wait_for", "SUSPENDED", "signal:tick")
    table = shared.run("turns", "greeter/2")
    assert table.exit_code == 0 and "wait_for" in table.stdout and "SUSPENDED" in table.stdout

    def signal_once_followed() -> None:
        # Following the suspended turn starts its stream; then the signal resumes it.
        while not shared.fleet._ledger.turn_events(identity="greeter/2", turn_id=handle.id).result():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        shared.fleet.signal("greeter/2", "tick", 5)

    with ThreadPoolExecutor(1) as pool:
        signalling = pool.submit(signal_once_followed)
        followed = shared.run("turns", "greeter/2", "--follow", handle.id, "--json")
        signalling.result(timeout=60)
    assert followed.exit_code == 0, followed.output
    events = [json.loads(line) for line in followed.stdout.splitlines()]
    assert [event["kind"] for event in events] == ["started", "resumed", "completed"]
    assert events[-1]["data"] == {"value": 5} and handle.result(timeout=60) == 5
    again = shared.run("turns", "greeter/2", "--follow", handle.id, "--after", events[-2]["id"])
    assert again.exit_code == 0 and again.stdout.split()[1] == "completed"
    refused(shared.run("turns", "greeter/2", "--follow", handle.id, "--after", "nonsense"), 2, "not an event id")
    refused(shared.run("turns", "greeter/2", "--after", "1.1"), 2, "--follow")
    refused(shared.run("turns", "nobody/here"), 2, "unknown identity")


@pytest.mark.timeout(120)
def test_timers_list_fire_now_and_cancel(shared: CliFleet) -> None:
    import time

    assert shared.data("send", "greeter/3", "plan", "--json", '{"every": 3600}') is None
    (timer,) = shared.data("timers", "list", "--identity", "greeter/3", "--json")
    assert (timer["name"], timer["kind"], timer["method"], timer["every"]) == ("nudge", "periodic", "greet", 3600.0)
    assert "nudge" in shared.run("timers", "list").stdout
    assert shared.data("timers", "list", "--due-within", "60", "--json") == []
    assert shared.run("timers", "fire-now", "greeter/3", "nudge").exit_code == 0
    deadline = time.monotonic() + 60
    while shared.data("timers", "list", "--identity", "greeter/3", "--json")[0]["fired"] < 1:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert shared.data("timers", "cancel", "greeter/3", "nudge", "--json")["cancelled"] is True
    assert shared.data("timers", "list", "--identity", "greeter/3", "--json") == []
    refused(shared.run("timers", "fire-now", "greeter/3", "nudge"), 2, "has no timer")
    refused(shared.run("timers", "list", "--identity", "nobody/here"), 2, "unknown identity")
