"""Where new hosts go, without a cluster: eligible nodes, least-used first, nodes left without a host."""

from __future__ import annotations

from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rayfleet.platform._placement import (
    assign_nodes,
    eligible_nodes,
    free_host_name,
    host_scheduling,
    nodes_without_hosts,
)


def node(node_id: str, *, cpus: float = 1.0, alive: bool = True) -> dict[str, object]:
    """One entry as ``ray.nodes()`` gives it (the fields placement reads)."""
    return {"NodeID": node_id, "Alive": alive, "Resources": {"CPU": cpus} if cpus else {"memory": 1.0}}


def test_only_alive_undrained_nodes_with_a_cpu_are_eligible_sorted_by_id() -> None:
    nodes = [node("c"), node("a"), node("dead", alive=False), node("head", cpus=0), node("b"), node("leaving")]
    assert eligible_nodes(nodes, draining={"leaving"}) == ["a", "b", "c"]
    # A cluster whose nodes all have no CPU still gets hosts: on every alive node.
    assert eligible_nodes([node("y", cpus=0), node("x", cpus=0), node("z", cpus=0, alive=False)]) == ["x", "y"]
    assert eligible_nodes([]) == []


def test_new_hosts_go_round_robin_over_nodes_and_fill_the_least_used_first() -> None:
    names = [f"rayfleet-host-{index}" for index in range(5)]
    assert assign_nodes(names, ["n1", "n2", "n3"], {}) == {
        "rayfleet-host-0": "n1", "rayfleet-host-1": "n2", "rayfleet-host-2": "n3",
        "rayfleet-host-3": "n1", "rayfleet-host-4": "n2",
    }
    # Two hosts already on n1 and one on n2 (one more on a node that left, one unknown):
    # the next ones fill n3 first, then even out.
    placed = {"h0": "n1", "h1": "n1", "h2": "n2", "h3": "gone", "h4": None}
    assert assign_nodes(["x", "y", "z"], ["n1", "n2", "n3"], placed) == {"x": "n3", "y": "n2", "z": "n3"}
    assert assign_nodes(["x"], [], placed) == {}


def test_nodes_without_hosts_are_the_ones_no_host_reported() -> None:
    placed = {"h0": "n1", "h1": "n1", "h2": None}
    assert nodes_without_hosts(["n1", "n2", "n3"], placed) == ["n2", "n3"]
    assert nodes_without_hosts(["n1"], placed) == []


def test_a_new_host_takes_the_lowest_free_name() -> None:
    assert free_host_name(set()) == "rayfleet-host-0"
    assert free_host_name({"rayfleet-host-0", "rayfleet-host-2"}) == "rayfleet-host-1"


def test_a_host_is_pinned_to_its_node_and_dies_with_it() -> None:
    node_id = "ab" * 28  # the shape of a Ray node id (28 bytes, hex)
    strategy = host_scheduling(node_id)
    assert isinstance(strategy, NodeAffinitySchedulingStrategy)
    assert (strategy.node_id, strategy.soft) == (node_id, False)
    assert host_scheduling(None) == "DEFAULT"
