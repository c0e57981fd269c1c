"""Reads of identities across the tables: their rows, continuity records, leases, pause flags, peers.

Reads of many identities (:func:`views`, :func:`wired_peers_of`, :func:`dedup_rows_of`)
take one statement each and return one row, a JSON document. Reads only, inside the
caller's transaction, so a view is consistent with whatever the same transaction
checks or writes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from ..identity._values import ContinuityRecord, SnapshotPointer
from ._store import Cursor, Transaction, rows_in
from ._values import IdentityView, LeaseView


def exists(tx: Transaction, identity: str) -> bool:
    return lookup(tx, identity).fetchone() is not None


def lookup(tx: Transaction, identity: str) -> Cursor:
    """The query :func:`exists` answers (a row if the identity exists), for a caller that reads it later:
    on PostgreSQL it travels with the statements sent up to that read, in one round trip."""
    return tx.execute("SELECT 1 FROM identities WHERE identity = ?", (identity,))


HOLDER_OF_LEASE = "LEFT JOIN holders h ON h.holder = l.holder"
"""Joins each lease ``l`` to its holder's liveness row ``h`` (none for a holder that keeps no such row)."""
LEASE_EXPIRES = "CASE WHEN h.expires_at > l.expires_at THEN h.expires_at ELSE l.expires_at END"
"""When lease ``l`` (joined by :data:`HOLDER_OF_LEASE`) expires: its own date, or its holder's if later.

A lease lives while either is ahead: a grant or a renewal of the lease dates the
lease, a renewal of its holder dates every lease the holder holds (see
``_leases.renew_holder``)."""


def leases(tx: Transaction, identities: Iterable[str], now: float) -> dict[str, LeaseView | None]:
    """The live lease on each of ``identities`` that exists (``None``: none, or expired).

    A few statements for any number of identities (a router asks about a thousand at once).
    """
    return {
        row[0]: _live_lease(*row[1:], now=now)
        for row in rows_in(tx, f"SELECT i.identity, l.holder, l.token, l.ttl, {LEASE_EXPIRES} FROM identities i "
                               f"LEFT JOIN leases l ON l.identity = i.identity {HOLDER_OF_LEASE} WHERE i.identity IN",
                           identities)
    }


def _live_lease(holder: str | None, token: int, ttl: float, expires_at: float, *, now: float) -> LeaseView | None:
    """A lease row (``holder`` ``None``: no row) as seen at ``now``: ``None`` unless it is live."""
    if holder is None or expires_at - now <= 0:
        return None
    return LeaseView(holder=holder, fencing_token=token, ttl=ttl, expires_in=expires_at - now)


def continuity(
    tx: Transaction, identity: str, *, with_state: bool = False,
) -> tuple[ContinuityRecord | None, SnapshotPointer | None]:
    """The record and the snapshot pointer; ``with_state`` loads a State kept in the ledger into the pointer."""
    row = tx.execute(
        "SELECT runtime_id, session_id, generation, checkpoint_version, fence, snapshot_file, snapshot_row, "
        f"{'snapshot_inline' if with_state else 'NULL'} FROM continuity WHERE identity = ?",
        (identity,),
    ).fetchone()
    if row is None:
        return None, None
    return _continuity_of(identity, *row[:7], inline=None if row[7] is None else bytes(row[7]))


def _continuity_of(
    identity: str, runtime_id: str | None, session_id: str, generation: int, version: int, fencing_token: int,
    file: str | None, file_row: int | None, *, inline: bytes | None,
) -> tuple[ContinuityRecord | None, SnapshotPointer | None]:
    """A continuity row's record and snapshot pointer (``runtime_id`` ``None``: no row)."""
    if runtime_id is None:
        return None, None
    record = ContinuityRecord(
        identity=identity, runtime_id=runtime_id, session_id=session_id, generation=generation,
        checkpoint_version=version, fencing_token=fencing_token,
    )
    pointer = None if file is None or file_row is None else SnapshotPointer(
        file=file, row=file_row, version=version, inline=inline,
    )
    return record, pointer


def presented(identities: Iterable[str]) -> str:
    """``identities`` as the JSON object parameter a set-based statement reads with ``json_each(?)`` (its keys)."""
    return json.dumps(dict.fromkeys(identities, 0), separators=(",", ":"))


def json_rows(tx: Transaction, sql: str, parameters: Sequence[Any]) -> list[list[Any]]:
    """The rows of a statement whose one column is ``tx.dialect.rows_json(...)`` (none for no rows).

    Many rows come back as one: a row stepped costs the SQLite driver a GIL handoff,
    which on a busy host's process waits up to the interpreter's switch interval.
    """
    row = tx.execute(sql, parameters).fetchone()
    return [] if row is None or row[0] is None else list(json.loads(row[0]))


def views(
    tx: Transaction, identities: Iterable[str], now: float, *, with_state: bool = False,
) -> dict[str, IdentityView]:
    """The views of those of ``identities`` that exist (in the order given), in two statements whatever their number.

    ``with_state`` loads a State kept in the ledger into each snapshot pointer.
    """
    names = list(identities)
    wanted = presented(names)
    dialect = tx.dialect
    inline = dialect.hex_of("c.snapshot_inline") if with_state else "NULL"
    columns = dialect.rows_json(
        "i.identity", dialect.hex_of("i.spec"), "i.fingerprint", "i.agent_class", "i.labels", "i.lifecycle",
        "i.reason", "i.addressability", "i.peers", "c.runtime_id", "c.session_id", "c.generation",
        "c.checkpoint_version", "c.fence", "c.snapshot_file", "c.snapshot_row", inline, "l.holder", "l.token",
        "l.ttl", LEASE_EXPIRES, "p.identity",
        # At most one: a suspended turn holds the identity's mailbox (see rayfleet.turns).
        "(SELECT min(t.turn_id) FROM turns t WHERE t.identity = i.identity AND t.status = 'SUSPENDED')",
        # A turn left running by an owner that stopped: its re-send replays it from its journal.
        "(SELECT min(t.turn_id) FROM turns t WHERE t.identity = i.identity AND t.status = 'RUNNING')",
        # Messages its mailbox holds: the next owner replays them (one index probe).
        "(SELECT min(k.seq) FROM parked k WHERE k.identity = i.identity)",
    )
    rows = json_rows(tx, (
        f"SELECT {columns} FROM identities i LEFT JOIN continuity c ON c.identity = i.identity "
        f"LEFT JOIN leases l ON l.identity = i.identity {HOLDER_OF_LEASE} "
        "LEFT JOIN paused p ON p.identity = i.identity "
        "WHERE i.identity IN (SELECT key FROM json_each(?))"
    ), (wanted,))
    peers = wired_peers_of(tx, wanted)
    found: dict[str, IdentityView] = {}
    for (identity, spec, fingerprint, agent_class, labels, lifecycle, reason, addressability, declared, runtime_id,
         session_id, generation, version, record_token, file, file_row, state, holder, token, ttl, expires_at,
         paused, suspended, running, parked) in rows:
        record, pointer = _continuity_of(identity, runtime_id, session_id, generation, version, record_token, file,
                                         file_row, inline=None if state is None else bytes.fromhex(state))
        found[identity] = IdentityView(
            identity=identity, spec=bytes.fromhex(spec), fingerprint=fingerprint, agent_class=agent_class,
            labels=json.loads(labels), addressability=addressability, lifecycle=lifecycle, reason=reason,
            continuity=record, snapshot=pointer, lease=_live_lease(holder, token, ttl, expires_at, now=now),
            paused=paused is not None, declared_peers=tuple(json.loads(declared)),
            wired_peers=peers.get(identity, ()), suspended_turn=suspended, running_turn=running,
            parked=parked is not None,
        )
    return {name: found[name] for name in names if name in found}


def wired_peers_of(tx: Transaction, wanted: str) -> dict[str, tuple[str, ...]]:
    """The wired peers of each identity of ``wanted`` (a :func:`presented` parameter) that has any, sorted."""
    pairs = json_rows(tx, (
        f"SELECT {tx.dialect.rows_json('e.owner', 'e.peer')} FROM ("
        "SELECT a AS owner, b AS peer FROM edges WHERE a IN (SELECT key FROM json_each(?)) "
        "UNION SELECT b AS owner, a AS peer FROM edges WHERE b IN (SELECT key FROM json_each(?))) e"
    ), (wanted, wanted))
    grouped: dict[str, list[str]] = {}
    for owner, peer in pairs:
        grouped.setdefault(owner, []).append(peer)
    return {owner: tuple(sorted(found)) for owner, found in grouped.items()}


def dedup_rows_of(tx: Transaction, identities: Iterable[str]) -> dict[str, list[tuple[str, bytes]]]:
    """The remembered idempotency keys of each of ``identities`` with their pickled replies, oldest first."""
    rows = json_rows(tx, (
        f"SELECT {tx.dialect.rows_json('identity', 'seq', 'key', tx.dialect.hex_of('reply'))} FROM dedup "
        "WHERE identity IN (SELECT key FROM json_each(?))"
    ), (presented(identities),))
    rows.sort(key=lambda row: row[1])
    grouped: dict[str, list[tuple[str, bytes]]] = {}
    for identity, _, key, reply in rows:
        grouped.setdefault(identity, []).append((key, bytes.fromhex(reply)))
    return grouped

