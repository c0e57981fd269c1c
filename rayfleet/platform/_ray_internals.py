"""Every use of Ray's private modules, each behind a guard whose fallback is the safe answer.

Ray offers no public call for any of these. Keeping them in one room means a Ray
upgrade that moves one breaks only this module, and each function says what rayfleet
loses then: none of the fallbacks can lose data, only speed or an early warning.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import ray

log = logging.getLogger("rayfleet.ray")


def bootstrap_address() -> str | None:
    """The cluster address a bare ``ray.init()`` would attach to, or ``None`` when it would start its own Ray.

    That is ``RAY_ADDRESS``, else the address file a ``ray start`` on this machine
    wrote. ``address="auto"`` is not the same: it also joins any Ray whose processes it
    sees on this machine, possibly someone else's. Fallback, on a Ray without the
    lookup: ``RAY_ADDRESS`` only, so a ``ray start`` cluster must then be named.
    """
    try:
        from ray._private.services import canonicalize_bootstrap_address

        lookup: Any = canonicalize_bootstrap_address  # annotated as taking str; None means "as ray.init() would"
        found = lookup(None)
    except (ImportError, AttributeError, TypeError):
        found = os.environ.get("RAY_ADDRESS") or None
    return str(found) if found else None


def started_head_node() -> bool:
    """Whether the ``ray.init`` this process made started a new local Ray (a head node).

    Attaching to an existing cluster makes a connect-only, non-head node. Fallback:
    ``False``, so a fleet is never stopped by a driver that cannot tell it started the
    Ray under it.
    """
    try:
        import ray._private.worker as worker
    except ImportError:  # pragma: no cover - only on a Ray without the module
        return False
    return bool(getattr(getattr(worker, "_global_node", None), "head", False))


def actor_state(handle: ray.actor.ActorHandle) -> str | None:
    """The GCS actor table's state of the actor behind ``handle`` (``ALIVE``, ``RESTARTING``, ``DEAD``, ...).

    The public ``ray.util.state`` shows the same table but needs the dashboard.
    Fallback: ``None`` (not known) on any failure; callers then treat the actor as
    alive, which is slower to fail over but as safe.
    """
    try:
        import ray._private.state as state

        info = state.actors(actor_id=handle._actor_id.hex())
    except Exception as error:  # noqa: BLE001 - an internal API; absent or failing means "not known"
        log.debug("cannot read the actor table: %s", error)
        return None
    found = info.get("State") if isinstance(info, dict) else None
    return found if isinstance(found, str) else None


def draining_nodes() -> dict[str, int]:
    """The nodes the GCS is draining, each with its deadline (ms since the epoch, 0 for none).

    The GCS drains a node for ``ray drain-node``, the autoscaler, KubeRay scale-down and
    preemption; Ray Data and Serve read the same table. Fallback: an empty answer on any
    failure (the next look tries again), so hosts lose only the early warning and their
    leases lapse by TTL.
    """
    try:
        import ray._private.state as state

        draining: dict[str, int] = state.state.get_draining_nodes()
    except Exception as error:  # noqa: BLE001 - an internal API; absent or failing means no early warning
        log.debug("cannot read draining nodes: %s", error)
        return {}
    return draining


def run_before_worker_exit(before_exit: Callable[[], None]) -> bool:
    """Make this Ray worker call ``before_exit()`` on its main thread when SIGTERM ends it.

    A Ray worker's SIGTERM handler exits through
    ``raise_sys_exit_with_custom_error_message`` in Ray's worker module; an async
    actor's code runs on another thread, where ``signal.signal`` is refused, so that
    function is wrapped instead. Ray's exit proceeds once ``before_exit`` returns.
    Fallback: returns ``False`` and wraps nothing when this Ray has no such exit path.
    """
    try:
        import ray._private.worker as worker
    except ImportError:  # pragma: no cover - only on a Ray without the module
        return False
    original = getattr(worker, "raise_sys_exit_with_custom_error_message", None)
    if original is None:
        return False

    def exit_after(*args: Any, **kwargs: Any) -> Any:
        before_exit()
        return original(*args, **kwargs)

    worker.raise_sys_exit_with_custom_error_message = exit_after
    return True
