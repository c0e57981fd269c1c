"""What the ledger's rules need from a database: transactions over rows, nothing more.

The table-group modules (``_identities``, ``_leases``, ...) are written against
:class:`Transaction` in a portable subset of SQL (``?`` placeholders, ``ON CONFLICT``
upserts, ``RETURNING``), so the fencing rules exist once whatever database stores them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

Row = tuple[Any, ...]


class Cursor(Protocol):
    """The result of one statement."""

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Row | None: ...

    def fetchall(self) -> list[Row]: ...

    def __iter__(self) -> Iterator[Row]: ...


class Transaction(Protocol):
    """One open transaction: statements run in it see each other's writes."""

    def execute(self, sql: str, parameters: Sequence[Any] = ..., /) -> Cursor: ...


class Database(Protocol):
    """A ledger database: serializable read-write transactions and consistent reads.

    ``transaction()`` commits when the block exits normally and rolls back when it
    raises; a committed transaction is durable when the block returns.
    """

    def transaction(self) -> AbstractContextManager[Transaction]: ...

    def read(self) -> AbstractContextManager[Transaction]: ...

    def close(self) -> None: ...
