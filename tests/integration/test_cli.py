"""The rayfleet command line against a live fleet in the test session's Ray."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

import rayfleet as rf
from rayfleet.cli._app import main


class Greeter(rf.Agent):
    class State(rf.State):
        greeted: list[str] = []

    @rf.handler
    async def greet(self, name: str) -> str:
        self.state.greeted = [*self.state.greeted, name]
        return f"hello {name}"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, object]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, json.loads(out.out) if code == 0 and out.out.strip() else out.err


@pytest.mark.timeout(120)
def test_cli_send_status_pause_and_dead_letters(storage: Path, capsys: pytest.CaptureFixture[str]) -> None:
    namespace = f"cli-{uuid.uuid4().hex[:8]}"
    fleet = rf.connect(storage=storage, namespace=namespace, hosts=1)
    try:
        fleet.spawn("greeter/1", Greeter)
        common = ("--storage", str(storage), "--namespace", namespace)
        assert run(capsys, *common, "send", "greeter/1", "greet", "--json", '{"name": "ada"}') == (0, "hello ada")
        code, statuses = run(capsys, *common, "status")
        assert code == 0 and [s["identity"] for s in statuses] == ["greeter/1"]  # type: ignore[union-attr,index]
        code, error = run(capsys, *common, "send", "greeter/1", "greet", "--json", "{not json")
        assert code == 2 and "--json is not valid JSON" in str(error)
        code, error = run(capsys, *common, "send", "greeter/1", "greet", "--json", '{"name": 3.5}')
        assert code == 2 and "not valid" in str(error)
        code, letters = run(capsys, *common, "dead-letters", "list")
        assert code == 0 and [letter["reason"] for letter in letters] == ["DECODE_FAILED"]  # type: ignore[index,union-attr]
        assert run(capsys, *common, "pause", "greeter/1")[0] == 0
        assert fleet.status("greeter/1").paused
        code, resumed = run(capsys, *common, "resume", "greeter/1")
        assert code == 0 and resumed == {"resumed": "greeter/1", "replayed": 0}
        code, error = run(capsys, *common, "status", "nobody/here")
        assert code == 2 and "unknown identity" in str(error)
        roster = str(Path(__file__).resolve().parents[2] / "examples" / "team.yaml")
        code, preview = run(capsys, *common, "apply", roster, "--dry-run")
        assert code == 0 and preview["dry_run"] and len(preview["created"]) == 3  # type: ignore[index]
        code, applied = run(capsys, *common, "apply", roster)
        assert code == 0 and len(applied["topology"]["wired"]) == 2  # type: ignore[index]
        assert main([*common, "topology", "export", "--format", "mermaid"]) == 0
        assert "team/planner" in capsys.readouterr().out
        workflow = rf.Workflow("cli-wf")
        workflow.step("hello", to="greeter/1", call="greet", payload={"name": "runs"})
        outcome = fleet.run(workflow)
        assert outcome.status is rf.RunStatus.COMPLETED, str(outcome.error.__cause__ or outcome.error)
        code, runs = run(capsys, *common, "runs", "list")
        assert code == 0 and [r["run_id"] for r in runs] == [outcome.run_id]  # type: ignore[index,union-attr]
        code, shown = run(capsys, *common, "runs", "show", outcome.run_id)
        assert code == 0 and shown["status"] == "COMPLETED"  # type: ignore[index]
        code, error = run(capsys, *common, "runs", "show", "no-such-run")
        assert code == 2 and "no run" in str(error)
    finally:
        fleet.shutdown(stop_actors=True)


@pytest.mark.timeout(180)
def test_job_entrypoint_runs_the_demo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    from rayfleet.jobs.demo import main as job_main

    monkeypatch.setenv("RAYFLEET_STORAGE", str(tmp_path / "job-store"))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert job_main() == 0
    assert "Demo passed" in capsys.readouterr().out


@pytest.mark.timeout(120)
def test_cli_reaches_a_postgresql_ledger_and_refuses_a_bad_ledger_url(
    postgres_ledger: str, storage: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    namespace = f"cli-{uuid.uuid4().hex[:8]}"
    fleet = rf.connect(storage=storage, ledger=postgres_ledger, namespace=namespace, hosts=1)
    try:
        fleet.spawn("greeter/pg", Greeter)
        common = ("--storage", str(storage), "--namespace", namespace, "--ledger", postgres_ledger)
        assert run(capsys, *common, "send", "greeter/pg", "greet", "--json", '{"name": "pg"}') == (0, "hello pg")
        code, message = run(capsys, "--storage", str(storage), "--namespace", f"cli-{uuid.uuid4().hex[:8]}",
                            "--ledger", "mysql://db/x", "status")
        assert code == 2 and "sqlite:///" in str(message) and "postgresql://" in str(message)
    finally:
        fleet.shutdown(stop_actors=True)
