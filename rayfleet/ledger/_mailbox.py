"""Durable message state of identities: the pause flag, parked messages, pending tells and the dead-letter log.

Pausing, parking and unparking change what an identity will do, so they are fenced
like any other write. Recording a dead letter is not: it is a report, and refusing it
because the reporter lost its lease would lose the message itself. Nor are pending
tells: the host that accepts a tell seldom owns its target, and holding the message
durably before the sender is answered is the point.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from . import _leases
from ._store import Row, Transaction
from ._values import StoredMessage

_LETTER_COLUMNS = "id, identity, message_id, envelope, reason, error, attempts, at"


def set_paused(tx: Transaction, *, identity: str, fencing_token: int, paused: bool, now: float) -> None:
    _leases.check_fence(tx, identity, fencing_token)
    if paused:
        tx.execute("INSERT INTO paused (identity, since) VALUES (?, ?) ON CONFLICT DO NOTHING", (identity, now))
    else:
        tx.execute("DELETE FROM paused WHERE identity = ?", (identity,))


def is_paused(tx: Transaction, identity: str) -> bool:
    return tx.execute("SELECT 1 FROM paused WHERE identity = ?", (identity,)).fetchone() is not None


def park(tx: Transaction, *, identity: str, fencing_token: int, message_id: str, envelope: bytes, now: float) -> int:
    _leases.check_fence(tx, identity, fencing_token)
    tx.execute(
        "INSERT INTO parked (identity, message_id, envelope, parked_at) VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
        (identity, message_id, envelope, now),
    )
    row = tx.execute("SELECT seq FROM parked WHERE identity = ? AND message_id = ?", (identity, message_id)).fetchone()
    assert row is not None  # inserted or already present, in this transaction
    return int(row[0])


def parked(tx: Transaction, identity: str, limit: int) -> list[StoredMessage]:
    return [
        StoredMessage(id=row[0], identity=identity, message_id=row[1], envelope=bytes(row[2]), at=row[3])
        for row in tx.execute(
            "SELECT seq, message_id, envelope, parked_at FROM parked WHERE identity = ? ORDER BY seq LIMIT ?",
            (identity, limit),
        )
    ]


def unpark(tx: Transaction, *, identity: str, fencing_token: int, seq: int) -> None:
    _leases.check_fence(tx, identity, fencing_token)
    tx.execute("DELETE FROM parked WHERE identity = ? AND seq = ?", (identity, seq))


def bury_parked(tx: Transaction, identity: str, *, reason: str, error: str, now: float) -> int:
    """Move every parked message of ``identity`` to the dead letters; returns how many."""
    rows = tx.execute(
        "SELECT message_id, envelope FROM parked WHERE identity = ? ORDER BY seq", (identity,)
    ).fetchall()
    for message_id, envelope in rows:
        add_dead_letter(tx, identity=identity, message_id=message_id, envelope=envelope, reason=reason, error=error,
                        attempts=0, now=now)
    tx.execute("DELETE FROM parked WHERE identity = ?", (identity,))
    return len(rows)


def cancel_parked(tx: Transaction, *, identity: str, fencing_token: int, now: float) -> int:
    _leases.check_fence(tx, identity, fencing_token)
    return bury_parked(tx, identity, reason="CANCELLED", error="parked work cancelled by fleet.cancel_parked", now=now)


def add_dead_letter(
    tx: Transaction, *, identity: str, message_id: str, envelope: bytes, reason: str, error: str, attempts: int,
    now: float,
) -> int:
    row = tx.execute(
        "INSERT INTO dead_letters (identity, message_id, envelope, reason, error, attempts, at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?) RETURNING id",
        (identity, message_id, envelope, reason, error, attempts, now),
    ).fetchone()
    assert row is not None  # RETURNING yields the inserted row
    return int(row[0])


def dead_letters(tx: Transaction, *, identity: str | None, limit: int) -> list[StoredMessage]:
    query = f"SELECT {_LETTER_COLUMNS} FROM dead_letters"
    parameters: tuple[object, ...] = ()
    if identity is not None:
        query += " WHERE identity = ?"
        parameters = (identity,)
    return [_letter(row) for row in tx.execute(query + " ORDER BY id LIMIT ?", (*parameters, limit)).fetchall()]


def dead_letter(tx: Transaction, letter_id: int) -> StoredMessage | None:
    row = tx.execute(f"SELECT {_LETTER_COLUMNS} FROM dead_letters WHERE id = ?", (letter_id,)).fetchone()
    return None if row is None else _letter(row)


def purge_dead_letters(
    tx: Transaction, *, identity: str | None, ids: Sequence[int] | None, before: float | None
) -> int:
    clauses: list[str] = []
    parameters: list[Any] = []
    if identity is not None:
        clauses.append("identity = ?")
        parameters.append(identity)
    if ids is not None:
        clauses.append(f"id IN ({', '.join('?' * len(ids))})" if ids else "FALSE")
        parameters.extend(ids)
    if before is not None:
        clauses.append("at < ?")
        parameters.append(before)
    where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
    return tx.execute(f"DELETE FROM dead_letters{where}", parameters).rowcount


def hold_tell(tx: Transaction, *, identity: str, message_id: str, envelope: bytes, now: float) -> int:
    """Hold a tell until it is settled; holding the same message twice is a no-op. Returns its seq."""
    tx.execute(
        "INSERT INTO tells (identity, message_id, envelope, accepted_at, attempted_at) VALUES (?, ?, ?, ?, ?) "
        "ON CONFLICT DO NOTHING",
        (identity, message_id, envelope, now, now),
    )
    row = tx.execute("SELECT seq FROM tells WHERE identity = ? AND message_id = ?", (identity, message_id)).fetchone()
    assert row is not None  # inserted or already present, in this transaction
    return int(row[0])


def claim_tells(tx: Transaction, *, attempted_before: float, limit: int, now: float) -> list[StoredMessage]:
    """Tells last attempted before ``attempted_before``, oldest first, marked as attempted ``now``.

    Marking them in the same transaction means two hosts sweeping at once never both claim one.
    """
    rows = tx.execute(
        "SELECT seq, identity, message_id, envelope, accepted_at FROM tells WHERE attempted_at < ? "
        "ORDER BY seq LIMIT ?",
        (attempted_before, limit),
    ).fetchall()
    for row in rows:
        tx.execute("UPDATE tells SET attempted_at = ? WHERE seq = ?", (now, row[0]))
    return [StoredMessage(id=row[0], identity=row[1], message_id=row[2], envelope=bytes(row[3]), at=row[4])
            for row in rows]


def settle_tell(
    tx: Transaction, *, identity: str, message_id: str, reason: str | None, error: str, now: float
) -> bool:
    """Forget a handled tell; with ``reason``, make sure it has a dead letter first. Returns whether it was held.

    The host that ran the turn may already have recorded the letter (same message id);
    then no second one is added.
    """
    row = tx.execute(
        "SELECT envelope FROM tells WHERE identity = ? AND message_id = ?", (identity, message_id)
    ).fetchone()
    if row is None:
        return False
    if reason is not None:
        recorded = tx.execute(
            "SELECT 1 FROM dead_letters WHERE identity = ? AND message_id = ?", (identity, message_id)
        ).fetchone()
        if recorded is None:
            add_dead_letter(tx, identity=identity, message_id=message_id, envelope=bytes(row[0]), reason=reason,
                            error=error, attempts=0, now=now)
    tx.execute("DELETE FROM tells WHERE identity = ? AND message_id = ?", (identity, message_id))
    return True


def drop(tx: Transaction, identity: str, now: float) -> None:
    """Forget the pause flag, and keep parked work and pending tells as dead letters: they can never run
    once the identity is gone."""
    tx.execute("DELETE FROM paused WHERE identity = ?", (identity,))
    bury_parked(tx, identity, reason="DELETED", error="identity deleted while the message was parked", now=now)
    for (message_id,) in tx.execute("SELECT message_id FROM tells WHERE identity = ?", (identity,)).fetchall():
        settle_tell(tx, identity=identity, message_id=message_id, reason="DELETED",
                    error="identity deleted before the tell was handled", now=now)


def _letter(row: Row) -> StoredMessage:
    return StoredMessage(id=row[0], identity=row[1], message_id=row[2], envelope=bytes(row[3]), reason=row[4],
                         error=row[5], attempts=row[6], at=row[7])
