"""The embedded store: one SQLite file (WAL, ``synchronous=FULL``), versioned schema, one lock.

Write transactions take SQLite's write lock up front (``BEGIN IMMEDIATE``), so the
check and the write of a fenced operation can never interleave with another writer.
A single connection behind a lock makes the store safe to share between threads.
"""

from __future__ import annotations

import sqlite3
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from ..errors import LedgerSchemaError
from ._store import Transaction

T = TypeVar("T")

# Each entry is applied once, in order, inside one transaction; ``PRAGMA user_version``
# records how many have run. Never edit an entry that has shipped: append a new one.
MIGRATIONS: tuple[str, ...] = (
    """
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
""",
    # 2: indexes for hot lookups (who declares X as a peer; identities by label) and the
    # ledger's own facts (fleet id, the incarnation that last applied lock-delay).
    """
CREATE TABLE IF NOT EXISTS declared_peers (
    identity TEXT NOT NULL,
    peer TEXT NOT NULL,
    PRIMARY KEY (identity, peer)
);
CREATE INDEX IF NOT EXISTS declared_peers_by_peer ON declared_peers(peer);
INSERT INTO declared_peers (identity, peer)
    SELECT identities.identity, json_each.value FROM identities, json_each(identities.peers)
    WHERE true ON CONFLICT DO NOTHING;
CREATE TABLE IF NOT EXISTS identity_labels (
    identity TEXT NOT NULL,
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (identity, key)
);
CREATE INDEX IF NOT EXISTS identity_labels_by_value ON identity_labels(key, value);
INSERT INTO identity_labels (identity, key, value)
    SELECT identities.identity, json_each.key, json_each.value FROM identities, json_each(identities.labels)
    WHERE true ON CONFLICT DO NOTHING;
CREATE TABLE IF NOT EXISTS ledger_meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
""",
    # 3: run ownership (the engine's lease and the run's token high-water, kept forever;
    # holder NULL once released) and exclusive-step leases. Step tokens keep coming from
    # run_leases.high_water; its holder column is no longer used.
    """
CREATE TABLE IF NOT EXISTS run_owners (
    run_id TEXT PRIMARY KEY,
    holder TEXT,
    token INTEGER NOT NULL,
    ttl REAL NOT NULL,
    expires_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS step_leases (
    run_id TEXT NOT NULL,
    label TEXT NOT NULL,
    holder TEXT NOT NULL,
    token INTEGER NOT NULL,
    ttl REAL NOT NULL,
    expires_at REAL NOT NULL,
    PRIMARY KEY (run_id, label)
);
""",
)


class SqliteDatabase:
    """A ledger :class:`~rayfleet.ledger._store.Database` in one SQLite file.

    Opening creates the file (and its folder) if needed and brings the schema up to
    date. A file written by a newer rayfleet (a schema version this code does not
    know) is refused rather than guessed at. Every open is a new incarnation: the
    process serving the file restarted, so the ledger applies lock-delay.

    Raises:
        LedgerSchemaError: the file's schema is newer than this rayfleet knows.
        sqlite3.Error: the file cannot be opened as a database.
    """

    kind = "sqlite"

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._incarnation = uuid.uuid4().hex
        self._connection = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False)
        self._connection.execute("PRAGMA journal_mode=WAL")
        self._connection.execute("PRAGMA synchronous=FULL")
        self.write(self._migrate)

    def _migrate(self, tx: Transaction) -> None:
        row = tx.execute("PRAGMA user_version").fetchone()
        version = int(row[0]) if row else 0
        if version > len(MIGRATIONS):
            raise LedgerSchemaError(location=self.describe(), found=version, known=len(MIGRATIONS))
        for script in MIGRATIONS[version:]:
            for statement in script.split(";"):
                if statement.strip():
                    tx.execute(statement)
        if version < len(MIGRATIONS):
            # PRAGMA takes no parameters; the value is an int we computed.
            tx.execute(f"PRAGMA user_version = {len(MIGRATIONS)}")

    def write(self, fn: Callable[[Transaction], T]) -> T:
        # BEGIN IMMEDIATE takes the write lock up front: no other writer can interleave
        # between a fenced operation's check and its write.
        with self._lock:
            self._connection.execute("BEGIN IMMEDIATE")
            try:
                result = fn(self._connection)
            except BaseException:
                self._connection.execute("ROLLBACK")
                raise
            self._connection.execute("COMMIT")
            return result

    def read(self, fn: Callable[[Transaction], T]) -> T:
        # One connection behind the lock: a read sees only committed transactions.
        with self._lock:
            return fn(self._connection)

    def now(self, tx: Transaction) -> float:
        return time.time()

    def incarnation(self, tx: Transaction) -> str:
        return self._incarnation

    def describe(self) -> str:
        return f"sqlite:///{self.path}"

    def close(self) -> None:
        with self._lock:
            self._connection.close()
