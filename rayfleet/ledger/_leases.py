"""Leases and fencing tokens: the rules that keep one writer per identity.

* A grant's token is strictly larger than every token issued before for that identity,
  and the raised high-water mark is written in the same transaction as the grant, so a
  restarted ledger never issues a token twice.
* Every write made on behalf of an identity presents ``(identity, token)`` and is checked
  by :func:`check_fence` in the transaction that writes: a token below the high-water
  mark is refused with ``StaleFencingTokenError``, an equal one accepted, a larger one
  (never issued) means the writer's lease is gone (``LeaseLostError``).
* A grant also stamps the continuity record with its token: the fence advances in the
  commit that grants, so there is no moment in which a grant exists and the previous
  owner could still write.
* Leases found live when the ledger opens are extended to one TTL from then
  (lock-delay): the ledger cannot know whether their holders are alive, and moving a
  live owner's agents would fence it needlessly. Leases already expired then are left
  expired.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping

from ..errors import (
    LeaseLostError,
    RayfleetError,
    StaleFencingTokenError,
    UnknownIdentityError,
)
from ..identity._names import format_runtime_id
from ..identity._values import LeaseDenied, LeaseGrant
from . import _views
from ._store import Transaction
from ._values import Activation


def new_session_id() -> str:
    return uuid.uuid4().hex


def apply_lock_delay(tx: Transaction, now: float) -> None:
    """Extend every lease still live at ``now`` to at least one TTL from ``now``.

    A lease that had expired already stays expired: its holder had stopped renewing
    before the ledger went down, so reviving it would only keep the identity
    unavailable for one more TTL after every restart.
    """
    tx.execute(
        "UPDATE leases SET expires_at = CASE WHEN expires_at < ? + ttl THEN ? + ttl ELSE expires_at END "
        "WHERE expires_at > ?",
        (now, now, now),
    )


def next_token(tx: Transaction, *, table: str, key: str, value: str) -> int:
    """Raise the high-water mark of ``value`` in ``table`` by one and return it (1 the first time).

    One statement (an upsert that returns the new mark), written in the caller's
    transaction, so the token is persisted exactly when the grant that uses it is.
    ``table`` and ``key`` are this package's own names, never user input.
    """
    row = tx.execute(
        f"INSERT INTO {table} ({key}, high_water) VALUES (?, 1) "
        f"ON CONFLICT({key}) DO UPDATE SET high_water = {table}.high_water + 1 RETURNING high_water",
        (value,),
    ).fetchone()
    assert row is not None  # RETURNING yields the upserted row
    return int(row[0])


def raise_high_water(tx: Transaction, identity: str) -> int:
    """Issue the next token of ``identity`` (persisted with the caller's transaction)."""
    return next_token(tx, table="fences", key="identity", value=identity)


def high_water(tx: Transaction, identity: str) -> int:
    row = tx.execute("SELECT high_water FROM fences WHERE identity = ?", (identity,)).fetchone()
    return 0 if row is None else int(row[0])


def check_fence(tx: Transaction, identity: str, token: int) -> None:
    """The one fencing check: raise unless ``token`` is the identity's current high-water mark."""
    row = tx.execute("SELECT high_water FROM fences WHERE identity = ?", (identity,)).fetchone()
    refusal = fence_refusal(identity, token, None if row is None else int(row[0]))
    if refusal is not None:
        raise refusal


def fence_marks(tx: Transaction, identities: Iterable[str]) -> dict[str, int]:
    """The high-water marks of many identities in a few reads (for :func:`fence_refusal`); absent ones left out."""
    marks: dict[str, int] = {}
    names = list(dict.fromkeys(identities))
    for start in range(0, len(names), IN_LIST):
        chunk = names[start:start + IN_LIST]
        query = f"SELECT identity, high_water FROM fences WHERE identity IN ({', '.join('?' * len(chunk))})"
        marks.update((row[0], int(row[1])) for row in tx.execute(query, chunk))
    return marks


def fence_refusal(identity: str, token: int, high_water: int | None) -> RayfleetError | None:
    """The fencing rule: ``token`` must equal the high-water mark (``None``: the identity does not exist)."""
    if high_water is None:
        return UnknownIdentityError(identity=identity)
    if token < high_water:
        return StaleFencingTokenError(identity=identity, presented=token, current=high_water)
    if token > high_water:
        return LeaseLostError(identity=identity, detail=f"token {token} was never issued (high-water {high_water})")
    return None


IN_LIST = 500
"""Identities per ``IN (...)`` list: well inside every store's limit on statement parameters."""


def acquire(
    tx: Transaction, *, holder: str, identities: Iterable[str], ttl: float, create_continuity: bool, now: float
) -> dict[str, Activation | LeaseDenied | RayfleetError]:
    results: dict[str, Activation | LeaseDenied | RayfleetError] = {}
    for identity in dict.fromkeys(identities):
        if not _views.exists(tx, identity):
            results[identity] = UnknownIdentityError(identity=identity)
            continue
        current = tx.execute("SELECT holder, expires_at FROM leases WHERE identity = ?", (identity,)).fetchone()
        if current is not None and current[0] != holder and current[1] > now:
            results[identity] = LeaseDenied(identity=identity, holder=current[0], expires_in=current[1] - now)
            continue
        token = raise_high_water(tx, identity)
        tx.execute(
            "INSERT INTO leases (identity, holder, token, ttl, expires_at) VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT(identity) DO UPDATE SET holder = excluded.holder, token = excluded.token, "
            "ttl = excluded.ttl, expires_at = excluded.expires_at",
            (identity, holder, token, ttl, now + ttl),
        )
        stamped = tx.execute("UPDATE continuity SET fence = ? WHERE identity = ?", (token, identity)).rowcount
        if not stamped and create_continuity:
            tx.execute(
                "INSERT INTO continuity (identity, runtime_id, session_id, generation, checkpoint_version, fence, "
                "snapshot_file, snapshot_row) VALUES (?, ?, ?, 0, 0, ?, NULL, NULL)",
                (identity, format_runtime_id(identity, 0), new_session_id(), token),
            )
        view = _views.view(tx, identity, now, with_state=True)
        if view is None:  # pragma: no cover - the identity row was read above, in this transaction
            raise UnknownIdentityError(identity=identity)
        results[identity] = Activation(
            grant=LeaseGrant(identity=identity, holder=holder, fencing_token=token, ttl=ttl), view=view,
            dedup=tuple(_views.dedup_rows(tx, identity)),
        )
    return results


_PRESENTED = "SELECT key, CAST(value AS TEXT) FROM json_each(?)"
"""The ``(identity, token)`` pairs of a JSON object ``{identity: token}`` bound to ``?``, tokens as text.

Written the same for SQLite (``json_each`` of an object) and PostgreSQL (``json_each(json)``)."""
_HELD = "(identity, CAST(token AS TEXT))"


def _presented(tokens: Mapping[str, int]) -> str:
    return json.dumps(dict(tokens), separators=(",", ":"))


def renew(tx: Transaction, *, holder: str, tokens: Mapping[str, int], now: float) -> frozenset[str]:
    """Extend each presented lease ``holder`` still holds with the presented token by its own TTL from ``now``.

    Returns the presented identities that were not renewed (lost): leased to someone
    else, under another token, or not leased at all.

    One statement moves every lease, and only lost identities come back as rows,
    whatever the number of leases. Work per lease that crossed into Python was what
    lost whole hosts: SQLite's driver hands the GIL over once per statement run and
    per row stepped, and with the host's event loop busy each handoff waited up to
    the interpreter's switch interval, so a host renewing 40,000 leases row by row
    took longer than the TTL and lost them all.
    """
    if not tokens:
        return frozenset()
    presented = _presented(tokens)
    renewed = tx.execute(f"UPDATE leases SET expires_at = ? + ttl WHERE holder = ? AND {_HELD} IN ({_PRESENTED})",
                         (now, holder, presented)).rowcount
    if renewed == len(tokens):
        return frozenset()
    return frozenset(row[0] for row in tx.execute(
        "SELECT key FROM json_each(?) WHERE (key, CAST(value AS TEXT)) NOT IN "
        "(SELECT identity, CAST(token AS TEXT) FROM leases WHERE holder = ?)", (presented, holder),
    ))


def release(tx: Transaction, *, holder: str, tokens: Mapping[str, int]) -> int:
    """Delete the presented leases ``holder`` still holds with the presented token, in one statement; how many."""
    if not tokens:
        return 0
    return int(tx.execute(f"DELETE FROM leases WHERE holder = ? AND {_HELD} IN ({_PRESENTED})",
                          (holder, _presented(tokens))).rowcount)


def free_holder(tx: Transaction, holder: str) -> list[str]:
    """Drop every lease of ``holder``; returns the freed identities, sorted."""
    freed = [row[0] for row in tx.execute("SELECT identity FROM leases WHERE holder = ? ORDER BY identity", (holder,))]
    tx.execute("DELETE FROM leases WHERE holder = ?", (holder,))
    return freed


def drop(tx: Transaction, identity: str) -> None:
    tx.execute("DELETE FROM leases WHERE identity = ?", (identity,))
