"""Binding a ledger to a storage root: both record one fleet id, or nothing starts.

A fleet's first start records a new id in both. Every later start, by a driver, a
host or the ledger actor, checks that the ledger and the storage agree. An empty
ledger over a storage that names a fleet means the ledger was lost or replaced:
starting would issue fencing token 1 again for identities whose snapshots exist.
"""

from __future__ import annotations

import uuid

from ..checkpoints._marker import read_fleet_id, write_fleet_id
from ..errors import FleetMismatchError
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
