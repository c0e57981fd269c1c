"""Binding a ledger to a storage root: both record one fleet id, or nothing starts.

A fleet's first start records a new id in both. Every later start, by a driver, a
host or the ledger actor, checks that the ledger and the storage agree. An empty
ledger over a storage that names a fleet means the ledger was lost or replaced:
starting would issue fencing token 1 again for identities whose snapshots exist.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from ..checkpoints._marker import MARKER, read_fleet_id, write_fleet_id
from ..errors import FleetMismatchError, FleetNotFoundError
from ..ledger._contract import LedgerClient


def bind_fleet(ledger: LedgerClient, *, storage: str, ledger_shown: str) -> str:
    """Make sure ``ledger`` and ``storage`` belong to one fleet; returns its id.

    Raises:
        FleetMismatchError: the storage names a fleet the ledger does not (an empty or
            a different ledger); nothing is written.
    """
    in_storage = read_fleet_id(storage)
    in_ledger = ledger.fleet_identity().result()
    if in_storage is not None and in_ledger != in_storage:
        raise FleetMismatchError(ledger=ledger_shown, storage=storage, ledger_fleet=in_ledger,
                                 storage_fleet=in_storage)
    fleet_id = in_ledger or ledger.fleet_identity(claim=f"fleet-{uuid.uuid4().hex[:16]}").result()
    if fleet_id is None:  # pragma: no cover - a claim always returns the recorded id
        raise FleetMismatchError(ledger=ledger_shown, storage=storage, ledger_fleet=None, storage_fleet=in_storage)
    if in_storage is None:
        write_fleet_id(storage, fleet_id)
    return fleet_id


def require_fleet_marker(storage: str) -> str:
    """The fleet id ``storage`` records; creates nothing, not even a missing local folder.

    Raises:
        FleetNotFoundError: the storage holds no fleet marker (no fleet was ever started there).
        StorageUnavailableError, InvalidSpecError: a remote storage cannot be read, or the marker is damaged.
    """
    local = "://" not in storage or storage.startswith("file://")
    root = storage.removeprefix("file://")
    # A local folder is looked at directly: opening it as a storage root would create it.
    fleet_id = read_fleet_id(storage) if not local or (Path(root) / MARKER).is_file() else None
    if fleet_id is None:
        raise FleetNotFoundError(
            missing=f"the storage {storage} holds no fleet (no {MARKER})",
            remedy="point it at the fleet's storage (connect(storage=...), RAYFLEET_STORAGE or rayfleet --storage), "
                   "or create a fleet there first (rf.connect() or rayfleet apply ROSTER)",
        )
    return fleet_id


def check_fleet(ledger: LedgerClient, *, storage: str, ledger_shown: str) -> str:
    """Like :func:`bind_fleet`, but only checks: ``ledger`` and ``storage`` must already name one fleet.

    Raises:
        FleetNotFoundError: the storage holds no fleet marker.
        FleetMismatchError: the ledger is empty or records another fleet.
    """
    in_storage = require_fleet_marker(storage)
    in_ledger = ledger.fleet_identity().result()
    if in_ledger != in_storage:
        raise FleetMismatchError(ledger=ledger_shown, storage=storage, ledger_fleet=in_ledger,
                                 storage_fleet=in_storage)
    return in_storage
