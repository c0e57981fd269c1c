"""A stopped fleet's records, read straight from its ledger file and storage, with no Ray and nothing created.

An embedded fleet (a script or ``rayfleet demo`` on a laptop) keeps everything on disk:
the SQLite ledger and the snapshot files. Once its driver exited, no cluster runs it,
yet its identities, dead letters, runs and topology are all there to read, and an
export needs no host. :class:`StoredFleet` is that reading: the read-only CLI commands
use it when they find no running fleet to attach to.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from ..checkpoints._export import ExportReport, export_fleet
from ..checkpoints._store import SnapshotStore
from ..errors import FleetNotFoundError
from ..host._messages import DeadLetter
from ..identity._values import IdentityStatus
from ..ledger._ledger import Ledger
from ..ledger._local import LocalLedgerClient
from ..ledger._location import LedgerLocation
from ..ledger._sqlite import SqliteDatabase
from ..ledger._values import HostInfo
from ._binding import check_fleet, require_fleet_marker
from ._fleet import DEFAULT_STORAGE, FleetConfig, _absolute_storage
from ._runs_client import RunsView
from ._status import identity_status, view_of
from ._topology_client import TopologyView


class StoredFleet:
    """The records of a fleet no cluster runs, read from its SQLite ledger file and its storage.

    The ledger file is opened read-only (nothing is created, migrated or written; a
    running fleet may still be writing it, and reads see only committed transactions),
    and the storage is only read. It answers what the read-only commands ask: statuses,
    dead letters, runs, the topology, and an export. No host runs, so :meth:`hosts` is
    empty and identities have no live owner.

    Raises:
        FleetNotFoundError: the storage holds no fleet, or the fleet's ledger is not a
            local SQLite file that exists (a PostgreSQL ledger is read through a running fleet).
        FleetMismatchError: the ledger and the storage belong to different fleets.
        LedgerUnavailableError, LedgerSchemaError: the ledger file cannot be read as it is.
    """

    started_ray = False

    def __init__(self, storage: str, ledger: LedgerLocation) -> None:
        self.storage = storage
        self.ledger_location = ledger
        require_fleet_marker(storage)
        if ledger.kind != "sqlite":
            raise FleetNotFoundError(
                missing=f"no running cluster serves the fleet whose ledger is {ledger.shown}",
                remedy="start the fleet's cluster, or point RAY_ADDRESS at it (only a local SQLite ledger is read "
                       "without one)",
            )
        if not ledger.path.is_file():
            raise FleetNotFoundError(missing=f"the fleet's ledger file {ledger.path} does not exist",
                                     remedy="point --ledger or RAYFLEET_LEDGER at it")
        self._ledger = LocalLedgerClient(Ledger(SqliteDatabase(ledger.path, read_only=True), authority=False))
        check_fleet(self._ledger, storage=storage, ledger_shown=ledger.shown)
        self.runs = RunsView(self._ledger)
        """The run registry, read only: ``get`` and ``list_runs``."""
        self.topology = TopologyView(self._ledger)
        """The live topology, read only: ``edges`` and ``export``."""

    @classmethod
    def open(cls, storage: str | None = None, ledger: str | None = None) -> StoredFleet:
        """The stored fleet that ``rf.connect(storage=storage, ledger=ledger)`` would attach to.

        ``None`` reads ``RAYFLEET_STORAGE`` / ``RAYFLEET_LEDGER`` as :func:`~rayfleet.connect` does.
        """
        config = FleetConfig(storage=storage or os.environ.get("RAYFLEET_STORAGE", DEFAULT_STORAGE),
                             ledger=ledger or os.environ.get("RAYFLEET_LEDGER") or None)
        root = _absolute_storage(config.storage)
        return cls(root, config.ledger_location(root))

    def status(self, identity: str) -> IdentityStatus:
        """Where ``identity`` is in its life, as the ledger last recorded it."""
        return identity_status(view_of(self._ledger, identity))

    def list_agents(self, labels: Mapping[str, str] | None = None) -> list[IdentityStatus]:
        """Statuses of all identities (sorted), or those whose labels include ``labels``."""
        return [identity_status(view) for view in self._ledger.list_identities(labels=dict(labels or {})).result()]

    def hosts(self) -> list[HostInfo]:
        """The hosts that run now: none."""
        return []

    def dead_letters(self, identity: str | None = None, *, limit: int = 1000) -> list[DeadLetter]:
        """Messages that could not be handled, oldest first, optionally for one identity."""
        return [DeadLetter.from_stored(item)
                for item in self._ledger.dead_letters(identity=identity, limit=limit).result()]

    def export(
        self, path: str | os.PathLike[str], *, progress: Callable[[int, int], None] | None = None
    ) -> ExportReport:
        """What :meth:`Fleet.export <rayfleet.Fleet.export>` writes: every identity's latest committed State,
        the dead letters and the runs as Parquet under ``path``."""
        return export_fleet(os.fspath(path), ledger=self._ledger, snapshots=SnapshotStore(self.storage),
                            progress=progress)

    def shutdown(self, *, stop_actors: bool = False) -> None:
        """Close the ledger file (there are no actors to stop)."""
        self._ledger.close()
