"""``Fleet``: the driver's handle on a rayfleet deployment, and ``connect``, which makes one."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import cloudpickle
import ray

from ..checkpoints._committer import INLINE_STATE_BYTES
from ..checkpoints._export import ExportReport, export_fleet
from ..checkpoints._journal_files import JournalFileStore
from ..checkpoints._store import SnapshotStore
from ..errors import (
    InvalidSpecError,
    RayfleetError,
    UnknownDeadLetterError,
    UsageError,
)
from ..host._messages import DeadLetter, Envelope, ParkedMessage
from ..host._reports import DeactivationReport, DrainReport, HostStatistics
from ..identity._agent import Agent, AgentSpec
from ..identity._names import validate_identity
from ..identity._values import (
    DEFAULT_DEDUP_CAPACITY,
    DEFAULT_IDLE_TIMEOUT,
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
from ..ledger._values import DEFAULT_LEASE_TTL, HostInfo
from ..retry import RetryPolicy
from ..roster._apply import ApplyReport
from ..roster._roster import RosterChange, load_roster, plan_roster, validate_roster
from ..turns._context import encode_signal
from ..turns._timers import timer_info
from ..turns._values import TimerInfo, TurnEvent, TurnInfo
from ..workflow._definition import Workflow, WorkflowOutcome
from ..workflow._waits import signal_waiter_identity
from ._approvals_client import ApprovalsClient
from ._attach import join_ray
from ._binding import require_fleet_marker
from ._host_pool import HostPool
from ._ledger_actor import LEDGER_ACTOR_NAME
from ._ledger_client import attach_ledger, start_ledger
from ._ref import AgentRef, send
from ._routing import Courier, HostDirectory, HostRequest
from ._runner import (
    RUNNER_ACTOR_NAME,
    UNFINISHED,
    RunnerClient,
    driver_holder,
    execute_run,
    new_run_id,
    runner_holder_prefix,
    waiter_record,
)
from ._runs_client import RunsClient
from ._shipping import rebuild_spec, spec_record
from ._status import identity_status, view_of
from ._topology_client import HostNotifier, TopologyClient
from ._turn_handle import (
    aread_events,
    cancel_turn,
    owner_turn,
    read_events,
    running_turn,
    turn_info,
    turn_status,
)
from ._wakes import deliver_wakes

DEFAULT_NAMESPACE = "rayfleet"
DEFAULT_STORAGE = "./.rayfleet"
SPAWN_BATCH = 5_000
"""Specs per ledger transaction in ``spawn_many``."""
REPLAY_LETTER_SCAN = 1_000_000

"""Dead letters of one identity read to find a replay's new letter (replays are rare, operator-driven)."""

_rebuild_spec = rebuild_spec
"""Specs a ledger stored before class shipping had its own room name this function by its old home, here."""


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
    lease_ttl: float = DEFAULT_LEASE_TTL
    """Seconds a lease lasts; hosts renew every TTL/3."""
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT
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
    lease_ttl: float = DEFAULT_LEASE_TTL,
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
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
            self._started_ray = join_ray(config.address, namespace=config.namespace, create=create)
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
        self.approvals = ApprovalsClient(self._ledger, self._courier)
        """The run registry: ``get``, ``list_runs``, ``wait``, ``cancel``, ``pause``, ``resume``."""
        self._hosts = HostPool(
            namespace=config.namespace, storage=self.storage, ledger_url=self.ledger_location.url,
            lease_ttl=config.lease_ttl, idle_timeout=config.idle_timeout,
            inline_state_bytes=config.inline_state_bytes, wanted=config.hosts, ledger=self._ledger,
            courier=self._courier,
        )
        if create:
            self._hosts.ensure()
        else:
            self._courier.refresh_sync()  # the hosts that run now, none started

    @property
    def started_ray(self) -> bool:
        """Whether this driver started the Ray it is connected to (then :meth:`shutdown` stops it)."""
        return self._started_ray

    # -- hosts ----------------------------------------------------------------------

    def add_host(self, *, node: str | None = None) -> str:
        """Start the host with the lowest name the ledger does not list, and return that name.

        A new host runs on ``node`` (a Ray node id, e.g. from ``ray.nodes()``) when given,
        else on the eligible node with the fewest of this fleet's hosts; either way Ray
        moves it to another node if that one dies. A host actor of that name that exists
        but is not registered (Ray restarted it and it has not started yet) is started
        where it runs instead.
        """
        return self._hosts.add(node=node)

    def host_nodes(self) -> dict[str, str | None]:
        """The Ray node id each of this fleet's host actors runs on (``None``: it did not answer in time)."""
        return self._hosts.nodes()

    def hosts(self) -> list[HostInfo]:
        """The registered hosts (name, lease holder id, start time, draining)."""
        return self._ledger.hosts().result()

    def host_statistics(self) -> list[HostStatistics]:
        """Counters of every live host."""
        return self._hosts.statistics()

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
        return self._hosts.drain(host, timeout=timeout, progress=progress)

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
        return self._hosts.deactivate_all(timeout=timeout, progress=progress)

    def undrain(self, host: str) -> None:
        """Let a drained ``host`` take new work again.

        Raises:
            FleetUnavailableError: no host actor of that name runs.
        """
        self._hosts.undrain(host)

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
        dedup_capacity: int = DEFAULT_DEDUP_CAPACITY,
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
        """Remove the identity and its continuity record; later calls raise ``UnknownIdentityError``.

        Its pending approvals are dropped (nothing can take their decision now); decided
        ones stay in ``fleet.approvals`` as the audit trail of who decided what."""
        self._lifecycle(identity, "delete", lambda host: host.delete.remote(identity))
        self._courier.directory.forget(identity)

    def deactivate(self, identity: str) -> bool:
        """Checkpoint and release an active agent now (it reactivates on its next message)."""
        return bool(self._lifecycle(identity, "deactivate", lambda host: host.deactivate.remote(identity)))

    def _lifecycle(self, identity: str, operation: str, request: HostRequest) -> Any:
        view_of(self._ledger, identity)  # unknown identities fail here, with a clear error
        return self._courier.route_sync(identity, request, method=operation)

    # -- signals ----------------------------------------------------------------------

    def signal(self, identity: str, name: str, value: Any = None, *, signal_id: str | None = None) -> int:
        """Send signal ``name`` (with ``value``) to ``identity``: durable, and taken by one ``wait_signal``.

        The signal is recorded once per ``signal_id`` (a retry with the same id records
        nothing new; without one, each call is a new signal). A turn suspended in
        ``self.wait_signal(name)`` is resumed at once; otherwise the signal is kept until
        a turn waits for that name. Returns how many suspended turns it woke (0 or 1).

        Raises:
            UnknownIdentityError: no agent has that identity.
            InvalidSpecError: an empty name, or a value that cannot be encoded or is
                over 256 KiB encoded.
        """
        blob = encode_signal(identity, name, value)
        woken = self._ledger.send_signal(identity=identity, name=name, signal_id=signal_id or uuid.uuid4().hex,
                                         value=blob).result()
        deliver_wakes(self._courier, woken)
        return len(woken)

    def signal_run(self, run_id: str, name: str, value: Any = None, *, signal_id: str | None = None) -> int:
        """Send signal ``name`` (with ``value``) to workflow run ``run_id``, for its ``wf.wait_signal`` steps.

        As :meth:`signal`: durable, recorded once per ``signal_id``, taken by one waiting
        step, kept until a step of the run waits for that name (it may be sent before the
        step starts). Returns how many waiting steps it woke (0 or 1).

        Raises:
            InvalidSpecError: an empty run id or name, or a value that cannot be encoded
                or is over 256 KiB encoded.
            UsageError: the run has ended: nothing of it will wait again (its waiters were
                deleted with its end), so the signal is refused rather than kept forever.
        """
        if not isinstance(run_id, str) or not run_id:
            raise InvalidSpecError(f"run_id must be a run's id, got {run_id!r}", field="run_id")
        if not isinstance(name, str) or not name:
            raise InvalidSpecError(f"a signal needs a name, got {name!r}", field="name")
        record = self._ledger.run(run_id).result()
        if record is not None and record.status not in UNFINISHED:
            raise UsageError(f"run {run_id!r} has ended ({record.status}): no step of it waits for signal {name!r} "
                             f"now or later; signal a run that is pending, running or paused",
                             api="fleet.signal_run()")
        identity = signal_waiter_identity(run_id, name)
        self._ledger.register(waiter_record(identity)).result()
        return self.signal(identity, name, value, signal_id=signal_id)

    # -- reminders and schedules --------------------------------------------------------

    def turns(self, identity: str, *, limit: int = 100) -> list[TurnInfo]:
        """The turns of ``identity`` in progress (running or suspended), newest first.

        Listed from the ledger, where a turn is once it journaled something (a step, a
        wait, a steering read), and from the owner host, which names the turn running
        there now even if it journals nothing (its ``started`` is then unknown: 0). The
        stream of any turn is read with ``ref.start(...).events()`` or over HTTP.

        Raises:
            UnknownIdentityError: no identity of that name exists.
        """
        view = view_of(self._ledger, validate_identity(identity))  # UnknownIdentityError for one that is not
        listed = [turn_info(row) for row in self._ledger.turns(identity=identity, limit=limit).result()]
        running = running_turn(self._courier, identity, view.lease)
        if running is not None and all(info.id != running.id for info in listed):
            listed = [running, *listed][:limit]
        return listed

    def turn(self, identity: str, turn_id: str) -> TurnInfo | None:
        """What is known of one turn: its row if it journaled, else what its stream says, else
        what its owner host says (``RUNNING`` while it runs there; once it ended there, how,
        while that host holds the identity and is among its last 16,384 ended turns);
        ``None`` if none of these (a turn that journaled and streamed nothing and ended on a
        host that no longer holds the identity, or one past its retention)."""
        known = turn_status(self._ledger, validate_identity(identity), turn_id)
        if known is not None:
            return known
        return owner_turn(self._courier, identity, view_of(self._ledger, identity).lease, turn_id)

    def turn_events(self, identity: str, turn_id: str, *, after: str | None = None) -> Iterator[TurnEvent]:
        """The stream of any turn of ``identity`` after event id ``after`` (as ``TurnHandle.events``).

        Without the turn's reply to go by, a turn whose owner never heard of it (not
        started yet, or one that streamed nothing and ended) ends the iteration after a
        few long polls.

        Raises:
            UnknownTurnEventError: ``after`` is not an event id of this turn.
        """
        return read_events(self._courier, validate_identity(identity), turn_id, after)

    def aturn_events(self, identity: str, turn_id: str, *, after: str | None = None) -> AsyncIterator[TurnEvent]:
        """:meth:`turn_events`, as an async iterator."""
        return aread_events(self._courier, validate_identity(identity), turn_id, after)

    def cancel_turn(self, identity: str, turn_id: str) -> bool:
        """Interrupt a turn in progress (as ``TurnHandle.cancel``); whether it was in progress."""
        return cancel_turn(self._courier, validate_identity(identity), turn_id)

    def timers(self, identity: str | None = None, *, due_within: float | None = None,
               limit: int = 1000) -> list[TimerInfo]:
        """Reminders and schedules, soonest due first: of ``identity`` (or all), due within ``due_within`` seconds.

        Raises:
            UnknownIdentityError: ``identity`` names no agent.
            InvalidSpecError: a negative ``due_within`` or a limit below 1.
        """
        if identity is not None:
            view_of(self._ledger, identity)
        if due_within is not None and (not isinstance(due_within, (int, float)) or due_within < 0):
            raise InvalidSpecError(f"due_within must be seconds >= 0, got {due_within!r}", field="due_within")
        due_before = None if due_within is None else time.time() + due_within
        rows = self._ledger.timers(identity=identity, due_before=due_before, limit=limit).result()
        return [timer_info(row) for row in rows]

    def fire_timer(self, identity: str, name: str) -> None:
        """Make timer ``name`` of ``identity`` due now: a host fires it within its wake interval (about a second).

        Raises:
            UnknownIdentityError: no agent has that identity.
            InvalidSpecError: it has no timer of that name.
        """
        view_of(self._ledger, identity)
        if not self._ledger.fire_timer_now(identity=identity, name=name).result():
            raise InvalidSpecError(f"{identity!r} has no timer {name!r}; list them with fleet.timers({identity!r})",
                                   field="name")

    def cancel_timer(self, identity: str, name: str) -> bool:
        """Remove timer ``name`` of ``identity`` (as ``self.forget`` does from inside it); whether there was one.

        Raises:
            UnknownIdentityError: no agent has that identity.
        """
        view_of(self._ledger, identity)
        return bool(self._ledger.forget_timer(identity=identity, name=name).result())

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
        return [DeadLetter.from_stored(item)
                for item in self._ledger.dead_letters(identity=identity, limit=limit).result()]

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
            report = self._hosts.stop(timeout=timeout, progress=progress)
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
