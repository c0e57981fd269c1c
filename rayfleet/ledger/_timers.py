"""Reminders and schedules (table ``timers``): registered by agents, fired by whichever host claims them.

* An agent's registration and removal present its fencing token (a zombie cannot set
  timers). An operator's removal or "fire now" does not.
* Due timers are claimed through the index on ``next_due``, a bounded batch at a time,
  and held for a while (no lock: an unsettled claim lapses and another host fires the
  same scheduled time again, which the firing's idempotency key makes one effect).
* A firing is settled by the host that made it (many firings in one transaction): the
  scheduled time it was for moves the timer to its next one (or removes a one-off), counting missed and late firings. A
  settlement for a scheduled time the timer has moved past (a re-registration, a
  duplicate) changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

from . import _turns, _views
from ._store import Row, Transaction
from ._turn_rows import TimerFired, TimerRow, TimerSpec

_COLUMNS = ("identity, name, method, payload, next_due, every, cron, tz, overlap, catch_up, created, last_fired, "
            "fired, missed, late, last_lateness")
_OF_T = ", ".join(f"t.{column}" for column in _COLUMNS.split(", "))
"""The columns of :data:`_COLUMNS` of the table named ``t``."""


def set_timer(tx: Transaction, *, identity: str, fencing_token: int, timer: TimerSpec, now: float) -> None:
    """Register ``timer`` (fenced), replacing one of the same name; its counters start again."""
    _turns.check_fence(tx, identity, fencing_token)
    tx.execute(
        "INSERT INTO timers (identity, name, method, payload, next_due, every, cron, tz, overlap, catch_up, created) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (identity, name) DO UPDATE SET "
        "method = excluded.method, payload = excluded.payload, next_due = excluded.next_due, every = excluded.every, "
        "cron = excluded.cron, tz = excluded.tz, overlap = excluded.overlap, catch_up = excluded.catch_up, "
        "created = excluded.created, claimed_until = NULL, last_fired = NULL, fired = 0, missed = 0, late = 0, "
        "last_lateness = NULL",
        (identity, timer.name, timer.method, timer.payload, timer.next_due, timer.every, timer.cron, timer.tz,
         timer.overlap, timer.catch_up, now),
    )


def forget(tx: Transaction, *, identity: str, name: str, fencing_token: int | None) -> bool:
    """Remove a timer (fenced when a token is given); whether there was one."""
    if fencing_token is not None:
        _turns.check_fence(tx, identity, fencing_token)
    return bool(tx.execute("DELETE FROM timers WHERE identity = ? AND name = ?", (identity, name)).rowcount)


def claim(tx: Transaction, *, now: float, limit: int, claim_for: float, holder: str | None = None,
          holder_first: float = 0.0) -> list[TimerRow]:
    """Timers due now that nobody holds (or whose claim lapsed), oldest due first, held for ``claim_for``.

    With ``holder`` (a host's holder id), a timer whose identity another holder's live
    lease covers is left to that holder for ``holder_first`` seconds past its due time:
    each host fires its own identities' timers, with no hop to the owner, and a timer
    of a dormant identity, of a lapsed lease, or overdue past that allowance goes to
    any host.

    When nothing is due (the idle sweep's case) this is one statement that reads one
    index entry, the same with a million timers as with none: the holder's filter, which
    costs a tenth of a millisecond more to plan on PostgreSQL, is asked only once
    something is due. Two hosts claiming at once conflict and one of them retries (every
    write is ``SERIALIZABLE``), so a timer is never claimed twice at one time.
    """
    due = "t.next_due <= ? AND (t.claimed_until IS NULL OR t.claimed_until <= ?)"
    if holder is None:
        rows = tx.execute(f"SELECT {_OF_T} FROM timers t WHERE {due} ORDER BY t.next_due LIMIT ?",
                          (now, now, limit)).fetchall()
    # The order makes this a read of the due-time index: without it PostgreSQL scanned the
    # whole table (100 ms over a million timers).
    elif tx.execute(f"SELECT 1 FROM timers t WHERE {due} ORDER BY t.next_due LIMIT 1",
                    (now, now)).fetchone() is None:
        return []
    else:
        rows = tx.execute(
            f"SELECT {_OF_T} FROM timers t WHERE {due} AND NOT EXISTS (SELECT 1 FROM leases l "
            f"{_views.HOLDER_OF_LEASE} WHERE l.identity = t.identity AND l.holder <> ? "
            f"AND {_views.LEASE_EXPIRES} > ? AND t.next_due > ?) ORDER BY t.next_due LIMIT ?",
            (now, now, holder, now, now - holder_first, limit)).fetchall()
    if rows:
        # A statement per timer, through the primary key: a row-value ``IN (VALUES ...)``
        # over the batch is a scan of the whole table on SQLite.
        tx.executemany("UPDATE timers SET claimed_until = ? WHERE identity = ? AND name = ?",
                       [(now + claim_for, row[0], row[1]) for row in rows])
    return [_row(row) for row in rows]


def settle(tx: Transaction, *, fired: Sequence[TimerFired], now: float) -> list[bool]:
    """Move each fired timer to its next time (or remove a one-off); whether each was still at its fired time."""
    return [_settle_one(tx, one, now) for one in fired]


def _settle_one(tx: Transaction, fired: TimerFired, now: float) -> bool:
    if fired.next_due is None:
        return bool(tx.execute("DELETE FROM timers WHERE identity = ? AND name = ? AND next_due = ?",
                               (fired.identity, fired.name, fired.scheduled)).rowcount)
    return bool(tx.execute(
        "UPDATE timers SET next_due = ?, claimed_until = NULL, last_fired = ?, fired = fired + 1, "
        "missed = missed + ?, late = late + ?, last_lateness = ? WHERE identity = ? AND name = ? AND next_due = ?",
        (fired.next_due, now, fired.missed, int(fired.late), fired.lateness, fired.identity, fired.name,
         fired.scheduled)).rowcount)


def release(tx: Transaction, *, identity: str, name: str, scheduled: float, next_due: float) -> bool:
    """Let a timer whose firing is allowed to overlap be claimed for its next time while this one runs."""
    return bool(tx.execute(
        "UPDATE timers SET next_due = ?, claimed_until = NULL WHERE identity = ? AND name = ? AND next_due = ?",
        (next_due, identity, name, scheduled)).rowcount)


def due_now(tx: Transaction, *, identity: str, name: str, now: float) -> bool:
    """Make a timer due now (an operator's "fire now"); whether there is one."""
    return bool(tx.execute("UPDATE timers SET next_due = ?, claimed_until = NULL WHERE identity = ? AND name = ?",
                           (now, identity, name)).rowcount)


def listing(tx: Transaction, *, identity: str | None, due_before: float | None, limit: int) -> list[TimerRow]:
    """Timers of ``identity`` (or all) due before ``due_before`` (or any time), soonest first."""
    where: list[str] = []
    parameters: list[object] = []
    if identity is not None:
        where.append("identity = ?")
        parameters.append(identity)
    if due_before is not None:
        where.append("next_due <= ?")
        parameters.append(due_before)
    clause = f"WHERE {' AND '.join(where)} " if where else ""
    return [_row(row) for row in tx.execute(
        f"SELECT {_COLUMNS} FROM timers {clause}ORDER BY next_due, identity, name LIMIT ?", (*parameters, limit))]


def drop(tx: Transaction, identity: str) -> None:
    """Forget every timer of a deleted identity."""
    tx.execute("DELETE FROM timers WHERE identity = ?", (identity,))


def _row(row: Row) -> TimerRow:
    (identity, name, method, payload, next_due, every, cron, tz, overlap, catch_up, created, last_fired, fired,
     missed, late, last_lateness) = row
    return TimerRow(
        identity=identity, name=name, method=method, payload=bytes(payload), next_due=float(next_due),
        every=None if every is None else float(every), cron=cron, tz=tz, overlap=overlap, catch_up=catch_up,
        created=float(created), last_fired=None if last_fired is None else float(last_fired), fired=int(fired),
        missed=int(missed), late=int(late), last_lateness=None if last_lateness is None else float(last_lateness),
    )
