"""rayfleet's metrics reach Ray's Prometheus endpoint: a known workload, scraped and parsed with prometheus_client.

The session's Ray runs without the dashboard; its metrics agent still serves the
node's Prometheus endpoint on the port ``tests/conftest.py`` chose, and workers report
to it every ``METRICS_REPORT_INTERVAL_MS``. The test polls the endpoint (bounded)
until the workload's values appear; it never times anything.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable

import pytest
from prometheus_client.parser import text_string_to_metric_families

import rayfleet as rf

WAIT = 90.0
"""Upper bound for the values to show up; with a 2 s report interval they take a few seconds."""


class MetricsProbe(rf.Agent):
    """Used by this test only, so its ``agent_class`` tag starts at zero in the session."""

    class State(rf.State):
        total: int = 0

    @rf.handler
    async def add(self, n: int) -> int:
        self.state.total += n
        return self.state.total

    @rf.handler
    async def boom(self) -> None:
        raise ValueError("refused on purpose")


PROBE = f"{__name__}:MetricsProbe"


def scrape(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Every sample of the endpoint, by sample name: ``[(labels, value), ...]``."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return samples


def total(samples: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float:
    return sum(value for found, value in samples.get(name, []) if all(found.get(k) == v for k, v in labels.items()))


def poll(url: str, check: Callable[[dict[str, list[tuple[dict[str, str], float]]]], bool], what: str) -> dict:
    deadline = time.monotonic() + WAIT
    while True:
        samples = scrape(url)
        if check(samples):
            return samples
        assert time.monotonic() < deadline, f"gave up waiting for {what}; rayfleet series seen: " + ", ".join(
            sorted(name for name in samples if "rayfleet" in name))
        time.sleep(0.5)


def test_a_known_workload_shows_up_on_rays_prometheus_endpoint(make_fleet: Callable[..., rf.Fleet],
                                                                ray_metrics_url: str) -> None:
    fleet = make_fleet(hosts=2)
    refs = [fleet.spawn(f"probe/{index}", MetricsProbe) for index in range(5)]
    for ref in refs:
        for n in (1, 2, 3):
            ref.call("add", n=n)
    with pytest.raises(rf.HandlerError):
        refs[0].call("boom")
    workflow = rf.Workflow("metrics-probe-flow")
    workflow.step("bump", to="probe/1", call="add", payload={"n": 10})
    run_id = fleet.submit(workflow)  # the runner actor's engine
    assert fleet.runs.wait(run_id, timeout=WAIT).status is rf.RunStatus.COMPLETED
    in_driver = rf.Workflow("metrics-probe-driver-flow")
    in_driver.step("bump", to="probe/2", call="add", payload={"n": 10})
    assert fleet.run(in_driver).status is rf.RunStatus.COMPLETED  # this driver's engine
    # 15 calls + the two workflows' steps succeeded; one call failed in its handler.
    ok, messages = 17, "ray_rayfleet_messages_total"

    def settled(samples: dict[str, list[tuple[dict[str, str], float]]]) -> bool:
        return (total(samples, messages, agent_class=PROBE, outcome="OK") == ok
                and total(samples, "ray_rayfleet_workflow_runs_total", workflow="metrics-probe-flow",
                          status="COMPLETED") == 1
                and total(samples, "ray_rayfleet_workflow_runs_total", workflow="metrics-probe-driver-flow",
                          status="COMPLETED") == 1
                and total(samples, "ray_rayfleet_active_agents", agent_class=PROBE) == 5
                and total(samples, "ray_rayfleet_dead_letters_total", agent_class=PROBE) == 1)

    samples = poll(ray_metrics_url, settled, f"{ok} OK messages of {PROBE}, two COMPLETED runs, 5 active agents")
    assert total(samples, messages, agent_class=PROBE, outcome="HANDLER_ERROR") == 1
    assert total(samples, "ray_rayfleet_dead_letters_total", agent_class=PROBE, reason="REJECTED") == 1
    assert total(samples, "ray_rayfleet_turn_seconds_count", agent_class=PROBE) == ok + 1
    assert total(samples, "ray_rayfleet_checkpoints_total", agent_class=PROBE) == ok
    assert total(samples, "ray_rayfleet_workflow_steps_total", workflow="metrics-probe-flow",
                 outcome="COMPLETED") == 1
    assert total(samples, "ray_rayfleet_workflow_runs_started_total", workflow="metrics-probe-flow") == 1
    hosts = {labels["host"] for labels, _ in samples[messages] if labels.get("agent_class") == PROBE}
    assert hosts and hosts <= {"rayfleet-host-0", "rayfleet-host-1"}
    # Shared with the rest of the session, so these are at least this workload's share.
    # (Ray 2.60 rebuilds a histogram's _sum from bucket midpoints, so only counts are exact.)
    assert total(samples, "ray_rayfleet_commit_batch_size_count") >= 1
    assert total(samples, "ray_rayfleet_ledger_operations_total", operation="commit_checkpoints", outcome="OK") >= 1
    assert total(samples, "ray_rayfleet_leases_held") >= 5
