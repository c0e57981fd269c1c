"""Registered hosts: one row per host name, holding the lease holder id of its live incarnation.

Ray runs at most one actor per name, so a new incarnation registering under a name
proves the previous one dead: its leases are freed in the same transaction.
"""

from __future__ import annotations

from . import _leases
from ._store import Transaction
from ._values import HostInfo


def register(tx: Transaction, *, name: str, holder: str, now: float, node: str | None = None,
             pid: int | None = None, process: str | None = None) -> list[str]:
    previous = tx.execute("SELECT holder FROM hosts WHERE name = ?", (name,)).fetchone()
    freed = _leases.free_holder(tx, previous[0]) if previous is not None and previous[0] != holder else []
    tx.execute(
        "INSERT INTO hosts (name, holder, started_at, draining, node, pid, process) VALUES (?, ?, ?, 0, ?, ?, ?) "
        "ON CONFLICT(name) DO UPDATE SET holder = excluded.holder, started_at = excluded.started_at, draining = 0, "
        "node = excluded.node, pid = excluded.pid, process = excluded.process",
        (name, holder, now, node, pid, process),
    )
    return freed


def remove(tx: Transaction, *, name: str, holder: str | None) -> list[str]:
    row = tx.execute("SELECT holder FROM hosts WHERE name = ?", (name,)).fetchone()
    if row is None or (holder is not None and row[0] != holder):
        return []
    freed = _leases.free_holder(tx, row[0])
    tx.execute("DELETE FROM hosts WHERE name = ?", (name,))
    return freed


def set_draining(tx: Transaction, *, name: str, draining: bool) -> None:
    tx.execute("UPDATE hosts SET draining = ? WHERE name = ?", (int(draining), name))


def hosts(tx: Transaction) -> list[HostInfo]:
    return [
        HostInfo(name=row[0], holder=row[1], started_at=row[2], draining=bool(row[3]), node=row[4], pid=row[5],
                 process=row[6])
        for row in tx.execute("SELECT name, holder, started_at, draining, node, pid, process FROM hosts ORDER BY name")
    ]
