"""Checkpoint pointers and the idempotency keys committed with them.

A pointer moves only forward: the writer's token must pass the fence check and the
version must exceed the stored one. A small State travels in the pointer itself
(``SnapshotPointer.inline``) and is stored in the same row. The keys of the turns a checkpoint covers are
written in the same transaction as its pointer, so a key is remembered exactly when
the effect it guards is durable.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..errors import RayfleetError, StaleCheckpointVersionError, UnknownIdentityError
from ..identity._values import SnapshotPointer
from . import _leases, _runs, _turns
from ._store import Row, StoreClock, Transaction, rows_in
from ._values import CheckpointCommit, CheckpointRow, CommitOutcome


def commit(tx: Transaction, commits: Iterable[CheckpointCommit], now: float | StoreClock) -> list[CommitOutcome]:
    """Move every pointer that passes its checks; one outcome per commit, in order.

    ``now`` stamps ``committed_at``: a time already read, or the store's clock, read by
    the update itself (on PostgreSQL a round trip less than reading it first).
    The common case, every commit passes, costs one batched conditional update and no
    reads (:func:`_all_pass`). Otherwise that update is undone and the batch is judged
    by the rules (:func:`_judged`). A commit that passes and carries a workflow step
    journals it in this transaction if the step's run token is current, and its
    outcome is then a :class:`StepJournaled` (see :func:`_runs.journal_with_checkpoint`).
    """
    batch = list(commits)
    move = _Move(now)
    # Read first, so on a pipelining store the reads travel with the update.
    standings = [(index, item.step, _runs.read_step_standing(tx, item.step))
                 for index, item in enumerate(batch) if item.step is not None]
    outcomes: list[CommitOutcome]
    if _all_pass(tx, batch, move):
        for item in batch:
            if item.dedup:
                _remember_keys(tx, item.identity, item.dedup, item.dedup_capacity)
        outcomes = [None] * len(batch)
    else:
        outcomes = list(_judged(tx, batch, move))
    for index, step, standing in standings:
        if outcomes[index] is None:
            outcomes[index] = _runs.journal_with_checkpoint(tx, step, standing)
    for item, outcome in zip(batch, outcomes, strict=True):
        if item.turn_end is not None and not isinstance(outcome, RayfleetError):
            _turns.end(tx, item.identity, item.turn_end, _turn_time(tx, now))
    return outcomes


def _turn_time(tx: Transaction, now: float | StoreClock) -> float:
    """``now`` as a number: a turn's row keeps a time, read from the store's clock if that is what was given."""
    if isinstance(now, StoreClock):
        row = tx.execute(f"SELECT {now.sql}").fetchone()
        assert row is not None  # a SELECT of an expression answers one row
        return float(row[0])
    return now


def alone(item: CheckpointCommit, now: float | StoreClock) -> tuple[str, list[object]]:
    """One statement that commits ``item`` if it passes, for a store whose ``WITH`` may write (``writes_in_with``).

    For a commit with at most one idempotency key (:func:`fits_alone`), as a turn's own is.

    Run as a transaction of its own (``Database.write_alone``) it does what :func:`commit`
    does for a batch of one that passes, in one round trip: the guarded update of
    :func:`_all_pass`, the key of :func:`_remember_keys` (numbered after the newest, the
    window trimmed from there), the step of :func:`_runs.journal_with_checkpoint` and the
    durable turn's end of :func:`_turns.end`, each only where the update moved the pointer.
    It answers one row for :func:`alone_outcome`. A commit that does not pass writes
    nothing; :func:`commit` then judges it.
    """
    move = _Move(now)
    parameters: list[object] = [*move.row(item), item.version, item.fencing_token]
    parts = [f"moved AS ({move.sql} AND checkpoint_version < ? AND EXISTS "
             "(SELECT 1 FROM fences WHERE fences.identity = continuity.identity AND fences.high_water = ?) "
             "RETURNING identity)"]
    if item.dedup:
        # A key already remembered keeps its first reply and its place. (One key, spelled
        # without arrays: with an array of keys PostgreSQL planned the statement anew on
        # every run, 0.3 ms, as the plan for any array looked dearer than one for the array at hand.)
        ((key, reply),) = item.dedup
        parts += [
            "fresh AS (SELECT CAST(? AS TEXT) AS key, CAST(? AS BYTEA) AS reply "
            # A scalar subquery, not NOT EXISTS: PostgreSQL plans that as an anti-join, and
            # a generic plan hashed the identity's whole window on every commit.
            "WHERE (SELECT 1 FROM dedup WHERE identity = ? AND key = ?) IS NULL)",
            "newest AS (SELECT COALESCE(MAX(seq), 0) AS seq FROM dedup WHERE identity = ?)",
            "added AS (INSERT INTO dedup (identity, key, reply, seq) SELECT moved.identity, fresh.key, fresh.reply, "
            "newest.seq + 1 FROM moved, fresh, newest ON CONFLICT DO NOTHING RETURNING 1)",
            # The snapshot the trim reads is from before the insert: the window ends at the
            # newest key, plus the one this statement adds.
            "trimmed AS (DELETE FROM dedup WHERE identity IN (SELECT identity FROM moved) AND seq <= "
            "(SELECT seq FROM newest) + (SELECT count(*) FROM fresh) - ? RETURNING 1)",
        ]
        parameters += [key, reply, item.identity, key, item.identity, max(item.dedup_capacity, 1)]
    if item.turn_end is not None:
        ended, ended_parameters = _turns.end_alone(item.turn_end, now, "moved")
        parts += ended
        parameters += ended_parameters
    standing = "NULL, NULL, NULL, NULL"
    if item.step is not None:
        step = item.step
        parts += [
            f"standing AS ({_runs.STEP_STANDING})",
            "step AS (INSERT INTO journal (run_id, label, output, tokens, seq) "
            "SELECT ?, ?, ?, ?, (SELECT COALESCE(MAX(seq), 0) + 1 FROM journal WHERE run_id = ?) "
            "FROM moved, standing WHERE standing.token = ? AND NOT standing.journaled "
            "ON CONFLICT DO NOTHING RETURNING 1)",
        ]
        parameters += [step.label, step.run_id, step.run_id, step.label, step.output, step.tokens, step.run_id,
                       step.run_token]
        standing = ("(SELECT token FROM standing), (SELECT cancel_requested FROM standing), "
                    "(SELECT pause_requested FROM standing), (SELECT journaled FROM standing)")
    return f"WITH {', '.join(parts)} SELECT (SELECT count(*) FROM moved), {standing}", parameters


def fits_alone(item: CheckpointCommit) -> bool:
    """Whether :func:`alone` can commit ``item``: it carries at most one idempotency key, and the turn it
    ends (if any) has no stream events to write with its end."""
    return len(item.dedup) <= 1 and (item.turn_end is None or not item.turn_end.events)


def alone_outcome(item: CheckpointCommit, rows: list[Row]) -> tuple[bool, CommitOutcome]:
    """What :func:`alone`'s statement answered: ``(True, outcome)`` if it committed ``item``, else ``(False, None)``."""
    moved, token, cancel, pause, journaled = rows[0]
    if not moved:
        return False, None
    if item.step is None:
        return True, None
    return True, _runs.step_outcome(item.step, None if token is None else (token, cancel, pause, journaled))


class _Move:
    """The update that moves one identity's pointer, with ``committed_at`` from ``now``."""

    __slots__ = ("_now", "sql")

    def __init__(self, now: float | StoreClock) -> None:
        stamp = now.sql if isinstance(now, StoreClock) else "?"
        self._now = () if isinstance(now, StoreClock) else (now,)
        self.sql = ("UPDATE continuity SET checkpoint_version = ?, fence = ?, snapshot_file = ?, snapshot_row = ?, "
                    f"snapshot_inline = ?, committed_at = {stamp} WHERE identity = ?")

    def row(self, item: CheckpointCommit) -> tuple[object, ...]:
        """The parameters of :attr:`sql` for ``item``."""
        return (item.version, item.fencing_token, item.pointer.file, item.pointer.row, item.pointer.inline,
                *self._now, item.identity)


def _all_pass(tx: Transaction, batch: list[CheckpointCommit], move: _Move) -> bool:
    """Move every pointer of ``batch`` if each passes its checks; otherwise move none and return False.

    Each update moves its row only where the fencing rule (:func:`_leases.fence_refusal`:
    the token equals the identity's high-water mark) and the version rule (newer than
    the stored one) hold, so it accepts exactly what :func:`_judged` accepts, in order
    (a second commit of one identity is checked against the first). Anything short of
    every row is rolled back to a savepoint (a batch of one needs none: its one update
    either moved the row or wrote nothing) and left to :func:`_judged` to explain.
    """
    guarded = (move.sql + " AND checkpoint_version < ? AND EXISTS "
               "(SELECT 1 FROM fences WHERE fences.identity = continuity.identity AND fences.high_water = ?)")
    rows = [(*move.row(item), item.version, item.fencing_token) for item in batch]
    if len(rows) == 1:
        # One update that moved nothing wrote nothing: no savepoint to roll back to (on
        # PostgreSQL a savepoint is a subtransaction, two statements and server work per commit).
        return tx.execute(guarded, rows[0]).rowcount == 1
    tx.execute("SAVEPOINT checkpoint_batch")
    moved = tx.executemany(guarded, rows).rowcount
    if moved != len(batch):
        tx.execute("ROLLBACK TO SAVEPOINT checkpoint_batch")
    tx.execute("RELEASE SAVEPOINT checkpoint_batch")
    return moved == len(batch)


def _judged(tx: Transaction, batch: list[CheckpointCommit], move: _Move) -> list[RayfleetError | None]:
    """Judge each commit of ``batch`` by the rules and move the pointers of those that pass.

    Set-based: the fence marks and current versions of the whole batch are read
    first, then each commit is judged in order (a second commit of one identity in
    the same batch is judged against the first), then one batched update.
    """
    marks = _leases.fence_marks(tx, (item.identity for item in batch))
    versions = _versions(tx, [item.identity for item in batch])
    outcomes: list[RayfleetError | None] = []
    updates: dict[str, tuple[object, ...]] = {}
    for item in batch:
        refusal = _leases.fence_refusal(item.identity, item.fencing_token, marks.get(item.identity))
        current = versions.get(item.identity)
        if refusal is not None:
            outcomes.append(refusal)
        elif current is None:
            outcomes.append(UnknownIdentityError(identity=item.identity))
        elif item.version <= current:
            outcomes.append(StaleCheckpointVersionError(identity=item.identity, presented=item.version,
                                                        current=current))
        else:
            versions[item.identity] = item.version
            updates[item.identity] = move.row(item)
            if item.dedup:
                _remember_keys(tx, item.identity, item.dedup, item.dedup_capacity)
            outcomes.append(None)
    if updates:
        tx.executemany(move.sql, list(updates.values()))
    return outcomes


def _versions(tx: Transaction, identities: list[str]) -> dict[str, int]:
    return {row[0]: int(row[1]) for row in rows_in(
        tx, "SELECT identity, checkpoint_version FROM continuity WHERE identity IN", identities)}


_ADD_KEY = ("INSERT INTO dedup (identity, key, reply, seq) "
            "SELECT ?, ?, ?, COALESCE(MAX(seq), 0) + 1 FROM dedup WHERE identity = ? AND true "
            "ON CONFLICT DO NOTHING")
"""Remember one key after the identity's newest. First writer wins: a key already remembered keeps its
original reply (FIFO, no refresh). ("WHERE true" lets SQLite tell the upsert clause from a join constraint.)"""


def _remember_keys(tx: Transaction, identity: str, entries: tuple[tuple[str, bytes], ...], capacity: int) -> None:
    # Sequence numbers are taken in SQL, so nothing here waits for a result: on a
    # pipelining store these statements travel with the commit.
    window = max(capacity, 1)
    if tx.dialect.writes_in_with:
        # Each key and the trim after it in one statement: on PostgreSQL a statement in the
        # commit's pipeline costs about 0.1 ms inside a busy host, more than the work it does.
        # The trim reads the snapshot from before the insert, so it counts from the new key's
        # number, or from the newest one when the key was remembered already.
        for key, reply in entries:
            tx.execute(f"WITH added AS ({_ADD_KEY} RETURNING seq) DELETE FROM dedup WHERE identity = ? AND seq <= "
                       "COALESCE((SELECT seq FROM added), (SELECT MAX(seq) FROM dedup WHERE identity = ?)) - ?",
                       (identity, key, reply, identity, identity, identity, window))
        return
    for key, reply in entries:
        tx.execute(_ADD_KEY, (identity, key, reply, identity))
    tx.execute("DELETE FROM dedup WHERE identity = ? AND seq <= "
               "(SELECT MAX(seq) FROM dedup WHERE identity = ?) - ?", (identity, identity, window))


def forget_keys(tx: Transaction, identity: str) -> None:
    tx.execute("DELETE FROM dedup WHERE identity = ?", (identity,))


def latest(tx: Transaction, *, after: str, limit: int, agent_class: str | None) -> list[CheckpointRow]:
    """Identities after ``after`` (by name, at most ``limit``), each with its latest checkpoint pointer.

    A page of the whole fleet (or of one agent class, on the ``identities_by_class`` index),
    so a caller can walk every identity without holding them all at once.
    """
    query = (
        "SELECT i.identity, i.agent_class, i.lifecycle, c.generation, c.checkpoint_version, c.fence, "
        "c.committed_at, c.snapshot_file, c.snapshot_row, c.snapshot_inline FROM identities i "
        "LEFT JOIN continuity c ON c.identity = i.identity WHERE i.identity > ?"
    )
    parameters: list[object] = [after]
    if agent_class is not None:
        query += " AND i.agent_class = ?"
        parameters.append(agent_class)
    parameters.append(limit)
    return [
        CheckpointRow(
            identity=row[0], agent_class=row[1], lifecycle=row[2], generation=row[3] or 0,
            checkpoint_version=row[4] or 0, fencing_token=row[5] or 0, committed_at=row[6],
            snapshot=None if row[7] is None else SnapshotPointer(
                file=row[7], row=row[8], version=row[4], inline=None if row[9] is None else bytes(row[9]),
            ),
        )
        for row in tx.execute(query + " ORDER BY i.identity LIMIT ?", parameters)
    ]


def referenced_files(tx: Transaction) -> set[str]:
    return {
        row[0] for row in tx.execute(
            "SELECT DISTINCT snapshot_file FROM continuity WHERE snapshot_file IS NOT NULL AND snapshot_file <> ''"
        )
    }
