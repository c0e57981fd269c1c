"""Hosts on a node that Ray drains (``ray drain-node``, the autoscaler, KubeRay scale-down) drain themselves.

The shared test Ray has one node, so this test starts its own two-node cluster (a head
and a worker node, on free ports, its own temp folder) and drives a fleet on it from a
subprocess. It tears the cluster down by killing only the processes it started.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
from ray_helpers import kill_processes_under

DRIVER = textwrap.dedent('''
    import json, subprocess, sys, time
    import ray
    import rayfleet as rf

    class Notebook(rf.Agent):
        class State(rf.State):
            lines: list[str] = []

        @rf.handler
        def write(self, line: str) -> int:
            self.state.lines.append(line)
            return len(self.state.lines)

    address, storage, worker_node = sys.argv[1], sys.argv[2], sys.argv[3]
    fleet = rf.connect(address, storage, namespace="drain-node", hosts=2, lease_ttl=120.0)

    def node_of(host):
        handle = ray.get_actor(host, namespace="drain-node")
        return ray.get(handle.__ray_call__.remote(lambda actor: ray.get_runtime_context().get_node_id()))

    for _ in range(8):  # placement spreads hosts: make sure some run on the worker node and some elsewhere
        nodes = {info.name: node_of(info.name) for info in fleet.hosts()}
        if worker_node in nodes.values() and set(nodes.values()) - {worker_node}:
            break
        fleet.add_host()
    doomed = sorted(name for name, node in nodes.items() if node == worker_node)
    refs = [fleet.spawn(f"note/{i}", Notebook, durability=rf.Durability.ON_DEACTIVATE) for i in range(16)]
    for ref in refs:
        ref.call("write", line="kept")
    moving = [ref.identity for ref in refs if fleet.status(ref.identity).host in doomed]

    subprocess.run(["ray", "drain-node", "--address", address, "--node-id", worker_node, "--reason",
                    "DRAIN_NODE_REASON_PREEMPTION", "--reason-message", "rayfleet test",
                    "--deadline-remaining-seconds", "60"], check=True, capture_output=True)
    for _ in range(600):
        if all(fleet.status(identity).lease is None for identity in moving):
            break
        time.sleep(0.1)
    statuses = {identity: fleet.status(identity) for identity in moving}
    ledger_node = node_of("rayfleet-ledger")
    print(json.dumps({
        "ledger_on_worker": ledger_node == worker_node,
        "doomed": doomed,
        "moving": moving,
        "draining": sorted(info.name for info in fleet.hosts() if info.draining),
        "released": [identity for identity, status in statuses.items() if status.lease is None],
        "checkpointed": [identity for identity, status in statuses.items() if status.checkpoint_version == 1],
        "values": [ref.call("write", line="again") for ref in refs],
    }))
''')


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.timeout(300)
def test_hosts_on_a_node_ray_drains_move_their_agents_off_it(tmp_path: Path) -> None:
    ray_cli = shutil.which("ray", path=str(Path(sys.executable).parent)) or "ray"
    temp_dir = Path(tempfile.mkdtemp(prefix="rfdrain-", dir="/tmp"))  # Ray's socket paths must stay short
    port = _free_port()
    address = f"127.0.0.1:{port}"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    env.pop("RAY_ADDRESS", None)
    started = [
        [ray_cli, "start", "--head", "--port", str(port), "--node-ip-address", "127.0.0.1", "--num-cpus", "1",
         "--include-dashboard=false", "--temp-dir", str(temp_dir)],
        [ray_cli, "start", "--address", address, "--node-ip-address", "127.0.0.1", "--num-cpus", "1",
         "--resources", '{"rayfleet_test_worker": 1}'],
    ]
    try:
        for command in started:
            subprocess.run(command, check=True, capture_output=True, env=env, timeout=120)
        probe = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(f'''
                import ray
                ray.init(address="{address}", log_to_driver=False)
                print(next(n["NodeID"] for n in ray.nodes() if n["Alive"] and "rayfleet_test_worker" in n["Resources"]))
            ''')], check=True, capture_output=True, text=True, env=env, timeout=120,
        )
        worker_node = probe.stdout.strip().splitlines()[-1]
        script = tmp_path / "driver.py"
        script.write_text(DRIVER)
        run = subprocess.run([sys.executable, str(script), address, str(tmp_path / "store"), worker_node],
                             capture_output=True, text=True, env=env, timeout=240)
        assert run.returncode == 0, run.stderr[-3000:]
        result = json.loads(run.stdout.strip().splitlines()[-1])
    finally:
        kill_processes_under(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)

    # R6: the SQLite ledger's actor is pinned to the head node, where its file is, never spread.
    assert result["ledger_on_worker"] is False
    assert result["doomed"], "no host was placed on the worker node"
    assert result["moving"], "no agent was owned by a host on the worker node"
    assert set(result["doomed"]) <= set(result["draining"])
    assert sorted(result["released"]) == sorted(result["moving"])  # released at once (the TTL is 120 s)
    assert sorted(result["checkpointed"]) == sorted(result["moving"])  # ON_DEACTIVATE State saved by the drain
    assert result["values"] == [2] * 16
