"""Helpers shared by the integration tests."""

from __future__ import annotations

import time

import ray


def kill_actor(name: str, namespace: str) -> None:
    """``ray.kill`` a named actor for good and wait until Ray no longer knows it.

    ``ray.kill`` returns before the actor is gone; a call sent right after it may still
    be served by the dying actor, which would make "served by another host" flaky.
    """
    ray.kill(ray.get_actor(name, namespace=namespace), no_restart=True)
    for _ in range(400):
        try:
            ray.get_actor(name, namespace=namespace)
        except ValueError:
            return
        time.sleep(0.025)
    raise AssertionError(f"actor {name} did not die within 10 s")
