"""A host whose start failed tries again on the next request, and says why meanwhile."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import ray

import rayfleet as rf
from rayfleet.demo.agents import Counter
from rayfleet.platform._host_actor import AgentHost


@pytest.mark.timeout(120)
def test_a_host_whose_start_failed_recovers_once_its_ledger_exists(make_fleet: object, storage: Path) -> None:
    namespace = f"t-{uuid.uuid4().hex[:10]}"
    root = str(storage.resolve())
    # The host comes up before its fleet's ledger actor exists (as when Ray restarts a host
    # while the ledger actor is still restarting), so its start fails for a real reason.
    host = AgentHost.options(  # type: ignore[attr-defined]
        name="rayfleet-host-0", namespace=namespace, lifetime="detached",
    ).remote("rayfleet-host-0", namespace, root, 10.0, 300.0, f"sqlite:///{root}/ledger.sqlite")
    with pytest.raises(ray.exceptions.RayTaskError) as raised:
        ray.get(host.start.remote())
    assert isinstance(raised.value.cause, rf.FleetUnavailableError) and "no ledger actor" in str(raised.value.cause)
    kind, error = ray.get(host.activate.remote("counter/a"))
    # A typed, retryable answer the courier can act on, not a raw Ray error.
    assert kind == "error" and isinstance(error, rf.FleetUnavailableError), (kind, error)
    assert "rayfleet-host-0" in error.detail and "ledger" in error.detail

    # The fleet's connect creates the ledger and reuses this very host actor (get_if_exists):
    # the host's next start succeeds and it serves.
    fleet: rf.Fleet = make_fleet(namespace=namespace, hosts=1)  # type: ignore[operator]
    counter = fleet.spawn("counter/a", Counter)
    assert counter.call(Counter.add, n=2) == 2
    assert fleet.status("counter/a").host == "rayfleet-host-0"
    assert ray.get_actor("rayfleet-host-0", namespace=namespace) is not None
