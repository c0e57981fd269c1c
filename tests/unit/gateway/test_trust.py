"""The trust boundary: HTTP clients name code only from allowed modules or classes the fleet already hosts."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

import rayfleet as rf
from rayfleet.demo import Counter
from rayfleet.gateway import allowed_modules_from_env
from rayfleet.gateway._problems import HttpProblem
from rayfleet.gateway._trust import ModulePolicy, known_agent_classes, specs_from_roster, workflow_from_path
from rayfleet.roster import RosterFile


@pytest.fixture
def tripwire(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A module ``gw_tripwire`` whose import writes a file: proof that something imported it."""
    marker = tmp_path / "imported"
    (tmp_path / "gw_tripwire.py").write_text(textwrap.dedent(f"""
        import pathlib
        import rayfleet as rf
        pathlib.Path({str(marker)!r}).write_text("imported")

        class Sneaky(rf.Agent):
            class State(rf.State):
                n: int = 0

        def build(name="gw-flow", target="counter/x"):
            workflow = rf.Workflow(name)
            workflow.step("one", to=target, call="add", payload={{"n": 1}})
            return workflow

        flow = build()
        not_a_workflow = 42
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "gw_tripwire", raising=False)
    return marker


def test_allowed_modules_from_env() -> None:
    assert allowed_modules_from_env(None) is None
    assert allowed_modules_from_env("  , ") is None
    assert allowed_modules_from_env("myapp.agents, other ,") == ("myapp.agents", "other")


def test_a_module_allows_itself_and_its_submodules_only() -> None:
    policy = ModulePolicy(allowed_modules=("myapp",))
    assert policy.allows("myapp") and policy.allows("myapp.agents.deep")
    assert not policy.allows("myapp2") and not policy.allows("my") and not policy.allows("other.myapp")
    assert not ModulePolicy(allowed_modules=None).allows("myapp")


def _roster(*agents: dict[str, object]) -> RosterFile:
    return RosterFile.model_validate({"agents": list(agents)})


def test_an_unknown_class_from_a_module_not_allowed_is_refused_before_import(tripwire: Path) -> None:
    roster = _roster({"identity": "ok/1", "agent": "rayfleet.demo.agents:Counter"},
                     {"identity": "bad/1", "agent": "gw_tripwire:Sneaky"})
    known = known_agent_classes([rf.AgentSpec(identity="c/1", agent=Counter)])
    with pytest.raises(HttpProblem) as caught:
        specs_from_roster(roster, known_classes=known, policy=ModulePolicy(allowed_modules=("rayfleet.demo",)))
    assert (caught.value.status, caught.value.field) == (403, "agents.1.agent")
    assert "RAYFLEET_ALLOWED_MODULES" in caught.value.message and "Nothing was applied" in caught.value.message
    assert not tripwire.exists()
    assert "gw_tripwire" not in sys.modules


def test_by_default_only_classes_the_fleet_hosts_are_allowed(tripwire: Path) -> None:
    known = known_agent_classes([rf.AgentSpec(identity="c/1", agent=Counter)])
    specs = specs_from_roster(_roster({"identity": "new/1", "agent": "rayfleet.demo.agents:Counter"}),
                              known_classes=known, policy=ModulePolicy())
    assert [(spec.identity, spec.agent) for spec in specs] == [("new/1", Counter)]
    with pytest.raises(HttpProblem) as caught:
        specs_from_roster(_roster({"identity": "x/1", "agent": "rayfleet.demo.agents:Planner"}),
                          known_classes=known, policy=ModulePolicy())
    assert caught.value.status == 403 and "is not set" in caught.value.message


def test_an_allowed_module_is_imported_and_its_class_used(tripwire: Path) -> None:
    specs = specs_from_roster(_roster({"identity": "s/1", "agent": "gw_tripwire:Sneaky", "labels": {"a": "b"}}),
                              known_classes={}, policy=ModulePolicy(allowed_modules=("gw_tripwire",)))
    assert tripwire.exists()
    assert specs[0].agent_class_path == "gw_tripwire:Sneaky" and dict(specs[0].labels) == {"a": "b"}


def test_a_workflow_from_a_module_not_allowed_is_refused_before_import(tripwire: Path) -> None:
    for policy in (ModulePolicy(), ModulePolicy(allowed_modules=("rayfleet",))):
        with pytest.raises(HttpProblem) as caught:
            workflow_from_path("gw_tripwire:flow", {}, policy=policy)
        assert (caught.value.status, caught.value.field) == (403, "workflow")
    assert not tripwire.exists()


def test_workflows_are_objects_or_functions_called_with_params(tripwire: Path) -> None:
    policy = ModulePolicy(allowed_modules=("gw_tripwire",))
    assert workflow_from_path("gw_tripwire:flow", {}, policy=policy).name == "gw-flow"
    assert workflow_from_path("gw_tripwire:build", {"name": "other"}, policy=policy).name == "other"


@pytest.mark.parametrize(("path", "params", "field", "text"), [
    ("gw_tripwire:flow", {"name": "x"}, "params", "takes no params"),
    ("gw_tripwire:build", {"nope": 1}, "params", "do not fit"),
    ("gw_tripwire:build", {"name": "/bad"}, "params", "raised InvalidSpecError"),
    ("gw_tripwire:not_a_workflow", {}, "workflow", "neither an rf.Workflow"),
    ("gw_tripwire:missing", {}, "workflow", "has no public"),
    ("gw_tripwire:_private", {}, "workflow", "has no public"),
    ("gw_tripwire.sub:flow", {}, "workflow", "cannot import"),
    ("gw_tripwire", {}, "workflow", "must look like"),
])
def test_bad_workflow_paths_are_400_naming_the_field(tripwire: Path, path: str, params: dict[str, object],
                                                      field: str, text: str) -> None:
    with pytest.raises(HttpProblem) as caught:
        workflow_from_path(path, params, policy=ModulePolicy(allowed_modules=("gw_tripwire",)))
    assert (caught.value.status, caught.value.field) == (400, field)
    assert text in caught.value.message
