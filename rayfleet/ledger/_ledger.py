"""The ledger: the one authority for leases, fencing tokens, continuity records and hosts.

Fencing rules (DESIGN.md section 4; Kleppmann's fencing tokens, Chubby's sequencers):

* a grant's token is strictly larger than every token issued before for that identity,
  and the new high-water mark is committed before the grant is returned, so a
  restarted ledger never issues a token twice;
* every write made on behalf of an identity presents ``(identity, token)``; a token
  below the high-water mark is refused with ``StaleFencingTokenError``, an equal one
  is accepted; the check and the write are one transaction;
* checkpoint versions strictly increase (``StaleCheckpointVersionError`` otherwise);
* after a restart, leases that were held are not granted to another holder until one
  TTL has passed (lock-delay), so a live owner is not fenced needlessly.

Fence advance is part of the grant: the transaction that raises the high-water mark
also stamps the continuity record with the new token. The seed advances the fence
with a separate upsert right after acquiring; doing both in one commit closes the
window in which a grant exists but the old owner could still write.

The class is synchronous over SQLite (WAL, ``synchronous=FULL``). It is wrapped by a
Ray actor in ``rayfleet.platform``; the ``LedgerStore`` seam lets a networked
database replace SQLite later.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import (
    InvalidSpecError,
    LeaseLostError,
    RayfleetError,
    StaleCheckpointVersionError,
    StaleFencingTokenError,
    UnknownIdentityError,
)
from ..identity._names import format_runtime_id
from ..identity._values import (
    PERSISTED_BROKEN,
    PERSISTED_LIVE,
    PERSISTED_RETIRED,
    ContinuityRecord,
    LeaseDenied,
    LeaseGrant,
    SnapshotPointer,
)

DEFAULT_LEASE_TTL = 10.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS identities (
    identity TEXT PRIMARY KEY,
    spec BLOB NOT NULL,
    fingerprint TEXT NOT NULL,
    agent_class TEXT NOT NULL,
    labels TEXT NOT NULL,
    addressability TEXT NOT NULL,
    peers TEXT NOT NULL DEFAULT '[]',
    lifecycle TEXT NOT NULL,
    reason TEXT NOT NULL DEFAULT '',
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS fences (
    identity TEXT PRIMARY KEY,
    high_water INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS leases (
    identity TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    token INTEGER NOT NULL,
    ttl REAL NOT NULL,
    expires_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS leases_by_holder ON leases(holder);
CREATE TABLE IF NOT EXISTS continuity (
    identity TEXT PRIMARY KEY,
    runtime_id TEXT NOT NULL,
    session_id TEXT NOT NULL,
    generation INTEGER NOT NULL,
    checkpoint_version INTEGER NOT NULL,
    fence INTEGER NOT NULL,
    snapshot_file TEXT,
    snapshot_row INTEGER
);
CREATE TABLE IF NOT EXISTS paused (
    identity TEXT PRIMARY KEY,
    since REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS parked (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    identity TEXT NOT NULL,
    message_id TEXT NOT NULL,
    envelope BLOB NOT NULL,
    parked_at REAL NOT NULL,
    UNIQUE(identity, message_id)
);
CREATE TABLE IF NOT EXISTS dead_letters (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    identity TEXT NOT NULL,
    message_id TEXT NOT NULL,
    envelope BLOB NOT NULL,
    reason TEXT NOT NULL,
    error TEXT NOT NULL,
    attempts INTEGER NOT NULL,
    at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS dead_letters_by_identity ON dead_letters(identity);
CREATE TABLE IF NOT EXISTS dedup (
    identity TEXT NOT NULL,
    key TEXT NOT NULL,
    reply BLOB NOT NULL,
    seq INTEGER NOT NULL,
    PRIMARY KEY (identity, key)
);
CREATE TABLE IF NOT EXISTS desired_edges (
    a TEXT NOT NULL,
    b TEXT NOT NULL,
    PRIMARY KEY (a, b)
);
CREATE TABLE IF NOT EXISTS edges (
    a TEXT NOT NULL,
    b TEXT NOT NULL,
    managed INTEGER NOT NULL,
    PRIMARY KEY (a, b)
);
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    workflow TEXT NOT NULL,
    code_version TEXT NOT NULL,
    status TEXT NOT NULL,
    detail TEXT NOT NULL DEFAULT '',
    definition BLOB,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    pause_requested INTEGER NOT NULL DEFAULT 0,
    outcome BLOB,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS journal (
    run_id TEXT NOT NULL,
    label TEXT NOT NULL,
    output BLOB NOT NULL,
    tokens INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    PRIMARY KEY (run_id, label)
);
CREATE TABLE IF NOT EXISTS compensations (
    run_id TEXT NOT NULL,
    label TEXT NOT NULL,
    ok INTEGER NOT NULL,
    error TEXT NOT NULL,
    seq INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS run_leases (
    run_id TEXT PRIMARY KEY,
    high_water INTEGER NOT NULL,
    holder TEXT
);
CREATE TABLE IF NOT EXISTS hosts (
    name TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    started_at REAL NOT NULL,
    draining INTEGER NOT NULL DEFAULT 0
);
"""


@dataclass(frozen=True, slots=True, kw_only=True)
class RegisterOutcome:
    """What ``register`` did: created the identity, or found an identical one."""

    created: bool
    lifecycle: str
    awaited: bool = False
    """Some other identity already declares this one as a peer (its edge can be wired now)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseView:
    holder: str
    fencing_token: int
    ttl: float
    expires_in: float


@dataclass(frozen=True, slots=True, kw_only=True)
class IdentityView:
    """Everything the ledger holds about one identity (read-only)."""

    identity: str
    spec: bytes
    """The cloudpickled ``AgentSpec``."""
    fingerprint: str
    agent_class: str
    labels: dict[str, str]
    addressability: str
    lifecycle: str
    reason: str
    continuity: ContinuityRecord | None
    snapshot: SnapshotPointer | None
    lease: LeaseView | None
    paused: bool = False
    declared_peers: tuple[str, ...] = ()
    """Peers named in the spec (desired edges)."""
    wired_peers: tuple[str, ...] = ()
    """Peers it is wired to now (live edges), which ``self.peers`` shows."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Activation:
    """The result of acquiring an identity to host it: grant plus what to load."""

    grant: LeaseGrant
    view: IdentityView
    dedup: tuple[tuple[str, bytes], ...] = ()
    """The identity's remembered idempotency keys and replies, oldest first."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointCommit:
    """One pointer to commit: identity, the writer's token, the new version and row.

    ``dedup`` carries the idempotency keys (and pickled replies) of the turns this
    checkpoint covers, committed in the same transaction as the pointer, so a key is
    remembered exactly when the effect it guards is durable.
    """

    identity: str
    fencing_token: int
    version: int
    pointer: SnapshotPointer
    dedup: tuple[tuple[str, bytes], ...] = ()
    dedup_capacity: int = 10_000


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredMessage:
    """A parked message or a dead letter as the ledger keeps it (payload still pickled)."""

    id: int
    identity: str
    message_id: str
    envelope: bytes
    at: float
    reason: str = ""
    error: str = ""
    attempts: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class HostView:
    name: str
    holder: str
    started_at: float
    draining: bool


class Ledger:
    """Leases, fencing and continuity over one SQLite database file.

    Thread-safe (one connection, one lock): the actor wrapping it may call from
    several threads. Every public method is one transaction.
    """

    def __init__(self, path: str | Path, *, clock: Callable[[], float] = time.time) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._clock = clock
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)
        self.incarnation = uuid.uuid4().hex[:8]
        self._apply_lock_delay()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _apply_lock_delay(self) -> None:
        # A restarted ledger cannot know whether a holder is still alive, so every lease
        # it finds is extended to at least one TTL from now; the holder can keep renewing.
        now = self._clock()
        with self._transaction() as db:
            db.execute("UPDATE leases SET expires_at = MAX(expires_at, ? + ttl)", (now,))

    # -- identities ---------------------------------------------------------------

    def register(
        self, *, identity: str, spec: bytes, fingerprint: str, agent_class: str, labels: Mapping[str, str],
        addressability: str = "ADDRESSABLE", peers: Iterable[str] = (),
    ) -> RegisterOutcome:
        """Record a spawned identity; idempotent for an identical spec.

        Raises:
            InvalidSpecError: if the identity exists with a different spec.
        """
        with self._transaction() as db:
            row = db.execute(
                "SELECT fingerprint, lifecycle FROM identities WHERE identity = ?", (identity,)
            ).fetchone()
            if row is not None:
                if row[0] != fingerprint:
                    raise InvalidSpecError(
                        f"identity {identity!r} already exists with a different spec; spawn is idempotent only "
                        f"for the same spec. Use fleet.apply() to change a spec, or delete the identity first",
                        subject="spec",
                    )
                return RegisterOutcome(created=False, lifecycle=row[1])
            self._write_identity(db, {
                "identity": identity, "spec": spec, "fingerprint": fingerprint, "agent_class": agent_class,
                "labels": labels, "addressability": addressability, "peers": tuple(peers),
            }, create=True)
            # Peers are stored as a JSON list of quoted names, so a quoted match is exact.
            awaited = db.execute(
                "SELECT 1 FROM identities WHERE identity != ? AND peers LIKE ? LIMIT 1",
                (identity, f'%{json.dumps(identity)}%'),
            ).fetchone() is not None
            return RegisterOutcome(created=True, lifecycle=PERSISTED_LIVE, awaited=awaited)

    def update_spec(
        self, *, identity: str, spec: bytes, fingerprint: str, agent_class: str, labels: Mapping[str, str],
        addressability: str = "ADDRESSABLE", peers: Iterable[str] = (),
    ) -> None:
        """Replace the spec of an existing identity."""
        self.apply_specs(creates=[], updates=[{
            "identity": identity, "spec": spec, "fingerprint": fingerprint, "agent_class": agent_class,
            "labels": labels, "addressability": addressability, "peers": tuple(peers),
        }])

    def apply_specs(self, *, creates: list[dict[str, Any]], updates: list[dict[str, Any]]) -> None:
        """Create and update many identities in one transaction (a roster applies whole or not at all).

        Each item has the keyword arguments of :meth:`register`.
        """
        with self._transaction() as db:
            for item in creates:
                if db.execute("SELECT 1 FROM identities WHERE identity = ?", (item["identity"],)).fetchone():
                    raise InvalidSpecError(f"identity {item['identity']!r} already exists", subject="roster")
                self._write_identity(db, item, create=True)
            for item in updates:
                self._write_identity(db, item, create=False)

    def _write_identity(self, db: sqlite3.Connection, item: Mapping[str, Any], *, create: bool) -> None:
        """Insert or update one identity row from the keyword arguments of :meth:`register`."""
        columns = (
            item["spec"], item["fingerprint"], item["agent_class"], json.dumps(dict(item.get("labels", {}))),
            item.get("addressability", "ADDRESSABLE"), json.dumps(sorted(item.get("peers", ()))),
        )
        if create:
            db.execute("INSERT INTO identities VALUES (?, ?, ?, ?, ?, ?, ?, ?, '', ?)",
                       (item["identity"], *columns, PERSISTED_LIVE, self._clock()))
            return
        changed = db.execute(
            "UPDATE identities SET spec = ?, fingerprint = ?, agent_class = ?, labels = ?, addressability = ?, "
            "peers = ? WHERE identity = ?",
            (*columns, item["identity"]),
        ).rowcount
        if not changed:
            raise UnknownIdentityError(identity=str(item["identity"]))

    def resolve(self, identities: Iterable[str]) -> dict[str, IdentityView]:
        """Views of the given identities; unknown ones are absent from the result."""
        with self._lock:
            return {
                identity: view
                for identity in identities
                if (view := self._view(self._db, identity)) is not None
            }

    def list_identities(self, *, labels: Mapping[str, str] | None = None) -> list[IdentityView]:
        """All identities, sorted, optionally only those whose labels include ``labels``."""
        with self._lock:
            names = [row[0] for row in self._db.execute("SELECT identity FROM identities ORDER BY identity")]
            views = [view for name in names if (view := self._view(self._db, name)) is not None]
        if labels:
            wanted = dict(labels)
            views = [view for view in views if all(view.labels.get(k) == v for k, v in wanted.items())]
        return views

    def _view(self, db: sqlite3.Connection, identity: str) -> IdentityView | None:
        row = db.execute(
            "SELECT spec, fingerprint, agent_class, labels, lifecycle, reason, addressability, peers FROM identities "
            "WHERE identity = ?",
            (identity,),
        ).fetchone()
        if row is None:
            return None
        record, pointer = self._continuity(db, identity)
        return IdentityView(
            identity=identity,
            spec=row[0],
            fingerprint=row[1],
            agent_class=row[2],
            labels=json.loads(row[3]),
            addressability=row[6],
            lifecycle=row[4],
            reason=row[5],
            continuity=record,
            snapshot=pointer,
            lease=self._lease(db, identity),
            paused=db.execute("SELECT 1 FROM paused WHERE identity = ?", (identity,)).fetchone() is not None,
            declared_peers=tuple(json.loads(row[7])),
            wired_peers=tuple(self._wired_peers(db, identity)),
        )

    def _continuity(self, db: sqlite3.Connection, identity: str) -> tuple[ContinuityRecord | None, SnapshotPointer | None]:
        row = db.execute(
            "SELECT runtime_id, session_id, generation, checkpoint_version, fence, snapshot_file, snapshot_row "
            "FROM continuity WHERE identity = ?",
            (identity,),
        ).fetchone()
        if row is None:
            return None, None
        record = ContinuityRecord(
            identity=identity, runtime_id=row[0], session_id=row[1], generation=row[2],
            checkpoint_version=row[3], fence=row[4],
        )
        pointer = None if row[5] is None else SnapshotPointer(file=row[5], row=row[6], version=row[3])
        return record, pointer

    def _lease(self, db: sqlite3.Connection, identity: str) -> LeaseView | None:
        row = db.execute("SELECT holder, token, ttl, expires_at FROM leases WHERE identity = ?", (identity,)).fetchone()
        if row is None:
            return None
        expires_in = row[3] - self._clock()
        if expires_in <= 0:
            return None
        return LeaseView(holder=row[0], fencing_token=row[1], ttl=row[2], expires_in=expires_in)

    # -- leases -------------------------------------------------------------------

    def acquire(
        self, *, holder: str, identities: Iterable[str], ttl: float = DEFAULT_LEASE_TTL, create_continuity: bool = True
    ) -> dict[str, Activation | LeaseDenied | RayfleetError]:
        """Acquire leases on many identities in one commit.

        Each granted identity gets a token one above its high-water mark (a holder that
        re-acquires its own lease gets a new, larger token too: lifecycle operations
        use that to fence themselves). The continuity record is stamped with the new
        token, and created at generation 0 when ``create_continuity`` and none exists.

        Returns, per identity: an :class:`Activation`, a :class:`LeaseDenied` naming
        the current holder, or an ``UnknownIdentityError``.
        """
        if ttl <= 0:
            raise InvalidSpecError(f"lease ttl must be positive, got {ttl!r}", subject="ttl")
        results: dict[str, Activation | LeaseDenied | RayfleetError] = {}
        now = self._clock()
        with self._transaction() as db:
            for identity in dict.fromkeys(identities):
                if db.execute("SELECT 1 FROM identities WHERE identity = ?", (identity,)).fetchone() is None:
                    results[identity] = UnknownIdentityError(identity=identity)
                    continue
                current = db.execute("SELECT holder, expires_at FROM leases WHERE identity = ?", (identity,)).fetchone()
                if current is not None and current[0] != holder and current[1] > now:
                    results[identity] = LeaseDenied(identity=identity, holder=current[0], expires_in=current[1] - now)
                    continue
                token = self._raise_high_water(db, identity)
                db.execute(
                    "INSERT INTO leases VALUES (?, ?, ?, ?, ?) ON CONFLICT(identity) DO UPDATE SET "
                    "holder = excluded.holder, token = excluded.token, ttl = excluded.ttl, expires_at = excluded.expires_at",
                    (identity, holder, token, ttl, now + ttl),
                )
                stamped = db.execute("UPDATE continuity SET fence = ? WHERE identity = ?", (token, identity)).rowcount
                if not stamped and create_continuity:
                    db.execute(
                        "INSERT INTO continuity VALUES (?, ?, ?, 0, 0, ?, NULL, NULL)",
                        (identity, format_runtime_id(identity, 0), new_session_id(), token),
                    )
                view = self._view(db, identity)
                assert view is not None  # the identity row was checked above, in this transaction
                dedup = tuple(self._dedup_rows(db, identity))
                results[identity] = Activation(
                    grant=LeaseGrant(identity=identity, holder=holder, fencing_token=token, ttl=ttl), view=view,
                    dedup=dedup,
                )
        return results

    def _raise_high_water(self, db: sqlite3.Connection, identity: str) -> int:
        row = db.execute("SELECT high_water FROM fences WHERE identity = ?", (identity,)).fetchone()
        token = 1 if row is None else row[0] + 1
        db.execute(
            "INSERT INTO fences VALUES (?, ?) ON CONFLICT(identity) DO UPDATE SET high_water = excluded.high_water",
            (identity, token),
        )
        return token

    def renew(self, *, holder: str, tokens: Mapping[str, int]) -> dict[str, LeaseGrant | None]:
        """Extend many leases by their TTL in one commit; ``None`` means the lease is lost.

        A lease is renewed only if ``holder`` still holds it with the same token (an
        expired lease that nobody else took is renewed too: fencing, not the clock,
        decides who may write).
        """
        results: dict[str, LeaseGrant | None] = {}
        now = self._clock()
        with self._transaction() as db:
            for identity, token in tokens.items():
                row = db.execute("SELECT holder, token, ttl FROM leases WHERE identity = ?", (identity,)).fetchone()
                if row is None or row[0] != holder or row[1] != token:
                    results[identity] = None
                    continue
                db.execute("UPDATE leases SET expires_at = ? WHERE identity = ?", (now + row[2], identity))
                results[identity] = LeaseGrant(identity=identity, holder=holder, fencing_token=token, ttl=row[2])
        return results

    def release(self, *, holder: str, tokens: Mapping[str, int]) -> int:
        """Give up leases (only those still held with the given token); returns how many."""
        with self._transaction() as db:
            return sum(
                db.execute(
                    "DELETE FROM leases WHERE identity = ? AND holder = ? AND token = ?", (identity, holder, token)
                ).rowcount
                for identity, token in tokens.items()
            )

    def revoke_holder(self, holder: str) -> list[str]:
        """Drop every lease of a holder known to be dead; returns the freed identities.

        Safe without waiting for the TTL because fencing, not timing, protects state:
        should the holder still be alive, its next write presents a superseded token.
        """
        with self._transaction() as db:
            return self._free_holder(db, holder)

    @staticmethod
    def _free_holder(db: sqlite3.Connection, holder: str) -> list[str]:
        freed = [row[0] for row in db.execute("SELECT identity FROM leases WHERE holder = ? ORDER BY identity", (holder,))]
        db.execute("DELETE FROM leases WHERE holder = ?", (holder,))
        return freed

    # -- fenced writes ------------------------------------------------------------

    def _check_fence(self, db: sqlite3.Connection, identity: str, token: int) -> None:
        row = db.execute("SELECT high_water FROM fences WHERE identity = ?", (identity,)).fetchone()
        if row is None:
            raise UnknownIdentityError(identity=identity)
        if token < row[0]:
            raise StaleFencingTokenError(identity=identity, presented=token, current=row[0])
        if token > row[0]:
            raise LeaseLostError(identity=identity, detail=f"token {token} was never issued (high-water {row[0]})")

    def check_fence(self, identity: str, token: int) -> None:
        """Raise unless ``token`` is the identity's current high-water mark."""
        with self._lock:
            self._check_fence(self._db, identity, token)

    def commit_checkpoints(self, commits: Iterable[CheckpointCommit]) -> list[RayfleetError | None]:
        """Move many snapshot pointers in one transaction; each is checked on its own.

        Returns one entry per commit, ``None`` when accepted, else the refusal
        (``StaleFencingTokenError``, ``StaleCheckpointVersionError``, ...). Refused
        entries change nothing; accepted ones are durable when this returns.
        """
        outcomes: list[RayfleetError | None] = []
        with self._transaction() as db:
            for commit in commits:
                try:
                    self._check_fence(db, commit.identity, commit.fencing_token)
                    row = db.execute(
                        "SELECT checkpoint_version FROM continuity WHERE identity = ?", (commit.identity,)
                    ).fetchone()
                    if row is None:
                        raise UnknownIdentityError(identity=commit.identity)
                    if commit.version <= row[0]:
                        raise StaleCheckpointVersionError(
                            identity=commit.identity, presented=commit.version, current=row[0]
                        )
                    db.execute(
                        "UPDATE continuity SET checkpoint_version = ?, fence = ?, snapshot_file = ?, snapshot_row = ? "
                        "WHERE identity = ?",
                        (commit.version, commit.fencing_token, commit.pointer.file, commit.pointer.row, commit.identity),
                    )
                    if commit.dedup:
                        self._remember_keys(db, commit.identity, commit.dedup, commit.dedup_capacity)
                    outcomes.append(None)
                except RayfleetError as error:
                    outcomes.append(error)
        return outcomes

    def _remember_keys(
        self, db: sqlite3.Connection, identity: str, entries: tuple[tuple[str, bytes], ...], capacity: int
    ) -> None:
        row = db.execute("SELECT MAX(seq) FROM dedup WHERE identity = ?", (identity,)).fetchone()
        seq = row[0] or 0
        for key, reply in entries:
            seq += 1
            # First writer wins: a key already remembered keeps its original reply (FIFO, no refresh).
            db.execute("INSERT OR IGNORE INTO dedup VALUES (?, ?, ?, ?)", (identity, key, reply, seq))
        db.execute("DELETE FROM dedup WHERE identity = ? AND seq <= ?", (identity, seq - max(capacity, 1)))

    def dedup_window(self, identity: str) -> list[tuple[str, bytes]]:
        """The remembered idempotency keys of an identity, oldest first, with their replies."""
        with self._lock:
            return self._dedup_rows(self._db, identity)

    @staticmethod
    def _dedup_rows(db: sqlite3.Connection, identity: str) -> list[tuple[str, bytes]]:
        return [
            (row[0], row[1]) for row in db.execute("SELECT key, reply FROM dedup WHERE identity = ? ORDER BY seq", (identity,))
        ]

    # -- topology -------------------------------------------------------------------

    @staticmethod
    def _wired_peers(db: sqlite3.Connection, identity: str) -> list[str]:
        return [
            row[0] for row in db.execute(
                "SELECT b FROM edges WHERE a = ? UNION SELECT a FROM edges WHERE b = ? ORDER BY 1", (identity, identity)
            )
        ]

    def wired_peers(self, identities: Iterable[str]) -> dict[str, tuple[str, ...]]:
        """The live peers of each identity."""
        with self._lock:
            return {identity: tuple(self._wired_peers(self._db, identity)) for identity in identities}

    def set_desired_edge(self, *, a: str, b: str, desired: bool) -> None:
        """Add or remove an explicit desired edge (``a < b``, canonical)."""
        with self._transaction() as db:
            for identity in (a, b):
                if db.execute("SELECT 1 FROM identities WHERE identity = ?", (identity,)).fetchone() is None:
                    raise UnknownIdentityError(identity=identity)
            if desired:
                db.execute("INSERT OR IGNORE INTO desired_edges VALUES (?, ?)", (a, b))
            else:
                db.execute("DELETE FROM desired_edges WHERE a = ? AND b = ?", (a, b))

    def topology(self) -> dict[str, object]:
        """Everything reconciliation needs, read in one go (one consistent view)."""
        with self._lock:
            rows = self._db.execute("SELECT identity, lifecycle, peers FROM identities ORDER BY identity").fetchall()
            return {
                "identities": {row[0]: row[1] for row in rows},
                "declared": {row[0]: tuple(json.loads(row[2])) for row in rows},
                "explicit": [tuple(r) for r in self._db.execute("SELECT a, b FROM desired_edges ORDER BY a, b")],
                "live": [(r[0], r[1], bool(r[2])) for r in self._db.execute("SELECT a, b, managed FROM edges ORDER BY a, b")],
            }

    def apply_topology(
        self, *, wire: list[tuple[str, str]], adopt: list[tuple[str, str]], unwire: list[tuple[str, str]],
        forget: list[tuple[str, str]], link: list[tuple[str, str]] | None = None,
    ) -> None:
        """Change live edges in one transaction: wire (managed), adopt, unwire, forget, link (unmanaged)."""
        with self._transaction() as db:
            for a, b in wire:
                db.execute("INSERT INTO edges VALUES (?, ?, 1) ON CONFLICT(a, b) DO UPDATE SET managed = 1", (a, b))
            for a, b in adopt:
                db.execute("UPDATE edges SET managed = 1 WHERE a = ? AND b = ?", (a, b))
            for a, b in [*unwire, *forget]:
                db.execute("DELETE FROM edges WHERE a = ? AND b = ? AND managed = 1", (a, b))
            for a, b in link or []:
                db.execute("INSERT OR IGNORE INTO edges VALUES (?, ?, 0)", (a, b))

    # -- workflow runs and their journal ---------------------------------------------

    def create_run(
        self, *, run_id: str, workflow: str, code_version: str, definition: bytes | None, force: bool = False
    ) -> str:
        """Register a run, or find it again to resume it; returns its status.

        Raises:
            InvalidSpecError: the run exists under a different code version (pass
                ``force=True`` to resume it anyway, e.g. after a compatible fix).
        """
        now = self._clock()
        with self._transaction() as db:
            row = db.execute("SELECT code_version, status FROM runs WHERE run_id = ?", (run_id,)).fetchone()
            if row is None:
                db.execute(
                    "INSERT INTO runs (run_id, workflow, code_version, status, definition, created_at, updated_at) "
                    "VALUES (?, ?, ?, 'PENDING', ?, ?, ?)",
                    (run_id, workflow, code_version, definition, now, now),
                )
                return "PENDING"
            if row[1] in ("COMPLETED", "COMPENSATED", "FAILED", "CANCELLED"):
                raise InvalidSpecError(
                    f"run {run_id!r} already ended ({row[1]}); a finished run is never resumed (its compensated "
                    f"steps would be replayed, not redone). Start a new run",
                    subject="run_id",
                )
            if row[0] != code_version and not force:
                raise InvalidSpecError(
                    f"run {run_id!r} was started by workflow code version {row[0]}, not {code_version}; "
                    f"resuming it under different code could re-derive different steps. Pass force=True to resume "
                    f"anyway, or start a new run",
                    subject="code_version",
                )
            db.execute(
                "UPDATE runs SET code_version = ?, definition = COALESCE(?, definition), updated_at = ? "
                "WHERE run_id = ?",
                (code_version, definition, now, run_id),
            )
            return str(row[1])

    def run_info(self, run_id: str) -> dict[str, object] | None:
        with self._lock:
            row = self._db.execute(
                "SELECT run_id, workflow, code_version, status, detail, cancel_requested, pause_requested, "
                "created_at, updated_at, outcome, definition IS NOT NULL FROM runs WHERE run_id = ?",
                (run_id,),
            ).fetchone()
        return None if row is None else _run_row(row)

    def list_runs(self, *, statuses: list[str] | None = None) -> list[dict[str, object]]:
        query = ("SELECT run_id, workflow, code_version, status, detail, cancel_requested, pause_requested, "
                 "created_at, updated_at, outcome, definition IS NOT NULL FROM runs")
        parameters: list[object] = []
        if statuses:
            query += f" WHERE status IN ({', '.join('?' * len(statuses))})"
            parameters.extend(statuses)
        with self._lock:
            rows = self._db.execute(query + " ORDER BY created_at, run_id", parameters).fetchall()
        return [_run_row(row) for row in rows]

    def run_definition(self, run_id: str) -> bytes | None:
        with self._lock:
            row = self._db.execute("SELECT definition FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        return None if row is None else row[0]

    def set_run_status(
        self, *, run_id: str, status: str, detail: str | None = "", outcome: bytes | None = None
    ) -> None:
        """Record a run's status; ``detail=None`` keeps the detail already recorded."""
        with self._transaction() as db:
            db.execute(
                "UPDATE runs SET status = ?, detail = COALESCE(?, detail), outcome = COALESCE(?, outcome), "
                "updated_at = ? WHERE run_id = ?",
                (status, detail, outcome, self._clock(), run_id),
            )

    def request_run(self, *, run_id: str, cancel: bool | None = None, pause: bool | None = None) -> bool:
        """Ask a run to cancel or to pause/resume dispatching; returns False for an unknown run."""
        with self._transaction() as db:
            if db.execute("SELECT 1 FROM runs WHERE run_id = ?", (run_id,)).fetchone() is None:
                return False
            if cancel is not None:
                db.execute("UPDATE runs SET cancel_requested = ? WHERE run_id = ?", (int(cancel), run_id))
            if pause is not None:
                db.execute("UPDATE runs SET pause_requested = ? WHERE run_id = ?", (int(pause), run_id))
            return True

    def journal_load(self, run_id: str) -> dict[str, object]:
        with self._lock:
            steps = self._db.execute(
                "SELECT label, output, tokens FROM journal WHERE run_id = ? ORDER BY seq", (run_id,)
            ).fetchall()
            compensated = self._db.execute(
                "SELECT label FROM compensations WHERE run_id = ? AND ok = 1 ORDER BY seq", (run_id,)
            ).fetchall()
        return {"steps": [(r[0], r[1], r[2]) for r in steps], "compensated": [r[0] for r in compensated]}

    def journal_step(self, *, run_id: str, label: str, output: bytes, tokens: int) -> None:
        """Journal one step's output; a step is journaled once (a repeat keeps the first)."""
        with self._transaction() as db:
            row = db.execute("SELECT COALESCE(MAX(seq), 0) FROM journal WHERE run_id = ?", (run_id,)).fetchone()
            db.execute("INSERT OR IGNORE INTO journal VALUES (?, ?, ?, ?, ?)", (run_id, label, output, tokens, row[0] + 1))

    def journal_compensation(self, *, run_id: str, label: str, ok: bool, error: str) -> None:
        with self._transaction() as db:
            row = db.execute("SELECT COALESCE(MAX(seq), 0) FROM compensations WHERE run_id = ?", (run_id,)).fetchone()
            db.execute("INSERT INTO compensations VALUES (?, ?, ?, ?, ?)", (run_id, label, int(ok), error, row[0] + 1))

    def acquire_run_lease(self, *, run_id: str, holder: str) -> int:
        """A strictly larger fencing token for an exclusive step of a run (persisted first)."""
        with self._transaction() as db:
            row = db.execute("SELECT high_water FROM run_leases WHERE run_id = ?", (run_id,)).fetchone()
            token = 1 if row is None else row[0] + 1
            db.execute(
                "INSERT INTO run_leases VALUES (?, ?, ?) ON CONFLICT(run_id) DO UPDATE SET "
                "high_water = excluded.high_water, holder = excluded.holder",
                (run_id, token, holder),
            )
            return token

    def release_run_lease(self, *, run_id: str, holder: str) -> None:
        with self._transaction() as db:
            db.execute("UPDATE run_leases SET holder = NULL WHERE run_id = ? AND holder = ?", (run_id, holder))

    # -- pause, parking and dead letters -------------------------------------------

    def set_paused(self, *, identity: str, fencing_token: int, paused: bool) -> None:
        """Persist the pause flag of an identity (fenced); it survives host failover."""
        with self._transaction() as db:
            self._check_fence(db, identity, fencing_token)
            if paused:
                db.execute("INSERT OR IGNORE INTO paused VALUES (?, ?)", (identity, self._clock()))
            else:
                db.execute("DELETE FROM paused WHERE identity = ?", (identity,))

    def is_paused(self, identity: str) -> bool:
        with self._lock:
            return self._db.execute("SELECT 1 FROM paused WHERE identity = ?", (identity,)).fetchone() is not None

    def park(self, *, identity: str, fencing_token: int, message_id: str, envelope: bytes) -> int:
        """Hold a message durably, in arrival order; parking the same message twice is a no-op."""
        with self._transaction() as db:
            self._check_fence(db, identity, fencing_token)
            db.execute(
                "INSERT OR IGNORE INTO parked (identity, message_id, envelope, parked_at) VALUES (?, ?, ?, ?)",
                (identity, message_id, envelope, self._clock()),
            )
            row = db.execute(
                "SELECT seq FROM parked WHERE identity = ? AND message_id = ?", (identity, message_id)
            ).fetchone()
            return int(row[0])

    def parked(self, identity: str, *, limit: int = 1000) -> list[StoredMessage]:
        """Parked messages of an identity, oldest first."""
        with self._lock:
            return [
                StoredMessage(id=row[0], identity=identity, message_id=row[1], envelope=row[2], at=row[3])
                for row in self._db.execute(
                    "SELECT seq, message_id, envelope, parked_at FROM parked WHERE identity = ? ORDER BY seq LIMIT ?",
                    (identity, limit),
                )
            ]

    def unpark(self, *, identity: str, fencing_token: int, seq: int) -> None:
        """Forget a parked message once its replay has been handled (fenced)."""
        with self._transaction() as db:
            self._check_fence(db, identity, fencing_token)
            db.execute("DELETE FROM parked WHERE identity = ? AND seq = ?", (identity, seq))

    def cancel_parked(self, *, identity: str, fencing_token: int) -> int:
        """Move every parked message of an identity to the dead letters (reason ``cancelled``)."""
        now = self._clock()
        with self._transaction() as db:
            self._check_fence(db, identity, fencing_token)
            rows = db.execute(
                "SELECT seq, message_id, envelope FROM parked WHERE identity = ? ORDER BY seq", (identity,)
            ).fetchall()
            for _, message_id, envelope in rows:
                db.execute(
                    "INSERT INTO dead_letters (identity, message_id, envelope, reason, error, attempts, at) "
                    "VALUES (?, ?, ?, 'CANCELLED', 'parked work cancelled by fleet.cancel_parked', 0, ?)",
                    (identity, message_id, envelope, now),
                )
            db.execute("DELETE FROM parked WHERE identity = ?", (identity,))
            return len(rows)

    def add_dead_letter(
        self, *, identity: str, message_id: str, envelope: bytes, reason: str, error: str, attempts: int
    ) -> int:
        """Record a message that could not be handled, with why; returns its letter id.

        Not fenced: a dead letter is a report, not a change to the identity's state, and
        losing it because the reporter was fenced out would lose the message itself.
        """
        with self._transaction() as db:
            cursor = db.execute(
                "INSERT INTO dead_letters (identity, message_id, envelope, reason, error, attempts, at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (identity, message_id, envelope, reason, error, attempts, self._clock()),
            )
            return int(cursor.lastrowid or 0)

    def dead_letters(self, *, identity: str | None = None, limit: int = 1000) -> list[StoredMessage]:
        query = "SELECT id, identity, message_id, envelope, reason, error, attempts, at FROM dead_letters"
        parameters: tuple[object, ...] = ()
        if identity is not None:
            query += " WHERE identity = ?"
            parameters = (identity,)
        with self._lock:
            rows = self._db.execute(query + " ORDER BY id LIMIT ?", (*parameters, limit)).fetchall()
        return [_dead_letter(row) for row in rows]

    def dead_letter(self, letter_id: int) -> StoredMessage | None:
        """One dead letter by id, or ``None``."""
        with self._lock:
            row = self._db.execute(
                "SELECT id, identity, message_id, envelope, reason, error, attempts, at FROM dead_letters WHERE id = ?",
                (letter_id,),
            ).fetchone()
        return None if row is None else _dead_letter(row)

    def purge_dead_letters(
        self, *, identity: str | None = None, ids: list[int] | None = None, before: float | None = None
    ) -> int:
        """Delete dead letters matching every given filter (all of them when none is given)."""
        clauses, parameters = [], []
        if identity is not None:
            clauses.append("identity = ?")
            parameters.append(identity)
        if ids is not None:
            clauses.append(f"id IN ({', '.join('?' * len(ids))})" if ids else "0")
            parameters.extend(ids)
        if before is not None:
            clauses.append("at < ?")
            parameters.append(before)
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        with self._transaction() as db:
            return db.execute(f"DELETE FROM dead_letters{where}", parameters).rowcount

    def set_lifecycle(self, *, identity: str, fencing_token: int, lifecycle: str, reason: str = "") -> None:
        """Persist retired / broken / live for an identity, fenced."""
        if lifecycle not in (PERSISTED_LIVE, PERSISTED_RETIRED, PERSISTED_BROKEN):
            raise InvalidSpecError(f"unknown lifecycle marker {lifecycle!r}", subject="lifecycle")
        with self._transaction() as db:
            self._check_fence(db, identity, fencing_token)
            db.execute(
                "UPDATE identities SET lifecycle = ?, reason = ? WHERE identity = ?", (lifecycle, reason, identity)
            )

    def reset(self, *, identity: str, fencing_token: int) -> ContinuityRecord:
        """Start a new generation: new runtime id and session, version 0, no snapshot.

        One transaction, so there is never a half-reset record to roll back (the seed
        re-writes an older generation on failure; this ledger never has to).
        """
        with self._transaction() as db:
            self._check_fence(db, identity, fencing_token)
            record, _ = self._continuity(db, identity)
            generation = 0 if record is None else record.generation + 1
            fresh = ContinuityRecord(
                identity=identity, runtime_id=format_runtime_id(identity, generation), session_id=new_session_id(),
                generation=generation, checkpoint_version=0, fence=fencing_token,
            )
            db.execute(
                "INSERT OR REPLACE INTO continuity VALUES (?, ?, ?, ?, 0, ?, NULL, NULL)",
                (identity, fresh.runtime_id, fresh.session_id, generation, fencing_token),
            )
            db.execute("UPDATE identities SET lifecycle = ?, reason = '' WHERE identity = ?", (PERSISTED_LIVE, identity))
            # A new generation starts with a fresh State, so it must not replay replies of the old one.
            db.execute("DELETE FROM dedup WHERE identity = ?", (identity,))
            return fresh

    def delete(self, *, identity: str, fencing_token: int) -> SnapshotPointer | None:
        """Remove an identity, its continuity record and lease; return its last snapshot.

        The fence high-water mark is kept forever, so a token issued before the delete
        can never write to an identity re-created under the same name.
        """
        with self._transaction() as db:
            self._check_fence(db, identity, fencing_token)
            _, pointer = self._continuity(db, identity)
            db.execute("DELETE FROM continuity WHERE identity = ?", (identity,))
            db.execute("DELETE FROM leases WHERE identity = ?", (identity,))
            db.execute("DELETE FROM identities WHERE identity = ?", (identity,))
            db.execute("DELETE FROM dedup WHERE identity = ?", (identity,))
            db.execute("DELETE FROM paused WHERE identity = ?", (identity,))
            db.execute("DELETE FROM edges WHERE a = ? OR b = ?", (identity, identity))
            db.execute("DELETE FROM desired_edges WHERE a = ? OR b = ?", (identity, identity))
            # Parked work of a deleted identity can never run: keep it as dead letters.
            db.execute(
                "INSERT INTO dead_letters (identity, message_id, envelope, reason, error, attempts, at) "
                "SELECT identity, message_id, envelope, 'DELETED', 'identity deleted while the message was parked', "
                "0, ? FROM parked WHERE identity = ?",
                (self._clock(), identity),
            )
            db.execute("DELETE FROM parked WHERE identity = ?", (identity,))
            # Burn one token so the deleting token itself is stale for a re-created identity.
            self._raise_high_water(db, identity)
            return pointer

    def referenced_snapshot_files(self) -> set[str]:
        """Every file some continuity record points at (the GC keeps these)."""
        with self._lock:
            return {row[0] for row in self._db.execute("SELECT DISTINCT snapshot_file FROM continuity WHERE snapshot_file IS NOT NULL")}

    def high_water(self, identity: str) -> int:
        """The highest token ever issued for ``identity`` (0 if none)."""
        with self._lock:
            row = self._db.execute("SELECT high_water FROM fences WHERE identity = ?", (identity,)).fetchone()
            return 0 if row is None else int(row[0])

    # -- hosts --------------------------------------------------------------------

    def register_host(self, *, name: str, holder: str) -> list[str]:
        """Record a host incarnation; leases of an earlier incarnation of the same name are freed.

        Ray runs at most one actor per name, so a new incarnation proves the old one dead.
        """
        with self._transaction() as db:
            previous = db.execute("SELECT holder FROM hosts WHERE name = ?", (name,)).fetchone()
            freed = self._free_holder(db, previous[0]) if previous is not None and previous[0] != holder else []
            db.execute(
                "INSERT OR REPLACE INTO hosts VALUES (?, ?, ?, 0)", (name, holder, self._clock())
            )
            return freed

    def remove_host(self, *, name: str, holder: str | None = None) -> list[str]:
        """Forget a host (dead or scaled in) and free its leases."""
        with self._transaction() as db:
            row = db.execute("SELECT holder FROM hosts WHERE name = ?", (name,)).fetchone()
            if row is None or (holder is not None and row[0] != holder):
                return []
            freed = self._free_holder(db, row[0])
            db.execute("DELETE FROM hosts WHERE name = ?", (name,))
            return freed

    def set_host_draining(self, *, name: str, draining: bool) -> None:
        with self._transaction() as db:
            db.execute("UPDATE hosts SET draining = ? WHERE name = ?", (int(draining), name))

    def hosts(self) -> list[HostView]:
        with self._lock:
            return [
                HostView(name=row[0], holder=row[1], started_at=row[2], draining=bool(row[3]))
                for row in self._db.execute("SELECT name, holder, started_at, draining FROM hosts ORDER BY name")
            ]


def _dead_letter(row: tuple[Any, ...]) -> StoredMessage:
    return StoredMessage(id=row[0], identity=row[1], message_id=row[2], envelope=row[3], reason=row[4],
                         error=row[5], attempts=row[6], at=row[7])


def _run_row(row: tuple[object, ...]) -> dict[str, object]:
    return {
        "run_id": row[0], "workflow": row[1], "code_version": row[2], "status": row[3], "detail": row[4],
        "cancel_requested": bool(row[5]), "pause_requested": bool(row[6]), "created_at": row[7],
        "updated_at": row[8], "outcome": row[9], "submitted": bool(row[10]),
    }


def new_session_id() -> str:
    return uuid.uuid4().hex
