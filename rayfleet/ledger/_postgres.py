"""The cluster store: the ledger in PostgreSQL, reached directly from every process through a connection pool.

Guarantees, and why they hold with many hosts on many nodes writing at once:

* Every write runs at ``SERIALIZABLE``: a fenced operation's check (the token against
  the high-water mark) and its write behave as if no other transaction ran between
  them. A transaction PostgreSQL aborts for a conflict (serialization failure,
  deadlock) changed nothing and is run again, a bounded number of times.
* Lease expiry is measured on the database's clock, not the hosts', so hosts with
  skewed clocks agree on when a lease lapsed.
* A lost connection before the commit is retried on a fresh connection (nothing was
  written). A connection lost *during* the commit leaves the outcome unknown; that is
  reported as :class:`~rayfleet.errors.LedgerUnavailableError` with
  ``committed_unknown`` and never retried blindly.
* The incarnation is the server's start time, so the ledger applies lock-delay once
  after the database restarted, however many processes open it.
* A write that is one statement (``write_alone``) is sent outside any transaction and is
  a transaction of its own, also ``SERIALIZABLE`` (the sessions' default level). It
  cannot prove its connection alive before the write as a transaction does, so a
  connection that has not answered for ``ALIVE_FOR`` seconds is checked first. Awaited
  (``write_alone_async``) it runs on the caller's event loop over a connection of that
  loop's, with the same checks and retries.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit, urlunsplit

import psycopg
import psycopg_pool
from psycopg import errors as pg_errors

from ..errors import LedgerSchemaError, LedgerUnavailableError
from ..retry import RetryPolicy
from ._schema import MIGRATIONS, POSTGRESQL
from ._store import Cursor, Row, Transaction

T = TypeVar("T")

CONFLICT_RETRY = RetryPolicy(max_attempts=12, base_delay=0.002, max_delay=0.2, jitter=0.5)
"""Re-runs of a transaction PostgreSQL aborted for a conflict with a concurrent one."""
CONNECTION_RETRY = RetryPolicy(max_attempts=6, base_delay=0.1, max_delay=2.0, jitter=0.2)
"""Re-runs after the connection was lost before the commit (e.g. while the server restarts)."""

_SCHEMA_LOCK = 727_274_001
"""Advisory lock id taken while migrating, so processes starting together migrate once."""

def redact(url: str) -> str:
    """``url`` without its password, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def _url_connect_timeout(url: str, default: float = 10.0) -> float:
    """The ``connect_timeout`` query parameter of ``url`` in seconds (libpq's own), or ``default``."""
    values = parse_qs(urlsplit(url).query).get("connect_timeout")
    try:
        seconds = float(values[0]) if values else default
    except ValueError:
        return default
    return seconds if 0 < seconds < math.inf else default


IDLE_IN_TRANSACTION_TIMEOUT_MS = 2_000
"""A session idle inside a transaction this long is ended by the server, releasing its locks.

Every ledger transaction runs its statements back to back, so a transaction left idle
means its process is frozen (SIGSTOP, a stuck event loop) or gone; without this, the
lease rows it touched stay locked for as long as it is frozen, and the host taking its
identities over would wait on them."""
LOCK_TIMEOUT_MS = 5_000
"""A statement waiting this long for a row lock fails (retried, then ``LedgerUnavailableError``)
instead of waiting without bound."""


_END_STALLED = (
    # Sessions whose client stopped while they hold a transaction open: waiting for the rest
    # of a pipeline (statements sent without their Sync) or blocked writing a result the
    # client does not read ("active", a Client wait), or idle in the transaction past the
    # server's own limit (seen, after a large result the client did not read).
    # Only those another session waits on for a lock are ended; pg_blocking_pids is asked
    # only while such a session exists. Their last sign of life is the later of the two times.
    "WITH stalled AS (SELECT pid, EXTRACT(EPOCH FROM clock_timestamp() - GREATEST(query_start, state_change))::float8 "
    "AS seconds FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() "
    "AND ((state = 'active' AND wait_event_type = 'Client') OR state = 'idle in transaction') "
    "AND GREATEST(query_start, state_change) < clock_timestamp() - make_interval(secs => ?)), "
    "blocking AS (SELECT DISTINCT unnest(pg_blocking_pids(pid)) AS pid FROM pg_stat_activity "
    "WHERE datname = current_database() AND wait_event_type = 'Lock' AND EXISTS (SELECT 1 FROM stalled)) "
    # In the select list, so that only the joined rows are ended (a WHERE could be applied to the scan of stalled).
    "SELECT s.pid, s.seconds, pg_terminate_backend(s.pid) FROM stalled s JOIN blocking b ON b.pid = s.pid"
)


_ENDED_WHILE_IDLE = pg_errors.IdleInTransactionSessionTimeout
ALIVE_FOR = IDLE_IN_TRANSACTION_TIMEOUT_MS / 4000
"""Seconds after the server's last answer in a transaction during which its session counts as alive;
after that the queued statements are sent (and answered) before the COMMIT is."""


_SESSION_SETTINGS = (
    f"SET idle_in_transaction_session_timeout = {IDLE_IN_TRANSACTION_TIMEOUT_MS}",
    f"SET lock_timeout = {LOCK_TIMEOUT_MS}",
    # What a statement sent outside a transaction block (PostgresDatabase.write_alone) runs
    # at; transactions name their level in their BEGIN.
    "SET default_transaction_isolation = 'serializable'",
)
"""Set on every session this process opens; the URL's own options (such as a search_path) are left as they are."""


def _configure_session(connection: psycopg.Connection[Row]) -> None:
    for setting in _SESSION_SETTINGS:
        connection.execute(setting)
    connection.commit()


class _Transaction:
    """A psycopg connection seen through the stores' portable SQL (``?`` placeholders), in few round trips.

    A statement is queued, not sent, until a result is needed: reading any result (a
    fetch, or ``rowcount``) sends every queued statement in one pipeline and waits for
    all their results; :meth:`commit` sends what is still queued together with the
    COMMIT. So the writes at the end of a transaction, whose results nobody reads,
    cost one round trip with the commit. Between two of these exchanges the server has
    answered everything it was sent, which keeps the session "idle in transaction"
    while this process computes (or is frozen), so the server's idle timeout still
    ends a transaction whose process stopped. A failing statement raises where a
    result is next read, at the latest at the commit; the transaction is then rolled
    back as any failed one.
    """

    __slots__ = ("_answered_at", "_connection", "_queued")

    dialect = POSTGRESQL

    def __init__(self, connection: psycopg.Connection[Row]) -> None:
        self._connection = connection
        self._queued: list[tuple[psycopg.Cursor[Row], str, Any, bool]] = []
        self._answered_at: float | None = None

    def answered_within(self, seconds: float) -> bool:
        """Whether the server answered in this transaction in the last ``seconds`` (the session was alive)."""
        return self._answered_at is not None and time.monotonic() - self._answered_at < seconds

    def one_queued(self) -> bool:
        """Whether exactly one statement (not an ``executemany``) waits to be sent.

        Sent on its own it costs less than in a pipeline with the ``COMMIT``: psycopg's
        pipeline mode took 0.08-0.1 ms more per use than a loopback round trip
        (``python -m benchmarks.pg_commit``).
        """
        return len(self._queued) == 1 and not self._queued[0][3]

    def execute(self, sql: str, parameters: Sequence[Any] = (), /) -> Cursor:
        cursor = self._connection.cursor()
        self._queued.append((cursor, sql.replace("?", "%s"), tuple(parameters), False))
        return _Rows(cursor, self)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]], /) -> Cursor:
        cursor = self._connection.cursor()
        self._queued.append((cursor, sql.replace("?", "%s"), [tuple(row) for row in rows], True))
        return _Rows(cursor, self)

    def send(self) -> None:
        """Run every queued statement and wait for their results."""
        queued, self._queued = self._queued, []
        if len(queued) == 1 and not queued[0][3]:
            cursor, sql, parameters, _ = queued[0]
            cursor.execute(sql, parameters)
        elif queued:
            with self._connection.pipeline():
                self._run(queued)
        self._answered_at = time.monotonic()

    def commit(self) -> None:
        """Send what is still queued and the COMMIT, in one round trip."""
        queued, self._queued = self._queued, []
        if queued:
            with self._connection.pipeline():
                self._run(queued)
                self._connection.commit()
        else:
            self._connection.commit()

    @staticmethod
    def _run(queued: list[tuple[psycopg.Cursor[Row], str, Any, bool]]) -> None:
        for cursor, sql, parameters, many in queued:
            if many:
                cursor.executemany(sql, parameters)
            else:
                cursor.execute(sql, parameters)


class _Attempt:
    """How far one attempt of a ledger call got: once ``committing``, a lost connection may have taken the write."""

    __slots__ = ("committing",)

    def __init__(self) -> None:
        self.committing = False


_RETRIED = (pg_errors.SerializationFailure, pg_errors.DeadlockDetected, psycopg.OperationalError,
            psycopg_pool.PoolTimeout, _ENDED_WHILE_IDLE)
"""What a failed attempt may raise that :meth:`_Retries.after` judges; anything else is the caller's."""


class _Retries:
    """When a ledger call is tried again, and when it gives up: the one rule of its blocking and awaited loops.

    A conflict (serialization failure, deadlock) changed nothing and is tried again up
    to :data:`CONFLICT_RETRY`'s attempts. A connection lost before the attempt was
    ``committing`` (or a session the server ended while idle in its transaction, which
    it rolled back) wrote nothing and is tried again up to :data:`CONNECTION_RETRY`'s;
    one lost while committing may have written, and is never tried again.
    """

    __slots__ = ("_conflicts", "_location", "_losses")

    def __init__(self, location: str) -> None:
        self._location = location
        self._conflicts = self._losses = 0

    def after(self, error: Exception, attempt: _Attempt) -> tuple[float, bool]:
        """``(seconds to wait, whether the connection was lost)`` before the next attempt; raises when there is none.

        ``error`` is one of :data:`_RETRIED`.

        Raises:
            LedgerUnavailableError: the connection was lost while committing
                (``committed_unknown``), or too often.
            Exception: ``error`` itself, after too many conflicts.
        """
        if isinstance(error, (pg_errors.SerializationFailure, pg_errors.DeadlockDetected)):
            self._conflicts += 1
            if self._conflicts >= CONFLICT_RETRY.max_attempts:
                raise error
            return CONFLICT_RETRY.delay_for(self._conflicts - 1), False
        # The server ends a session idle inside a transaction (this process was frozen)
        # and rolls it back: nothing was committed, whatever step it was at.
        if attempt.committing and not isinstance(error, _ENDED_WHILE_IDLE):
            raise LedgerUnavailableError(location=self._location, detail=str(error).strip(),
                                         committed_unknown=True) from None
        self._losses += 1
        if self._losses >= CONNECTION_RETRY.max_attempts:
            raise LedgerUnavailableError(location=self._location, detail=str(error).strip()) from None
        return CONNECTION_RETRY.delay_for(self._losses - 1), True


class _Rows:
    """A psycopg cursor as a :class:`Cursor`; a statement without a result set yields no rows."""

    __slots__ = ("_cursor", "_transaction")

    def __init__(self, cursor: psycopg.Cursor[Row], transaction: _Transaction) -> None:
        self._cursor = cursor
        self._transaction = transaction

    def _arrived(self) -> psycopg.Cursor[Row]:
        """The cursor once the statement's result has come back (sending the queued statements if need be)."""
        if self._cursor.pgresult is None:
            self._transaction.send()
        return self._cursor

    @property
    def rowcount(self) -> int:
        return self._arrived().rowcount

    def fetchone(self) -> Row | None:
        cursor = self._arrived()
        return cursor.fetchone() if cursor.description is not None else None

    def fetchall(self) -> list[Row]:
        cursor = self._arrived()
        return cursor.fetchall() if cursor.description is not None else []

    def __iter__(self) -> Iterator[Row]:
        return iter(self.fetchall())


class PostgresDatabase:
    """A ledger :class:`~rayfleet.ledger._store.Database` in PostgreSQL.

    Args:
        url: ``postgresql://user:password@host:5432/database``.
        pool_size: most connections this process keeps open.
        connect_timeout: seconds to wait for the server when opening, and for a free or new connection
            on each attempt of a ledger call; by default the URL's ``?connect_timeout=`` (as libpq
            reads it), else 10.

    Raises:
        LedgerUnavailableError: the server cannot be reached within ``connect_timeout``.
        LedgerSchemaError: the database was written by a newer rayfleet.
    """

    kind = "postgresql"
    dialect = POSTGRESQL
    clock_sql = "EXTRACT(EPOCH FROM clock_timestamp())::float8"

    def __init__(self, url: str, *, pool_size: int = 8, connect_timeout: float | None = None) -> None:
        self.url = url
        self._location = redact(url)
        self._answered: weakref.WeakKeyDictionary[
            psycopg.Connection[Row] | psycopg.AsyncConnection[Row], float
        ] = weakref.WeakKeyDictionary()
        self._async: tuple[asyncio.AbstractEventLoop, psycopg.AsyncConnection[Row]] | None = None
        self._answered_lock = threading.Lock()
        if connect_timeout is None:
            connect_timeout = _url_connect_timeout(url)
        self._connect_timeout = connect_timeout
        self._pool: psycopg_pool.ConnectionPool[psycopg.Connection[Row]] = psycopg_pool.ConnectionPool(
            # No check of each connection as it leaves the pool (a round trip per ledger call):
            # a connection found broken is retried below, after the pool was checked whole.
            url, min_size=1, max_size=pool_size, open=False,
            # How long one ledger call waits for a connection: the default 30 s, times the
            # reconnection attempts below, kept a call hanging for minutes while the server was away.
            timeout=connect_timeout,
            # How long the pool keeps re-trying one lost connection (with growing pauses) before
            # it gives up and the next call starts afresh. psycopg_pool's 300 s let the pauses grow
            # past a minute, so calls failed long after the server was back.
            reconnect_timeout=max(5.0, 2 * connect_timeout),
            kwargs={"autocommit": False, "connect_timeout": max(1, int(connect_timeout))},
            configure=_configure_session,
            name="rayfleet-ledger",
        )
        try:
            self._pool.open(wait=True, timeout=connect_timeout)
        except psycopg_pool.PoolTimeout as error:
            self._pool.close()
            raise LedgerUnavailableError(location=self._location, detail=f"no connection ({error})") from None
        self.write(self._migrate)

    def _migrate(self, tx: Transaction) -> None:
        tx.execute("SELECT pg_advisory_xact_lock(?)", (_SCHEMA_LOCK,))
        tx.execute("CREATE TABLE IF NOT EXISTS rayfleet_schema (version INTEGER NOT NULL)")
        row = tx.execute("SELECT version FROM rayfleet_schema").fetchone()
        version = 0 if row is None else int(row[0])
        if version > len(MIGRATIONS):
            raise LedgerSchemaError(location=self._location, found=version, known=len(MIGRATIONS))
        for migration in MIGRATIONS[version:]:
            for statement in migration.statements(POSTGRESQL):
                tx.execute(statement)
        if row is None:
            tx.execute("INSERT INTO rayfleet_schema (version) VALUES (?)", (len(MIGRATIONS),))
        elif version < len(MIGRATIONS):
            tx.execute("UPDATE rayfleet_schema SET version = ?", (len(MIGRATIONS),))

    def write(self, fn: Callable[[Transaction], T]) -> T:
        return self._run(fn, psycopg.IsolationLevel.SERIALIZABLE, read_only=False)

    def read(self, fn: Callable[[Transaction], T]) -> T:
        # A read-only snapshot: consistent, and never aborted for a conflict.
        return self._run(fn, psycopg.IsolationLevel.REPEATABLE_READ, read_only=True)

    def write_alone(self, sql: str, parameters: Sequence[Any] = ()) -> list[Row]:
        """Run one statement as a transaction of its own (``SERIALIZABLE``) and return its rows.

        Sent outside a transaction block, it costs one round trip: no ``BEGIN`` and no
        ``COMMIT`` of its own (a one-checkpoint commit 1.71 against 1.87 ms per whole
        call, ``python -m benchmarks.pg_commit``). It is all or nothing, and durable when
        this returns. A connection that has not answered lately is checked first, so a
        connection lost before the statement is sent is retried; one lost after it was
        sent raises ``LedgerUnavailableError`` with ``committed_unknown``.
        """
        converted = sql.replace("?", "%s")

        def attempt(connection: psycopg.Connection[Row], attempt_state: _Attempt) -> list[Row]:
            connection.autocommit = True
            try:
                if not self._answered_within(connection, ALIVE_FOR):
                    connection.execute("SELECT 1")
                attempt_state.committing = True
                cursor = connection.execute(converted, tuple(parameters))
                return cursor.fetchall() if cursor.description is not None else []
            finally:
                with contextlib.suppress(psycopg.Error):
                    connection.autocommit = False

        return self._attempts(attempt)

    def _run(self, fn: Callable[[Transaction], T], isolation: psycopg.IsolationLevel, *, read_only: bool) -> T:
        def attempt(connection: psycopg.Connection[Row], attempt_state: _Attempt) -> T:
            try:
                # Set on the idle connection, psycopg sends them with the transaction's
                # BEGIN: no statement of their own, no extra round trip.
                connection.isolation_level = isolation
                connection.read_only = read_only
                tx = _Transaction(connection)
                result = fn(tx)
                if not tx.answered_within(ALIVE_FOR) or tx.one_queued():
                    # Nothing has shown the session alive lately: one the server dropped while
                    # it sat in the pool, or ended while this process was stopped, fails here,
                    # before the COMMIT, so the write is known not to have happened and is retried.
                    # (A lone statement goes first anyway: that is the cheaper way to send it.)
                    tx.send()
                attempt_state.committing = True
                tx.commit()
                return result
            except BaseException:
                # After a failed commit too: a statement that failed in the pipeline
                # left the transaction aborted, and a broken connection is discarded anyway.
                with contextlib.suppress(psycopg.Error):
                    connection.rollback()
                raise

        return self._attempts(attempt)

    def _attempts(self, attempt: Callable[[psycopg.Connection[Row], _Attempt], T]) -> T:
        """``attempt`` on a pooled connection, again after a conflict or a connection lost before it committed."""
        retries = _Retries(self._location)
        while True:
            attempt_state = _Attempt()
            try:
                with self._pool.connection() as connection:
                    result = attempt(connection, attempt_state)
                    self._heard_from(connection)
                    return result
            except _RETRIED as error:
                pause, lost = retries.after(error, attempt_state)
                time.sleep(pause)
                if lost:
                    # After a server restart every idle connection is dead: replace them all at once,
                    # rather than spending one attempt on each.
                    with contextlib.suppress(psycopg.Error, psycopg_pool.PoolTimeout):
                        self._pool.check()

    async def write_alone_async(self, sql: str, parameters: Sequence[Any] = ()) -> list[Row]:
        """:meth:`write_alone`, awaited on the calling event loop over a connection of its own.

        What a host's commit of one turn takes: a blocking write handed to a worker thread
        and back cost about 0.1 to 0.3 ms more per call than this (``python -m
        benchmarks.pg_commit``). Guarantees and failures are those of :meth:`write_alone`,
        with the same retries; the loop's connection is opened on first use and again
        after it was lost. Calls on one loop share its connection, one statement at a time.
        """
        converted = sql.replace("?", "%s")
        retries = _Retries(self._location)
        while True:
            attempt_state = _Attempt()
            try:
                connection = await self._loop_connection()
                if not self._answered_within(connection, ALIVE_FOR):
                    await connection.execute("SELECT 1")
                attempt_state.committing = True
                cursor = await connection.execute(converted, tuple(parameters))
                rows = await cursor.fetchall() if cursor.description is not None else []
                self._heard_from(connection)
                return rows
            except _RETRIED as error:
                pause, lost = retries.after(error, attempt_state)
                if lost:
                    self._forget_loop_connection()
                await asyncio.sleep(pause)

    async def _loop_connection(self) -> psycopg.AsyncConnection[Row]:
        """The running loop's connection, opened (in autocommit, with the session settings) if it has none."""
        loop = asyncio.get_running_loop()
        if self._async is not None and self._async[0] is loop and not self._async[1].closed:
            return self._async[1]
        self._forget_loop_connection()
        connection = await psycopg.AsyncConnection.connect(
            self.url, autocommit=True, connect_timeout=max(1, int(self._connect_timeout)),
        )
        for setting in _SESSION_SETTINGS:
            await connection.execute(setting)
        self._async = (loop, connection)
        return connection

    def _forget_loop_connection(self) -> None:
        """Close the loop connection, if any (a lost one, or one of a loop no longer running here)."""
        if self._async is not None:
            # libpq's close needs no loop: the connection's own loop may be gone.
            self._async[1].pgconn.finish()
            self._async = None

    def _heard_from(self, connection: psycopg.Connection[Row] | psycopg.AsyncConnection[Row]) -> None:
        with self._answered_lock:
            self._answered[connection] = time.monotonic()

    def _answered_within(
        self, connection: psycopg.Connection[Row] | psycopg.AsyncConnection[Row], seconds: float,
    ) -> bool:
        """Whether ``connection`` finished an operation in the last ``seconds`` (so it was alive then)."""
        with self._answered_lock:
            answered = self._answered.get(connection)
        return answered is not None and time.monotonic() - answered < seconds

    def now(self, tx: Transaction) -> float:
        row = tx.execute(f"SELECT {self.clock_sql}").fetchone()
        assert row is not None  # a SELECT of one expression returns one row
        return float(row[0])

    def incarnation(self, tx: Transaction) -> str:
        row = tx.execute("SELECT pg_postmaster_start_time()::text").fetchone()
        assert row is not None  # a SELECT of one expression returns one row
        return str(row[0])

    def end_stalled_sessions(self, older_than: float) -> dict[int, float]:
        """End this database's sessions stalled mid-transaction for over ``older_than`` seconds that others wait on.

        The server ends a session left idle inside a transaction
        (``idle_in_transaction_session_timeout``), but not every session a stopped client
        leaves holding locks: one in the middle of a pipeline (a process frozen inside
        ``executemany``) stays *active*, waiting for the client's next message; one whose
        result the client stopped reading stays *active*, blocked writing it; and one
        idle in its transaction after a large result was seen idle far past that limit
        (likely because ending it means writing the error to a client that does not read).
        Each keeps its row locks for as long as the client is stopped. Ending it aborts
        its transaction, so nothing it wrote lands; a client that wakes finds its
        connection gone (an unknown outcome, which fencing makes safe to retry). Returns
        each ended session's process id and how long its client had been silent. Ending
        another session takes the same role (or ``pg_signal_backend``); a refusal raises
        ``LedgerUnavailableError``.
        """
        rows = self.write_alone(_END_STALLED, (older_than,))
        return {int(pid): float(seconds) for pid, seconds, ended in rows if ended}

    def describe(self) -> str:
        return self._location

    def close(self) -> None:
        self._forget_loop_connection()
        self._pool.close()
