"""Quickstart: a durable counter outlives the host that owned it.

Run: python examples/quickstart.py
(on a local Ray it starts, or the cluster at RAY_ADDRESS; the fleet's storage is
RAYFLEET_STORAGE, else ./.rayfleet). Exits 0 when every check held.
"""

from __future__ import annotations

import contextlib
import time

import ray
from _checks import conclude

import rayfleet as rf

IDENTITY = "quickstart/counter"


class Counter(rf.Agent):
    """Adds numbers; the total is its durable State."""

    class State(rf.State):
        total: int = 0

    @rf.handler
    async def add(self, n: int) -> int:
        self.state.total += n
        return self.state.total


def wait_until_dead(actor: ray.actor.ActorHandle) -> None:
    """Return once Ray reports ``actor`` dead.

    ``ray.kill`` returns before the process is gone, and a call sent at once may still
    reach the dying host. rayfleet keeps that safe (one call has one effect, even when
    the dying host committed it before dying), but this script wants to show a call
    served by another host, so it waits.
    """
    while True:
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=30)
        except ray.exceptions.RayActorError:
            return
        time.sleep(0.05)


def main() -> None:
    # Two hosts: one to kill, one to take the counter over.
    with rf.connect(hosts=2) as fleet:
        # A counter of an earlier run of this script would start above zero.
        with contextlib.suppress(rf.UnknownIdentityError):
            fleet.delete(IDENTITY)
        counter = fleet.spawn(IDENTITY, Counter)
        first = counter.call("add", n=2)
        before = fleet.status(IDENTITY)
        token_before = before.lease.fencing_token if before.lease else None
        print(f"{IDENTITY} added 2 and holds {first}; it lives on {before.host} with fencing token {token_before}, "
              f"checkpoint version {before.checkpoint_version} committed")

        assert before.host is not None
        host = ray.get_actor(before.host, namespace=fleet.config.namespace)
        ray.kill(host)
        wait_until_dead(host)
        print(f"killed its host {before.host} without warning")

        second = counter.call("add", n=3)
        after = fleet.status(IDENTITY)
        token_after = after.lease.fencing_token if after.lease else None
        print(f"{IDENTITY} added 3 and holds {second}: served by {after.host} with fencing token {token_after}, "
              f"from the last checkpoint")

    checks = {
        "the second call saw the first call's State (2 + 3 = 5)": first == 2 and second == 5,
        "another host serves the counter": after.host is not None and after.host != before.host,
        "the new owner holds a larger fencing token, so the old one could write nothing more":
            token_before is not None and token_after is not None and token_after > token_before,
        "it is the same life of the counter (generation and runtime id kept)":
            after.generation == before.generation and after.runtime_id == before.runtime_id,
    }
    conclude("quickstart", checks)


if __name__ == "__main__":
    main()
