"""Peer edges: the explicit desired edges and the live edges (managed or found).

Edges are stored canonical (``a < b``). The reconcile arithmetic lives in
``rayfleet.topology``; this module only reads one consistent snapshot and applies a
computed change in one transaction.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from ..errors import UnknownIdentityError
from . import _views
from ._store import Transaction
from ._values import EdgeRow, TopologyChange, TopologySnapshot


def set_desired(tx: Transaction, *, a: str, b: str, desired: bool) -> None:
    for identity in (a, b):
        if not _views.exists(tx, identity):
            raise UnknownIdentityError(identity=identity)
    if desired:
        tx.execute("INSERT INTO desired_edges (a, b) VALUES (?, ?) ON CONFLICT DO NOTHING", (a, b))
    else:
        tx.execute("DELETE FROM desired_edges WHERE a = ? AND b = ?", (a, b))


def snapshot(tx: Transaction) -> TopologySnapshot:
    rows = tx.execute("SELECT identity, lifecycle, peers FROM identities ORDER BY identity").fetchall()
    return TopologySnapshot(
        lifecycles={row[0]: row[1] for row in rows},
        declared={row[0]: tuple(json.loads(row[2])) for row in rows},
        explicit=tuple((r[0], r[1]) for r in tx.execute("SELECT a, b FROM desired_edges ORDER BY a, b")),
        live=tuple(
            EdgeRow(a=r[0], b=r[1], managed=bool(r[2]))
            for r in tx.execute("SELECT a, b, managed FROM edges ORDER BY a, b")
        ),
    )


def apply(tx: Transaction, change: TopologyChange) -> None:
    for a, b in change.wire:
        tx.execute("INSERT INTO edges (a, b, managed) VALUES (?, ?, 1) ON CONFLICT(a, b) DO UPDATE SET managed = 1",
                   (a, b))
    for a, b in change.adopt:
        tx.execute("UPDATE edges SET managed = 1 WHERE a = ? AND b = ?", (a, b))
    for a, b in (*change.unwire, *change.forget):
        tx.execute("DELETE FROM edges WHERE a = ? AND b = ? AND managed = 1", (a, b))
    for a, b in change.link:
        tx.execute("INSERT INTO edges (a, b, managed) VALUES (?, ?, 0) ON CONFLICT DO NOTHING", (a, b))


def wired_peers(tx: Transaction, identities: Iterable[str]) -> dict[str, tuple[str, ...]]:
    names = list(identities)
    found = _views.wired_peers_of(tx, _views.presented(names))
    return {identity: found.get(identity, ()) for identity in names}


def drop(tx: Transaction, identity: str) -> None:
    tx.execute("DELETE FROM edges WHERE a = ? OR b = ?", (identity, identity))
    tx.execute("DELETE FROM desired_edges WHERE a = ? OR b = ?", (identity, identity))
