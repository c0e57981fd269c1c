"""The run registry, the workflow journal, compensation records, run leases and step leases.

* A step is journaled once: a repeated write keeps the first output, so a resumed run
  re-derives exactly what the first attempt recorded.
* **One engine per run.** The engine executing a run holds the run's lease (holder,
  TTL, renewal). A grant's token is strictly larger than every token issued before
  for the run and is persisted in the grant's transaction; the high-water mark is kept
  forever. A live lease of another holder is refused (:class:`RunOwnedElsewhereError`)
  unless the caller names that holder as known dead (``takeover_from``); a lapsed one
  can be taken by anyone; the same holder re-acquiring gets a larger token.
* **Fenced writes.** Every write an engine makes for a run (journal entries,
  compensation records, status, step leases) presents ``(run_id, token)`` and is
  checked in the transaction that writes: any token but the run's high-water mark is
  refused with :class:`StaleRunTokenError`. As for identities, fencing and not the
  clock decides: a lapsed lease nobody took still writes and renews.
* **Exclusive steps.** An exclusive step holds a step lease on ``(run_id, label)``
  whose token (the conversation fence ``run/label``) is strictly larger than any step
  token issued before for the run. While it is held and has not lapsed, nobody else
  gets it, whatever holder name they give; its TTL bounds it by the step's dispatch.
  Taking a run from a holder known dead frees that run's step leases too.

The rules themselves live in ``_run_rules``, free of any store, so the in-memory
journal of ``rayfleet.testing`` applies exactly the same ones.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import InvalidSpecError
from . import _leases
from ._run_rules import Holding, fence_refusal, grant_refusal, renew_refusal
from ._store import Cursor, Row, Transaction
from ._values import (
    JournalEntry,
    JournalRecord,
    RunLease,
    RunRecord,
    RunRequests,
    RunStart,
    StepEntry,
    StepJournaled,
)

ENDED = ("COMPLETED", "COMPENSATED", "FAILED", "CANCELLED")
_RUN_COLUMNS = ("runs.run_id, workflow, code_version, status, detail, cancel_requested, pause_requested, "
                "created_at, updated_at, outcome, definition IS NOT NULL, run_owners.holder")
_RUNS_WITH_OWNER = "runs LEFT JOIN run_owners ON run_owners.run_id = runs.run_id"


def create(
    tx: Transaction, *, run_id: str, workflow: str, code_version: str, definition: bytes | None, force: bool,
    now: float,
) -> str:
    row = tx.execute("SELECT code_version, status FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    if row is None:
        tx.execute(
            "INSERT INTO runs (run_id, workflow, code_version, status, definition, created_at, updated_at) "
            "VALUES (?, ?, ?, 'PENDING', ?, ?, ?)",
            (run_id, workflow, code_version, definition, now, now),
        )
        return "PENDING"
    if row[1] in ENDED:
        raise InvalidSpecError(
            f"run {run_id!r} already ended ({row[1]}); a finished run is never resumed (its compensated "
            f"steps would be replayed, not redone). Start a new run",
            field="run_id",
        )
    if row[0] != code_version and not force:
        raise InvalidSpecError(
            f"run {run_id!r} was started by workflow code version {row[0]}, not {code_version}; "
            f"resuming it under different code could re-derive different steps. Pass force=True to resume "
            f"anyway, or start a new run",
            field="code_version",
        )
    tx.execute(
        "UPDATE runs SET code_version = ?, definition = COALESCE(?, definition), updated_at = ? WHERE run_id = ?",
        (code_version, definition, now, run_id),
    )
    return str(row[1])


def get(tx: Transaction, run_id: str) -> RunRecord | None:
    row = tx.execute(f"SELECT {_RUN_COLUMNS} FROM {_RUNS_WITH_OWNER} WHERE runs.run_id = ?", (run_id,)).fetchone()
    return None if row is None else _record(row)


def list_runs(tx: Transaction, statuses: Sequence[str] | None) -> list[RunRecord]:
    query = f"SELECT {_RUN_COLUMNS} FROM {_RUNS_WITH_OWNER}"
    parameters: list[object] = []
    if statuses:
        query += f" WHERE status IN ({', '.join('?' * len(statuses))})"
        parameters.extend(statuses)
    return [_record(row) for row in tx.execute(query + " ORDER BY created_at, runs.run_id", parameters).fetchall()]


def definition(tx: Transaction, run_id: str) -> bytes | None:
    row = tx.execute("SELECT definition FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    return None if row is None or row[0] is None else bytes(row[0])


def set_status(
    tx: Transaction, *, run_id: str, fencing_token: int, status: str, detail: str | None, outcome: bytes | None,
    release_holder: str | None, now: float,
) -> RunRequests:
    asked = _asked(tx, run_id)
    check_fence(tx, run_id, fencing_token)
    tx.execute(
        "UPDATE runs SET status = ?, detail = COALESCE(?, detail), outcome = COALESCE(?, outcome), "
        "updated_at = ? WHERE run_id = ?",
        (status, detail, outcome, now, run_id),
    )
    if release_holder is not None:
        release_lease(tx, run_id=run_id, holder=release_holder, token=fencing_token)
    return _requests(asked)


def _asked(tx: Transaction, run_id: str) -> Cursor:
    """Queue the read of what is asked of a run; :func:`_requests` judges it once the write's statements are queued.

    Statement order matters on a store that sends statements only when a result is
    read: the requests travel with the fence check, the writes with the commit.
    """
    return tx.execute("SELECT cancel_requested, pause_requested FROM runs WHERE run_id = ?", (run_id,))


def _requests(asked: Cursor) -> RunRequests:
    row = asked.fetchone()
    return RunRequests() if row is None else RunRequests(cancel=bool(row[0]), pause=bool(row[1]))


def request(tx: Transaction, *, run_id: str, cancel: bool | None, pause: bool | None) -> bool:
    if tx.execute("SELECT 1 FROM runs WHERE run_id = ?", (run_id,)).fetchone() is None:
        return False
    if cancel is not None:
        tx.execute("UPDATE runs SET cancel_requested = ? WHERE run_id = ?", (int(cancel), run_id))
    if pause is not None:
        tx.execute("UPDATE runs SET pause_requested = ? WHERE run_id = ?", (int(pause), run_id))
    return True


def journal(tx: Transaction, run_id: str) -> JournalRecord:
    steps = tx.execute("SELECT label, output, tokens FROM journal WHERE run_id = ? ORDER BY seq", (run_id,)).fetchall()
    compensated = tx.execute(
        "SELECT label FROM compensations WHERE run_id = ? AND ok = 1 ORDER BY seq", (run_id,)
    ).fetchall()
    return JournalRecord(
        steps=tuple(JournalEntry(label=r[0], output=bytes(r[1]), tokens=r[2]) for r in steps),
        compensated=tuple(r[0] for r in compensated),
    )


def journal_step(
    tx: Transaction, *, run_id: str, fencing_token: int, label: str, output: bytes, tokens: int
) -> RunRequests:
    asked = _asked(tx, run_id)
    check_fence(tx, run_id, fencing_token)
    _insert_step(tx, run_id=run_id, label=label, output=output, tokens=tokens)
    return _requests(asked)


def _insert_step(tx: Transaction, *, run_id: str, label: str, output: bytes, tokens: int) -> None:
    # A step is journaled once: a repeated label keeps the first output.
    # ("WHERE true" lets SQLite tell the upsert clause from a join constraint.)
    tx.execute(
        "INSERT INTO journal (run_id, label, output, tokens, seq) "
        "SELECT ?, ?, ?, ?, COALESCE(MAX(seq), 0) + 1 FROM journal WHERE run_id = ? AND true ON CONFLICT DO NOTHING",
        (run_id, label, output, tokens, run_id),
    )


STEP_STANDING = (
    "SELECT run_owners.token, runs.cancel_requested, runs.pause_requested, "
    "EXISTS (SELECT 1 FROM journal WHERE journal.run_id = run_owners.run_id AND journal.label = ?) AS journaled "
    "FROM run_owners LEFT JOIN runs ON runs.run_id = run_owners.run_id WHERE run_owners.run_id = ?"
)
"""A run's token, its cancel and pause requests, and whether a step (the first parameter) is journaled;
no row for an unknown run. Parameters: the step's label, the run's id."""


def read_step_standing(tx: Transaction, entry: StepEntry) -> Cursor:
    """Queue the read that :func:`journal_with_checkpoint` judges ``entry`` by.

    Queued before the checkpoint's own statements, so on a pipelining store it travels
    with them and costs no round trip of its own.
    """
    return tx.execute(STEP_STANDING, (entry.label, entry.run_id))


def journal_with_checkpoint(tx: Transaction, entry: StepEntry, standing: Cursor) -> StepJournaled | None:
    """Journal ``entry`` in the transaction of the checkpoint that carried it; ``None`` if its token is stale.

    ``standing`` is :func:`read_step_standing`'s read in this transaction. A stale (or
    unknown) run token journals nothing and refuses nothing: the checkpoint stands on
    its own, and the engine, told nothing was journaled, journals the step itself,
    where the stale token is refused. A step journaled before keeps its output.
    """
    row = standing.fetchone()
    outcome = step_outcome(entry, row)
    if outcome is not None and outcome.inserted:
        _insert_step(tx, run_id=entry.run_id, label=entry.label, output=entry.output, tokens=entry.tokens)
    return outcome


def step_outcome(entry: StepEntry, standing: Row | None) -> StepJournaled | None:
    """What journaling ``entry`` comes to, by its run's :data:`STEP_STANDING` row (``None``: no such run).

    ``None`` when the run token is stale (nothing is journaled); else whether this output
    is the one journaled (``inserted``) and what is asked of the run.
    """
    if standing is None or fence_refusal(run_id=entry.run_id, high_water=int(standing[0]), presented=entry.run_token):
        return None
    return StepJournaled(inserted=not standing[3], requests=RunRequests(cancel=bool(standing[1]),
                                                                       pause=bool(standing[2])))


def journal_compensation(
    tx: Transaction, *, run_id: str, fencing_token: int, label: str, ok: bool, error: str
) -> None:
    check_fence(tx, run_id, fencing_token)
    row = tx.execute("SELECT COALESCE(MAX(seq), 0) FROM compensations WHERE run_id = ?", (run_id,)).fetchone()
    seq = (row[0] if row else 0) + 1
    tx.execute("INSERT INTO compensations (run_id, label, ok, error, seq) VALUES (?, ?, ?, ?, ?)",
               (run_id, label, int(ok), error, seq))


# -- run leases --------------------------------------------------------------------

def _holding(tx: Transaction, run_id: str) -> Holding | None:
    row = tx.execute("SELECT holder, token, expires_at FROM run_owners WHERE run_id = ?", (run_id,)).fetchone()
    return None if row is None else Holding(holder=row[0], token=int(row[1]), expires_at=float(row[2]))


def check_fence(tx: Transaction, run_id: str, token: int) -> None:
    """Raise ``StaleRunTokenError`` unless ``token`` is the run's high-water token."""
    current = _holding(tx, run_id)
    refusal = fence_refusal(run_id=run_id, high_water=0 if current is None else current.token, presented=token)
    if refusal is not None:
        raise refusal


def acquire_lease(
    tx: Transaction, *, run_id: str, holder: str, ttl: float, takeover_from: str | None, now: float
) -> RunLease:
    current = _holding(tx, run_id)
    refusal = grant_refusal(run_id=run_id, current=current, holder=holder, now=now, takeover_from=takeover_from)
    if refusal is not None:
        raise refusal
    token = (0 if current is None else current.token) + 1
    tx.execute(
        "INSERT INTO run_owners (run_id, holder, token, ttl, expires_at) VALUES (?, ?, ?, ?, ?) "
        "ON CONFLICT(run_id) DO UPDATE SET holder = excluded.holder, token = excluded.token, ttl = excluded.ttl, "
        "expires_at = excluded.expires_at",
        (run_id, holder, token, ttl, now + ttl),
    )
    if takeover_from is not None and current is not None and current.holder == takeover_from != holder:
        # The caller knows the previous engine is dead: its exclusive steps will not finish.
        tx.execute("DELETE FROM step_leases WHERE run_id = ?", (run_id,))
    return RunLease(run_id=run_id, holder=holder, token=token, ttl=ttl)


def start(
    tx: Transaction, *, run_id: str, holder: str, ttl: float, takeover_from: str | None, now: float
) -> RunStart:
    lease = acquire_lease(tx, run_id=run_id, holder=holder, ttl=ttl, takeover_from=takeover_from, now=now)
    return RunStart(lease=lease, journal=journal(tx, run_id))


def renew_lease(tx: Transaction, *, run_id: str, holder: str, token: int, now: float) -> RunLease:
    refusal = renew_refusal(run_id=run_id, current=_holding(tx, run_id), holder=holder, token=token)
    if refusal is not None:
        raise refusal
    row = tx.execute("SELECT ttl FROM run_owners WHERE run_id = ?", (run_id,)).fetchone()
    assert row is not None  # renew_refusal refuses a run with no lease
    ttl = float(row[0])
    tx.execute("UPDATE run_owners SET expires_at = ? WHERE run_id = ?", (now + ttl, run_id))
    return RunLease(run_id=run_id, holder=holder, token=token, ttl=ttl)


def release_lease(tx: Transaction, *, run_id: str, holder: str, token: int) -> bool:
    # The token stays as the run's high-water mark, so no earlier token can write again.
    return bool(tx.execute("UPDATE run_owners SET holder = NULL WHERE run_id = ? AND holder = ? AND token = ?",
                           (run_id, holder, token)).rowcount)


def apply_lock_delay(tx: Transaction, now: float) -> None:
    """Keep leases found live when the ledger opens for one TTL: their holders may be alive.

    A lease that had lapsed already stays lapsed (its holder had stopped renewing).
    """
    _leases.lock_delay(tx, ("run_owners", "step_leases"), now)


# -- step leases -------------------------------------------------------------------

def acquire_step_lease(
    tx: Transaction, *, run_id: str, label: str, holder: str, fencing_token: int, ttl: float, now: float
) -> int:
    check_fence(tx, run_id, fencing_token)
    row = tx.execute("SELECT holder, token, expires_at FROM step_leases WHERE run_id = ? AND label = ?",
                     (run_id, label)).fetchone()
    current = None if row is None else Holding(holder=row[0], token=int(row[1]), expires_at=float(row[2]))
    refusal = grant_refusal(run_id=run_id, current=current, holder=holder, now=now, step=label)
    if refusal is not None:
        raise refusal
    token = _leases.next_token(tx, table="run_leases", key="run_id", value=run_id)
    tx.execute(
        "INSERT INTO step_leases (run_id, label, holder, token, ttl, expires_at) VALUES (?, ?, ?, ?, ?, ?) "
        "ON CONFLICT(run_id, label) DO UPDATE SET holder = excluded.holder, token = excluded.token, "
        "ttl = excluded.ttl, expires_at = excluded.expires_at",
        (run_id, label, holder, token, ttl, now + ttl),
    )
    return token


def release_step_lease(tx: Transaction, *, run_id: str, label: str, holder: str, token: int) -> bool:
    return bool(tx.execute("DELETE FROM step_leases WHERE run_id = ? AND label = ? AND holder = ? AND token = ?",
                           (run_id, label, holder, token)).rowcount)


def _record(row: Row) -> RunRecord:
    return RunRecord(
        run_id=row[0], workflow=row[1], code_version=row[2], status=row[3], detail=row[4],
        cancel_requested=bool(row[5]), pause_requested=bool(row[6]), created_at=row[7], updated_at=row[8],
        outcome=None if row[9] is None else bytes(row[9]), submitted=bool(row[10]), owner=row[11],
    )
