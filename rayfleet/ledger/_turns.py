"""Durable turns' rows and journals (table ``turns`` and ``turn_steps``).

* Every write presents the identity's fencing token, checked in the writing
  transaction: a zombie cannot journal, and a host that lost the identity learns it at
  its next journal write.
* A completed entry is final: an upsert never changes an entry that is completed, so a
  replay that writes the same entry again (or a late duplicate) cannot alter an outcome
  a handler already saw.
* Suspended turns are found through the index on ``wake_at``, a bounded batch at a
  time, and claimed for a while (no lock: an unsettled claim lapses), so the cost of
  the wake sweep is per due turn, never per turn.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from . import _leases, _turn_events
from ._store import Cursor, Row, StoreClock, Transaction
from ._turn_rows import TurnEnd, TurnEntry, TurnEntryKind, TurnEntryState, TurnRecord, TurnWake, TurnWrite

IN_PROGRESS = ("RUNNING", "SUSPENDED")
_COLUMNS = "identity, turn_id, method, status, envelope, waiting_for, wake_at, started_at, updated_at, error"


def check_fence(tx: Transaction, identity: str, fencing_token: int) -> None:
    _leases.check_fence(tx, identity, fencing_token)


def write(tx: Transaction, *, identity: str, fencing_token: int, turn: TurnWrite, now: float) -> None:
    _leases.check_fence(tx, identity, fencing_token)
    write_checked(tx, identity=identity, turn=turn, now=now)


def write_checked(tx: Transaction, *, identity: str, turn: TurnWrite, now: float) -> None:
    """:func:`write` once the caller's transaction checked the fence."""
    if not turn.entries_only:
        _write_row(tx, identity=identity, turn=turn, now=now)
    if turn.entries:
        tx.executemany(
            "INSERT INTO turn_steps (identity, turn_id, position, kind, name, state, value) "
            "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (identity, turn_id, position) DO UPDATE SET "
            "kind = excluded.kind, name = excluded.name, state = excluded.state, value = excluded.value "
            "WHERE turn_steps.state <> 'completed'",
            [(identity, turn.turn_id, entry.position, entry.kind.value, entry.name, entry.state.value, entry.value)
             for entry in turn.entries],
        )


def _write_row(tx: Transaction, *, identity: str, turn: TurnWrite, now: float) -> None:
    tx.execute(
        "INSERT INTO turns (identity, turn_id, method, status, envelope, waiting_for, wake_at, started_at, updated_at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (identity, turn_id) DO UPDATE SET "
        "status = excluded.status, waiting_for = excluded.waiting_for, wake_at = excluded.wake_at, "
        "claimed_until = NULL, updated_at = excluded.updated_at",
        (identity, turn.turn_id, turn.method, turn.status, turn.envelope, turn.waiting_for, turn.wake_at, now, now),
    )


def alone(identity: str, fencing_token: int, turn: TurnWrite, now: float | StoreClock) -> tuple[str, list[object]]:
    """One statement that is :func:`write` when the fence passes, for a store whose ``WITH`` may write.

    Run as a transaction of its own it writes the row and the entries only where the
    token is the identity's high-water mark, and answers one row: how many fences
    passed (0 or 1). A write that did not pass wrote nothing; :func:`write` then names
    the refusal. (On PostgreSQL: one round trip, where the transaction takes five.) A
    write that need not wait for the disk (``turn.flush`` false) says so in the same
    statement.
    """
    stamp = now.sql if isinstance(now, StoreClock) else "?"
    stamps: list[object] = [] if isinstance(now, StoreClock) else [now, now]
    parameters: list[object] = [identity, fencing_token]
    if turn.flush:
        parts = ["fenced AS (SELECT identity FROM fences WHERE identity = ? AND high_water = ?)"]
    else:
        # Local to this statement's transaction; referenced by ``fenced`` so that it runs.
        parts = ["relaxed AS (SELECT set_config('synchronous_commit', 'off', true))",
                 "fenced AS (SELECT identity FROM fences, relaxed WHERE identity = ? AND high_water = ?)"]
    if not turn.entries_only:
        parts.append(
            "turn_row AS (INSERT INTO turns (identity, turn_id, method, status, envelope, waiting_for, wake_at, "
            f"started_at, updated_at) SELECT ?, ?, ?, ?, ?, ?, CAST(? AS DOUBLE PRECISION), {stamp}, {stamp} "
            "FROM fenced ON CONFLICT (identity, turn_id) DO UPDATE SET status = excluded.status, "
            "waiting_for = excluded.waiting_for, wake_at = excluded.wake_at, claimed_until = NULL, "
            "updated_at = excluded.updated_at RETURNING 1)")
        parameters += [identity, turn.turn_id, turn.method, turn.status, turn.envelope, turn.waiting_for,
                       turn.wake_at, *stamps]
    if turn.entries:
        values = ", ".join("(?, ?, CAST(? AS BIGINT), ?, ?, ?, CAST(? AS BYTEA))" for _ in turn.entries)
        parts.append(
            f"entry (identity, turn_id, position, kind, name, state, value) AS (VALUES {values})")
        parts.append(
            "steps AS (INSERT INTO turn_steps (identity, turn_id, position, kind, name, state, value) "
            "SELECT entry.* FROM entry, fenced ON CONFLICT (identity, turn_id, position) DO UPDATE SET "
            "kind = excluded.kind, name = excluded.name, state = excluded.state, value = excluded.value "
            "WHERE turn_steps.state <> 'completed' RETURNING 1)")
        for entry in turn.entries:
            parameters += [identity, turn.turn_id, entry.position, entry.kind.value, entry.name, entry.state.value,
                           entry.value]
    return f"WITH {', '.join(parts)} SELECT count(*) FROM fenced", parameters


def end(tx: Transaction, identity: str, ended: TurnEnd, now: float) -> None:
    """Mark a turn ended and drop its journal (no fence check: the caller's transaction made it)."""
    tx.execute(
        "UPDATE turns SET status = ?, error = ?, waiting_for = '', wake_at = NULL, claimed_until = NULL, "
        "updated_at = ? WHERE identity = ? AND turn_id = ?",
        (ended.status, ended.error, now, identity, ended.turn_id),
    )
    tx.execute("DELETE FROM turn_steps WHERE identity = ? AND turn_id = ?", (identity, ended.turn_id))
    if ended.events:
        _turn_events.append(tx, ended.events)


def end_alone(ended: TurnEnd, now: float | StoreClock, moved: str) -> tuple[list[str], list[object]]:
    """:func:`end` as parts of a ``WITH`` (a store whose ``WITH`` may write), for the identities of CTE ``moved``.

    For an end without stream events (those :func:`end` appends with it). Returns the
    parts and their parameters, in order.
    """
    if ended.events:
        raise ValueError("a turn's end with stream events is written by end(), in a transaction")
    stamp = now.sql if isinstance(now, StoreClock) else "?"
    stamps: list[object] = [] if isinstance(now, StoreClock) else [now]
    parts = [
        f"turn_ended AS (UPDATE turns SET status = ?, error = ?, waiting_for = '', wake_at = NULL, "
        f"claimed_until = NULL, updated_at = {stamp} WHERE identity IN (SELECT identity FROM {moved}) "
        "AND turn_id = ? RETURNING 1)",
        f"journal_dropped AS (DELETE FROM turn_steps WHERE identity IN (SELECT identity FROM {moved}) "
        "AND turn_id = ? RETURNING 1)",
    ]
    return parts, [ended.status, ended.error, *stamps, ended.turn_id, ended.turn_id]


def end_fenced(tx: Transaction, *, identity: str, fencing_token: int, ended: TurnEnd, now: float) -> None:
    _leases.check_fence(tx, identity, fencing_token)
    end(tx, identity, ended, now)


def record(tx: Transaction, identity: str, turn_id: str) -> TurnRecord | None:
    row = tx.execute(f"SELECT {_COLUMNS} FROM turns WHERE identity = ? AND turn_id = ?",
                     (identity, turn_id)).fetchone()
    if row is None:
        return None
    entries = tuple(
        TurnEntry(position=int(position), kind=TurnEntryKind(kind), name=name, state=TurnEntryState(state),
                     value=None if value is None else bytes(value))
        for position, kind, name, state, value in tx.execute(
            "SELECT position, kind, name, state, value FROM turn_steps WHERE identity = ? AND turn_id = ? "
            "ORDER BY position", (identity, turn_id))
    )
    return dataclasses.replace(_record(row, entries, len(entries)),
                               last_event=_turn_events.last(tx, identity=identity, turn_id=turn_id))


def listing(
    tx: Transaction, *, identity: str | None, statuses: Sequence[str], limit: int,
) -> list[TurnRecord]:
    """Turns of ``identity`` (or all) with one of ``statuses``, newest first, without their journals' values."""
    marks = ", ".join("?" * len(statuses))
    where, parameters = f"status IN ({marks})", list(statuses)
    if identity is not None:
        where += " AND identity = ?"
        parameters.append(identity)
    rows = tx.execute(f"SELECT {_COLUMNS} FROM turns WHERE {where} ORDER BY updated_at DESC LIMIT ?",
                      (*parameters, limit)).fetchall()
    counts: dict[tuple[str, str], int] = {}
    if rows:
        for row_identity, turn_id, count in tx.execute(
            f"SELECT identity, turn_id, count(*) FROM turn_steps WHERE turn_id IN ({', '.join('?' * len(rows))}) "
            "GROUP BY identity, turn_id", [row[1] for row in rows]):
            counts[(row_identity, turn_id)] = int(count)
    return [_record(row, (), counts.get((row[0], row[1]), 0)) for row in rows]


def claim_wakes(tx: Transaction, *, now: float, limit: int, claim_for: float) -> list[TurnWake]:
    """Suspended turns whose wake time has come and that nobody claimed (or whose claim lapsed)."""
    rows = tx.execute(
        "SELECT identity, turn_id, envelope, waiting_for, wake_at FROM turns "
        "WHERE wake_at <= ? AND status = 'SUSPENDED' AND (claimed_until IS NULL OR claimed_until <= ?) "
        "ORDER BY wake_at LIMIT ?", (now, now, limit)).fetchall()
    if rows:
        tx.executemany("UPDATE turns SET claimed_until = ? WHERE identity = ? AND turn_id = ?",
                       [(now + claim_for, row[0], row[1]) for row in rows])
    return [TurnWake(identity=row[0], turn_id=row[1], envelope=bytes(row[2]), waiting_for=row[3],
                     wake_at=float(row[4])) for row in rows]


def wake(tx: Transaction, *, identity: str, turn_id: str, now: float) -> bool:
    """Make a suspended turn due now (a signal or a decision arrived); whether one was suspended."""
    return bool(make_due(tx, identity=identity, turn_id=turn_id, now=now).rowcount)


def waiting_for(tx: Transaction, *, identity: str, waiting_for: str) -> list[str]:
    """The suspended turns of ``identity`` waiting for ``waiting_for`` (an identity has few turns in progress)."""
    return [row[0] for row in tx.execute(
        "SELECT turn_id FROM turns WHERE identity = ? AND status = 'SUSPENDED' AND waiting_for = ?",
        (identity, waiting_for))]


def waiting_entries(tx: Transaction, *, identity: str, waiting_for: str, kind: str, name: str) -> Cursor:
    """The suspended turns of ``identity`` waiting for ``waiting_for``, oldest first (an identity has few turns
    in progress): rows of ``(turn id, envelope, position)``, the position of the turn's first waiting
    journal entry of ``kind`` and ``name`` (``None`` if it has none). Read by the caller, when it needs it."""
    return tx.execute(
        "SELECT t.turn_id, t.envelope, (SELECT min(s.position) FROM turn_steps s WHERE s.identity = t.identity "
        "AND s.turn_id = t.turn_id AND s.kind = ? AND s.name = ? AND s.state = 'waiting') FROM turns t "
        "WHERE t.identity = ? AND t.status = 'SUSPENDED' AND t.waiting_for = ? ORDER BY t.started_at, t.turn_id",
        (kind, name, identity, waiting_for))


def make_due(tx: Transaction, *, identity: str, turn_id: str, now: float) -> Cursor:
    """Make a suspended turn due now. Its result is not read here: a caller that read the turn as
    suspended in this transaction leaves it unread, and on PostgreSQL it goes with the commit."""
    return tx.execute("UPDATE turns SET wake_at = ?, claimed_until = NULL WHERE identity = ? AND turn_id = ? "
                      "AND status = 'SUSPENDED'", (now, identity, turn_id))


def purge(tx: Transaction, *, ended_before: float, limit: int) -> int:
    """Forget at most ``limit`` ended turns last updated before ``ended_before`` (via the index on ``updated_at``)."""
    rows = tx.execute(
        "SELECT identity, turn_id FROM turns WHERE updated_at < ? AND status NOT IN ('RUNNING', 'SUSPENDED') "
        "ORDER BY updated_at LIMIT ?", (ended_before, limit)).fetchall()
    tx.executemany("DELETE FROM turns WHERE identity = ? AND turn_id = ?", [(row[0], row[1]) for row in rows])
    # Signals already taken are kept as long as the turns that took them, for the record.
    tx.execute("DELETE FROM signals WHERE taken_by IS NOT NULL AND sent_at < ?", (ended_before,))
    return len(rows)


def drop(tx: Transaction, identity: str) -> None:
    """Forget every turn of a deleted identity."""
    tx.execute("DELETE FROM turn_steps WHERE identity = ?", (identity,))
    tx.execute("DELETE FROM turns WHERE identity = ?", (identity,))
    _turn_events.drop(tx, identity)


def _record(row: Row, entries: tuple[TurnEntry, ...], steps: int) -> TurnRecord:
    identity, turn_id, method, status, envelope, waiting, wake_at, started, updated, error = row
    return TurnRecord(identity=identity, turn_id=turn_id, method=method, status=status, envelope=bytes(envelope),
                      waiting_for=waiting, wake_at=None if wake_at is None else float(wake_at),
                      started=float(started), updated=float(updated), error=error, entries=entries,
                      steps=steps)
