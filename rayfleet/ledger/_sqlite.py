"""The embedded store: one SQLite file (WAL, ``synchronous=FULL``), versioned schema, one lock.

Write transactions take SQLite's write lock up front (``BEGIN IMMEDIATE``), so the
check and the write of a fenced operation can never interleave with another writer.
A single connection behind a lock makes the store safe to share between threads.
"""

from __future__ import annotations

import os
import sqlite3
import struct
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

if sys.platform == "linux":  # asking who holds a lock is Linux-only here; the module imports anywhere
    import fcntl

from ..errors import LedgerSchemaError, LedgerUnavailableError
from ._schema import MIGRATIONS, SQLITE
from ._store import Row, Transaction

T = TypeVar("T")

_UNAVAILABLE = frozenset({
    "SQLITE_BUSY", "SQLITE_LOCKED", "SQLITE_FULL", "SQLITE_IOERR", "SQLITE_READONLY", "SQLITE_CANTOPEN",
})
"""Result codes of a database that cannot serve now (locked by another process, disk full or read-only).

Not errors of the statement itself: SQLite reports syntax errors as ``OperationalError`` too.
"""


_WAL_WRITE_LOCK = 120
"""The byte of the ``-shm`` file that SQLite's unix VFS locks (``F_WRLCK``) while a connection holds the
write lock of a database in WAL mode: ``UNIX_SHM_BASE``, ``(22 + SQLITE_SHM_NLOCK) * 4`` = 120 in
``os_unix.c``, plus ``WAL_WRITE_LOCK`` (0); the WAL format's documentation (walformat.html) names the same
eight lock bytes from offset 120."""
_FLOCK = struct.Struct("hhqqi4x")
"""Linux's ``struct flock``: type, whence, start, length, pid (and padding)."""
_probes: dict[tuple[int, int], int] = {}
"""Descriptors of ``-shm`` files opened to ask who holds a lock, by (device, inode); never closed."""
_probes_lock = threading.Lock()


def _lock_holder(shm: Path) -> int | None:
    """The process id of another process holding ``shm``'s WAL write lock now, or ``None``.

    The descriptor asked through is never closed: closing any descriptor of a file
    drops every POSIX lock this process holds on that file, SQLite's own included.
    One is kept per file, known by its device and inode: while it is open no other file
    can have that inode, so a descriptor found by the path's inode is one of this file.
    """
    try:
        found = os.stat(shm)
    except FileNotFoundError:
        return None  # no connection has the database open in WAL mode: nobody holds its write lock
    with _probes_lock:
        descriptor = _probes.get((found.st_dev, found.st_ino))
        if descriptor is None:
            try:
                descriptor = os.open(shm, os.O_RDONLY)
            except FileNotFoundError:
                return None  # removed since (the last connection closed): nobody holds the lock
            # Filed by what was opened: the path may name a new file since the stat. A second
            # descriptor of a file already known stays open all the same (closing it would drop locks).
            opened = os.fstat(descriptor)
            descriptor = _probes.setdefault((opened.st_dev, opened.st_ino), descriptor)
    asked = _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, _WAL_WRITE_LOCK, 1, 0)
    kind, _, _, _, pid = _FLOCK.unpack(fcntl.fcntl(descriptor, fcntl.F_GETLK, asked))
    return None if kind == fcntl.F_UNLCK else int(pid)


class SqliteDatabase:
    """A ledger :class:`~rayfleet.ledger._store.Database` in one SQLite file.

    Opening creates the file (and its folder) if needed and brings the schema up to
    date. A file written by a newer rayfleet (a schema version this code does not
    know) is refused rather than guessed at. Every open is a new incarnation: the
    process serving the file restarted, so the ledger applies lock-delay.

    With ``read_only`` the file is opened for reading only, as it is: nothing is
    created or migrated, and every write fails. That is how the read-only commands
    look at a stopped fleet without touching it.

    Raises:
        LedgerSchemaError: the file's schema is newer than this rayfleet knows.
        LedgerUnavailableError: the file cannot be opened (``read_only``: it does not
            exist, or its schema is older than this rayfleet reads without migrating it).
        sqlite3.Error: the file cannot be opened as a database.
    """

    kind = "sqlite"
    dialect = SQLITE
    clock_sql = "((julianday('now') - 2440587.5) * 86400.0)"
    """The same clock as :meth:`now` (the operating system's), in SQLite's own date functions."""

    def __init__(self, path: str | Path, *, busy_timeout: float = 5.0, read_only: bool = False) -> None:
        self.path = Path(path)
        if not read_only:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._aside_lock = threading.Lock()
        self._aside: sqlite3.Connection | None = None
        self._closed = False
        real = Path(os.path.realpath(self.path))  # SQLite puts the -shm beside the file a link points to
        self._shm = real.with_name(real.name + "-shm")
        self._busy_timeout = busy_timeout
        self._incarnation = uuid.uuid4().hex
        try:
            if read_only:
                # A file no process has open has no write-ahead log beside it: read it as
                # immutable, or SQLite would make the -wal and -shm files to read it.
                # Where a log exists, a writer may still be at work: read through it.
                immutable = "" if Path(f"{real}-wal").exists() else "&immutable=1"
                self._connection = sqlite3.connect(
                    f"{real.as_uri()}?mode=ro{immutable}", uri=True, isolation_level=None,
                    check_same_thread=False, timeout=busy_timeout,
                )
                self.read(self._require_current_schema)
                return
            self._connection = sqlite3.connect(
                str(self.path), isolation_level=None, check_same_thread=False, timeout=busy_timeout
            )
            self._connection.execute("PRAGMA journal_mode=WAL")
            self._connection.execute("PRAGMA synchronous=FULL")
        except sqlite3.OperationalError as error:
            raise self._unavailable(error) from None
        self.write(self._migrate)

    def _require_current_schema(self, tx: Transaction) -> None:
        row = tx.execute("PRAGMA user_version").fetchone()
        version = int(row[0]) if row else 0
        if version > len(MIGRATIONS):
            raise LedgerSchemaError(location=self.describe(), found=version, known=len(MIGRATIONS))
        if version < len(MIGRATIONS):
            raise LedgerUnavailableError(
                location=self.describe(),
                detail=f"the file is at schema version {version}, older than this rayfleet's {len(MIGRATIONS)}, and "
                       "is not changed by a read; start the fleet once (rf.connect() with this storage) to migrate it",
            )

    def _migrate(self, tx: Transaction) -> None:
        row = tx.execute("PRAGMA user_version").fetchone()
        version = int(row[0]) if row else 0
        if version > len(MIGRATIONS):
            raise LedgerSchemaError(location=self.describe(), found=version, known=len(MIGRATIONS))
        for migration in MIGRATIONS[version:]:
            for statement in migration.statements(SQLITE):
                tx.execute(statement)
        if version < len(MIGRATIONS):
            # PRAGMA takes no parameters; the value is an int we computed.
            tx.execute(f"PRAGMA user_version = {len(MIGRATIONS)}")

    def write(self, fn: Callable[[Transaction], T]) -> T:
        # BEGIN IMMEDIATE takes the write lock up front: no other writer can interleave
        # between a fenced operation's check and its write.
        # Another process holding the lock past the busy timeout (or a full or read-only
        # disk) is an outage: LedgerUnavailableError, after which nothing was changed.
        with self._lock:
            try:
                self._connection.execute("BEGIN IMMEDIATE")
                return self._finish(fn)
            except sqlite3.OperationalError as error:
                raise self._translated(error) from None

    def write_alone(self, sql: str, parameters: Sequence[Any] = ()) -> list[Row]:
        return self.write(lambda tx: tx.execute(sql, parameters).fetchall())

    def write_now(self, fn: Callable[[Transaction], T]) -> tuple[bool, T | None]:
        """:meth:`write`, but only if nothing has to be waited for: ``(False, None)`` when this
        process or another holds the write lock at this moment, else ``(True, result)``.

        For callers on an event loop, which must not sleep in SQLite's busy handler.
        """
        if not self._lock.acquire(blocking=False):
            return False, None
        try:
            self._connection.execute("PRAGMA busy_timeout = 0")
            try:
                self._connection.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as error:
                if getattr(error, "sqlite_errorname", None) in ("SQLITE_BUSY", "SQLITE_LOCKED"):
                    return False, None
                raise
            finally:
                self._connection.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout * 1000)}")
            return True, self._finish(fn)
        except sqlite3.OperationalError as error:
            raise self._translated(error) from None
        finally:
            self._lock.release()

    def _finish(self, fn: Callable[[Transaction], T]) -> T:
        """Run ``fn`` in the transaction just begun and commit it; roll back if anything fails."""
        statements = _Statements(self._connection)
        try:
            result = fn(statements)
            self._connection.execute("COMMIT")
        except BaseException:
            if self._connection.in_transaction:
                self._connection.execute("ROLLBACK")
            raise
        finally:
            statements.close()
        return result

    def _translated(self, error: sqlite3.OperationalError) -> Exception:
        """An outage (locked, full, read-only) as ``LedgerUnavailableError``; any other error as it came."""
        if getattr(error, "sqlite_errorname", None) in _UNAVAILABLE:
            return self._unavailable(error)
        return error

    def read(self, fn: Callable[[Transaction], T]) -> T:
        # One connection behind the lock: a read sees only committed transactions.
        with self._lock:
            return self._read_on(self._connection, fn)

    def _read_on(self, connection: sqlite3.Connection, fn: Callable[[Transaction], T]) -> T:
        statements = _Statements(connection)
        try:
            return fn(statements)
        except sqlite3.OperationalError as error:
            raise self._translated(error) from None
        finally:
            statements.close()

    def _unavailable(self, error: sqlite3.Error) -> LedgerUnavailableError:
        return LedgerUnavailableError(
            location=self.describe(),
            detail=f"{error} (another process may hold the database's lock, or its disk is full or read-only)",
        )

    def now(self, tx: Transaction) -> float:
        return time.time()

    def incarnation(self, tx: Transaction) -> str:
        return self._incarnation

    def describe(self) -> str:
        return f"sqlite:///{self.path}"

    def write_lock_holder(self) -> int | None:
        """The process id of another process that holds the file's write lock at this moment, else ``None``.

        Asked of the kernel (``F_GETLK`` on the ``-shm`` file), not of SQLite, so it
        answers even while the holder is stopped. Answers ``None`` off Linux (the lock
        record's layout is Linux's), and for this process's own locks.
        """
        return _lock_holder(self._shm) if sys.platform == "linux" else None

    def read_aside(self, fn: Callable[[Transaction], T]) -> T:
        """:meth:`read` on a connection of its own, opened on first use.

        Never waits for this process's writers (a reader of a WAL database waits on
        nobody), while :meth:`read` waits for the one connection a writer may hold
        through a whole busy wait.
        """
        with self._aside_lock:
            if self._closed:
                raise sqlite3.ProgrammingError("Cannot operate on a closed database.")
            if self._aside is None:
                self._aside = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False,
                                              timeout=self._busy_timeout)
            return self._read_on(self._aside, fn)

    def close(self) -> None:
        with self._lock:
            self._connection.close()
        with self._aside_lock:
            self._closed = True
            if self._aside is not None:
                self._aside.close()
                self._aside = None


class _Statements:
    """The connection as a :class:`Transaction` whose statements are all closed when it ends.

    A statement left open (a SELECT not read to its end, its cursor kept alive by an
    error's traceback) holds the connection's read snapshot after the transaction, and
    SQLite then fails this connection's next write at once (``SQLITE_BUSY``, without the
    busy wait) whenever another process has written meanwhile or holds the write lock.
    """

    __slots__ = ("_connection", "_cursors")

    dialect = SQLITE

    def __init__(self, connection: sqlite3.Connection) -> None:
        self._connection = connection
        self._cursors: list[sqlite3.Cursor] = []

    def execute(self, sql: str, parameters: Sequence[Any] = (), /) -> sqlite3.Cursor:
        cursor = self._connection.execute(sql, parameters)
        self._cursors.append(cursor)
        return cursor

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]], /) -> sqlite3.Cursor:
        cursor = self._connection.executemany(sql, rows)
        self._cursors.append(cursor)
        return cursor

    def close(self) -> None:
        for cursor in self._cursors:
            cursor.close()
        self._cursors.clear()
