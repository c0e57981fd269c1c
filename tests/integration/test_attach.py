"""A driver that attaches to a running ``ray start`` cluster never stops the fleet it found there.

The cluster here is a real ``ray start --head`` of its own, with its own temp folder
(``RAY_TMPDIR``), so the address file ``ray.init()`` discovers it by is not the shared
``/tmp/ray`` one, and the test session's Ray is not touched. Every driver runs in a
subprocess: this process is already connected to the session's Ray.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

import rayfleet as rf

RAY = str(Path(sys.executable).parent / "ray")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _environment(temp_root: str, *, address: str | None) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if name != "RAY_ADDRESS"}
    env["RAY_TMPDIR"] = temp_root  # ray start writes <root>/ray/ray_current_cluster; ray.init() reads it
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    if address is not None:
        env["RAY_ADDRESS"] = address
    return env


@pytest.fixture
def cluster() -> Iterator[tuple[str, str]]:
    """A head node started by ``ray start``: ``(address, temp root)``; only its own processes are stopped."""
    # Short: Ray's socket paths under the temp root must fit in 107 bytes.
    temp_root = tempfile.mkdtemp(prefix="rfa-", dir="/tmp")
    port = _free_port()
    address = f"127.0.0.1:{port}"
    subprocess.run(
        [RAY, "start", "--head", f"--port={port}", "--num-cpus=1", "--include-dashboard=false",
         "--disable-usage-stats"],
        env=_environment(temp_root, address=None), check=True, capture_output=True, timeout=120,
    )
    try:
        yield address, temp_root
    finally:
        # Never `ray stop`: it stops every Ray on the machine. Ours are the processes that
        # name our temp root (or our GCS port) on their command line.
        for process in psutil.process_iter(["cmdline"]):
            line = " ".join(process.info["cmdline"] or ())
            if process.pid != os.getpid() and (temp_root in line or f"--gcs-address={address}" in line):
                with contextlib.suppress(psutil.NoSuchProcess):
                    process.kill()


def _python(script: str, env: dict[str, str], cwd: Path) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.timeout(400)
def test_cli_without_ray_address_leaves_a_fleet_on_the_discovered_cluster_running(
    cluster: tuple[str, str], tmp_path: Path
) -> None:
    address, temp_root = cluster
    namespace = f"attach-{uuid.uuid4().hex[:8]}"
    storage = tmp_path / "store"
    attached = _environment(temp_root, address=address)
    discovered = _environment(temp_root, address=None)
    # A driver given the address creates the fleet, adds 2, and leaves (its shutdown must not stop it).
    out = _python(f"""
        import rayfleet as rf
        fleet = rf.connect(storage={str(storage)!r}, namespace={namespace!r}, hosts=1)
        print(fleet.started_ray)
        fleet.spawn("counter/a", "rayfleet.demo.agents:Counter")
        print(fleet.agent("counter/a").call("add", n=2))
        print(fleet.hosts()[0].holder)
        fleet.shutdown()
    """, attached, tmp_path)
    started, total, holder = out.split()
    assert (started, total) == ("False", "2")

    # The CLI with no RAY_ADDRESS finds the cluster the way ray.init() does, and on exit
    # must leave every actor of the fleet it attached to running.
    cli = subprocess.run(
        [sys.executable, "-c", "from rayfleet.cli import main; raise SystemExit(main())",
         "--storage", str(storage), "--namespace", namespace, "send", "counter/a", "add", "--json", '{"n": 3}'],
        env=discovered, cwd=tmp_path, capture_output=True, text=True, timeout=180,
    )
    assert cli.returncode == 0, cli.stderr[-3000:]
    assert cli.stdout.strip() == "5"

    out = _python(f"""
        import ray
        ray.init(namespace={namespace!r})
        alive = []
        for name in ("rayfleet-host-0", "rayfleet-ledger"):
            try:
                ray.get_actor(name)
            except ValueError:  # killed for good (the CLI's shutdown kills with no_restart)
                continue
            alive.append(name)
        print(" ".join(alive) or "-")
    """, attached, tmp_path)
    assert out.split() == ["rayfleet-host-0", "rayfleet-ledger"]
    # The same host incarnation (same lease holder) still serves the agent: 5 + 1.
    out = _python(f"""
        import rayfleet as rf
        fleet = rf.connect(storage={str(storage)!r}, namespace={namespace!r}, hosts=1)
        print(fleet.agent("counter/a").call("add", n=1))
        print(fleet.hosts()[0].holder)
        fleet.shutdown()
    """, attached, tmp_path)
    assert out.split() == ["6", holder]


def test_a_driver_inside_an_initialized_ray_did_not_start_it(fleet: rf.Fleet) -> None:
    # The session fixture started Ray; a fleet connecting inside it must never claim it.
    assert fleet.started_ray is False
