"""How a process reaches the ledger, by its location: over Ray (SQLite) or directly (PostgreSQL).

A SQLite ledger lives in one file, so one actor (``rayfleet-ledger``, pinned to the node
that holds the file) owns it: it creates and migrates the file and applies lock-delay
when it restarts. Hosts and the runner on that same node open the file themselves
(SQLite in WAL mode takes writers from several processes of one machine, each
transaction under the file's write lock), so a checkpoint costs no Ray hop; processes
on other nodes call the actor. A PostgreSQL ledger is reached by every process through
its own connection pool: no actor hop, and no single process every checkpoint has to
pass through.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ..errors import FleetNotFoundError, FleetUnavailableError, RayfleetError
from ..ledger._contract import LedgerClient
from ..ledger._ledger import Ledger
from ..ledger._local import LocalLedgerClient
from ..ledger._location import LedgerLocation, open_ledger
from ..ledger._sqlite import SqliteDatabase
from ._binding import bind_fleet, check_fleet
from ._ledger_actor import LEDGER_ACTOR_NAME, LedgerActor, RayLedgerClient
from ._metrics import RayLedgerMetrics

log = logging.getLogger("rayfleet.ledger")

ON_LOOP_COMMITS = 8
"""A direct SQLite client writes a commit of at most this many checkpoints on the caller's thread (see
``LocalLedgerClient``): few enough that the turns it holds up are few."""
DIRECT_CLIENT_THREADS = 8
"""Worker threads of a direct (PostgreSQL) ledger client: ledger calls one process may have in flight."""
_HEAD_NODE_RESOURCE = "node:__internal_head__"


def connect_ledger(location: LedgerLocation, *, namespace: str) -> LedgerClient:
    """A client of an existing fleet's ledger (hosts and the runner use this).

    Raises:
        FleetUnavailableError: the ledger actor of a SQLite ledger does not exist.
        LedgerUnavailableError: a PostgreSQL ledger cannot be reached.
    """
    if location.networked:
        observe = _direct_metrics().operation
        return LocalLedgerClient(open_ledger(location), threads=DIRECT_CLIENT_THREADS, observe=observe)
    try:
        return RayLedgerClient(ray.get_actor(LEDGER_ACTOR_NAME, namespace=namespace))
    except ValueError:
        detail = f"no ledger actor {LEDGER_ACTOR_NAME!r} in namespace {namespace!r}"
        raise FleetUnavailableError(detail=detail) from None


async def connect_ledger_from(location: LedgerLocation, *, namespace: str, node: str) -> LedgerClient:
    """A client for a host or the runner running on Ray node ``node``: direct wherever the store allows.

    PostgreSQL: a connection pool. SQLite: the file itself when this process is on the
    ledger actor's node and the file there belongs to the fleet the actor serves;
    otherwise (another node, or any doubt) the actor. Ledger operations of a direct
    client are counted in the ledger metrics of this process.

    Raises:
        FleetUnavailableError: the ledger actor of a SQLite ledger does not exist.
        LedgerUnavailableError: a PostgreSQL ledger cannot be reached.
    """
    client = connect_ledger(location, namespace=namespace)
    if not isinstance(client, RayLedgerClient) or not location.path.is_file():
        return client
    return _beside_the_file(location, await client.serving(), node=node) or client


def _beside_the_file(
    location: LedgerLocation, serving: tuple[str, str | None], *, node: str,
) -> LocalLedgerClient | None:
    """A direct client of the SQLite file, when this process (on ``node``) may write it; else ``None``.

    ``serving`` is what the ledger actor answered: its node and the fleet id it serves.
    """
    served_node, fleet = serving
    if served_node != node or not location.path.is_file():
        return None
    try:
        direct = LocalLedgerClient(
            Ledger(SqliteDatabase(location.path), authority=False), threads=DIRECT_CLIENT_THREADS,
            observe=_direct_metrics().operation, small_commits=ON_LOOP_COMMITS,
        )
        found = direct.ledger.fleet_identity()
    except RayfleetError as error:
        log.warning("opening the ledger file %s directly failed (%s); going through the ledger actor",
                    location.path, error.message)
        return None
    if found != fleet:
        # Not the file the actor serves (another mount under the same path): never write to it.
        direct.close()
        return None
    return direct


@functools.cache
def _direct_metrics() -> RayLedgerMetrics:
    """One tally per process: its direct clients' operations, exported as the ledger actor's are."""
    return RayLedgerMetrics()


def start_ledger(location: LedgerLocation, *, namespace: str, storage: str, node: str | None = None) -> LedgerClient:
    """The driver's client: creates the ledger actor of a SQLite ledger if needed, and binds the fleet.

    The client is direct where the store allows (see :func:`connect_ledger_from`): a
    PostgreSQL pool, or the SQLite file itself when this driver runs on its node.

    The actor is pinned to ``node`` (a Ray node id), by default the head node: a
    SQLite file belongs to one machine, and an actor restarted on another node would
    open an empty file there.

    Raises:
        FleetMismatchError: the ledger and the storage belong to different fleets.
        LedgerUnavailableError: a PostgreSQL ledger cannot be reached.
    """
    if location.networked:
        client: LedgerClient = LocalLedgerClient(open_ledger(location), threads=DIRECT_CLIENT_THREADS)
    else:
        strategy = NodeAffinitySchedulingStrategy(node_id=node or head_node_id(), soft=False)
        # ray.remote classes gain .options at run time; their stubs do not say so.
        handle: Any = LedgerActor.options(  # type: ignore[attr-defined]
            name=LEDGER_ACTOR_NAME, namespace=namespace, lifetime="detached", get_if_exists=True,
            scheduling_strategy=strategy,
        ).remote(str(location.path), storage)
        client = RayLedgerClient(handle)
        try:
            client.incarnation().result()
        except RayfleetError:
            # The actor refuses to serve (e.g. an empty ledger over this fleet's storage): remove
            # it, so that connecting again with the right ledger does not find this one.
            ray.kill(handle)
            raise
    bind_fleet(client, storage=storage, ledger_shown=location.shown)
    if isinstance(client, RayLedgerClient):
        # A driver on the file's node (a laptop, a job on the head node) writes it itself too.
        here = str(ray.get_runtime_context().get_node_id())
        return _beside_the_file(location, client.serving().result(), node=here) or client
    return client


def attach_ledger(location: LedgerLocation, *, namespace: str, storage: str) -> LedgerClient:
    """The driver's client of a running fleet's ledger; creates nothing (``connect(create=False)``).

    Raises:
        FleetNotFoundError: a SQLite ledger's actor does not run in ``namespace``.
        FleetMismatchError: the ledger and the storage belong to different fleets (or the ledger is empty).
        LedgerUnavailableError: a PostgreSQL ledger cannot be reached.
    """
    try:
        client = connect_ledger(location, namespace=namespace)
    except FleetUnavailableError:
        raise FleetNotFoundError(
            missing=f"the fleet of {storage} does not run in Ray namespace {namespace!r} (no actor "
                    f"{LEDGER_ACTOR_NAME!r})",
            remedy="give the namespace it runs in (connect(namespace=...), rayfleet --namespace), or start it on this "
                   "cluster (rf.connect() or rayfleet apply ROSTER)",
        ) from None
    try:
        check_fleet(client, storage=storage, ledger_shown=location.shown)
    except RayfleetError:
        if isinstance(client, LocalLedgerClient):
            client.close()
        raise
    return client


def head_node_id() -> str:
    """The Ray node id of the cluster's head node (the driver's node if none is marked)."""
    for node in ray.nodes():
        if node.get("Alive") and _HEAD_NODE_RESOURCE in node.get("Resources", {}):
            return str(node["NodeID"])
    return str(ray.get_runtime_context().get_node_id())
