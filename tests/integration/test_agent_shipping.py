"""Agent classes reach hosts that cannot import them: a roster's module beside the roster file, a
module on the driver's ``sys.path`` only, and the same after Ray restarts the host process.

The hosts here were started by this test session's driver from the repository's folder;
the agents' modules are written afterwards into temporary folders the hosts never had
on their path, which a probe agent checks on the host itself.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray

import rayfleet as rf


class Probe(rf.Agent):
    """Answers from inside a host: can this process import a module, and which process is it."""

    @rf.handler
    async def importable(self, name: str) -> bool:
        importlib.invalidate_caches()
        return importlib.util.find_spec(name) is not None

    @rf.handler
    async def pid(self) -> int:
        return os.getpid()


def _write_agents(folder: Path, module: str) -> None:
    """``<module>.py`` with an Echo agent that uses a helper from ``<module>_helpers.py`` beside it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{module}_helpers.py").write_text("def shout(text: str) -> str:\n    return text.upper() + '!'\n")
    (folder / f"{module}.py").write_text(
        "import rayfleet as rf\n"
        f"from {module}_helpers import shout\n\n\n"
        "class Echo(rf.Agent):\n"
        "    class State(rf.State):\n"
        "        heard: int = 0\n\n"
        "    @rf.handler\n"
        "    async def echo(self, text: str) -> str:\n"
        "        self.state.heard += 1\n"
        "        return f'{shout(text)} #{self.state.heard}'\n"
    )


@pytest.fixture(scope="module")
def fleet(ray_session: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[rf.Fleet]:
    # One host, so a call after its restart must be served by the restarted process.
    fleet = rf.connect(storage=tmp_path_factory.mktemp("shipping") / "store", namespace=f"t-{uuid.uuid4().hex[:10]}",
                       hosts=1, lease_ttl=3.0)
    yield fleet
    fleet.shutdown(stop_actors=True)


@pytest.fixture(scope="module")
def probe(fleet: rf.Fleet) -> rf.AgentRef:
    return fleet.spawn("probe/host", Probe)


def _apply_roster_beside_its_module(fleet: rf.Fleet, folder: Path, module: str, identity: str) -> rf.ApplyReport:
    _write_agents(folder, module)
    roster = folder / "team.yaml"
    roster.write_text(f"agents:\n  - identity: {identity}\n    agent: {module}:Echo\n    labels: {{role: echo}}\n")
    return fleet.apply(str(roster))


def test_a_roster_module_beside_the_roster_file_runs_on_hosts_that_cannot_import_it(
    fleet: rf.Fleet, probe: rf.AgentRef, tmp_path: Path
) -> None:
    module = f"acc_agents_{uuid.uuid4().hex[:8]}"
    report = _apply_roster_beside_its_module(fleet, tmp_path / "roster", module, "echo/roster")
    assert report.created == ("echo/roster",)
    assert probe.call("importable", name=module) is False
    assert probe.call("importable", name=f"{module}_helpers") is False
    assert module not in sys.path and str(tmp_path / "roster") not in sys.path

    assert fleet.agent("echo/roster").call("echo", text="hi") == "HI! #1"
    assert fleet.status("echo/roster").agent_class == f"{module}:Echo"
    # Applying the same roster again changes nothing: the shipped class keeps its path.
    again = fleet.apply(str(tmp_path / "roster" / "team.yaml"))
    assert (again.created, again.updated, again.unchanged) == ((), {}, ("echo/roster",))
    assert fleet.agent("echo/roster").call("echo", text="again") == "AGAIN! #2"


def test_a_class_from_a_folder_on_the_drivers_path_only_runs_on_the_hosts(
    fleet: rf.Fleet, probe: rf.AgentRef, tmp_path: Path
) -> None:
    module = f"driver_agents_{uuid.uuid4().hex[:8]}"
    _write_agents(tmp_path / "src", module)
    sys.path.insert(0, str(tmp_path / "src"))
    try:
        agents = importlib.import_module(module)
        ref = fleet.spawn("echo/driver", agents.Echo)
        assert probe.call("importable", name=module) is False
        assert ref.call("echo", text="yo") == "YO! #1"
    finally:
        sys.path.remove(str(tmp_path / "src"))


def test_a_host_restarted_by_ray_rebuilds_shipped_classes_from_the_ledger(
    fleet: rf.Fleet, probe: rf.AgentRef, tmp_path: Path
) -> None:
    module = f"restart_agents_{uuid.uuid4().hex[:8]}"
    _apply_roster_beside_its_module(fleet, tmp_path / "roster", module, "echo/restart")
    ref = fleet.agent("echo/restart")
    assert ref.call("echo", text="one") == "ONE! #1"
    pid_before = probe.call("pid")
    [host] = fleet.hosts()

    # A crash, not a removal: Ray starts the same named actor again in a new process,
    # which knows nothing but what the ledger holds.
    ray.kill(ray.get_actor(host.name, namespace=fleet.config.namespace), no_restart=False)
    # ray.kill returns before the process is gone, and the dying one may still answer a call.
    deadline = time.monotonic() + 60
    while probe.call("pid", timeout=60) == pid_before:
        assert time.monotonic() < deadline, "the host was not restarted within 60 s"
        time.sleep(0.1)

    assert ref.call("echo", text="two", timeout=60) == "TWO! #2"
    assert probe.call("importable", name=module) is False
    assert fleet.status("echo/restart").host == host.name
