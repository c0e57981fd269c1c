"""The scenario of tests/integration/test_multinode.py, run in a process of its own on a cluster of its own.

``python multinode_driver.py STORAGE POSTGRES_URL`` starts a three-node
``ray.cluster_utils.Cluster`` (a head and two workers, one CPU each), runs two fleets
on it, removes a worker node that holds hosts of both, adds a node, and prints what it
saw as one JSON line (last on stdout). It must run in its own process: the test process
already runs the session's Ray, and ``ray.init`` can join only one cluster per process.
The caller sets ``RAY_TMPDIR`` to a folder of its own, so that this cluster's address
file and sockets never reach another Ray on the machine.

The fleets:
* ``mn``: SQLite ledger, the default host count (one per CPU: 3), 300 agents that each
  answered once before the removal and must answer again, with their State, after it.
* ``mn-pg``: PostgreSQL ledger (every host is a ledger client, so the removed node held
  some), 6 agents taking increments from 12 writers while the node goes away; every
  increment acknowledged to a writer must be in the agent's State afterwards, once.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import ray
from ray.cluster_utils import Cluster

import rayfleet as rf

AGENTS = 300
PG_AGENTS = 6
PG_WRITERS = 12
CONCURRENCY = 32
JOIN_PATIENCE = 60.0


class Tally(rf.Agent):
    class State(rf.State):
        keys: list[str] = []

    @rf.handler
    def add(self, key: str) -> int:
        self.state.keys.append(key)
        return len(self.state.keys)

    @rf.handler
    def keys(self) -> list[str]:
        return list(self.state.keys)


async def bounded(calls: list[Callable[[], Awaitable[Any]]], limit: int) -> list[Any]:
    """Run ``calls`` at most ``limit`` at a time; each result, or the exception it raised."""
    gate = asyncio.Semaphore(limit)

    async def one(call: Callable[[], Awaitable[Any]]) -> Any:
        async with gate:
            try:
                return await call()
            except Exception as error:  # reported, not raised: every failure is counted
                return error

    return await asyncio.gather(*(one(call) for call in calls))


def described(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"[:300]


PHASES: dict[str, float] = {}
CLOCK_ZERO = time.monotonic()


def phase(name: str) -> None:
    """Note when a phase ended (seconds since the start), for the report."""
    PHASES[name] = round(time.monotonic() - CLOCK_ZERO, 1)


async def main(storage: str, postgres: str) -> dict[str, Any]:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    workers = [cluster.add_node(num_cpus=1, wait=False) for _ in range(2)]  # started side by side
    cluster.wait_for_nodes()
    phase("cluster")
    try:
        report = await scenario(cluster, [worker.node_id for worker in workers], storage, postgres)
    finally:
        ray.shutdown()
        cluster.shutdown()
    phase("teardown")
    report["phases"] = PHASES
    return report


async def scenario(cluster: Cluster, worker_nodes: list[str], storage: str, postgres: str) -> dict[str, Any]:
    report: dict[str, Any] = {}
    ray.init(address=cluster.address, namespace="mn", log_to_driver=True)
    fleet, pg = await asyncio.gather(  # both fleets' hosts start side by side
        asyncio.to_thread(rf.connect, cluster.address, f"{storage}/mn", namespace="mn"),
        asyncio.to_thread(rf.connect, cluster.address, f"{storage}/pg", namespace="mn-pg", ledger=postgres),
    )
    phase("connect")
    nodes = sorted(node["NodeID"] for node in ray.nodes() if node["Alive"])
    report["nodes"] = nodes
    placed = {"mn": fleet.host_nodes(), "mn-pg": pg.host_nodes()}
    report["host_nodes_before"] = placed
    report["head_node"] = cluster.head_node.node_id
    report["ledger_routes"] = {
        "mn": {s.host: s.ledger_route for s in fleet.host_statistics()},
        "mn-pg": {s.host: s.ledger_route for s in pg.host_statistics()},
    }

    refs = fleet.spawn_many(rf.AgentSpec(identity=f"tally/{index}", agent=Tally) for index in range(AGENTS))
    began = time.monotonic()
    first = await bounded([lambda ref=ref: ref.ask("add", key="before") for ref in refs], CONCURRENCY)
    report["first_round_seconds"] = round(time.monotonic() - began, 2)  # activating all 300, no fault: the baseline
    report["first_answers_ok"] = sum(answer == 1 for answer in first)
    pg_refs = pg.spawn_many(rf.AgentSpec(identity=f"pg/{index}", agent=Tally) for index in range(PG_AGENTS))
    for ref in pg_refs:
        await ref.ask("add", key=f"{ref.identity}/first")

    # The worker node holding the most hosts of both fleets (each has at least one there).
    doomed = max(worker_nodes, key=lambda node: sum(list(hosts.values()).count(node) for hosts in placed.values()))
    report["removed_node"] = doomed
    report["hosts_on_removed_node"] = {
        namespace: sorted(name for name, node in hosts.items() if node == doomed) for namespace, hosts in placed.items()
    }
    owners = {ref.identity: fleet.status(ref.identity).host for ref in refs}
    report["agents_on_removed_node"] = sum(owner in report["hosts_on_removed_node"]["mn"] for owner in owners.values())

    acknowledged: dict[str, list[str]] = {ref.identity: [f"{ref.identity}/first"] for ref in pg_refs}
    pg_errors: list[str] = []
    writing = True

    async def writer(number: int) -> None:
        count = 0
        while writing:
            ref = pg_refs[(number + count) % PG_AGENTS]
            key = f"{ref.identity}/w{number}-{count}"
            count += 1
            try:
                await ref.ask("add", key=key, idempotency_key=key)
            except Exception as error:  # counted: the scenario expects none
                pg_errors.append(described(error))
                continue
            acknowledged[ref.identity].append(key)

    phase("first round")
    writers = [asyncio.get_running_loop().create_task(writer(number)) for number in range(PG_WRITERS)]
    await asyncio.sleep(1.0)  # increments in flight on every pg host when the node goes

    removal = worker_node_object(cluster, doomed)
    started = time.monotonic()
    await asyncio.to_thread(cluster.remove_node, removal)
    report["remove_node_seconds"] = round(time.monotonic() - started, 2)

    latencies: list[float] = []

    async def again(ref: rf.AgentRef) -> Any:
        answer = await ref.ask("add", key="after", idempotency_key=f"{ref.identity}/after")
        latencies.append(time.monotonic() - started)
        return answer

    answers = await bounded([lambda ref=ref: again(ref) for ref in refs], CONCURRENCY)
    report["recovery_seconds"] = round(time.monotonic() - started, 2)
    report["slowest_answer_seconds"] = round(max(latencies, default=0.0), 2)
    report["answers_with_state"] = sum(answer == 2 for answer in answers)
    report["errors"] = sorted({described(answer) for answer in answers if isinstance(answer, BaseException)})
    report["other_answers"] = sorted({repr(a) for a in answers if a != 2 and not isinstance(a, BaseException)})
    report["fleet_unavailable"] = sum(isinstance(answer, rf.FleetUnavailableError) for answer in answers)

    await asyncio.sleep(2.0)  # increments go on a little after the recovery
    writing = False
    await asyncio.gather(*writers)
    report["pg_errors"] = sorted(set(pg_errors))
    report["pg_acknowledged"] = sum(len(keys) for keys in acknowledged.values())
    lost, repeated = [], []
    for ref in pg_refs:
        stored = await ref.ask("keys")
        lost += [key for key in acknowledged[ref.identity] if key not in stored]
        repeated += sorted({key for key in stored if stored.count(key) > 1})
    report["pg_lost"] = lost
    report["pg_repeated"] = repeated

    phase("removal")
    joined_at = time.monotonic()
    joined = cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    report["joined_node"] = joined.node_id
    report["host_nodes_after_join"] = {}
    for namespace, each in (("mn", fleet), ("mn-pg", pg)):
        hosts: dict[str, str | None] = {}
        while time.monotonic() - joined_at < JOIN_PATIENCE:
            hosts = each.host_nodes()
            if joined.node_id in hosts.values():
                break
            await asyncio.sleep(0.5)
        report["host_nodes_after_join"][namespace] = hosts
    report["join_seconds"] = round(time.monotonic() - joined_at, 2)
    report["after_join_answers"] = sum(
        answer == 3 for answer in await bounded(
            [lambda ref=ref: ref.ask("add", key="joined", idempotency_key=f"{ref.identity}/joined") for ref in refs],
            CONCURRENCY,
        )
    )
    phase("join")
    fleet.shutdown(stop_actors=True)
    pg.shutdown(stop_actors=True)
    return report


def worker_node_object(cluster: Cluster, node_id: str) -> Any:
    return next(node for node in cluster.worker_nodes if node.node_id == node_id)


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1], sys.argv[2]))), flush=True)
