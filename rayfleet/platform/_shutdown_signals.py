"""How a host learns that it is about to go away: SIGTERM, or its Ray node being drained.

Both end the same way: the host drains (checkpoints and releases every agent within a
deadline) so its identities move at once instead of after a lease TTL.

Ray gives an actor no public hook for either, so this module leans on two Ray
internals, each guarded so that a Ray without them only loses the early warning (the
leases then lapse by TTL, which is safe):

* A Ray worker's SIGTERM handler runs on the main thread and exits through
  ``ray._private.worker.raise_sys_exit_with_custom_error_message``. An async actor's
  code runs on another thread, where ``signal.signal`` is refused, so the host wraps
  that function: the drain runs on the actor's event loop while the main thread
  waits (bounded), then Ray's exit proceeds.
* ``ray._private.state.state.get_draining_nodes()`` lists nodes the GCS is draining
  (``ray drain-node``, the autoscaler, KubeRay scale-down and preemption), with their
  deadlines; Ray Data and Serve read the same table.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

log = logging.getLogger("rayfleet.host")

DRAIN_ON_EXIT_TIMEOUT = 20.0
"""Seconds a host drains after SIGTERM before it exits anyway (Kubernetes allows 30 by default)."""
NODE_DRAIN_POLL = 2.0
"""Seconds between looks at the GCS's list of draining nodes."""
NODE_DRAIN_MARGIN = 2.0
"""Seconds before a node's drain deadline by which the host wants to be done."""


def drain_on_sigterm(
    loop: asyncio.AbstractEventLoop, drain: Callable[[float], Coroutine[Any, Any, Any]],
    timeout: float = DRAIN_ON_EXIT_TIMEOUT,
) -> bool:
    """Make SIGTERM run ``drain(timeout)`` on ``loop`` before this Ray worker exits.

    Returns ``False`` (and logs) when this Ray has no such exit path to wrap.
    """
    try:
        import ray._private.worker as worker
    except ImportError:  # pragma: no cover - only on a Ray without the module
        return False
    original = getattr(worker, "raise_sys_exit_with_custom_error_message", None)
    if original is None:
        log.warning("this Ray has no SIGTERM exit hook; a terminated host's leases will lapse by TTL instead")
        return False

    def exit_after_draining(*args: Any, **kwargs: Any) -> Any:
        log.warning("SIGTERM: draining for up to %.0f s before exiting", timeout)
        try:
            asyncio.run_coroutine_threadsafe(drain(timeout), loop).result(timeout + 5.0)
        except Exception as error:  # noqa: BLE001 - exit regardless; the leases lapse by TTL
            log.warning("drain on SIGTERM did not finish: %s", error)
        return original(*args, **kwargs)

    worker.raise_sys_exit_with_custom_error_message = exit_after_draining
    return True


def node_drain_timeout(node_id: str, default: float) -> float | None:
    """Seconds left to drain when the GCS is draining ``node_id``, else ``None``.

    ``default`` is used when the drain has no deadline. Errors reading the GCS count
    as "not draining": the next poll tries again.
    """
    deadline_ms = draining_nodes().get(node_id)
    if deadline_ms is None:
        return None
    if deadline_ms == 0:
        return default
    return max(deadline_ms / 1000.0 - time.time() - NODE_DRAIN_MARGIN, 1.0)


def draining_nodes() -> dict[str, int]:
    """The nodes the GCS is draining, each with its deadline (ms since the epoch, 0 for none).

    Errors reading the GCS give an empty answer: the next look tries again.
    """
    try:
        import ray._private.state as state

        draining: dict[str, int] = state.state.get_draining_nodes()
    except Exception as error:  # noqa: BLE001 - an internal API; absent or failing means no early warning
        log.debug("cannot read draining nodes: %s", error)
        return {}
    return draining
