"""A host that Ray restarts starts and registers by itself, before any request reaches it.

Nothing routes to a host the ledger does not list, so a restarted host that waited for
a request to start would stay idle for good. (A start sent to itself as an actor task
from its constructor could fail: Ray still saw the actor restarting and, with no task
retries, failed the task at once.)
"""

from __future__ import annotations

import pytest
import ray
from polling import eventually

import rayfleet as rf

KILLS = 4
"""Restarts in a row: the start raced Ray's restart, so one restart could miss it."""


@pytest.mark.timeout(600)
def test_a_host_restarted_by_ray_registers_again_with_no_request_sent_to_it(make_fleet: object) -> None:
    fleet: rf.Fleet = make_fleet(hosts=1)  # type: ignore[operator]
    (host,) = fleet.hosts()
    for kill in range(KILLS):
        before = {info.name: info.holder for info in fleet.hosts()}
        ray.kill(ray.get_actor(host.name, namespace=fleet.config.namespace), no_restart=False)

        def registered_anew(before: dict[str, str] = before) -> bool:
            now = {info.name: info.holder for info in fleet.hosts()}
            return host.name in now and now[host.name] != before.get(host.name)

        eventually(registered_anew, f"restart {kill + 1}: {host.name} registered again by itself", timeout=120)
