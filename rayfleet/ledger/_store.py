"""What the ledger's rules need from a database: transactions over rows, nothing more.

The table-group modules (``_identities``, ``_leases``, ...) are written against
:class:`Transaction` in a portable subset of SQL (``?`` placeholders, ``ON CONFLICT``
upserts, ``RETURNING``), so the fencing rules exist once whatever database stores them.

A store runs a whole operation as a function of one transaction (``write(fn)``), not
as a ``with`` block: a store whose database may abort a transaction for a conflict
(PostgreSQL at SERIALIZABLE) can then run the function again on a fresh transaction,
which a ``with`` block cannot.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from ._schema import Dialect

Row = tuple[Any, ...]
T = TypeVar("T")


class Cursor(Protocol):
    """The result of one statement."""

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Row | None: ...

    def fetchall(self) -> list[Row]: ...

    def __iter__(self) -> Iterator[Row]: ...


class Transaction(Protocol):
    """One open transaction: statements run in it see each other's writes."""

    @property
    def dialect(self) -> Dialect:
        """How this store spells what the portable subset lacks (one-row JSON reads of many rows)."""
        ...

    def execute(self, sql: str, parameters: Sequence[Any] = ..., /) -> Cursor: ...

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]], /) -> Cursor:
        """Run ``sql`` once per row; the cursor's ``rowcount`` is the rows changed by all of them."""
        ...


IN_LIST = 500
"""Values per ``IN (...)`` list: well inside every store's limit on statement parameters."""


def rows_in(tx: Transaction, select: str, values: Iterable[Any]) -> Iterator[Row]:
    """The rows of ``select`` (which ends in ``IN``) for ``values``, a statement per :data:`IN_LIST` of them.

    Repeated values are asked once. Rows come in no particular order.
    """
    distinct = list(dict.fromkeys(values))
    for start in range(0, len(distinct), IN_LIST):
        chunk = distinct[start:start + IN_LIST]
        yield from tx.execute(f"{select} ({', '.join('?' * len(chunk))})", chunk)


class Database(Protocol):
    """A ledger database: serializable read-write transactions and consistent reads.

    ``write(fn)`` runs ``fn`` in one transaction and commits it; the commit is durable
    when ``write`` returns. If ``fn`` raises, nothing it wrote is kept and the error
    propagates. A store may run ``fn`` more than once (after a conflict it rolled back),
    so ``fn`` must have no effect outside the transaction.
    """

    kind: str
    """``"sqlite"`` or ``"postgresql"``: which store this is, for messages and metrics."""

    dialect: Dialect
    """How this store spells what the portable subset lacks (as its transactions' ``dialect``)."""

    def write(self, fn: Callable[[Transaction], T]) -> T: ...

    def write_alone(self, sql: str, parameters: Sequence[Any] = ...) -> list[Row]:
        """Run one statement as a write transaction of its own and return its rows (durable when this returns)."""
        ...

    def read(self, fn: Callable[[Transaction], T]) -> T: ...

    def now(self, tx: Transaction) -> float:
        """The authority's wall clock, in seconds since the epoch, as seen inside ``tx``."""
        ...

    clock_sql: str
    """:meth:`now` as an SQL expression, for a statement that stamps a row without reading the clock first."""

    def incarnation(self, tx: Transaction) -> str:
        """Changes whenever the database itself restarted (lock-delay applies after a restart)."""
        ...

    def describe(self) -> str:
        """Where the data lives, for messages (no passwords)."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class AwaitedWrites(Protocol):
    """A :class:`Database` that can also run :meth:`Database.write_alone` awaited on the caller's event loop.

    A store whose writes are network exchanges (PostgreSQL) saves the worker thread a
    blocking call needs; a local file (SQLite) has nothing to await.
    """

    async def write_alone_async(self, sql: str, parameters: Sequence[Any] = ...) -> list[Row]:
        """:meth:`Database.write_alone`, awaited: same guarantees and failures."""
        ...


@runtime_checkable
class StalledSessions(Protocol):
    """A :class:`Database` served by a server whose sessions a stopped client can leave holding locks (PostgreSQL).

    A SQLite file has its own form of this (a process stopped inside its commit keeps the
    file's write lock), which only ending that process ends: see :class:`WriteLockHolders`.
    """

    def end_stalled_sessions(self, older_than: float) -> dict[int, float]:
        """End the sessions stalled mid-transaction for over ``older_than`` seconds that others wait on.

        Returns each ended session's server process id with the seconds it had stalled.
        """
        ...


@runtime_checkable
class WriteLockHolders(Protocol):
    """A :class:`Database` in a file whose write lock belongs to a process (SQLite): it can say which one holds it."""

    def write_lock_holder(self) -> int | None:
        """The process id of another process holding the write lock at this moment, else ``None``."""
        ...

    def read_aside(self, fn: Callable[[Transaction], T]) -> T:
        """:meth:`Database.read`, on a connection that never waits for this process's writers."""
        ...


@runtime_checkable
class ImmediateWrites(Protocol):
    """A :class:`Database` that can tell at once whether a write would wait for its write lock (SQLite)."""

    def write_now(self, fn: Callable[[Transaction], T]) -> tuple[bool, T | None]:
        """:meth:`Database.write`, only if nothing has to be waited for: ``(False, None)`` when the write lock
        is held at this moment, else ``(True, result)``."""
        ...


class WouldWait(Exception):
    """A write of an :class:`ImmediateDatabase` would have waited; nothing was written (control flow, never
    raised to a caller of the ledger).

    Caught by ``Ledger.immediately``, which answers ``(False, None)`` instead.
    """


@dataclass(frozen=True, slots=True)
class StoreClock:
    """The store's own clock as an SQL expression (``Database.clock_sql``), read as a statement runs."""

    sql: str


@dataclass(frozen=True, slots=True)
class Statement(Generic[T]):
    """One statement that does a whole ledger operation when it passes, and how to read its answer."""

    sql: str
    parameters: Sequence[Any]
    answer: Callable[[list[Row]], T | None]
    """The operation's reply from the statement's rows; ``None`` when it did not pass and wrote nothing."""


class ImmediateDatabase:
    """An :class:`ImmediateWrites` store whose writes raise :class:`WouldWait` rather than wait for the lock.

    Reads and everything else are the store's own; closing it leaves the store open.
    """

    def __init__(self, store: Database) -> None:
        if not isinstance(store, ImmediateWrites):
            raise TypeError(f"{type(store).__name__} cannot tell whether a write would wait")
        self._store = store
        self._writes_now: ImmediateWrites = store
        self.kind = store.kind
        self.dialect = store.dialect
        self.clock_sql = store.clock_sql

    def write(self, fn: Callable[[Transaction], T]) -> T:
        wrote, result = self._writes_now.write_now(fn)
        if not wrote:
            raise WouldWait
        return result  # type: ignore[return-value]  # None only when fn returned None

    def write_alone(self, sql: str, parameters: Sequence[Any] = ()) -> list[Row]:
        return self.write(lambda tx: tx.execute(sql, parameters).fetchall())

    def read(self, fn: Callable[[Transaction], T]) -> T:
        return self._store.read(fn)

    def now(self, tx: Transaction) -> float:
        return self._store.now(tx)

    def incarnation(self, tx: Transaction) -> str:
        return self._store.incarnation(tx)

    def describe(self) -> str:
        return self._store.describe()

    def close(self) -> None:
        """Nothing to close: the store belongs to the ledger this one was made from."""
