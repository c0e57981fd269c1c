"""Turn streams' persisted events (table ``turn_events``).

* Every append is fenced by the epoch it carries, which is the writing owner's fencing
  token: a row whose epoch is not its identity's current high-water mark is refused (not
  written), so a zombie cannot append to a stream after the identity moved on.
* Appends of many identities share one transaction (a host's group commit); the refused
  identities are answered, and the others' rows are written.
* An event is written once: a second append of the same ``(identity, epoch, seq)`` changes nothing.
* Retention is swept a bounded batch at a time through the partial index on the end
  events, so its cost is per ended stream, never per event kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from . import _leases
from ._store import Transaction
from ._turn_rows import TurnEventRow

END_KINDS = ("completed", "failed", "interrupted")
"""The kinds of a stream's last event: the turn ended."""

_COLUMNS = "identity, turn_id, epoch, seq, kind, data, at"


def append(tx: Transaction, events: Sequence[TurnEventRow]) -> list[str]:
    """Write ``events`` whose epoch is their identity's current token; the identities refused, sorted."""
    marks = _leases.fence_marks(tx, {event.identity for event in events})
    refused = {event.identity for event in events if marks.get(event.identity) != event.epoch}
    accepted = [event for event in events if event.identity not in refused]
    if accepted:
        tx.executemany(
            f"INSERT INTO turn_events ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (identity, epoch, seq) DO NOTHING",
            [(e.identity, e.turn_id, e.epoch, e.seq, e.kind, e.data, e.at) for e in accepted],
        )
    return sorted(refused)


def after(tx: Transaction, *, identity: str, turn_id: str, epoch: int, seq: int, limit: int) -> list[TurnEventRow]:
    """The turn's events after ``(epoch, seq)``, oldest first, at most ``limit``."""
    rows = tx.execute(
        f"SELECT {_COLUMNS} FROM turn_events WHERE identity = ? AND turn_id = ? AND "
        "(epoch > ? OR (epoch = ? AND seq > ?)) ORDER BY epoch, seq LIMIT ?",
        (identity, turn_id, epoch, epoch, seq, limit)).fetchall()
    return [_row(row) for row in rows]


def last(tx: Transaction, *, identity: str, turn_id: str) -> TurnEventRow | None:
    row = tx.execute(
        f"SELECT {_COLUMNS} FROM turn_events WHERE identity = ? AND turn_id = ? ORDER BY epoch DESC, seq DESC "
        "LIMIT 1", (identity, turn_id)).fetchone()
    return None if row is None else _row(row)


def owner_of(tx: Transaction, *, identity: str, epoch: int, seq: int) -> str | None:
    """The turn whose event is ``(epoch, seq)``, or ``None`` if no such event is kept."""
    row = tx.execute("SELECT turn_id FROM turn_events WHERE identity = ? AND epoch = ? AND seq = ?",
                     (identity, epoch, seq)).fetchone()
    return None if row is None else str(row[0])


def purge(tx: Transaction, *, ended_before: float, limit: int) -> int:
    """Forget the streams of at most ``limit`` turns that ended before ``ended_before``; returns how many."""
    marks = ", ".join("?" * len(END_KINDS))
    ended = tx.execute(
        f"SELECT identity, turn_id FROM turn_events WHERE kind IN ({marks}) AND at < ? ORDER BY at LIMIT ?",
        (*END_KINDS, ended_before, limit)).fetchall()
    tx.executemany("DELETE FROM turn_events WHERE identity = ? AND turn_id = ?",
                   [(row[0], row[1]) for row in ended])
    return len(ended)


def drop(tx: Transaction, identity: str) -> None:
    """Forget every stream of a deleted identity."""
    tx.execute("DELETE FROM turn_events WHERE identity = ?", (identity,))


def _row(row: Sequence[Any]) -> TurnEventRow:
    identity, turn_id, epoch, seq, kind, data, at = row
    return TurnEventRow(identity=str(identity), turn_id=str(turn_id), epoch=int(epoch), seq=int(seq), kind=str(kind),
                        data=str(data), at=float(at))
