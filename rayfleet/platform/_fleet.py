"""``Fleet``: the driver's handle on a rayfleet deployment, and ``connect``, which makes one."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import os
import pickle
import socket
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

import cloudpickle
import ray

from ..checkpoints._committer import INLINE_STATE_BYTES
from ..checkpoints._export import ExportReport, export_fleet
from ..checkpoints._journal_files import JournalFileStore
from ..checkpoints._store import SnapshotStore
from ..errors import (
    FleetNotFoundError,
    FleetUnavailableError,
    InvalidSpecError,
    RayfleetError,
    UnknownDeadLetterError,
    UsageError,
)
from ..host._messages import DeadLetter, DeadLetterReason, Envelope, ParkedMessage
from ..host._runtime import DeactivationReport, DrainReport, HostStatistics
from ..identity._agent import Agent, AgentSpec
from ..identity._names import validate_identity
from ..identity._values import (
    Addressability,
    Durability,
    EventKind,
    IdentityEvent,
    IdentityStatus,
    LifecycleState,
    TopologyPolicy,
)
from ..ledger._local import LocalLedgerClient
from ..ledger._location import LedgerLocation
from ..ledger._values import HostInfo, SpecRecord
from ..retry import RetryPolicy
from ..roster._apply import ApplyReport
from ..roster._roster import RosterChange, load_roster, plan_roster, validate_roster
from ..workflow._definition import Workflow, WorkflowOutcome
from ._binding import require_fleet_marker
from ._host_actor import NODE_ANSWER_TIMEOUT, launch_host
from ._ledger_actor import LEDGER_ACTOR_NAME
from ._ledger_client import attach_ledger, start_ledger
from ._placement import (
    HOST_NAME_PREFIX,
    assign_nodes,
    free_host_name,
    host_actor_names,
    live_nodes,
    nodes_without_hosts,
)
from ._ref import AgentRef, send
from ._routing import Courier, HostDirectory, HostRequest, _HostGone
from ._runner import (
    RUNNER_ACTOR_NAME,
    RunnerClient,
    driver_holder,
    execute_run,
    new_run_id,
    runner_holder_prefix,
)
from ._runs_client import RunsClient
from ._status import identity_status, view_of
from ._topology_client import HostNotifier, TopologyClient

log = logging.getLogger("rayfleet.fleet")

DEFAULT_NAMESPACE = "rayfleet"
DEFAULT_STORAGE = "./.rayfleet"
SPAWN_BATCH = 5_000
REPLAY_LETTER_SCAN = 1_000_000
"""Dead letters of one identity read to find a replay's new letter (replays are rare, operator-driven)."""
"""Specs per ledger transaction in ``spawn_many``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetConfig:
    """How a fleet is deployed. Built by :func:`connect`; every field has a default."""

    address: str | None = None
    """Ray address; ``None`` uses ``RAY_ADDRESS``, else a cluster ``ray start`` left on this machine
    (as ``ray.init()`` finds it), else starts a local Ray."""
    storage: str = DEFAULT_STORAGE
    """Folder or ``pyarrow.fs`` URI (``s3://bucket/prefix?...``) for snapshots and large journal
    outputs, and for the SQLite ledger when it is a local folder."""
    ledger: str | None = None
    """Ledger URL: ``sqlite:///abs/path/ledger.sqlite`` or ``postgresql://user:password@host:5432/db``;
    ``None`` means ``RAYFLEET_LEDGER``, else a SQLite file ``<storage>/ledger.sqlite``."""
    ledger_path: str | None = None
    """Shorthand for ``ledger="sqlite:///<ledger_path>"``."""
    ledger_node: str | None = None
    """Ray node id the SQLite ledger actor is pinned to; ``None`` means the head node."""
    namespace: str = DEFAULT_NAMESPACE
    """Ray namespace of the fleet's actors; fleets in different namespaces are independent."""
    hosts: int | None = None
    """Number of host actors; ``None`` means one per CPU of the cluster (at least 1). Either way
    every eligible node gets at least one (see ``_placement``), at connect and when it joins."""
    lease_ttl: float = 10.0
    """Seconds a lease lasts; hosts renew every TTL/3."""
    idle_timeout: float = 300.0
    """Seconds without a turn before an agent is checkpointed and deactivated."""
    inline_state_bytes: int = INLINE_STATE_BYTES
    """States whose Arrow encoding is at most this many bytes are checkpointed inside the
    ledger's commit (one durable write per turn); larger ones, and group commits of many
    agents, go to snapshot files. 0 writes every checkpoint to a file."""

    def _validate(self) -> None:
        if self.hosts is not None and (not isinstance(self.hosts, int) or self.hosts < 1):
            raise InvalidSpecError(f"hosts must be a positive integer, got {self.hosts!r}", field="hosts")
        for name in ("lease_ttl", "idle_timeout"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value <= 0:
                raise InvalidSpecError(f"{name} must be a positive number of seconds, got {value!r}", field=name)
        if type(self.inline_state_bytes) is not int or self.inline_state_bytes < 0:
            raise InvalidSpecError(
                f"inline_state_bytes must be a whole number of bytes, 0 or more, got {self.inline_state_bytes!r}",
                field="inline_state_bytes",
            )
        if not self.namespace or not isinstance(self.namespace, str):
            raise InvalidSpecError(f"namespace must be a non-empty string, got {self.namespace!r}", field="namespace")
        if self.ledger is not None and self.ledger_path is not None:
            raise InvalidSpecError("pass ledger= or ledger_path=, not both", field="ledger")
        if self.ledger is not None:
            LedgerLocation.parse(self.ledger)

    def ledger_location(self, storage: str) -> LedgerLocation:
        """Where this fleet's ledger lives, given its absolute storage root.

        Raises:
            InvalidSpecError: no ledger was named and the storage is not a local folder.
        """
        if self.ledger is not None:
            return LedgerLocation.parse(self.ledger)
        if self.ledger_path is not None:
            return LedgerLocation.sqlite(self.ledger_path)
        return LedgerLocation.sqlite(_default_ledger_path(storage))


def connect(
    address: str | None = None,
    storage: str | os.PathLike[str] | None = None,
    *,
    namespace: str | None = None,
    hosts: int | None = None,
    lease_ttl: float = 10.0,
    idle_timeout: float = 300.0,
    ledger: str | None = None,
    ledger_path: str | None = None,
    ledger_node: str | None = None,
    create: bool = True,
    inline_state_bytes: int = INLINE_STATE_BYTES,
) -> Fleet:
    """Connect to (or start) a fleet and return its driver handle.

    ``address=None`` uses ``RAY_ADDRESS`` when set, else attaches to a cluster a ``ray start``
    on this machine left (as ``ray.init()`` finds it), else starts a local Ray; only in that
    last case does :meth:`Fleet.shutdown` stop the fleet's actors by default;
    ``storage=None`` uses ``RAYFLEET_STORAGE`` when set, else ``./.rayfleet``;
    ``namespace=None`` uses ``RAYFLEET_NAMESPACE`` when set, else ``rayfleet`` (as the CLI does).
    ``ledger=None`` uses ``RAYFLEET_LEDGER`` when set, else a SQLite file in the
    storage folder; ``ledger="postgresql://..."`` puts the ledger in PostgreSQL, which
    every process then reaches directly. The ledger actor (SQLite) and host actors
    are created if they do not exist yet (they are detached, so they outlive this
    driver) and reused if they do.

    ``inline_state_bytes``: States whose Arrow encoding is at most this large travel in
    the ledger's commit instead of a snapshot file (see :class:`FleetConfig`); hosts
    that already run keep the value they were created with.

    ``create=False`` attaches to a fleet that is already running and creates nothing:
    no local Ray is started (``address=None`` only finds a cluster as ``ray.init()``
    does), no fleet marker, ledger or ledger actor is made, no host is started. It
    refuses with :class:`~rayfleet.FleetNotFoundError` when the storage holds no fleet,
    no cluster is found, or the fleet does not run in ``namespace`` (the storage is
    checked first, before Ray is reached). Every `rayfleet` command but `apply` and
    `gateway` attaches this way.

    Raises:
        InvalidSpecError: for a bad option or ledger URL.
        FleetNotFoundError: with ``create=False``, there is no running fleet to attach to.
        FleetUnavailableError: if Ray cannot be reached.
        FleetMismatchError: the ledger is empty or another fleet's, over this fleet's storage.
        LedgerUnavailableError: a PostgreSQL ledger cannot be reached.
    """
    storage_text = str(storage) if storage is not None else os.environ.get("RAYFLEET_STORAGE", DEFAULT_STORAGE)
    config = FleetConfig(
        address=address or os.environ.get("RAY_ADDRESS") or None,
        storage=storage_text,
        ledger=ledger if ledger is not None or ledger_path is not None else os.environ.get("RAYFLEET_LEDGER") or None,
        ledger_path=ledger_path,
        ledger_node=ledger_node,
        namespace=namespace if namespace is not None else os.environ.get("RAYFLEET_NAMESPACE") or DEFAULT_NAMESPACE,
        hosts=hosts,
        lease_ttl=lease_ttl,
        idle_timeout=idle_timeout,
        inline_state_bytes=inline_state_bytes,
    )
    config._validate()
    return Fleet(config, create=create)


class Fleet:
    """The driver API: spawn agents, call them, manage their lifecycle.

    Every method is safe to call from a plain (non-async) driver; ``AgentRef.ask``
    and :meth:`subscribe` are the async entry points.
    """

    def __init__(self, config: FleetConfig, *, create: bool = True) -> None:
        """Prefer :func:`connect`; ``create=False`` attaches without creating anything (see there)."""
        self.config = config
        self._started_ray = False
        self._closed = False
        self.storage = _absolute_storage(config.storage)
        self.ledger_location = config.ledger_location(self.storage)
        """Where the ledger lives (``.kind`` is ``sqlite`` or ``postgresql``; ``.shown`` hides the password)."""
        if not create:
            # Before Ray: a wrong or empty storage folder is refused at once, and is left as it was.
            require_fleet_marker(self.storage)
        if not ray.is_initialized():
            address = config.address if create else _attach_address(config.address)
            if address:
                _require_listener(address)
            try:
                ray.init(address=address, namespace=config.namespace, log_to_driver=True,
                         include_dashboard=None if address else False)
            except ConnectionError as error:
                # Ray reports a missing auth token only in its own log lines, as a failed connection.
                hint = "" if os.environ.get("RAY_AUTH_MODE") == "token" else (
                    " (a cluster with Ray's token authentication, which `ray start` enables, also needs "
                    "RAY_AUTH_MODE=token on this client)")
                raise FleetUnavailableError(detail=f"cannot connect to Ray at {address!r}: {error}{hint}") from error
            # Recorded from what ray.init did, never inferred from the address: with no
            # address ray.init still attaches to a cluster it discovers (RAY_ADDRESS, or
            # the address file a `ray start` on this machine wrote), and that cluster's
            # fleet must outlive this driver.
            self._started_ray = _started_local_ray()
        self._snapshots: SnapshotStore | None = None
        self._journal_files: JournalFileStore | None = None
        if "://" in self.storage:
            # Reached once before any actor exists: a wrong endpoint or a missing bucket fails
            # connect with a clear error instead of the first checkpoint, and creates nothing.
            self._snapshot_store().storage.check()
        if create:
            self._ledger = start_ledger(self.ledger_location, namespace=config.namespace, storage=self.storage,
                                        node=config.ledger_node)
        else:
            self._ledger = attach_ledger(self.ledger_location, namespace=config.namespace, storage=self.storage)
        self._courier = Courier(
            HostDirectory(config.namespace), self._ledger, lease_ttl=config.lease_ttl
        )
        self._runner = RunnerClient(config.namespace, self.ledger_location.url, self.storage)
        self.topology = TopologyClient(self._ledger, HostNotifier(self._courier))
        """Peer wiring: ``wire``, ``unwire``, ``edges``, ``reconcile``, ``export``."""
        self.runs = RunsClient(self._ledger, self._runner)
        """The run registry: ``get``, ``list_runs``, ``wait``, ``cancel``, ``pause``, ``resume``."""
        if create:
            self._ensure_hosts()
        else:
            self._courier.refresh_sync()  # the hosts that run now, none started

    @property
    def started_ray(self) -> bool:
        """Whether this driver started the Ray it is connected to (then :meth:`shutdown` stops it)."""
        return self._started_ray

    # -- hosts ----------------------------------------------------------------------

    def _ensure_hosts(self) -> None:
        """Start the hosts ``rayfleet-host-0..N-1`` that do not exist, then one on every node with none.

        Existing host actors are reused where they run (the ledger may also list hosts of
        an earlier Ray session that are gone: they are started again). New ones go to the
        least-used eligible node (see ``_placement``).
        """
        wanted = self.config.hosts or max(1, int(ray.cluster_resources().get("CPU", 1)))
        names = [f"{HOST_NAME_PREFIX}{index}" for index in range(wanted)]
        existing = set(host_actor_names(self.config.namespace))
        nodes = live_nodes()
        placed = self._host_nodes(sorted(existing))
        placement = assign_nodes([name for name in names if name not in existing], nodes, placed)
        placed.update(placement)
        taken = existing | set(names)
        for node in nodes_without_hosts(nodes, placed):
            name = free_host_name(taken)
            taken.add(name)
            names.append(name)
            placement[name] = node
        handles = [self._start_host(name, placement.get(name)) for name in names]
        ray.get([handle.start.remote() for handle in handles])
        self._courier.refresh_sync()

    def _start_host(self, name: str, node: str | None) -> ray.actor.ActorHandle:
        return launch_host(name, namespace=self.config.namespace, storage=self.storage,
                           lease_ttl=self.config.lease_ttl, idle_timeout=self.config.idle_timeout,
                           ledger=self.ledger_location.url, node=node,
                           inline_state_bytes=self.config.inline_state_bytes)

    def _host_nodes(self, names: list[str]) -> dict[str, str | None]:
        """The node each named host actor runs on; ``None`` for one that does not answer in time."""
        asked: dict[str, ray.ObjectRef[str]] = {}
        for name in names:
            with contextlib.suppress(ValueError):  # gone since it was listed
                asked[name] = ray.get_actor(name, namespace=self.config.namespace).node_id.remote()
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

    def add_host(self, *, node: str | None = None) -> str:
        """Start the host with the lowest name the ledger does not list, and return that name.

        A new host runs on ``node`` (a Ray node id, e.g. from ``ray.nodes()``) when given,
        else on the eligible node with the fewest of this fleet's hosts; either way Ray
        moves it to another node if that one dies. A host actor of that name that exists
        but is not registered (Ray restarted it and it has not started yet) is started
        where it runs instead.
        """
        name = free_host_name({host.name for host in self._ledger.hosts().result()})
        if node is None:
            placed = self._host_nodes(host_actor_names(self.config.namespace))
            node = assign_nodes([name], live_nodes(), placed).get(name)
        ray.get(self._start_host(name, node).start.remote())
        self._courier.refresh_sync()
        return name

    def host_nodes(self) -> dict[str, str | None]:
        """The Ray node id each of this fleet's host actors runs on (``None``: it did not answer in time)."""
        return self._host_nodes(host_actor_names(self.config.namespace))

    def hosts(self) -> list[HostInfo]:
        """The registered hosts (name, lease holder id, start time, draining)."""
        return self._ledger.hosts().result()

    def host_statistics(self) -> list[HostStatistics]:
        """Counters of every live host."""
        self._courier.refresh_sync()
        handles = [self._courier.directory.handle(name) for name in self._courier.directory.names]
        return list(ray.get([handle.statistics.remote() for handle in handles]))

    def drain(
        self, host: str, *, timeout: float = 25.0, progress: Callable[[int, int], None] | None = None,
    ) -> DrainReport:
        """Move every agent off ``host`` within ``timeout`` seconds; it takes no new work until :meth:`undrain`.

        Agents are checkpointed and released; any still busy at the deadline have their
        handler stopped and their lease released without their unsaved State (counted in
        ``released_unsaved``), so no identity waits a lease TTL to move. Call ``ray.kill``
        on the host afterwards to scale in. A host drains the same way on SIGTERM and
        when Ray drains its node. ``progress`` is told ``(moved, total)`` about every
        second; the report says how long the drain took.

        Raises:
            FleetUnavailableError: no host actor of that name runs.
        """
        handle = self._host_handle(host)
        [report] = self._await_hosts(lambda host: host.drain.remote(timeout), [handle], progress=progress)
        self._courier.refresh_sync()
        return cast(DrainReport, report)

    def deactivate_all(
        self, *, timeout: float = 300.0, progress: Callable[[int, int], None] | None = None,
    ) -> DeactivationReport:
        """Checkpoint and release every active agent of every host; each reactivates on its next message.

        Hosts work side by side, each in batches (commits grouped, one release call per
        batch), so 100,000 agents take seconds. ``progress`` is told ``(deactivated,
        total)`` about every second. Returns once every host is done, or after
        ``timeout`` seconds, with what was left (``remaining``) still hosted.

        Raises:
            FleetUnavailableError: Ray cannot be reached.
        """
        return self._deactivate_on(self._live_host_handles(), lambda host: host.deactivate_all.remote(),
                                   progress=progress, timeout=timeout)

    def _deactivate_on(
        self, handles: list[ray.actor.ActorHandle], request: Callable[[ray.actor.ActorHandle], ray.ObjectRef[Any]],
        *, progress: Callable[[int, int], None] | None, timeout: float,
    ) -> DeactivationReport:
        """Send ``request`` (answered with how many agents a host deactivated) to ``handles``; the report."""
        started = time.monotonic()
        done = self._await_hosts(request, handles, progress=progress, timeout=timeout)
        return DeactivationReport(hosts=len(handles), deactivated=sum(d for d in done if isinstance(d, int)),
                                  remaining=self._active_agents(handles), seconds=round(time.monotonic() - started, 3))

    def _live_host_handles(self) -> list[ray.actor.ActorHandle]:
        directory = self._courier.directory
        self._courier.refresh_sync()
        handles = []
        for name in directory.names:
            if name not in directory.dead:
                with contextlib.suppress(_HostGone):  # died without deregistering: nothing to stop
                    handles.append(directory.handle(name))
        return handles

    def _active_agents(self, handles: list[ray.actor.ActorHandle]) -> int:
        """Active agents on these hosts; a host that does not answer in time counts 0."""
        total = 0
        for ref in [handle.statistics.remote() for handle in handles]:
            with contextlib.suppress(Exception):  # a dead or busy host has nothing to report now
                total += ray.get(ref, timeout=PROGRESS_INTERVAL * 5).active_agents
        return total

    def _await_hosts(
        self, request: Callable[[ray.actor.ActorHandle], ray.ObjectRef[Any]], handles: list[ray.actor.ActorHandle],
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

    def undrain(self, host: str) -> None:
        """Let a drained ``host`` take new work again."""
        ray.get(self._host_handle(host).undrain.remote())
        self._courier.refresh_sync()

    def _host_handle(self, host: str) -> ray.actor.ActorHandle:
        try:
            return self._courier.directory.handle(host)
        except _HostGone:
            raise FleetUnavailableError(
                detail=f"no host actor {host!r} runs in namespace {self.config.namespace!r} (fleet.hosts() lists the "
                       f"registered hosts)"
            ) from None

    # -- agents ---------------------------------------------------------------------

    def spawn(
        self,
        identity: str | AgentSpec,
        agent: type[Agent] | str | None = None,
        *,
        labels: Mapping[str, str] | None = None,
        addressability: Addressability | str = Addressability.ADDRESSABLE,
        peers: tuple[str, ...] | list[str] = (),
        topology: TopologyPolicy | str = TopologyPolicy.OPEN,
        durability: Durability | str = Durability.EVERY_TURN,
        checkpoint_interval: float = 1.0,
        display_name: str = "",
        context: Mapping[str, Any] | None = None,
        retry: RetryPolicy | None = None,
        dedup_capacity: int = 10_000,
        eager: bool = False,
    ) -> AgentRef:
        """Create an agent (idempotent) and return a ref to it.

        Spawning an identity that exists with the same spec returns a ref to it;
        with a different spec it raises. ``eager=True`` activates it now instead of
        on its first message.

        Raises:
            InvalidSpecError: bad identity or spec, or a conflicting existing spec.
        """
        if isinstance(identity, AgentSpec):
            if agent is not None:
                raise InvalidSpecError("pass either an AgentSpec or an identity and agent class, not both",
                                       field="agent")
            spec = identity
        else:
            if agent is None:
                raise InvalidSpecError(
                    f"spawn({identity!r}) needs an agent class: fleet.spawn({identity!r}, MyAgent)", field="agent"
                )
            # AgentSpec turns enum names given as strings into the enums, and refuses unknown ones.
            spec = AgentSpec(
                identity=identity, agent=agent, labels=labels or {},
                addressability=cast(Addressability, addressability), peers=tuple(peers),
                topology=cast(TopologyPolicy, topology), durability=cast(Durability, durability),
                checkpoint_interval=checkpoint_interval, display_name=display_name, context=context or {},
                retry=retry or RetryPolicy(), dedup_capacity=dedup_capacity,
            )
        outcome = self._ledger.register(spec_record(spec)).result()
        if outcome.created and (spec.peers or outcome.awaited):
            self.topology.reconcile()
        ref = AgentRef(self._courier, spec.identity)
        if eager:
            identity = spec.identity
            self._courier.route_sync(identity, lambda host: host.activate.remote(identity), method="activate")
        return ref

    def spawn_many(
        self, specs: Iterable[AgentSpec], *, batch: int = SPAWN_BATCH,
        progress: Callable[[int, int], None] | None = None,
    ) -> list[AgentRef]:
        """Create many agents in a few ledger transactions (idempotent, like :meth:`spawn`); refs in order.

        Every spec is validated before anything is written; each batch of ``batch``
        specs is one transaction, so a batch applies whole or not at all. Identities
        whose peers are declared are wired afterwards, in one reconcile. ``progress``
        is called with (specs registered, total) after each batch.

        Raises:
            InvalidSpecError: a spec is not an ``AgentSpec``, an identity repeats, or an
                identity exists with a different spec (batches before it stay applied).
        """
        specs = list(specs)
        seen: set[str] = set()
        for spec in specs:
            if not isinstance(spec, AgentSpec):
                raise InvalidSpecError(f"spawn_many takes rf.AgentSpec values, got {type(spec).__name__}",
                                       field="specs")
            if spec.identity in seen:
                raise InvalidSpecError(f"identity {spec.identity!r} appears twice in spawn_many", field="specs")
            seen.add(spec.identity)
        if not isinstance(batch, int) or batch < 1:
            raise InvalidSpecError(f"batch must be a positive integer, got {batch!r}", field="batch")
        wire = False
        for start in range(0, len(specs), batch):
            chunk = specs[start:start + batch]
            outcomes = self._ledger.register_many([spec_record(spec) for spec in chunk]).result()
            wire = wire or any(o.created and (s.peers or o.awaited) for s, o in zip(chunk, outcomes, strict=True))
            if progress is not None:
                progress(start + len(chunk), len(specs))
        if wire:
            self.topology.reconcile()
        return [AgentRef(self._courier, spec.identity) for spec in specs]

    def apply(
        self, roster: str | os.PathLike[str] | list[AgentSpec] | list[dict[str, Any]], *, dry_run: bool = False,
        prune: bool = False, progress: Callable[[int, int], None] | None = None,
    ) -> ApplyReport:
        """Make the fleet match a roster (a YAML file or a list of specs), idempotently.

        Creates missing identities, updates changed specs (labels, peers,
        addressability, ...), and with ``prune=True`` retires identities the roster
        does not list; then reconciles the topology. ``dry_run=True`` only reports.
        ``progress`` is called with (steps done, total): the one ledger write of every
        creation and update, each updated agent's deactivation, each retirement, the
        reconcile.

        Raises:
            InvalidSpecError: naming the file and line, or the identity, of the first
                problem; nothing is applied.
        """
        specs = load_roster(roster)
        current = {view.identity: view for view in self._ledger.list_identities().result()}
        validate_roster(specs, existing=current.keys())
        change: RosterChange = plan_roster(
            specs, {identity: cloudpickle.loads(view.spec) for identity, view in current.items()}, prune=prune
        )
        # Pruning an identity that is already retired would change nothing but its token.
        retired_now = {identity for identity, view in current.items()
                       if identity_status(view).state is LifecycleState.RETIRING}
        to_retire = tuple(identity for identity in change.prune if identity not in retired_now)
        created = tuple(spec.identity for spec in change.create)
        updated = {spec.identity: list(fields) for spec, fields in change.update}
        if dry_run:
            return ApplyReport(created=created, updated=updated, unchanged=tuple(change.unchanged), retired=to_retire,
                               topology=None, dry_run=True)
        total, done = 2 + len(change.update) + len(to_retire), 0

        def step() -> None:
            nonlocal done
            done += 1
            if progress is not None:
                progress(done, total)

        self._ledger.apply_specs(
            creates=[spec_record(spec) for spec in change.create],
            updates=[spec_record(spec) for spec, _ in change.update],
        ).result()
        step()
        for spec, _ in change.update:
            # The owner reloads the new spec when the agent next activates.
            self.deactivate(spec.identity)
            step()
        for identity in to_retire:
            self.retire(identity, reconcile=False)
            step()
        topology = self.topology.reconcile()
        step()
        return ApplyReport(created=created, updated=updated, unchanged=tuple(change.unchanged), retired=to_retire,
                           topology=topology, dry_run=False)

    def agent(self, identity: str) -> AgentRef:
        """A ref to an existing agent by name (existence is checked on first use)."""
        return AgentRef(self._courier, validate_identity(identity))

    def spec(self, identity: str) -> AgentSpec:
        """The spec an identity was spawned with."""
        spec: AgentSpec = cloudpickle.loads(view_of(self._ledger, identity).spec)
        return spec

    def status(self, identity: str) -> IdentityStatus:
        """Where ``identity`` is in its life, who owns it, and its lease."""
        return identity_status(view_of(self._ledger, identity))

    def list_agents(self, labels: Mapping[str, str] | None = None) -> list[IdentityStatus]:
        """Statuses of all identities (sorted), or those whose labels include ``labels``."""
        return [identity_status(view) for view in self._ledger.list_identities(labels=dict(labels or {})).result()]

    def retire(self, identity: str, *, reconcile: bool = True) -> int:
        """Checkpoint and deactivate; calls then fail with ``InvalidStateError`` until respawn.

        Its managed peer edges are unwired. Returns the fencing token the retirement
        was written with.
        """
        token = int(self._lifecycle(identity, "retire", lambda host: host.retire.remote(identity)))
        if reconcile:
            self.topology.reconcile()
        return token

    def respawn(self, identity: str) -> IdentityStatus:
        """Bring a retired, broken or live identity back from its last committed State (and its edges)."""
        self._lifecycle(identity, "respawn", lambda host: host.respawn.remote(identity))
        self.topology.reconcile()
        return self.status(identity)

    def reset(self, identity: str) -> IdentityStatus:
        """New generation and session, fresh State; the old State is discarded. Edges are kept."""
        self._lifecycle(identity, "reset", lambda host: host.reset.remote(identity))
        self.topology.reconcile()
        return self.status(identity)

    def delete(self, identity: str) -> None:
        """Remove the identity and its continuity record; later calls raise ``UnknownIdentityError``."""
        self._lifecycle(identity, "delete", lambda host: host.delete.remote(identity))
        self._courier.directory.forget(identity)

    def deactivate(self, identity: str) -> bool:
        """Checkpoint and release an active agent now (it reactivates on its next message)."""
        return bool(self._lifecycle(identity, "deactivate", lambda host: host.deactivate.remote(identity)))

    def _lifecycle(self, identity: str, operation: str, request: HostRequest) -> Any:
        view_of(self._ledger, identity)  # unknown identities fail here, with a clear error
        return self._courier.route_sync(identity, request, method=operation)

    # -- pause, parking and dead letters ---------------------------------------------

    def pause(self, identity: str) -> None:
        """Park every later message of ``identity`` durably, in order, until :meth:`resume`.

        Callers of ``call`` wait (up to their timeout) while their message is parked.
        The pause survives host failover.
        """
        self._lifecycle(identity, "pause", lambda host: host.pause.remote(identity))

    def resume(self, identity: str) -> int:
        """Replay parked messages oldest first through the same gates, then take new work.

        Returns how many parked messages were replayed.
        """
        return int(self._lifecycle(identity, "resume", lambda host: host.resume.remote(identity)))

    def parked(self, identity: str) -> list[ParkedMessage]:
        """Messages held for a paused identity, oldest first."""
        view_of(self._ledger, identity)
        return [
            ParkedMessage(seq=item.id, identity=item.identity, envelope=cloudpickle.loads(item.envelope),
                          parked_at=item.at)
            for item in self._ledger.parked(identity, limit=1_000_000).result()
        ]

    def cancel_parked(self, identity: str) -> int:
        """Drop the parked work of ``identity`` into the dead-letter log (reason CANCELLED)."""
        return int(self._lifecycle(identity, "cancel_parked", lambda host: host.cancel_parked.remote(identity)))

    def dead_letters(self, identity: str | None = None, *, limit: int = 1000) -> list[DeadLetter]:
        """Messages that could not be handled, oldest first, optionally for one identity."""
        stored = self._ledger.dead_letters(identity=identity, limit=limit).result()
        return [
            DeadLetter(id=item.id, identity=item.identity, envelope=cloudpickle.loads(item.envelope),
                       reason=DeadLetterReason(item.reason), error=item.error, attempts=item.attempts, at=item.at)
            for item in stored
        ]

    def replay_dead_letter(self, letter_id: int, *, timeout: float | None = None) -> Any:
        """Send a dead letter's original message again and return the reply.

        The message goes out as it was sent (same id, arguments and idempotency key, so
        a keyed effect that did happen is not repeated) but without its deadline:
        replaying is the decision to run it now, and the old deadline would only
        expire it again. The letter is removed when the replay was handled, or when it
        failed and the host recorded a new dead letter for it (so exactly one letter
        remains). When the replay was refused before any handling (the identity is
        retired, the handler is gone, the lease moved, ...) or its outcome is unknown
        (no reply within ``timeout``), the letter stays, and the error is raised.

        Raises:
            UnknownDeadLetterError: no dead letter has ``letter_id`` (perhaps already replayed).
            DeadlineExceededError: no reply within ``timeout`` (the letter stays; the request
                is cancelled, best effort, so the message may still have run).
            InvalidStateError, UnknownHandlerError, NotAddressableError, LeaseLostError,
            FleetUnavailableError, HandlerError, ...: the replay's own failure.
        """
        letter = self._ledger.dead_letter(letter_id).result()
        if letter is None:
            raise UnknownDeadLetterError(letter_id=letter_id)
        envelope: Envelope = dataclasses.replace(cloudpickle.loads(letter.envelope), deadline=None)
        try:
            reply = send(self._courier, envelope, timeout=timeout)
        except RayfleetError:
            if self._dead_lettered_since(letter.identity, envelope.message_id, letter_id):
                self._ledger.purge_dead_letters(ids=[letter_id]).result()
            raise
        self._ledger.purge_dead_letters(ids=[letter_id]).result()
        return reply

    def _dead_lettered_since(self, identity: str, message_id: str, letter_id: int) -> bool:
        """Whether the message has a dead letter newer than ``letter_id`` (its replay failed and was recorded)."""
        # The ledger is asked rather than the error's type trusted: a host whose own
        # dead-letter write failed raises the same error without leaving a letter.
        letters = self._ledger.dead_letters(identity=identity, limit=REPLAY_LETTER_SCAN).result()
        return any(item.id > letter_id and item.message_id == message_id for item in letters)

    def purge_dead_letters(
        self, identity: str | None = None, *, ids: list[int] | None = None, before: float | None = None
    ) -> int:
        """Delete dead letters matching every given filter; returns how many were deleted."""
        return self._ledger.purge_dead_letters(identity=identity, ids=ids, before=before).result()

    # -- workflows ------------------------------------------------------------------

    def run(self, workflow: Workflow, *, run_id: str | None = None, force: bool = False) -> WorkflowOutcome:
        """Run a workflow in this process and return its outcome (blocking).

        Passing the ``run_id`` of an unfinished run resumes it: journaled steps are
        re-derived from the journal, never executed again. A run started under a
        different code version is refused unless ``force=True``. Step failures do not
        raise: the outcome's ``status`` is COMPENSATED or FAILED and ``error`` holds
        the typed error (``outcome.raise_error()`` raises it).

        The run's lease makes this process its one engine while it runs: resuming a run
        that another live engine executes (the runner, or another ``fleet.run``) is
        refused, and nothing is done. A run whose runner actor no longer exists is
        taken over at once; one left by a vanished driver, once that driver's lease
        has lapsed (its TTL, 10 s by default).

        Raises:
            InvalidSpecError: the workflow is not valid (named step), or a code-version mismatch.
            RunOwnedElsewhereError: another live engine holds the run (the error names it).
            StaleRunTokenError: another engine took the run over while this one ran it.
            UsageError: called from a running event loop (use ``await fleet.run_async(wf)``).
        """
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self.run_async(workflow, run_id=run_id, force=force))
        raise UsageError(
            "fleet.run() blocks and cannot be called from a running event loop; use await fleet.run_async(wf)",
            api="fleet.run()",
        )

    async def run_async(self, workflow: Workflow, *, run_id: str | None = None, force: bool = False) -> WorkflowOutcome:
        """:meth:`run`, awaited."""
        workflow.validate()
        resuming = run_id is not None
        run_id = run_id or new_run_id(workflow)
        self._ledger.create_run(run_id=run_id, workflow=workflow.name, code_version=workflow.code_version(),
                                definition=None, force=force).result()
        takeover = None
        if resuming:  # a run id minted just now has had no engine: there is nobody to take over from
            record = self._ledger.run(run_id).result()
            takeover = self._dead_runner(None if record is None else record.owner)
        return await execute_run(self._courier, workflow, run_id, self._journal_file_store(), holder=driver_holder(),
                                 takeover_from=takeover)

    def _dead_runner(self, owner: str | None) -> str | None:
        """``owner`` if it names a runner of this fleet and Ray knows no runner actor any more."""
        if owner is None or not owner.startswith(runner_holder_prefix(self.config.namespace)):
            return None
        try:
            ray.get_actor(RUNNER_ACTOR_NAME, namespace=self.config.namespace)
        except ValueError:
            return owner  # killed for good: its engine is gone with it
        return None  # alive or restarting: the runner resumes the run itself

    def submit(self, workflow: Workflow, *, run_id: str | None = None) -> str:
        """Run a workflow in the detached runner actor, which survives this driver; returns the run id.

        The runner resumes unfinished runs from the journal after it restarts.

        Raises:
            InvalidSpecError: the workflow is not valid, or a builder cannot be pickled.
        """
        workflow.validate(for_submit=True)
        run_id = run_id or new_run_id(workflow)
        self._ledger.create_run(run_id=run_id, workflow=workflow.name, code_version=workflow.code_version(),
                                definition=cloudpickle.dumps(workflow)).result()
        self._runner.start(run_id)
        return run_id

    def collect_garbage(self, *, min_age: float = 60.0) -> list[str]:
        """Delete snapshot files no continuity record points at and older than ``min_age`` seconds."""
        referenced = self._ledger.referenced_snapshot_files().result()
        return self._snapshot_store().collect_garbage(referenced, min_age=min_age)

    def export(
        self, path: str | os.PathLike[str], *, progress: Callable[[int, int], None] | None = None
    ) -> ExportReport:
        """Write every identity's latest committed State, the dead letters and the runs as Parquet under ``path``.

        ``path`` is a local folder or any ``pyarrow.fs`` URI (``s3://bucket/prefix?...``),
        like the storage. One table (folder) per agent class, named ``module.Class``,
        with ``identity``, ``lifecycle``, ``generation``, ``checkpoint_version``,
        ``fencing_token`` and ``committed_at`` columns and one column per State field;
        plus ``dead_letters`` and ``runs``. Retired and broken identities are exported
        with their last committed State; identities that never committed one have no
        row (counted in ``uncheckpointed``). Identities are read and written a page at a
        time, so a large fleet is never held in memory. An earlier export at ``path``
        is replaced. ``progress`` is told ``(done, total)`` identities as it goes.

        What is exported is what was committed: State an agent holds but has not
        checkpointed yet (``PERIODIC`` or ``ON_DEACTIVATE`` durability) is not in it.

        Raises:
            InvalidSpecError: ``path`` is unusable, or holds files other than an earlier export.
            StorageUnavailableError: the destination or the snapshots cannot be reached.
            LedgerUnavailableError: the ledger cannot be reached.
        """
        return export_fleet(os.fspath(path), ledger=self._ledger, snapshots=self._snapshot_store(),
                            progress=progress)

    def _snapshot_store(self) -> SnapshotStore:
        # Made on first use: a local folder is created only when the driver itself needs it.
        if self._snapshots is None:
            self._snapshots = SnapshotStore(self.storage)
        return self._snapshots

    def _journal_file_store(self) -> JournalFileStore:
        if self._journal_files is None:
            self._journal_files = JournalFileStore(self.storage)
        return self._journal_files

    # -- events ---------------------------------------------------------------------

    async def subscribe(self, identity: str, *, poll_interval: float = 1.0) -> AsyncIterator[IdentityEvent]:
        """Events of ``identity`` from whichever host owns it, until it is deleted.

        Only events emitted after the subscription opened are delivered. A slow
        reader loses the oldest events beyond 64 per host rather than stalling it.
        """
        view_of(self._ledger, identity)
        subscriber = uuid.uuid4().hex
        directory = self._courier.directory
        await self._courier.refresh_async()
        handles = {name: directory.handle(name) for name in directory.names}
        await asyncio.gather(*(h.open_subscription.remote(identity, subscriber) for h in handles.values()))
        queue: asyncio.Queue[IdentityEvent | None] = asyncio.Queue()

        async def pump(handle: ray.actor.ActorHandle) -> None:
            try:
                while True:
                    events, ended = await handle.poll_events.remote(subscriber, poll_interval)
                    for event in events:
                        await queue.put(event)
                    if ended:
                        return
            except ray.exceptions.RayActorError:
                return

        pumps = [asyncio.get_running_loop().create_task(pump(handle)) for handle in handles.values()]
        try:
            while True:
                event = await queue.get()
                if event is None:
                    return
                yield event
                if event.kind is EventKind.DELETED:
                    return
        finally:
            for task in pumps:
                task.cancel()
            for handle in handles.values():
                handle.close_subscription.remote(subscriber)

    # -- shutdown -------------------------------------------------------------------

    def shutdown(
        self, *, stop_actors: bool | None = None, timeout: float = 300.0,
        progress: Callable[[int, int], None] | None = None,
    ) -> DeactivationReport | None:
        """Disconnect; with ``stop_actors`` also checkpoint every agent and stop the fleet's actors.

        ``stop_actors`` defaults to :attr:`started_ray`: a driver that attached to a running
        cluster leaves the fleet there running, and one that started its own Ray stops the
        actors gracefully before that Ray ends with it. Stopping deactivates every agent
        first, as :meth:`deactivate_all` (``progress`` is told ``(deactivated, total)``);
        after ``timeout`` seconds the hosts are stopped anyway, and agents still hosted
        then lose unsaved State (their count is the report's ``remaining``). Returns that
        report when actors were stopped, else ``None``. A second call does nothing.
        """
        if self._closed:
            return None
        self._closed = True
        stop = self._started_ray if stop_actors is None else stop_actors
        report = None
        if stop:
            handles = self._live_host_handles()
            report = self._deactivate_on(handles, lambda host: host.shutdown.remote(), progress=progress,
                                         timeout=timeout)
            for handle in handles:
                ray.kill(handle)
            # Host actors the ledger no longer lists (restarted and not started yet, or started
            # by the node watch moments ago) are the fleet's too.
            with contextlib.suppress(Exception):
                for name in host_actor_names(self.config.namespace):
                    with contextlib.suppress(ValueError):
                        ray.kill(ray.get_actor(name, namespace=self.config.namespace))
            self._runner.stop()
            if not self.ledger_location.networked:
                # The SQLite ledger's actor, whether this driver called it or wrote the file itself.
                with contextlib.suppress(ValueError):
                    ray.kill(ray.get_actor(LEDGER_ACTOR_NAME, namespace=self.config.namespace))
        if isinstance(self._ledger, LocalLedgerClient):
            self._ledger.close()  # a direct client's connections and threads
        if self._started_ray:
            ray.shutdown()
        return report

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()


PROGRESS_INTERVAL = 1.0
"""Seconds between progress reports of bulk operations on hosts (deactivate_all, drain, shutdown)."""
RAY_PROBE_TIMEOUT = 5.0
"""Seconds to wait for a TCP connection to a Ray address before ``ray.init`` is even tried."""


def _require_listener(address: str) -> None:
    """Fail fast when nothing listens at a ``host:port`` (or ``ray://host:port``) Ray address.

    ``ray.init`` retries an address where nothing listens for many minutes; one TCP
    connection tells at once. Addresses in another form (``auto``, ``local``) are left
    to Ray.

    Raises:
        FleetUnavailableError: the connection was refused or timed out.
    """
    parts = urlsplit("//" + address.removeprefix("ray://"))
    try:
        host, port = parts.hostname, parts.port
    except ValueError:  # a port that is not a number: Ray's own message says more
        return
    if not host or port is None:
        return
    try:
        with socket.create_connection((host, port), timeout=RAY_PROBE_TIMEOUT):
            pass
    except OSError as error:
        raise FleetUnavailableError(
            detail=f"nothing answers at the Ray address {address!r} ({error}); start the cluster "
                   f"(`ray start --head --port {port}`) or give the right address (connect(address=...), RAY_ADDRESS "
                   f"or rayfleet --address)"
        ) from None


def _attach_address(address: str | None) -> str:
    """The Ray address to attach to without starting a local Ray.

    Raises:
        FleetNotFoundError: no address was given and ``ray.init()`` would find no cluster.
    """
    if address:
        return address
    # ``address="auto"`` is not used: it also joins any Ray whose processes it sees on
    # this machine, possibly someone else's. ``ray.init()`` itself reads RAY_ADDRESS, then
    # the address file ``ray start`` writes; Ray offers no public call for that lookup,
    # so without it only RAY_ADDRESS counts.
    try:
        from ray._private.services import canonicalize_bootstrap_address

        lookup: Any = canonicalize_bootstrap_address  # annotated as taking str; None means "as ray.init() would"
        found = lookup(None)
    except (ImportError, AttributeError, TypeError):
        found = os.environ.get("RAY_ADDRESS") or None
    if not found:
        raise FleetNotFoundError(
            missing="no running Ray cluster was found (RAY_ADDRESS is not set and no `ray start` cluster was found "
                    "on this machine)",
            remedy="start the fleet's cluster (`ray start --head --port <port>`) or give its address "
                   "(connect(address=...), RAY_ADDRESS or rayfleet --address)",
        )
    return str(found)


def _started_local_ray() -> bool:
    """Whether the ``ray.init`` this process just made started a new local Ray (a head node).

    Attaching to an existing cluster makes a connect-only, non-head node. Ray has no
    public flag for this; if its internals change, the answer is ``False``, so a fleet
    is never stopped by a driver that cannot tell it started the Ray under it.
    """
    node = getattr(ray._private.worker, "_global_node", None)
    return bool(getattr(node, "head", False))


def spec_record(spec: AgentSpec) -> SpecRecord:
    """The ledger's record of a spec (the spec itself travels pickled)."""
    return SpecRecord(
        identity=spec.identity, spec=pickle_spec(spec), fingerprint=spec.fingerprint(),
        agent_class=spec.agent_class_path, labels=dict(spec.labels), addressability=spec.addressability.value,
        peers=tuple(spec.peers),
    )


def pickle_spec(spec: AgentSpec) -> bytes:
    """Pickle a spec so any host can rebuild it, whoever started the host and wherever.

    Agent classes from the user's own files (not an installed package) are pickled by
    value, whether the spec names the class itself or a ``"module:Class"`` path (a
    roster's module beside the roster file, a script's folder added to ``sys.path``):
    hosts are detached actors started by whichever driver came first, with that
    driver's ``sys.path`` and working directory, so they cannot import a module only
    this driver sees. The bytes go into the ledger with the spec, so a host Ray
    restarts later rebuilds the class from there too. Classes of installed packages
    are pickled by reference, as Ray users would expect: install them on every node.

    The class is pickled once per process and its bytes reused for every spec that
    names it, so creating many agents of one class costs little per agent.

    Raises:
        InvalidSpecError: the agent class must travel by value and cannot be pickled.
    """
    agent = spec.agent
    if isinstance(agent, str):
        resolved = spec.agent_class  # the driver imported it when the spec was built
        if not _ships_by_value(resolved):
            pickled: bytes = cloudpickle.dumps(spec)
            return pickled
        agent = resolved
    fields = {field.name: getattr(spec, field.name) for field in dataclasses.fields(spec) if field.name != "agent"}
    package = _SpecPackage(fields, _class_bytes(agent))
    try:
        return pickle.dumps(package, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, TypeError, AttributeError):
        pickled = cloudpickle.dumps(package)  # e.g. a lambda in the spec's context
        return pickled


_CLASS_BYTES: dict[type[Agent], bytes] = {}


def _class_bytes(agent: type[Agent]) -> bytes:
    cached = _CLASS_BYTES.get(agent)
    if cached is None:
        if _ships_by_value(agent):
            for module in _modules_shipped_with(agent):
                cloudpickle.register_pickle_by_value(module)
        try:
            cached = cloudpickle.dumps(agent)
        except Exception as error:  # cloudpickle raises many types for unpicklable module state
            raise InvalidSpecError(
                f"agent class {agent.__module__}:{agent.__qualname__} is not installed on the cluster, so it "
                f"travels to the hosts by value, but it cannot be pickled ({type(error).__name__}: {error}). "
                f"Keep unpicklable objects (locks, connections, clients) out of its module's globals and create "
                f"them in on_activate, or install its package on every node",
                field="agent",
            ) from error
        _CLASS_BYTES[agent] = cached
    return cached


def _ships_by_value(agent: type[Agent]) -> bool:
    """Whether hosts may lack ``agent``'s module: it comes from a file that no installed package holds."""
    location = getattr(sys.modules.get(agent.__module__), "__file__", None)
    return bool(location) and not _is_installed(str(location))


def _modules_shipped_with(agent: type[Agent]) -> list[Any]:
    """``agent``'s module and every loaded module importable from the same ``sys.path`` folder.

    A module beside a roster, or in a folder only this driver has on its path, often
    imports helpers from next to it; those travel by value as well, or the host would
    fail to import them while rebuilding the class. Modules imported later, from
    inside a handler, are not known here and must be installed on the nodes.
    """
    module = sys.modules[agent.__module__]
    root = _import_root(module)
    shipped = [module]
    if root is None:
        return shipped
    for name, other in list(sys.modules.items()):
        location = getattr(other, "__file__", None)
        if other is module or not location or name == "__main__" or _is_installed(str(location)):
            continue
        if _import_root(other) == root:
            shipped.append(other)
    return shipped


def _import_root(module: Any) -> Path | None:
    """The folder on ``sys.path`` a module was imported from (``a.b`` in ``/x/a/b.py`` -> ``/x``)."""
    location = getattr(module, "__file__", None)
    name = getattr(module, "__name__", "")
    if name == "__main__":
        # `python -m pkg.tool` runs pkg/tool.py as __main__ from the folder above pkg/.
        spec = getattr(module, "__spec__", None)
        name = spec.name if spec is not None and spec.name else ""
    if not location:
        return None
    path = Path(location).resolve()
    depth = name.count(".") + (1 if path.name == "__init__.py" else 0)
    if depth >= len(path.parents):
        return None
    return path.parents[depth]


class _SpecPackage:
    """A spec in transit: its fields, and its agent class as bytes pickled once per class."""

    __slots__ = ("class_bytes", "fields")

    def __init__(self, fields: dict[str, Any], class_bytes: bytes) -> None:
        self.fields = fields
        self.class_bytes = class_bytes

    def __reduce__(self) -> tuple[Any, tuple[dict[str, Any], bytes]]:
        return (_rebuild_spec, (self.fields, self.class_bytes))


def _rebuild_spec(fields: dict[str, Any], class_bytes: bytes) -> AgentSpec:
    return AgentSpec(agent=_agent_class(class_bytes), **fields)


@functools.lru_cache(maxsize=256)
def _agent_class(class_bytes: bytes) -> Any:
    """The agent class pickled as ``class_bytes`` (a path, or a class by value), rebuilt once per process.

    cloudpickle keeps one class object per pickled class in a process, so every spec of
    one agent class gets the same class (State codecs and group commits are keyed by
    it); but it builds the class anew before finding that out, running the metaclass
    (a State's pydantic schema) on every activation. Equal bytes are the same class.
    """
    return cloudpickle.loads(class_bytes)


def _is_installed(path: str) -> bool:
    parts = Path(path).resolve().parts
    return "site-packages" in parts or "dist-packages" in parts or Path(path).resolve().is_relative_to(_PACKAGE_ROOT)


_PACKAGE_ROOT = Path(__file__).resolve().parent.parent


def _absolute_storage(storage: str) -> str:
    if "://" in storage:
        return storage
    return str(Path(storage).expanduser().resolve())


def _default_ledger_path(storage: str) -> str:
    if "://" in storage and not storage.startswith("file://"):
        raise InvalidSpecError(
            f"storage {storage!r} is remote; name the ledger: connect(ledger='sqlite:///<local path>') on one "
            f"node, or connect(ledger='postgresql://...') on a cluster",
            field="ledger",
        )
    root = storage.removeprefix("file://")
    return str(Path(root) / "ledger.sqlite")
