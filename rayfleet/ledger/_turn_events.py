"""Turn streams' persisted events (table ``turn_events``).

* Every append is fenced by the epoch it carries, which is the writing owner's fencing
  token: a row whose epoch is not its identity's current high-water mark is refused (not
  written), so a zombie cannot append to a stream after the identity moved on.
* Appends of many identities share one transaction (a host's group commit); the refused
  identities are answered, and the others' rows are written.
* An event is written once: a second append of the same ``(identity, epoch, seq)`` changes nothing.
* Retention is swept a bounded batch at a time through the partial index on the end
  events, so its cost is per ended stream, never per event kept.
* A stream with no end (its turn was cut off and never sent again) is forgotten once
  nothing was written to it for a long while and its turn is neither running nor
  suspended in the journal; found through the partial index on start events, a bounded
  batch at a time, with a cursor so long-suspended turns never hold the others back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from . import _leases
from ._store import Transaction
from ._turn_rows import AbandonedSweep, TurnEventRow

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


IN_PROGRESS = ("RUNNING", "SUSPENDED")
"""Statuses of a journaled turn that may still write to its stream (``rf.TurnStatus`` values)."""


def purge_abandoned(tx: Transaction, *, idle_before: float, after: float, limit: int) -> AbandonedSweep:
    """Forget streams without an end event, idle since ``idle_before``, whose turn is not in progress.

    Reads at most ``limit`` start events after ``after`` (oldest first); a stream whose
    turn the journal holds as running or suspended, or that wrote since ``idle_before``,
    is left alone.
    """
    starts = tx.execute(
        "SELECT identity, turn_id, at FROM turn_events WHERE kind = 'started' AND at > ? AND at < ? "
        "ORDER BY at LIMIT ?", (after, idle_before, limit)).fetchall()
    forgotten = 0
    for identity, turn_id in dict.fromkeys((str(row[0]), str(row[1])) for row in starts):
        newest = last(tx, identity=identity, turn_id=turn_id)
        if newest is None or newest.kind in END_KINDS or newest.at >= idle_before:
            continue
        # The journal's row, read here rather than through _turns, which writes this table.
        status = tx.execute("SELECT status FROM turns WHERE identity = ? AND turn_id = ?",
                            (identity, turn_id)).fetchone()
        if status is not None and status[0] in IN_PROGRESS:
            continue
        tx.execute("DELETE FROM turn_events WHERE identity = ? AND turn_id = ?", (identity, turn_id))
        forgotten += 1
    return AbandonedSweep(forgotten=forgotten, next_after=float(starts[-1][2]) if len(starts) >= limit else None)


def drop(tx: Transaction, identity: str) -> None:
    """Forget every stream of a deleted identity."""
    tx.execute("DELETE FROM turn_events WHERE identity = ?", (identity,))


def _row(row: Sequence[Any]) -> TurnEventRow:
    identity, turn_id, epoch, seq, kind, data, at = row
    return TurnEventRow(identity=str(identity), turn_id=str(turn_id), epoch=int(epoch), seq=int(seq), kind=str(kind),
                        data=str(data), at=float(at))
