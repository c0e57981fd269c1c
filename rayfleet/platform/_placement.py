"""Where host actors run: spread over the cluster's live nodes, and onto nodes that join.

Ray's ``SPREAD`` strategy does not spread actors that ask for no resources (hosts take
``num_cpus=0``, so that they never hold back the CPUs agents' work needs): three hosts
may all land on one node. So each new host gets a node chosen here: the eligible node
with the fewest of the fleet's hosts, ties going to the lowest node id (round-robin over
the alive nodes sorted by id, when none has a host yet).

The host is pinned there with ``NodeAffinitySchedulingStrategy(soft=False)``: it lives
and dies with its node. ``soft=True`` was tried and rejected for two measured reasons:
Ray may place a soft-pinned actor elsewhere while the chosen node is busy starting
worker processes (six actors soft-pinned round-robin over three nodes landed 3+3 on two
of them, hard-pinned ones 2+2+2), and when a node dies its soft-pinned hosts are
restarted elsewhere one worker start at a time (about 3 s each on a 2-CPU machine, 15 s
for five), while their identities wait. A hard-pinned host is reported dead
(``ActorUnschedulableError``) the moment its node is gone: routers free its leases and
its identities are activated on live hosts at once. A host whose process dies on a live
node is still restarted there by Ray. Lost hosts are not replaced on other nodes; a node
left with no host, or a node that joins, gets one (see ``AgentHost``).

Eligible nodes are the alive ones that are not being drained and have a CPU (a KubeRay
head started with ``num-cpus: 0`` is kept free of work); when no node has a CPU, every
alive node is.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ._ray_internals import draining_nodes

HOST_NAME_PREFIX = "rayfleet-host-"
NODE_WATCH_INTERVAL = 5.0
"""Seconds between the fleet's looks for live nodes that have no host (see ``AgentHost``)."""


def eligible_nodes(nodes: Iterable[Mapping[str, Any]], draining: Collection[str] = ()) -> list[str]:
    """The ids of the nodes new hosts may go to, sorted; ``nodes`` are entries of ``ray.nodes()``."""
    alive = [node for node in nodes if node.get("Alive") and node.get("NodeID") not in draining]
    with_cpu = [node for node in alive if float(node.get("Resources", {}).get("CPU", 0.0)) > 0]
    return sorted(str(node["NodeID"]) for node in (with_cpu or alive))


def live_nodes() -> list[str]:
    """:func:`eligible_nodes` of this cluster now (a GCS read: blocking, call it off an event loop)."""
    return eligible_nodes(ray.nodes(), draining_nodes())


def assign_nodes(names: Sequence[str], nodes: Sequence[str], placed: Mapping[str, str | None]) -> dict[str, str]:
    """A node for each of ``names``: each in turn to the node with the fewest hosts, ties to the lowest id.

    ``placed`` maps the hosts that already exist to their node (``None`` when unknown,
    e.g. a host that is restarting); hosts on nodes outside ``nodes`` do not count.
    Empty when there is no node.
    """
    load = Counter(dict.fromkeys(nodes, 0))
    for node in placed.values():
        if node is not None and node in load:
            load[node] += 1
    chosen: dict[str, str] = {}
    for name in names:
        if not load:
            break
        node = min(load, key=lambda candidate: (load[candidate], candidate))
        chosen[name] = node
        load[node] += 1
    return chosen


def nodes_without_hosts(nodes: Sequence[str], placed: Mapping[str, str | None]) -> list[str]:
    """The nodes of ``nodes`` that no host in ``placed`` runs on, in order."""
    occupied = set(placed.values())
    return [node for node in nodes if node not in occupied]


def free_host_name(taken: Collection[str]) -> str:
    """The lowest ``rayfleet-host-<n>`` not in ``taken`` (registered hosts and host actors alike)."""
    index = 0
    while f"{HOST_NAME_PREFIX}{index}" in taken:
        index += 1
    return f"{HOST_NAME_PREFIX}{index}"


def host_scheduling(node: str | None) -> NodeAffinitySchedulingStrategy | str:
    """The scheduling strategy of a new host meant for ``node`` (Ray's default when there is none)."""
    return "DEFAULT" if node is None else NodeAffinitySchedulingStrategy(node_id=node, soft=False)


def host_actor_names(namespace: str) -> list[str]:
    """The names of the fleet's host actors Ray knows (alive or restarting), registered or not."""
    return sorted(
        entry["name"] for entry in ray.util.list_named_actors(all_namespaces=True)
        if entry["namespace"] == namespace and entry["name"].startswith(HOST_NAME_PREFIX)
    )
