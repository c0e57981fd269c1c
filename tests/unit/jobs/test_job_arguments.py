"""Job entrypoints refuse bad arguments before they touch a cluster: exit code 2 and what to do."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rayfleet.jobs import apply, demo, workflow

FLOWS = '''
import rayfleet as rf

def trip() -> rf.Workflow:
    wf = rf.Workflow("trip")
    wf.step("count", to="counter/a", call="add", payload={"n": 1})
    return wf

ready = trip()
not_a_workflow = 42
'''


@pytest.fixture
def flows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "job_flows.py").write_text(FLOWS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("RAYFLEET_STORAGE", raising=False)
    return tmp_path


def test_a_workflow_is_named_by_import_path_as_an_object_or_a_factory(flows: Path) -> None:
    assert workflow.load_workflow("job_flows:trip").name == "trip"
    assert workflow.load_workflow("job_flows:ready").name == "trip"


@pytest.mark.parametrize(("path", "message"), [
    ("job_flows", "must look like 'package.module:attribute'"),
    ("no_such_module_x:trip", "cannot import module 'no_such_module_x'.*--working-dir"),
    ("job_flows:missing", "has no 'missing'"),
    ("job_flows:not_a_workflow", "is a int, not an rf.Workflow"),
])
def test_a_bad_workflow_path_exits_2_naming_the_problem(
    flows: Path, path: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert workflow.main([path, "--run-id", "r1", "--storage", str(flows / "store")]) == 2
    assert re.search(message, capsys.readouterr().err)


def test_a_workflow_job_needs_a_run_id(flows: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert workflow.main(["job_flows:trip", "--storage", str(flows / "store")]) == 2
    assert "--run-id" in capsys.readouterr().err


@pytest.mark.parametrize("job", [apply, workflow])
def test_jobs_that_keep_state_refuse_to_run_without_a_named_storage(
    job: object, flows: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    roster = flows / "team.yaml"
    roster.write_text("agents: []\n")
    argv = [str(roster)] if job is apply else ["job_flows:trip", "--run-id", "r1"]
    assert job.main(argv) == 2  # type: ignore[attr-defined]
    err = capsys.readouterr().err
    assert "RAYFLEET_STORAGE" in err and "new for each submission" in err


def test_apply_names_a_missing_roster_file(flows: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert apply.main([str(flows / "nope.yaml"), "--storage", str(flows / "store")]) == 2
    assert "nope.yaml" in capsys.readouterr().err


@pytest.mark.parametrize("job", [apply, demo, workflow])
def test_every_job_explains_itself(job: object, capsys: pytest.CaptureFixture[str]) -> None:
    assert job.main(["--help"]) == 0  # type: ignore[attr-defined]
    assert "Usage: rayfleet.jobs." in capsys.readouterr().out
