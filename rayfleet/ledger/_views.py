"""Reads of one identity across the tables: its row, continuity record, lease, pause flag, peers.

Reads only, inside the caller's transaction, so a view is consistent with whatever the
same transaction checks or writes.
"""

from __future__ import annotations

import json

from ..identity._values import ContinuityRecord, SnapshotPointer
from ._store import Transaction
from ._values import IdentityView, LeaseView


def exists(tx: Transaction, identity: str) -> bool:
    return tx.execute("SELECT 1 FROM identities WHERE identity = ?", (identity,)).fetchone() is not None


def lease(tx: Transaction, identity: str, now: float) -> LeaseView | None:
    """The live lease on ``identity``, or ``None`` when there is none or it has expired."""
    row = tx.execute("SELECT holder, token, ttl, expires_at FROM leases WHERE identity = ?", (identity,)).fetchone()
    if row is None or row[3] - now <= 0:
        return None
    return LeaseView(holder=row[0], fencing_token=row[1], ttl=row[2], expires_in=row[3] - now)


def continuity(
    tx: Transaction, identity: str, *, with_state: bool = False,
) -> tuple[ContinuityRecord | None, SnapshotPointer | None]:
    """The record and the snapshot pointer; ``with_state`` loads a State kept in the ledger into the pointer."""
    row = tx.execute(
        "SELECT runtime_id, session_id, generation, checkpoint_version, fence, snapshot_file, snapshot_row, "
        f"{'snapshot_inline' if with_state else 'NULL'} FROM continuity WHERE identity = ?",
        (identity,),
    ).fetchone()
    if row is None:
        return None, None
    record = ContinuityRecord(
        identity=identity, runtime_id=row[0], session_id=row[1], generation=row[2],
        checkpoint_version=row[3], fence=row[4],
    )
    pointer = None if row[5] is None else SnapshotPointer(
        file=row[5], row=row[6], version=row[3], inline=None if row[7] is None else bytes(row[7]),
    )
    return record, pointer


def wired_peers(tx: Transaction, identity: str) -> tuple[str, ...]:
    return tuple(
        row[0] for row in tx.execute(
            "SELECT b FROM edges WHERE a = ? UNION SELECT a FROM edges WHERE b = ? ORDER BY 1", (identity, identity)
        )
    )


def dedup_rows(tx: Transaction, identity: str) -> list[tuple[str, bytes]]:
    """The remembered idempotency keys of ``identity`` with their pickled replies, oldest first."""
    return [
        (row[0], bytes(row[1]))
        for row in tx.execute("SELECT key, reply FROM dedup WHERE identity = ? ORDER BY seq", (identity,))
    ]


def view(tx: Transaction, identity: str, now: float, *, with_state: bool = False) -> IdentityView | None:
    row = tx.execute(
        "SELECT spec, fingerprint, agent_class, labels, lifecycle, reason, addressability, peers FROM identities "
        "WHERE identity = ?",
        (identity,),
    ).fetchone()
    if row is None:
        return None
    record, pointer = continuity(tx, identity, with_state=with_state)
    return IdentityView(
        identity=identity,
        spec=bytes(row[0]),
        fingerprint=row[1],
        agent_class=row[2],
        labels=json.loads(row[3]),
        addressability=row[6],
        lifecycle=row[4],
        reason=row[5],
        continuity=record,
        snapshot=pointer,
        lease=lease(tx, identity, now),
        paused=tx.execute("SELECT 1 FROM paused WHERE identity = ?", (identity,)).fetchone() is not None,
        declared_peers=tuple(json.loads(row[7])),
        wired_peers=wired_peers(tx, identity),
    )
