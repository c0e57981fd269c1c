"""Identities: their specs, lifecycle markers, and the fenced operations that change a whole identity.

``reset`` and ``delete`` each touch several table groups in one transaction, so an
identity is never left half reset or half deleted.
"""

from __future__ import annotations

import json
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
from . import _checkpoints, _edges, _leases, _mailbox, _views
from ._store import Transaction
from ._values import IdentityView, RegisterOutcome, SpecRecord

LIFECYCLE_MARKERS = (PERSISTED_LIVE, PERSISTED_RETIRED, PERSISTED_BROKEN)


def register(tx: Transaction, record: SpecRecord, now: float) -> RegisterOutcome:
    row = tx.execute("SELECT fingerprint, lifecycle FROM identities WHERE identity = ?", (record.identity,)).fetchone()
    if row is not None:
        if row[0] != record.fingerprint:
            raise InvalidSpecError(
                f"identity {record.identity!r} already exists with a different spec; spawn is idempotent only "
                f"for the same spec. Use fleet.apply() to change a spec, or delete the identity first",
                field="spec",
            )
        return RegisterOutcome(created=False, lifecycle=row[1])
    write(tx, record, create=True, now=now)
    # Peers are stored as a JSON list of quoted names, so a quoted match is exact.
    awaited = tx.execute(
        "SELECT 1 FROM identities WHERE identity != ? AND peers LIKE ? LIMIT 1",
        (record.identity, f"%{json.dumps(record.identity)}%"),
    ).fetchone() is not None
    return RegisterOutcome(created=True, lifecycle=PERSISTED_LIVE, awaited=awaited)


def apply_specs(tx: Transaction, creates: Sequence[SpecRecord], updates: Sequence[SpecRecord], now: float) -> None:
    for record in creates:
        if _views.exists(tx, record.identity):
            raise InvalidSpecError(f"identity {record.identity!r} already exists", field="roster")
        write(tx, record, create=True, now=now)
    for record in updates:
        write(tx, record, create=False, now=now)


def write(tx: Transaction, record: SpecRecord, *, create: bool, now: float) -> None:
    """Insert or update one identity row."""
    columns = (
        record.spec, record.fingerprint, record.agent_class, json.dumps(dict(record.labels)),
        record.addressability, json.dumps(sorted(record.peers)),
    )
    if create:
        tx.execute(
            "INSERT INTO identities (identity, spec, fingerprint, agent_class, labels, addressability, peers, "
            "lifecycle, reason, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, '', ?)",
            (record.identity, *columns, PERSISTED_LIVE, now),
        )
        return
    changed = tx.execute(
        "UPDATE identities SET spec = ?, fingerprint = ?, agent_class = ?, labels = ?, addressability = ?, "
        "peers = ? WHERE identity = ?",
        (*columns, record.identity),
    ).rowcount
    if not changed:
        raise UnknownIdentityError(identity=record.identity)


def list_views(tx: Transaction, labels: Mapping[str, str] | None, now: float) -> list[IdentityView]:
    names = [row[0] for row in tx.execute("SELECT identity FROM identities ORDER BY identity")]
    views = [view for name in names if (view := _views.view(tx, name, now)) is not None]
    if labels:
        wanted = dict(labels)
        views = [view for view in views if all(view.labels.get(k) == v for k, v in wanted.items())]
    return views


def set_lifecycle(tx: Transaction, *, identity: str, fencing_token: int, lifecycle: str, reason: str) -> None:
    _leases.check_fence(tx, identity, fencing_token)
    tx.execute("UPDATE identities SET lifecycle = ?, reason = ? WHERE identity = ?", (lifecycle, reason, identity))


def reset(tx: Transaction, *, identity: str, fencing_token: int) -> ContinuityRecord:
    _leases.check_fence(tx, identity, fencing_token)
    record, _ = _views.continuity(tx, identity)
    generation = 0 if record is None else record.generation + 1
    fresh = ContinuityRecord(
        identity=identity, runtime_id=format_runtime_id(identity, generation), session_id=_leases.new_session_id(),
        generation=generation, checkpoint_version=0, fence=fencing_token,
    )
    tx.execute(
        "INSERT INTO continuity (identity, runtime_id, session_id, generation, checkpoint_version, fence, "
        "snapshot_file, snapshot_row) VALUES (?, ?, ?, ?, 0, ?, NULL, NULL) ON CONFLICT(identity) DO UPDATE SET "
        "runtime_id = excluded.runtime_id, session_id = excluded.session_id, generation = excluded.generation, "
        "checkpoint_version = 0, fence = excluded.fence, snapshot_file = NULL, snapshot_row = NULL",
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
    _checkpoints.forget_keys(tx, identity)
    _edges.drop(tx, identity)
    _mailbox.drop(tx, identity, now)
    # The high-water mark is kept forever, and one token is burnt, so the deleting
    # token (and any before it) is stale for an identity re-created under this name.
    _leases.raise_high_water(tx, identity)
    return pointer
