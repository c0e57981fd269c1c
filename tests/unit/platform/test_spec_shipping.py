"""Specs travel to hosts that cannot import the driver's modules: agent classes not installed go by value.

No Ray here: the bytes a driver writes to the ledger are unpickled in a fresh Python
whose ``sys.path`` lacks the roster's folder, as a host started by another driver would.
"""

from __future__ import annotations

import dataclasses
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import cloudpickle
import pytest

import rayfleet as rf
from rayfleet.platform._shipping import pickle_spec
from rayfleet.roster import load_roster

AGENTS = '''
import rayfleet as rf
from ship_helpers import shout


class Echo(rf.Agent):
    class State(rf.State):
        heard: list[str] = []

    @rf.handler
    async def echo(self, text: str) -> str:
        self.state.heard.append(text)
        return shout(text)
'''

HELPERS = '''
def shout(text: str) -> str:
    return text.upper() + "!"
'''

HOST = '''
import asyncio, importlib.util, sys
import cloudpickle

assert importlib.util.find_spec("ship_agents") is None, "the roster's module must not be importable here"
assert importlib.util.find_spec("ship_helpers") is None
spec = cloudpickle.loads(open(sys.argv[1], "rb").read())
agent = spec.agent_class()
print(spec.identity, spec.agent_class_path, asyncio.run(type(agent).echo(agent, text="hi")), agent.state.heard)
'''


@pytest.fixture
def roster_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "team"
    folder.mkdir()
    (folder / "ship_agents.py").write_text(AGENTS)
    (folder / "ship_helpers.py").write_text(HELPERS)
    (folder / "team.yaml").write_text("agents:\n  - identity: echo/one\n    agent: ship_agents:Echo\n")
    return folder


def test_a_roster_module_beside_the_roster_file_is_rebuilt_where_it_cannot_be_imported(
    roster_folder: Path, tmp_path: Path
) -> None:
    path_before = list(sys.path)
    [spec] = load_roster(str(roster_folder / "team.yaml"))
    assert sys.path == path_before, "loading a roster must not leave its folder on sys.path"
    assert spec.agent == "ship_agents:Echo"
    blob = tmp_path / "spec.bin"
    blob.write_bytes(pickle_spec(spec))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(HOST), str(blob)], cwd=elsewhere,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    # The helper module imported beside the agent's travelled with it.
    assert done.stdout.split() == ["echo/one", "ship_agents:Echo", "HI!", "['hi']"]


def test_specs_a_ledger_stored_before_shipping_moved_still_rebuild(roster_folder: Path) -> None:
    # Stored spec bytes name the function that rebuilds them; older ones name its first home.
    from rayfleet.platform import _shipping

    [spec] = load_roster(str(roster_folder / "team.yaml"))
    package = pickle.loads(pickle_spec(spec))
    assert isinstance(package, rf.AgentSpec)
    fields = {field.name: getattr(package, field.name) for field in dataclasses.fields(package) if field.name != "agent"}
    current = pickle.dumps(_shipping._SpecPackage(fields, _shipping._class_bytes(package.agent_class)), protocol=3)
    here, before = b"crayfleet.platform._shipping\nrebuild_spec\n", b"crayfleet.platform._fleet\n_rebuild_spec\n"
    assert current.count(here) == 1
    rebuilt = cloudpickle.loads(current.replace(here, before))
    assert rebuilt.identity == "echo/one" and rebuilt.agent_class is package.agent_class


def test_a_class_path_of_an_installed_package_stays_a_reference() -> None:
    spec = rf.AgentSpec(identity="counter/a", agent="rayfleet.demo.agents:Counter")
    rebuilt = cloudpickle.loads(pickle_spec(spec))
    assert rebuilt.agent == "rayfleet.demo.agents:Counter"
    assert len(pickle_spec(spec)) < 2_000  # the path, not the class's code


def test_an_agent_module_that_cannot_be_pickled_is_refused_with_the_fix(tmp_path: Path) -> None:
    (tmp_path / "ship_locked.py").write_text(
        "import threading\nimport rayfleet as rf\nLOCK = threading.Lock()\n\n"
        "class Locked(rf.Agent):\n    @rf.handler\n    async def get(self) -> bool:\n        return LOCK.locked()\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        import ship_locked  # type: ignore[import-not-found]

        with pytest.raises(rf.InvalidSpecError, match="cannot be pickled.*on_activate"):
            pickle_spec(rf.AgentSpec(identity="locked/a", agent=ship_locked.Locked))
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("ship_locked", None)


def test_specs_of_one_shipped_class_rebuild_the_class_once_not_once_per_identity(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Rebuilding a class by value runs its metaclass (a State's pydantic schema) even when
    # cloudpickle then hands back the class it already has: once per activation, before.
    import cloudpickle.cloudpickle as by_value

    (tmp_path / "ship_many.py").write_text(AGENTS.replace("from ship_helpers import shout", "shout = str.upper"))
    monkeypatch.syspath_prepend(str(tmp_path))
    import ship_many  # type: ignore[import-not-found]

    try:
        blobs = [pickle_spec(rf.AgentSpec(identity=f"echo/{index}", agent=ship_many.Echo)) for index in range(20)]
        built: list[str] = []
        skeleton = by_value._make_skeleton_class

        def counted(*args: object, **kwargs: object) -> type:
            built.append(str(args[1]))
            return skeleton(*args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(by_value, "_make_skeleton_class", counted)
        specs = [cloudpickle.loads(blob) for blob in blobs]
        assert {spec.agent_class for spec in specs} == {ship_many.Echo}
        # Echo, its State and its handler's arguments model: each once (was once per spec: 60).
        assert sorted(built) == sorted(set(built)) and len(built) <= 3, built
    finally:
        sys.modules.pop("ship_many", None)
