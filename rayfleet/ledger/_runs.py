"""The run registry, the workflow journal, compensation records and run leases.

A step is journaled once: a repeated write keeps the first output, so a resumed run
re-derives exactly what the first attempt recorded. A run lease's token is persisted
before it is returned, like an identity's.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import InvalidSpecError
from ._store import Row, Transaction
from ._values import JournalEntry, JournalRecord, RunRecord

ENDED = ("COMPLETED", "COMPENSATED", "FAILED", "CANCELLED")
_RUN_COLUMNS = ("run_id, workflow, code_version, status, detail, cancel_requested, pause_requested, "
                "created_at, updated_at, outcome, definition IS NOT NULL")


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
    row = tx.execute(f"SELECT {_RUN_COLUMNS} FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    return None if row is None else _record(row)


def list_runs(tx: Transaction, statuses: Sequence[str] | None) -> list[RunRecord]:
    query = f"SELECT {_RUN_COLUMNS} FROM runs"
    parameters: list[object] = []
    if statuses:
        query += f" WHERE status IN ({', '.join('?' * len(statuses))})"
        parameters.extend(statuses)
    return [_record(row) for row in tx.execute(query + " ORDER BY created_at, run_id", parameters).fetchall()]


def definition(tx: Transaction, run_id: str) -> bytes | None:
    row = tx.execute("SELECT definition FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    return None if row is None or row[0] is None else bytes(row[0])


def set_status(
    tx: Transaction, *, run_id: str, status: str, detail: str | None, outcome: bytes | None, now: float
) -> None:
    tx.execute(
        "UPDATE runs SET status = ?, detail = COALESCE(?, detail), outcome = COALESCE(?, outcome), "
        "updated_at = ? WHERE run_id = ?",
        (status, detail, outcome, now, run_id),
    )


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


def journal_step(tx: Transaction, *, run_id: str, label: str, output: bytes, tokens: int) -> None:
    row = tx.execute("SELECT COALESCE(MAX(seq), 0) FROM journal WHERE run_id = ?", (run_id,)).fetchone()
    seq = (row[0] if row else 0) + 1
    tx.execute(
        "INSERT INTO journal (run_id, label, output, tokens, seq) VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
        (run_id, label, output, tokens, seq),
    )


def journal_compensation(tx: Transaction, *, run_id: str, label: str, ok: bool, error: str) -> None:
    row = tx.execute("SELECT COALESCE(MAX(seq), 0) FROM compensations WHERE run_id = ?", (run_id,)).fetchone()
    seq = (row[0] if row else 0) + 1
    tx.execute("INSERT INTO compensations (run_id, label, ok, error, seq) VALUES (?, ?, ?, ?, ?)",
               (run_id, label, int(ok), error, seq))


def acquire_lease(tx: Transaction, *, run_id: str, holder: str) -> int:
    row = tx.execute("SELECT high_water FROM run_leases WHERE run_id = ?", (run_id,)).fetchone()
    token = 1 if row is None else int(row[0]) + 1
    tx.execute(
        "INSERT INTO run_leases (run_id, high_water, holder) VALUES (?, ?, ?) ON CONFLICT(run_id) DO UPDATE SET "
        "high_water = excluded.high_water, holder = excluded.holder",
        (run_id, token, holder),
    )
    return token


def release_lease(tx: Transaction, *, run_id: str, holder: str) -> None:
    tx.execute("UPDATE run_leases SET holder = NULL WHERE run_id = ? AND holder = ?", (run_id, holder))


def _record(row: Row) -> RunRecord:
    return RunRecord(
        run_id=row[0], workflow=row[1], code_version=row[2], status=row[3], detail=row[4],
        cancel_requested=bool(row[5]), pause_requested=bool(row[6]), created_at=row[7], updated_at=row[8],
        outcome=None if row[9] is None else bytes(row[9]), submitted=bool(row[10]),
    )
