"""Hosts spread over a three-node cluster; a node that holds hosts is removed, and another joins.

The shared test Ray has one node, so the scenario (``tests/support/multinode_driver.py``)
runs in a subprocess on a ``ray.cluster_utils.Cluster`` of its own, under a temp folder
of its own (``RAY_TMPDIR``: Ray's address file and sockets stay there, so no other Ray
on the machine is affected), and whatever of it is left is killed by that folder's name.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pg_support
import pytest
from ray_helpers import kill_processes_under

DRIVER = Path(__file__).resolve().parent.parent / "support" / "multinode_driver.py"


@pytest.fixture(scope="module")
def removal(tmp_path_factory: pytest.TempPathFactory, postgres_url: str) -> dict[str, Any]:
    temp_dir = Path(tempfile.mkdtemp(prefix="rfmn-", dir="/tmp"))  # Ray's socket paths must stay short
    env = {**os.environ, "RAY_TMPDIR": str(temp_dir),
           "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    env.pop("RAY_ADDRESS", None)
    storage = tmp_path_factory.mktemp("multinode")
    try:
        run = subprocess.run([sys.executable, str(DRIVER), str(storage), postgres_url],
                             capture_output=True, text=True, env=env, timeout=240)
    finally:
        kill_processes_under(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)
    assert run.returncode == 0, run.stderr[-4000:]
    report: dict[str, Any] = json.loads(run.stdout.strip().splitlines()[-1])
    print("multi-node report:", json.dumps(report, indent=1))
    return report


@pytest.fixture(scope="module")
def postgres_url() -> Iterator[str]:
    url = pg_support.create_database()
    yield url
    pg_support.drop_database(url)


@pytest.mark.timeout(300)
def test_hosts_are_spread_over_every_node(removal: dict[str, Any]) -> None:
    for namespace, hosts in removal["host_nodes_before"].items():
        assert set(hosts.values()) == set(removal["nodes"]), (namespace, hosts)
    assert removal["first_answers_ok"] == 300


@pytest.mark.timeout(300)
def test_hosts_beside_the_sqlite_file_write_it_directly_and_the_others_call_the_ledger_actor(
    removal: dict[str, Any],
) -> None:
    placed, routes = removal["host_nodes_before"]["mn"], removal["ledger_routes"]
    expected = {host: "direct" if node == removal["head_node"] else "ledger actor" for host, node in placed.items()}
    assert routes["mn"] == expected and set(expected.values()) == {"direct", "ledger actor"}
    assert set(routes["mn-pg"].values()) == {"direct"}  # PostgreSQL: every host has its own pool


@pytest.mark.timeout(300)
def test_every_agent_answers_with_its_state_after_a_node_with_hosts_is_removed(removal: dict[str, Any]) -> None:
    assert removal["hosts_on_removed_node"]["mn"] and removal["hosts_on_removed_node"]["mn-pg"]
    assert removal["agents_on_removed_node"] > 0
    assert removal["errors"] == [] and removal["fleet_unavailable"] == 0
    assert removal["other_answers"] == []
    assert removal["answers_with_state"] == 300
    print(f"all 300 agents answered {removal['recovery_seconds']} s after the node was removed "
          f"(removing it took {removal['remove_node_seconds']} s)")


@pytest.mark.timeout(300)
def test_the_postgresql_ledger_loses_no_acknowledged_increment(removal: dict[str, Any]) -> None:
    assert removal["pg_acknowledged"] > 6
    assert removal["pg_errors"] == []
    assert removal["pg_lost"] == []
    assert removal["pg_repeated"] == []  # each increment carried an idempotency key: once, retried or not


@pytest.mark.timeout(300)
def test_a_node_that_joins_gets_a_host(removal: dict[str, Any]) -> None:
    for namespace, hosts in removal["host_nodes_after_join"].items():
        assert removal["joined_node"] in hosts.values(), (namespace, hosts)
    assert removal["after_join_answers"] == 300
    print(f"a host ran on the new node {removal['join_seconds']} s after it joined")
