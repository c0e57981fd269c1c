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
* A lease lives until its own date, or while its holder's row in ``holders`` is live,
  whichever is later. A host renews that one row instead of each of its leases
  (:func:`renew_holder`); the row is only renewed while live, and armed again only
  after the holder renewed each lease it still hosts (:func:`renew`, which names the
  lost ones), so a row never keeps a lease that lapsed and was granted elsewhere.
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
from ._store import Transaction, rows_in
from ._values import Activation


def new_session_id() -> str:
    return uuid.uuid4().hex


def apply_lock_delay(tx: Transaction, now: float) -> None:
    """Extend every lease still live at ``now`` to at least one TTL from ``now``.

    A lease that had expired already stays expired: its holder had stopped renewing
    before the ledger went down, so reviving it would only keep the identity
    unavailable for one more TTL after every restart.
    """
    lock_delay(tx, ("leases", "holders"), now)


def lock_delay(tx: Transaction, tables: Iterable[str], now: float) -> None:
    """Extend every held row of ``tables`` (columns ``holder``, ``ttl``, ``expires_at``) live at ``now`` to one TTL on.

    The one lock-delay statement, for identity leases, holder rows and run leases.
    ``tables`` are this package's own names, never user input.
    """
    for table in tables:
        tx.execute(
            f"UPDATE {table} SET expires_at = CASE WHEN expires_at < ? + ttl THEN ? + ttl ELSE expires_at END "
            "WHERE holder IS NOT NULL AND expires_at > ?",
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
    return {row[0]: int(row[1]) for row in rows_in(tx, "SELECT identity, high_water FROM fences WHERE identity IN",
                                                     identities)}


def fence_refusal(identity: str, token: int, high_water: int | None) -> RayfleetError | None:
    """The fencing rule: ``token`` must equal the high-water mark (``None``: the identity does not exist)."""
    if high_water is None:
        return UnknownIdentityError(identity=identity)
    if token < high_water:
        return StaleFencingTokenError(identity=identity, presented=token, current=high_water)
    if token > high_water:
        return LeaseLostError(identity=identity, detail=f"token {token} was never issued (high-water {high_water})")
    return None


def acquire(
    tx: Transaction, *, holder: str, identities: Iterable[str], ttl: float, create_continuity: bool, now: float
) -> dict[str, Activation | LeaseDenied | RayfleetError]:
    """Grant ``holder`` the lease of each of ``identities`` that is free, or its own, under a new token.

    Set-based: a handful of statements for any number of identities, each read
    returning one row (see :func:`_views.json_rows`). Row by row, an activation batch
    of 256 identities on a busy host held the store's write lock for over 6 s, and
    every other writer of the file (lease renewals included) waited that long.
    """
    wanted = list(dict.fromkeys(identities))
    dialect = tx.dialect
    found = {
        identity: (lease_holder, expires_at, has_record)
        for identity, lease_holder, expires_at, has_record in _views.json_rows(tx, (
            f"SELECT {dialect.rows_json('i.identity', 'l.holder', _views.LEASE_EXPIRES, 'c.identity')} "
            f"FROM identities i LEFT JOIN leases l ON l.identity = i.identity {_views.HOLDER_OF_LEASE} "
            "LEFT JOIN continuity c ON c.identity = i.identity WHERE i.identity IN (SELECT key FROM json_each(?))"
        ), (_views.presented(wanted),))
    }
    results: dict[str, Activation | LeaseDenied | RayfleetError] = {}
    granted: list[str] = []
    for identity in wanted:
        if identity not in found:
            results[identity] = UnknownIdentityError(identity=identity)
            continue
        lease_holder, expires_at, _ = found[identity]
        if lease_holder is not None and lease_holder != holder and expires_at > now:
            results[identity] = LeaseDenied(identity=identity, holder=lease_holder, expires_in=expires_at - now)
            continue
        granted.append(identity)
    if not granted:
        return results
    keys = _views.presented(granted)
    # The tokens: each identity's high-water mark raised by one, persisted with the grant.
    tx.execute("INSERT INTO fences (identity, high_water) SELECT key, 1 FROM json_each(?) WHERE true "
               "ON CONFLICT(identity) DO UPDATE SET high_water = fences.high_water + 1", (keys,))
    tx.execute(
        "INSERT INTO leases (identity, holder, token, ttl, expires_at) "
        "SELECT identity, ?, high_water, ?, ? FROM fences WHERE identity IN (SELECT key FROM json_each(?)) "
        "ON CONFLICT(identity) DO UPDATE SET holder = excluded.holder, token = excluded.token, "
        "ttl = excluded.ttl, expires_at = excluded.expires_at",
        (holder, ttl, now + ttl, keys),
    )
    tx.execute("UPDATE continuity SET fence = (SELECT high_water FROM fences WHERE identity = continuity.identity) "
               "WHERE identity IN (SELECT key FROM json_each(?))", (keys,))
    unrecorded = [identity for identity in granted if not found[identity][2]]
    if create_continuity and unrecorded:
        runtime_ids = {identity: format_runtime_id(identity, 0) for identity in unrecorded}
        sessions = {identity: new_session_id() for identity in unrecorded}
        # Materialized, the sessions get an index (SQLite builds one on the fly; PostgreSQL
        # hashes them): joined as a second table function, SQLite scanned all of them for
        # every identity, 2 s for 5,000.
        tx.execute(
            f"WITH s AS MATERIALIZED (SELECT key, value FROM {dialect.each_text}(?)) "
            "INSERT INTO continuity (identity, runtime_id, session_id, generation, checkpoint_version, fence, "
            "snapshot_file, snapshot_row) SELECT r.key, r.value, s.value, 0, 0, f.high_water, NULL, NULL "
            f"FROM {dialect.each_text}(?) r JOIN s ON s.key = r.key JOIN fences f ON f.identity = r.key",
            (json.dumps(sessions), json.dumps(runtime_ids)),
        )
    views = _views.views(tx, granted, now, with_state=True)
    dedup = _views.dedup_rows_of(tx, granted)
    for identity in granted:
        view = views[identity]  # its identity row was read above, in this transaction
        assert view.lease is not None  # granted just now, for ttl > 0
        results[identity] = Activation(
            grant=LeaseGrant(identity=identity, holder=holder, fencing_token=view.lease.fencing_token, ttl=ttl),
            view=view, dedup=tuple(dedup.get(identity, ())),
        )
    return {identity: results[identity] for identity in wanted}


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


def renew_holder(tx: Transaction, *, holder: str, ttl: float, now: float) -> bool:
    """Keep every lease ``holder`` holds live until ``ttl`` from ``now``, in one row write, if ``holder`` is live.

    ``False`` (and nothing written) when the holder's row has lapsed or was never
    armed: then some of its leases may have lapsed too and been granted to others,
    so the holder must renew each lease it still hosts (:func:`renew`, which names
    the lost ones) and then :func:`arm_holder`. A live row means no lease of the
    holder lapsed since the row was armed, so nothing was taken from it.
    """
    return tx.execute("UPDATE holders SET ttl = ?, expires_at = ? + ? WHERE holder = ? AND expires_at > ?",
                      (ttl, now, ttl, holder, now)).rowcount == 1


def arm_holder(tx: Transaction, *, holder: str, ttl: float, now: float) -> int:
    """Make ``holder``'s row live until ``ttl`` from ``now``, so that :func:`renew_holder` keeps its leases.

    Leases of ``holder`` that have lapsed by their own date are deleted first (how
    many is returned): the holder renewed every lease it still hosts just before,
    so those are ones it no longer hosts (a release that failed), and a live row
    must not revive them. Lapsed rows of any holder go too: they extend nothing.
    """
    if renew_holder(tx, holder=holder, ttl=ttl, now=now):
        return 0
    lapsed = tx.execute("DELETE FROM leases WHERE holder = ? AND expires_at <= ?", (holder, now)).rowcount
    tx.execute("DELETE FROM holders WHERE expires_at <= ?", (now,))
    tx.execute("INSERT INTO holders (holder, ttl, expires_at) VALUES (?, ?, ?)", (holder, ttl, now + ttl))
    return int(lapsed)


def free_holder(tx: Transaction, holder: str) -> list[str]:
    """Drop every lease of ``holder`` and its liveness row; returns the freed identities, sorted."""
    freed = [row[0] for row in tx.execute("SELECT identity FROM leases WHERE holder = ? ORDER BY identity", (holder,))]
    tx.execute("DELETE FROM leases WHERE holder = ?", (holder,))
    tx.execute("DELETE FROM holders WHERE holder = ?", (holder,))
    return freed


def drop(tx: Transaction, identity: str) -> None:
    tx.execute("DELETE FROM leases WHERE identity = ?", (identity,))
