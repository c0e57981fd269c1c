"""Checkpoint pointers and the idempotency keys committed with them.

A pointer moves only forward: the writer's token must pass the fence check and the
version must exceed the stored one. The keys of the turns a checkpoint covers are
written in the same transaction as its pointer, so a key is remembered exactly when
the effect it guards is durable.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..errors import RayfleetError, StaleCheckpointVersionError, UnknownIdentityError
from . import _leases
from ._store import Transaction
from ._values import CheckpointCommit


def commit(tx: Transaction, commits: Iterable[CheckpointCommit]) -> list[RayfleetError | None]:
    outcomes: list[RayfleetError | None] = []
    for item in commits:
        try:
            _leases.check_fence(tx, item.identity, item.fencing_token)
            row = tx.execute(
                "SELECT checkpoint_version FROM continuity WHERE identity = ?", (item.identity,)
            ).fetchone()
            if row is None:
                raise UnknownIdentityError(identity=item.identity)
            if item.version <= row[0]:
                raise StaleCheckpointVersionError(identity=item.identity, presented=item.version, current=row[0])
            tx.execute(
                "UPDATE continuity SET checkpoint_version = ?, fence = ?, snapshot_file = ?, snapshot_row = ? "
                "WHERE identity = ?",
                (item.version, item.fencing_token, item.pointer.file, item.pointer.row, item.identity),
            )
            if item.dedup:
                _remember_keys(tx, item.identity, item.dedup, item.dedup_capacity)
            outcomes.append(None)
        except RayfleetError as error:
            outcomes.append(error)
    return outcomes


def _remember_keys(tx: Transaction, identity: str, entries: tuple[tuple[str, bytes], ...], capacity: int) -> None:
    row = tx.execute("SELECT MAX(seq) FROM dedup WHERE identity = ?", (identity,)).fetchone()
    seq = (row[0] if row else None) or 0
    for key, reply in entries:
        seq += 1
        # First writer wins: a key already remembered keeps its original reply (FIFO, no refresh).
        tx.execute("INSERT INTO dedup (identity, key, reply, seq) VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
                   (identity, key, reply, seq))
    tx.execute("DELETE FROM dedup WHERE identity = ? AND seq <= ?", (identity, seq - max(capacity, 1)))


def forget_keys(tx: Transaction, identity: str) -> None:
    tx.execute("DELETE FROM dedup WHERE identity = ?", (identity,))


def referenced_files(tx: Transaction) -> set[str]:
    return {
        row[0] for row in tx.execute("SELECT DISTINCT snapshot_file FROM continuity WHERE snapshot_file IS NOT NULL")
    }
