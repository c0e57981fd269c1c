"""``ray job submit`` against a real ``ray start --head`` with token auth: the job entrypoints run to success,
and a workflow job submitted again with its run id resumes that run from the journal.

The cluster is this module's own: started on free ports of 127.0.0.1 with its own temp
folder (``RAY_TMPDIR``), so ``ray.init()`` elsewhere never discovers it, and stopped by
killing only its own processes (never ``ray stop``, which stops every Ray on the
machine). Token auth is on (``RAY_AUTH_MODE=token``) with a token of its own in
``RAY_AUTH_TOKEN``, so the user's ``~/.ray/auth_token`` is neither read nor written.
The job client is Ray's own ``JobSubmissionClient``, in a subprocess (this process is
connected to the session's Ray, whose auth settings it has).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
FINISHED = ("SUCCEEDED", "FAILED", "STOPPED")

pytestmark = pytest.mark.timeout(400)


def _free_ports(count: int) -> list[int]:
    probes = [socket.socket() for _ in range(count)]
    try:
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [int(probe.getsockname()[1]) for probe in probes]
    finally:
        for probe in probes:
            probe.close()


@dataclass(frozen=True)
class Cluster:
    dashboard: str
    token: str
    env: dict[str, str]

    def client_env(self, *, token: str | None) -> dict[str, str]:
        """The environment of a job client: with ``token``, Ray 2.60's token auth; without, none."""
        env = {k: v for k, v in self.env.items() if k not in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_TMPDIR")}
        if token is not None:
            env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)
        return env


def _kill_tree(temp_root: str, gcs: str) -> None:
    """Kill the processes of this cluster only: those naming its temp root or GCS, and their children."""
    ours = []
    for process in psutil.process_iter(["cmdline"]):
        line = " ".join(process.info["cmdline"] or ())
        if process.pid != os.getpid() and (temp_root in line or gcs in line):
            ours.append(process)
    for process in list(ours):
        with contextlib.suppress(psutil.NoSuchProcess):
            ours.extend(process.children(recursive=True))
    for process in ours:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    temp_root = tempfile.mkdtemp(prefix="rfj-", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    gcs, dashboard, client, agent, agent_grpc, runtime_env_agent, metrics, node_manager, objects = _free_ports(9)
    token = secrets.token_hex(32)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAY_AUTH"))}
    env.update(RAY_TMPDIR=temp_root, RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token,
               PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}")  # `python` in an entrypoint is this venv's
    subprocess.run(
        [str(BIN / "ray"), "start", "--head", f"--port={gcs}", "--node-ip-address=127.0.0.1", "--num-cpus=2",
         "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard}",
         f"--ray-client-server-port={client}", f"--dashboard-agent-listen-port={agent}",
         f"--dashboard-agent-grpc-port={agent_grpc}", f"--runtime-env-agent-port={runtime_env_agent}",
         f"--metrics-export-port={metrics}", f"--node-manager-port={node_manager}",
         f"--object-manager-port={objects}", "--disable-usage-stats"],
        env=env, check=True, capture_output=True, timeout=180,
    )
    try:
        yield Cluster(dashboard=f"http://127.0.0.1:{dashboard}", token=token, env=env)
    finally:
        _kill_tree(temp_root, f"127.0.0.1:{gcs}")


CLIENT = """
import json, sys, time
from ray.job_submission import JobStatus, JobSubmissionClient

client = JobSubmissionClient(sys.argv[1])
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    request = json.loads(line)
    try:
        if request["op"] == "submit":
            reply = {"id": client.submit_job(entrypoint=request["entrypoint"], runtime_env=request["runtime_env"])}
        elif request["op"] == "wait":
            deadline = time.monotonic() + request["timeout"]
            while True:
                status = client.get_job_status(request["id"])
                if status.is_terminal() or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            reply = {"status": status.value, "logs": client.get_job_logs(request["id"])}
        elif request["op"] == "stop":
            reply = {"stopped": client.stop_job(request["id"])}
    except Exception as error:
        reply = {"error": f"{type(error).__name__}: {error}"}
    print(json.dumps(reply), flush=True)
"""


class Jobs:
    """Ray's JobSubmissionClient, authenticated, in one long-lived subprocess (one import of Ray)."""

    def __init__(self, cluster: Cluster) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-c", CLIENT, cluster.dashboard], env=cluster.client_env(token=cluster.token),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        assert self._ask(None) == {"ready": True}

    def _ask(self, request: dict[str, Any] | None) -> dict[str, Any]:
        assert self._process.stdin is not None and self._process.stdout is not None
        if request is not None:
            self._process.stdin.write(json.dumps(request) + "\n")
            self._process.stdin.flush()
        line = self._process.stdout.readline()
        assert line, "the job client died"
        reply: dict[str, Any] = json.loads(line)
        assert "error" not in reply, reply["error"]
        return reply

    def submit(self, entrypoint: str, *, working_dir: Path, env_vars: dict[str, str] | None = None) -> str:
        runtime_env: dict[str, Any] = {"working_dir": str(working_dir)}
        if env_vars:
            runtime_env["env_vars"] = env_vars
        return str(self._ask({"op": "submit", "entrypoint": entrypoint, "runtime_env": runtime_env})["id"])

    def wait(self, job: str, *, timeout: float = 240) -> tuple[str, str]:
        """The job's final status and its log (the status it has after ``timeout`` seconds, if not final)."""
        reply = self._ask({"op": "wait", "id": job, "timeout": timeout})
        return str(reply["status"]), str(reply["logs"])

    def stop(self, job: str) -> None:
        self._ask({"op": "stop", "id": job})

    def close(self) -> None:
        assert self._process.stdin is not None
        self._process.stdin.close()
        self._process.wait(timeout=30)


@pytest.fixture(scope="module")
def jobs(cluster: Cluster) -> Iterator[Jobs]:
    client = Jobs(cluster)
    yield client
    client.close()


@pytest.fixture(scope="module")
def demo_job(jobs: Jobs, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The demo, submitted once and early: it runs while the workflow test's jobs do."""
    # As the README says: from the repository, --working-dir . (the job imports this checkout's rayfleet).
    storage = tmp_path_factory.mktemp("demo")
    return jobs.submit(f"python -m rayfleet.jobs.demo --storage {storage}", working_dir=ROOT)


def _result(logs: str) -> dict[str, Any]:
    """The JSON result line a job prints last."""
    last = [line for line in logs.splitlines() if line.startswith("{")][-1]
    result: dict[str, Any] = json.loads(last)
    return result


def test_a_job_client_without_the_token_is_refused(cluster: Cluster) -> None:
    probe = "from ray.job_submission import JobSubmissionClient\nimport sys\nJobSubmissionClient(sys.argv[1]).list_jobs()"
    missing = subprocess.run([sys.executable, "-c", probe, cluster.dashboard], env=cluster.client_env(token=None),
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode != 0 and "Missing authentication token" in missing.stderr, missing.stderr[-2000:]
    wrong = subprocess.run([sys.executable, "-c", probe, cluster.dashboard],
                           env=cluster.client_env(token=secrets.token_hex(32)),
                           capture_output=True, text=True, timeout=120)
    assert wrong.returncode != 0 and "Invalid authentication token" in wrong.stderr, wrong.stderr[-2000:]


FLOWS = """
import asyncio
from pathlib import Path

import rayfleet as rf

GATE = Path({gate!r})
STARTED = Path({started!r})


class Tally(rf.Agent):
    class State(rf.State):
        total: int = 0

    @rf.handler
    async def add(self, n: int) -> int:
        self.state.total += n
        return self.state.total


class Gate(rf.Agent):
    @rf.handler
    async def pass_through(self) -> str:
        STARTED.write_text("started")
        while not GATE.exists():  # the test opens the gate once the first job is stopped
            await asyncio.sleep(0.05)
        return "opened"


def trip() -> rf.Workflow:
    workflow = rf.Workflow("trip")
    workflow.step("count", to="tally/main", call="add", payload=lambda ctx: {{"n": 1}})
    workflow.step("gate", to="gate/main", call="pass_through", after=["count"], timeout=300)
    return workflow
"""

ROSTER = """
agents:
  - identity: tally/main
    agent: flows:Tally
  - identity: gate/main
    agent: flows:Gate
"""


def test_a_workflow_job_submitted_again_resumes_its_run_from_the_journal(
    jobs: Jobs, demo_job: str, tmp_path: Path
) -> None:
    project = tmp_path / "project"  # the user's folder: agents, workflow and roster, as --working-dir
    project.mkdir()
    gate, started = tmp_path / "gate", tmp_path / "started"
    (project / "flows.py").write_text(textwrap.dedent(FLOWS.format(gate=str(gate), started=str(started))))
    (project / "team.yaml").write_text(ROSTER)
    # The fleet's settings travel in the job's runtime_env, as the README shows.
    fleet = {"RAYFLEET_STORAGE": str(tmp_path / "store"), "RAYFLEET_NAMESPACE": f"jobs-{uuid.uuid4().hex[:8]}",
             "RAYFLEET_HOSTS": "1"}

    status, logs = jobs.wait(jobs.submit("python -m rayfleet.jobs.apply team.yaml", working_dir=project,
                                         env_vars=fleet))
    assert status == "SUCCEEDED", logs[-4000:]
    assert _result(logs)["created"] == ["tally/main", "gate/main"]  # in roster order

    run = "python -m rayfleet.jobs.workflow flows:trip --run-id trip-1 --roster team.yaml"
    first = jobs.submit(run, working_dir=project, env_vars=fleet)
    deadline = time.monotonic() + 120
    while not started.exists():  # step "count" is journaled; step "gate" is in flight
        assert time.monotonic() < deadline, jobs.wait(first, timeout=0)[1][-4000:]
        time.sleep(0.1)
    jobs.stop(first)
    status, logs = jobs.wait(first)
    assert status == "STOPPED", logs[-4000:]
    assert "2 unchanged" in logs  # the roster was applied again: nothing to do

    gate.write_text("open")
    status, logs = jobs.wait(jobs.submit(run, working_dir=project, env_vars=fleet))
    assert status == "SUCCEEDED", logs[-4000:]
    resumed = _result(logs)
    assert (resumed["how"], resumed["status"]) == ("resumed", "COMPLETED"), resumed
    # "count" came from the journal: executed once, so the tally's total is still 1.
    assert resumed["outputs"] == {"count": 1, "gate": "opened"}
    assert "resuming run 'trip-1': RUNNING" in logs

    status, logs = jobs.wait(jobs.submit(run, working_dir=project, env_vars=fleet))
    assert status == "SUCCEEDED", logs[-4000:]
    again = _result(logs)
    assert (again["how"], again["status"], again["outputs"]) == ("already ended", "COMPLETED", resumed["outputs"])


def test_the_demo_runs_as_a_ray_job_from_a_checkout(jobs: Jobs, demo_job: str) -> None:
    status, logs = jobs.wait(demo_job)
    assert status == "SUCCEEDED", logs[-4000:]
    assert "Demo passed" in logs
