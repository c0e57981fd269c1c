"""The host pool: starting a fleet's host actors where they belong, and asking all of them at once."""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable
from typing import Any, cast

import ray

from ..errors import FleetUnavailableError
from ..host._reports import DeactivationReport, DrainReport, HostStatistics
from ..ledger._contract import LedgerClient
from ._host_actor import NODE_ANSWER_TIMEOUT, launch_host
from ._placement import (
    HOST_NAME_PREFIX,
    assign_nodes,
    free_host_name,
    host_actor_names,
    live_nodes,
    nodes_without_hosts,
)
from ._routing import Courier, HostGone

log = logging.getLogger("rayfleet.fleet")  # the name operators filter on, as before the pool had a room

PROGRESS_INTERVAL = 1.0
"""Seconds between progress reports of bulk operations on hosts (deactivate_all, drain, shutdown)."""

HostCall = Callable[[ray.actor.ActorHandle], "ray.ObjectRef[Any]"]
"""A request sent to one host actor, e.g. ``lambda host: host.deactivate_all.remote()``."""


class HostPool:
    """A fleet's host actors: which run, where new ones go, and requests sent to every one.

    The ledger's host table and Ray's named actors are the truth; the pool keeps no
    state of its own beyond the settings new hosts are started with, so any number of
    drivers may hold a pool of one fleet.
    """

    def __init__(
        self, *, namespace: str, storage: str, ledger_url: str, lease_ttl: float, idle_timeout: float,
        inline_state_bytes: int, wanted: int | None, ledger: LedgerClient, courier: Courier,
    ) -> None:
        """``wanted`` hosts are named ``rayfleet-host-0..N-1``; ``None`` means one per CPU of the cluster."""
        self.namespace = namespace
        self._launch = functools.partial(
            launch_host, namespace=namespace, storage=storage, lease_ttl=lease_ttl, idle_timeout=idle_timeout,
            ledger=ledger_url, inline_state_bytes=inline_state_bytes,
        )
        self._wanted = wanted
        self._ledger = ledger
        self._courier = courier

    def ensure(self) -> None:
        """Start the hosts ``rayfleet-host-0..N-1`` that do not exist, then one on every node with none.

        Existing host actors are reused where they run (the ledger may also list hosts of
        an earlier Ray session that are gone: they are started again). New ones go to the
        least-used eligible node (see ``_placement``).
        """
        wanted = self._wanted or max(1, int(ray.cluster_resources().get("CPU", 1)))
        names = [f"{HOST_NAME_PREFIX}{index}" for index in range(wanted)]
        existing = set(host_actor_names(self.namespace))
        nodes = live_nodes()
        placed = self._nodes_of(sorted(existing))
        placement = assign_nodes([name for name in names if name not in existing], nodes, placed)
        placed.update(placement)
        taken = existing | set(names)
        for node in nodes_without_hosts(nodes, placed):
            name = free_host_name(taken)
            taken.add(name)
            names.append(name)
            placement[name] = node
        handles = [self._start(name, placement.get(name)) for name in names]
        ray.get([handle.start.remote() for handle in handles])
        self._courier.refresh_sync()

    def add(self, *, node: str | None = None) -> str:
        """Start the host with the lowest name the ledger does not list, and return that name.

        See :meth:`~rayfleet.Fleet.add_host` for where it runs.
        """
        name = free_host_name({host.name for host in self._ledger.hosts().result()})
        if node is None:
            placed = self._nodes_of(host_actor_names(self.namespace))
            node = assign_nodes([name], live_nodes(), placed).get(name)
        ray.get(self._start(name, node).start.remote())
        self._courier.refresh_sync()
        return name

    def nodes(self) -> dict[str, str | None]:
        """The Ray node id each host actor runs on (``None``: it did not answer in time)."""
        return self._nodes_of(host_actor_names(self.namespace))

    def statistics(self) -> list[HostStatistics]:
        """Counters of every live host."""
        self._courier.refresh_sync()
        handles = [self._courier.directory.handle(name) for name in self._courier.directory.names]
        return list(ray.get([handle.statistics.remote() for handle in handles]))

    def drain(self, host: str, *, timeout: float, progress: Callable[[int, int], None] | None) -> DrainReport:
        """Drain ``host`` (see :meth:`~rayfleet.Fleet.drain`).

        Raises:
            FleetUnavailableError: no host actor of that name runs.
        """
        [report] = self._await(lambda handle: handle.drain.remote(timeout), [self.handle(host)], progress=progress)
        self._courier.refresh_sync()
        return cast(DrainReport, report)

    def undrain(self, host: str) -> None:
        """Let a drained ``host`` take new work again.

        Raises:
            FleetUnavailableError: no host actor of that name runs.
        """
        ray.get(self.handle(host).undrain.remote())
        self._courier.refresh_sync()

    def deactivate_all(self, *, timeout: float, progress: Callable[[int, int], None] | None) -> DeactivationReport:
        """Checkpoint and release every active agent of every live host (see :meth:`~rayfleet.Fleet.deactivate_all`)."""
        return self._deactivate_on(self._live_handles(), lambda host: host.deactivate_all.remote(),
                                   progress=progress, timeout=timeout)

    def stop(self, *, timeout: float, progress: Callable[[int, int], None] | None) -> DeactivationReport:
        """Shut every host down gracefully (within ``timeout``), then end every host actor of the fleet."""
        handles = self._live_handles()
        report = self._deactivate_on(handles, lambda host: host.shutdown.remote(), progress=progress,
                                     timeout=timeout)
        for handle in handles:
            ray.kill(handle)
        # Host actors the ledger no longer lists (restarted and not started yet, or started
        # by the node watch moments ago) are the fleet's too.
        with contextlib.suppress(Exception):
            for name in host_actor_names(self.namespace):
                with contextlib.suppress(ValueError):
                    ray.kill(ray.get_actor(name, namespace=self.namespace))
        return report

    def handle(self, host: str) -> ray.actor.ActorHandle:
        """The actor handle of ``host``.

        Raises:
            FleetUnavailableError: no host actor of that name runs.
        """
        try:
            return self._courier.directory.handle(host)
        except HostGone:
            raise FleetUnavailableError(
                detail=f"no host actor {host!r} runs in namespace {self.namespace!r} (fleet.hosts() lists the "
                       f"registered hosts)"
            ) from None

    def _start(self, name: str, node: str | None) -> ray.actor.ActorHandle:
        return self._launch(name, node=node)

    def _nodes_of(self, names: list[str]) -> dict[str, str | None]:
        """The node each named host actor runs on; ``None`` for one that does not answer in time."""
        asked: dict[str, ray.ObjectRef[str]] = {}
        for name in names:
            with contextlib.suppress(ValueError):  # gone since it was listed
                asked[name] = ray.get_actor(name, namespace=self.namespace).node_id.remote()
        nodes: dict[str, str | None] = dict.fromkeys(names)
        if not asked:
            return nodes
        ready, _ = ray.wait(list(asked.values()), num_returns=len(asked), timeout=NODE_ANSWER_TIMEOUT)
        answered = set(ready)
        for name, ref in asked.items():
            if ref in answered:
                with contextlib.suppress(ray.exceptions.RayError):
                    nodes[name] = ray.get(ref)
        return nodes

    def _deactivate_on(
        self, handles: list[ray.actor.ActorHandle], request: HostCall,
        *, progress: Callable[[int, int], None] | None, timeout: float,
    ) -> DeactivationReport:
        """Send ``request`` (answered with how many agents a host deactivated) to ``handles``; the report."""
        started = time.monotonic()
        done = self._await(request, handles, progress=progress, timeout=timeout)
        return DeactivationReport(hosts=len(handles), deactivated=sum(d for d in done if isinstance(d, int)),
                                  remaining=self._active_agents(handles), seconds=round(time.monotonic() - started, 3))

    def _live_handles(self) -> list[ray.actor.ActorHandle]:
        directory = self._courier.directory
        self._courier.refresh_sync()
        handles = []
        for name in directory.names:
            if name not in directory.dead:
                with contextlib.suppress(HostGone):  # died without deregistering: nothing to stop
                    handles.append(directory.handle(name))
        return handles

    def _active_agents(self, handles: list[ray.actor.ActorHandle]) -> int:
        """Active agents on these hosts; a host that does not answer in time counts 0."""
        total = 0
        for ref in [handle.statistics.remote() for handle in handles]:
            with contextlib.suppress(Exception):  # a dead or busy host has nothing to report now
                total += ray.get(ref, timeout=PROGRESS_INTERVAL * 5).active_agents
        return total

    def _await(
        self, request: HostCall, handles: list[ray.actor.ActorHandle],
        *, progress: Callable[[int, int], None] | None, timeout: float | None = None,
    ) -> list[Any]:
        """Send ``request`` to every host and wait, telling ``progress(done, total)`` from their active agents.

        Returns each request's reply (a host that died or raised gives its exception
        instead); after ``timeout`` seconds, the requests still running give ``None``.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        total = self._active_agents(handles) if progress is not None else 0
        pending = [request(handle) for handle in handles]
        waiting = list(pending)
        while waiting:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                log.warning("gave up waiting for %d hosts after %.0f s", len(waiting), timeout)
                break
            _, waiting = ray.wait(waiting, num_returns=len(waiting),
                                  timeout=PROGRESS_INTERVAL if left is None else min(PROGRESS_INTERVAL, left))
            if progress is not None:
                active = self._active_agents(handles) if waiting else 0
                progress(max(total - active, 0), total)
        replies: list[Any] = []
        for ref in pending:
            if ref in waiting:
                replies.append(None)
                continue
            try:
                replies.append(ray.get(ref))
            except Exception as error:  # noqa: BLE001 - reported per host, the others' replies still count
                log.warning("a host failed: %s", error)
                replies.append(error)
        return replies
