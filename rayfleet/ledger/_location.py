"""Where a ledger lives, from a URL: ``sqlite:///abs/path/ledger.sqlite`` or ``postgresql://user:pw@host:5432/db``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from ..errors import InvalidSpecError
from ._ledger import Ledger
from ._postgres import PostgresDatabase, redact
from ._sqlite import SqliteDatabase
from ._store import Database

SQLITE_PREFIX = "sqlite:///"
_POSTGRES_SCHEMES = ("postgresql", "postgres")


@dataclass(frozen=True, slots=True)
class LedgerLocation:
    """A parsed ledger URL: which store, and the file path (SQLite) or connection URL (PostgreSQL)."""

    kind: Literal["sqlite", "postgresql"]
    url: str
    """The URL as given (with its password, if any: never print it; use :attr:`shown`)."""

    @classmethod
    def parse(cls, url: str) -> LedgerLocation:
        """Parse and check a ledger URL.

        Raises:
            InvalidSpecError: the URL is not ``sqlite:///<absolute path>`` or ``postgresql://...``.
        """
        if not isinstance(url, str) or not url:
            raise InvalidSpecError(f"ledger must be a URL string, got {url!r}", field="ledger")
        if url.startswith(SQLITE_PREFIX):
            path = url[len(SQLITE_PREFIX) - 1:]
            if not Path(path).is_absolute() or path == "/":
                raise InvalidSpecError(
                    f"ledger {url!r}: a SQLite ledger needs an absolute file path, "
                    f"e.g. sqlite:///var/rayfleet/ledger.sqlite",
                    field="ledger",
                )
            return cls("sqlite", url)
        scheme = urlsplit(url).scheme
        if scheme in _POSTGRES_SCHEMES:
            if not urlsplit(url).hostname:
                raise InvalidSpecError(
                    "ledger URL names no host; use postgresql://user:password@host:5432/database", field="ledger"
                )
            return cls("postgresql", url)
        raise InvalidSpecError(
            f"ledger {url.split('@')[-1]!r} is not a URL rayfleet knows; use sqlite:///<absolute path> (one node) "
            f"or postgresql://user:password@host:5432/database (clusters)",
            field="ledger",
        )

    @classmethod
    def sqlite(cls, path: str | Path) -> LedgerLocation:
        return cls("sqlite", SQLITE_PREFIX + str(Path(path).resolve()).lstrip("/"))

    @property
    def path(self) -> Path:
        """The SQLite file (only for ``kind == "sqlite"``)."""
        return Path(self.url[len(SQLITE_PREFIX) - 1:])

    @property
    def networked(self) -> bool:
        """Whether every process can reach the database itself (no ledger actor needed)."""
        return self.kind == "postgresql"

    @property
    def shown(self) -> str:
        """The URL without its password."""
        if self.kind == "sqlite":
            return self.url
        return redact(self.url)



def open_database(location: LedgerLocation) -> Database:
    """Connect to the store at ``location`` (creating or migrating its schema)."""
    if location.kind == "sqlite":
        return SqliteDatabase(location.path)
    return PostgresDatabase(location.url)


def open_ledger(location: LedgerLocation) -> Ledger:
    """The ledger at ``location``, opened in this process."""
    return Ledger(open_database(location))
