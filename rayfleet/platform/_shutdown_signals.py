"""How a host learns that it is about to go away: SIGTERM, or its Ray node being drained.

Both end the same way: the host drains (checkpoints and releases every agent within a
deadline) so its identities move at once instead of after a lease TTL.

Ray gives an actor no public hook for either, so both lean on Ray internals, kept in
``_ray_internals`` with their fallbacks: a Ray without them only loses the early
warning (the leases then lapse by TTL, which is safe). SIGTERM runs the drain on the
actor's event loop while the worker's main thread waits (bounded), then Ray's exit
proceeds; a node drain is seen by polling the GCS's list of draining nodes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from ._ray_internals import draining_nodes, run_before_worker_exit

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

    def drain_first() -> None:
        log.warning("SIGTERM: draining for up to %.0f s before exiting", timeout)
        try:
            asyncio.run_coroutine_threadsafe(drain(timeout), loop).result(timeout + 5.0)
        except Exception as error:  # noqa: BLE001 - exit regardless; the leases lapse by TTL
            log.warning("drain on SIGTERM did not finish: %s", error)

    if not run_before_worker_exit(drain_first):
        log.warning("this Ray has no SIGTERM exit hook; a terminated host's leases will lapse by TTL instead")
        return False
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

