"""Facts the ledger keeps about itself: which fleet it belongs to, which incarnation applied lock-delay."""

from __future__ import annotations

from ._store import Transaction

FLEET_ID = "fleet_id"
INCARNATION = "incarnation"


def get(tx: Transaction, key: str) -> str | None:
    row = tx.execute("SELECT value FROM ledger_meta WHERE key = ?", (key,)).fetchone()
    return None if row is None else str(row[0])


def put(tx: Transaction, key: str, value: str) -> None:
    tx.execute(
        "INSERT INTO ledger_meta (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
        (key, value),
    )
