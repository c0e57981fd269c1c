"""Identities: their specs, lifecycle markers, and the fenced operations that change a whole identity.

``reset`` and ``delete`` each touch several table groups in one transaction, so an
identity is never left half reset or half deleted.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence

from ..errors import InvalidSpecError, UnknownIdentityError
from ..identity._names import format_runtime_id
from ..identity._values import (
    PERSISTED_BROKEN,
    PERSISTED_LIVE,
    PERSISTED_RETIRED,
    ContinuityRecord,
    SnapshotPointer,
)
from . import _approvals, _checkpoints, _edges, _leases, _mailbox, _signals, _timers, _turns, _views
from ._store import Transaction
from ._values import IdentityView, RegisterOutcome, SpecRecord

LIFECYCLE_MARKERS = (PERSISTED_LIVE, PERSISTED_RETIRED, PERSISTED_BROKEN)


def register(tx: Transaction, record: SpecRecord, now: float) -> RegisterOutcome:
    row = tx.execute("SELECT fingerprint, lifecycle FROM identities WHERE identity = ?", (record.identity,)).fetchone()
    if row is not None:
        if row[0] != record.fingerprint:
            raise _different_spec(record.identity)
        return RegisterOutcome(created=False, lifecycle=row[1])
    write(tx, record, create=True, now=now)
    return RegisterOutcome(created=True, lifecycle=PERSISTED_LIVE, awaited=bool(_awaited(tx, [record.identity])))


def register_many(tx: Transaction, records: Sequence[SpecRecord], now: float) -> list[RegisterOutcome]:
    """Register many identities in one transaction; each is idempotent as in :func:`register`.

    Existing identities are read in one statement, new ones written with one statement
    per table, and which new ones are awaited read in one more, so the cost is per
    record, not per identity already in the fleet, and the statements are a handful.
    """
    found = _existing(tx, [record.identity for record in records])
    outcomes: list[RegisterOutcome] = []
    fresh: list[SpecRecord] = []
    for record in records:
        if record.identity in found:
            fingerprint, lifecycle = found[record.identity]
            if fingerprint != record.fingerprint:
                raise _different_spec(record.identity)
            outcomes.append(RegisterOutcome(created=False, lifecycle=lifecycle))
            continue
        found[record.identity] = (record.fingerprint, PERSISTED_LIVE)
        fresh.append(record)
        outcomes.append(RegisterOutcome(created=True, lifecycle=PERSISTED_LIVE))
    _insert(tx, fresh, now)
    awaited = _awaited(tx, [record.identity for record in fresh])
    return [
        RegisterOutcome(created=True, lifecycle=PERSISTED_LIVE, awaited=True)
        if outcome.created and record.identity in awaited else outcome
        for record, outcome in zip(records, outcomes, strict=True)
    ]


def _existing(tx: Transaction, identities: Sequence[str]) -> dict[str, tuple[str, str]]:
    """The fingerprint and lifecycle marker of each of ``identities`` that exists, in one statement."""
    return {
        identity: (fingerprint, lifecycle)
        for identity, fingerprint, lifecycle in _views.json_rows(tx, (
            f"SELECT {tx.dialect.rows_json('identity', 'fingerprint', 'lifecycle')} FROM identities "
            "WHERE identity IN (SELECT key FROM json_each(?))"
        ), (_views.presented(identities),))
    }


def _awaited(tx: Transaction, identities: Sequence[str]) -> set[str]:
    """Those of ``identities`` another identity already declares as a peer (their edges can be wired now)."""
    if not identities:
        return set()
    return {row[0] for row in _views.json_rows(tx, (
        f"SELECT {tx.dialect.rows_json('d.peer')} FROM (SELECT DISTINCT peer FROM declared_peers "
        "WHERE peer IN (SELECT key FROM json_each(?)) AND identity != peer) d"
    ), (_views.presented(identities),))}


def _different_spec(identity: str) -> InvalidSpecError:
    return InvalidSpecError(
        f"identity {identity!r} already exists with a different spec; spawn is idempotent only "
        f"for the same spec. Use fleet.apply() to change a spec, or delete the identity first",
        field="spec",
    )


def apply_specs(tx: Transaction, creates: Sequence[SpecRecord], updates: Sequence[SpecRecord], now: float) -> None:
    """Create ``creates`` (none may exist yet, each named once) and update ``updates``.

    The creates take a few statements whatever their number.
    """
    if creates:
        names = [record.identity for record in creates]
        existing = sorted(_existing(tx, names))
        repeated = sorted(name for name, count in Counter(names).items() if count > 1)
        if existing or repeated:
            raise InvalidSpecError(f"identity {(existing or repeated)[0]!r} already exists", field="roster")
        _insert(tx, creates, now)
    for record in updates:
        write(tx, record, create=False, now=now)


def write(tx: Transaction, record: SpecRecord, *, create: bool, now: float) -> None:
    """Insert or update one identity row, with its label and declared-peer index rows."""
    if create:
        _insert(tx, [record], now)
        return
    changed = tx.execute(
        "UPDATE identities SET spec = ?, fingerprint = ?, agent_class = ?, labels = ?, addressability = ?, "
        "peers = ? WHERE identity = ?",
        (*_columns(record), record.identity),
    ).rowcount
    if not changed:
        raise UnknownIdentityError(identity=record.identity)
    _drop_index_rows(tx, record.identity)
    _insert_index_rows(tx, [record])


def _columns(record: SpecRecord) -> tuple[object, ...]:
    return (
        record.spec, record.fingerprint, record.agent_class, json.dumps(dict(record.labels)),
        record.addressability, json.dumps(sorted(record.peers)),
    )


def _insert(tx: Transaction, records: Sequence[SpecRecord], now: float) -> None:
    if not records:
        return
    tx.executemany(
        "INSERT INTO identities (identity, spec, fingerprint, agent_class, labels, addressability, peers, "
        "lifecycle, reason, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, '', ?)",
        [(record.identity, *_columns(record), PERSISTED_LIVE, now) for record in records],
    )
    _insert_index_rows(tx, records)


def _insert_index_rows(tx: Transaction, records: Sequence[SpecRecord]) -> None:
    labels = [(r.identity, key, str(value)) for r in records for key, value in sorted(r.labels.items())]
    peers = [(r.identity, peer) for r in records for peer in sorted(set(r.peers))]
    if labels:
        tx.executemany("INSERT INTO identity_labels (identity, key, value) VALUES (?, ?, ?)", labels)
    if peers:
        tx.executemany("INSERT INTO declared_peers (identity, peer) VALUES (?, ?)", peers)


def _drop_index_rows(tx: Transaction, identity: str) -> None:
    tx.execute("DELETE FROM identity_labels WHERE identity = ?", (identity,))
    tx.execute("DELETE FROM declared_peers WHERE identity = ?", (identity,))


def list_views(tx: Transaction, labels: Mapping[str, str] | None, now: float) -> list[IdentityView]:
    """Views of every identity whose labels include ``labels`` (all of them without), sorted.

    The label filter runs on the ``identity_labels`` index, so asking for a few
    identities by label does not read the rest of the fleet.
    """
    names = _labelled(tx, labels)
    found = _views.views(tx, names, now)
    return [found[name] for name in names if name in found]


def select(tx: Transaction, labels: Mapping[str, str], lifecycle: str) -> list[str]:
    """The names of the identities in ``lifecycle`` whose labels include ``labels``, sorted: one query."""
    return _labelled(tx, labels, lifecycle=lifecycle)


def _labelled(tx: Transaction, labels: Mapping[str, str] | None, *, lifecycle: str | None = None) -> list[str]:
    conditions: list[str] = []
    parameters: list[str] = []
    for key, value in sorted(dict(labels or {}).items()):
        conditions.append("identity IN (SELECT identity FROM identity_labels WHERE key = ? AND value = ?)")
        parameters += [key, str(value)]
    if lifecycle is not None:
        conditions.append("lifecycle = ?")
        parameters.append(lifecycle)
    where = f" WHERE {' AND '.join(conditions)}" if conditions else ""
    return [row[0] for row in tx.execute(f"SELECT identity FROM identities{where} ORDER BY identity", parameters)]


def set_lifecycle(tx: Transaction, *, identity: str, fencing_token: int, lifecycle: str, reason: str) -> None:
    _leases.check_fence(tx, identity, fencing_token)
    tx.execute("UPDATE identities SET lifecycle = ?, reason = ? WHERE identity = ?", (lifecycle, reason, identity))


def reset(tx: Transaction, *, identity: str, fencing_token: int) -> ContinuityRecord:
    _leases.check_fence(tx, identity, fencing_token)
    record, _ = _views.continuity(tx, identity)
    generation = 0 if record is None else record.generation + 1
    fresh = ContinuityRecord(
        identity=identity, runtime_id=format_runtime_id(identity, generation), session_id=_leases.new_session_id(),
        generation=generation, checkpoint_version=0, fencing_token=fencing_token,
    )
    tx.execute(
        "INSERT INTO continuity (identity, runtime_id, session_id, generation, checkpoint_version, fence, "
        "snapshot_file, snapshot_row) VALUES (?, ?, ?, ?, 0, ?, NULL, NULL) ON CONFLICT(identity) DO UPDATE SET "
        "runtime_id = excluded.runtime_id, session_id = excluded.session_id, generation = excluded.generation, "
        "checkpoint_version = 0, fence = excluded.fence, snapshot_file = NULL, snapshot_row = NULL, "
        "snapshot_inline = NULL, committed_at = NULL",
        (identity, fresh.runtime_id, fresh.session_id, generation, fencing_token),
    )
    tx.execute("UPDATE identities SET lifecycle = ?, reason = '' WHERE identity = ?", (PERSISTED_LIVE, identity))
    # A new generation starts with a fresh State, so it must not replay replies of the old one.
    _checkpoints.forget_keys(tx, identity)
    return fresh


def delete(tx: Transaction, *, identity: str, fencing_token: int, now: float) -> SnapshotPointer | None:
    _leases.check_fence(tx, identity, fencing_token)
    _, pointer = _views.continuity(tx, identity)
    tx.execute("DELETE FROM continuity WHERE identity = ?", (identity,))
    _leases.drop(tx, identity)
    tx.execute("DELETE FROM identities WHERE identity = ?", (identity,))
    _drop_index_rows(tx, identity)
    _checkpoints.forget_keys(tx, identity)
    _edges.drop(tx, identity)
    _mailbox.drop(tx, identity, now)
    _turns.drop(tx, identity)
    _signals.drop(tx, identity)
    _approvals.drop(tx, identity)
    _timers.drop(tx, identity)
    # The high-water mark is kept forever, and one token is burnt, so the deleting
    # token (and any before it) is stale for an identity re-created under this name.
    _leases.raise_high_water(tx, identity)
    return pointer
