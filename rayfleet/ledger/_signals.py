"""Durable signals (table ``signals``) and the turns that wait for them.

* A signal is recorded once per ``(identity, name, signal id)``: a sender that retries
  with the same id records nothing new.
* A signal is kept until a turn takes it, oldest first: one sent before anyone waits
  is there for the first turn that waits for its name.
* Taking a signal and journaling it as the waiting entry's outcome is one transaction,
  so a signal is taken by exactly one wait and never lost between a host's check and
  its suspension: a turn that finds no signal suspends in the same transaction (fenced
  by the identity's token), and a signal recorded after that finds the turn suspended,
  completes its waiting entry with the value and makes it due (not fenced: the entry
  belongs to no host while the turn is suspended).
"""

from __future__ import annotations

import dataclasses

from . import _turns
from ._store import Transaction
from ._turn_rows import TurnEntry, TurnEntryKind, TurnEntryState, TurnWake, TurnWrite

WAITING_PREFIX = "signal:"
"""A turn waiting for signal ``name`` records ``waiting_for = "signal:<name>"``."""


def waiting_for(name: str) -> str:
    return WAITING_PREFIX + name


def send(
    tx: Transaction, *, identity: str, name: str, signal_id: str, value: bytes, now: float,
) -> list[TurnWake]:
    """Record the signal (once per id) and hand it to the turn waiting for it, if one does; returns that turn.

    The waiting turn's entry is completed with the signal's value in this transaction
    (the signal taken by it), so its replay returns the value without another write; the
    wake carries that entry (``TurnWake.taken``). A signal nobody waits for is kept.
    """
    inserted = tx.execute(
        "INSERT INTO signals (identity, name, signal_id, value, sent_at) VALUES (?, ?, ?, ?, ?) "
        "ON CONFLICT (identity, name, signal_id) DO NOTHING",
        (identity, name, signal_id, value, now),
    )
    waiting = _turns.waiting_entries(tx, identity=identity, waiting_for=waiting_for(name),
                                     kind=TurnEntryKind.SIGNAL.value, name=name)
    fresh = inserted.rowcount  # on PostgreSQL, the insert and the read of the waiting turns in one round trip
    woken: list[TurnWake] = []
    given = False
    for turn_id, envelope, position in waiting.fetchall():
        taken: TurnEntry | None = None
        if fresh and not given and position is not None:
            tx.execute("UPDATE turn_steps SET state = 'completed', value = ? WHERE identity = ? AND turn_id = ? "
                       "AND position = ?", (value, identity, turn_id, position))
            tx.execute("UPDATE signals SET taken_by = ? WHERE identity = ? AND name = ? AND signal_id = ?",
                       (f"{turn_id}:{position}", identity, name, signal_id))
            taken = TurnEntry(position=int(position), kind=TurnEntryKind.SIGNAL, name=name,
                              state=TurnEntryState.COMPLETED, value=value)
            given = True
        # Read as suspended in this transaction, so due now: the writes go with the commit.
        _turns.make_due(tx, identity=identity, turn_id=turn_id, now=now)
        woken.append(TurnWake(identity=identity, turn_id=turn_id, envelope=bytes(envelope),
                              waiting_for=waiting_for(name), wake_at=now, taken=taken))
    return woken


def wait(
    tx: Transaction, *, identity: str, fencing_token: int, name: str, turn: TurnWrite, now: float,
) -> bytes | None:
    """Take the oldest pending signal ``name`` as the outcome of ``turn``'s entry, or write ``turn`` (the suspension).

    ``turn`` carries exactly one entry, the wait. With a signal pending, the entry is
    written completed with the signal's value and the turn stays running; the value is
    returned. Without, ``turn`` is written as given and ``None`` returned. An entry a
    signal already completed (a turn that ran again, from a journal read before the
    signal came) returns that signal's value: it is the wait's outcome, and suspending
    again would leave the turn waiting for a signal it was given.
    """
    (entry,) = turn.entries
    # One read for both: the entry already completed by a signal (sent while the turn ran again
    # from a journal read before it), which is this wait's outcome; else the oldest pending signal.
    # Read after the fence check, which sends it with its own on PostgreSQL (one round trip).
    found = tx.execute(
        "SELECT pending, signal_id, value FROM ("
        "SELECT 0 AS pending, '' AS signal_id, value, 0.0 AS sent_at FROM turn_steps WHERE identity = ? "
        "AND turn_id = ? AND position = ? AND state = 'completed' "
        "UNION ALL SELECT 1, signal_id, value, sent_at FROM signals WHERE identity = ? AND name = ? "
        "AND taken_by IS NULL) AS found ORDER BY pending, sent_at, signal_id LIMIT 1",
        (identity, turn.turn_id, entry.position, identity, name))
    _turns.check_fence(tx, identity, fencing_token)
    row = found.fetchone()
    if row is None:
        _turns.write_checked(tx, identity=identity, turn=turn, now=now)
        return None
    signal_id, value = row[1], bytes(row[2])
    if row[0]:
        tx.execute("UPDATE signals SET taken_by = ? WHERE identity = ? AND name = ? AND signal_id = ?",
                   (f"{turn.turn_id}:{entry.position}", identity, name, signal_id))
    taken = dataclasses.replace(entry, state=TurnEntryState.COMPLETED, value=value)
    _turns.write_checked(tx, identity=identity, now=now, turn=dataclasses.replace(
        turn, status="RUNNING", waiting_for="", wake_at=None, entries=(taken,)))
    return value


def pending(tx: Transaction, *, identity: str) -> list[tuple[str, str, float]]:
    """The signals of ``identity`` no turn has taken yet: ``(name, signal id, sent at)``, oldest first."""
    return [(row[0], row[1], float(row[2])) for row in tx.execute(
        "SELECT name, signal_id, sent_at FROM signals WHERE identity = ? AND taken_by IS NULL "
        "ORDER BY sent_at, signal_id", (identity,))]


def drop(tx: Transaction, identity: str) -> None:
    """Forget every signal of a deleted identity."""
    tx.execute("DELETE FROM signals WHERE identity = ?", (identity,))
