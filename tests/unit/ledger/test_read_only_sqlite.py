"""A SQLite ledger opened read-only (what the read-only commands read a stopped fleet through)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

import rayfleet as rf
from rayfleet.errors import LedgerSchemaError, LedgerUnavailableError
from rayfleet.ledger._ledger import Ledger
from rayfleet.ledger._sqlite import SqliteDatabase


def written(tmp_path: Path) -> Path:
    """A ledger file as a stopped fleet leaves it: written, then closed."""
    path = tmp_path / "ledger.sqlite"
    ledger = Ledger(path)
    assert ledger.fleet_identity(claim="fleet-1") == "fleet-1"
    ledger.close()
    return path


def test_it_reads_what_was_committed_and_creates_nothing(tmp_path: Path) -> None:
    path = written(tmp_path)
    before = sorted(tmp_path.iterdir())
    database = SqliteDatabase(path, read_only=True)
    ledger = Ledger(database, authority=False)
    try:
        assert ledger.fleet_identity() == "fleet-1"
        assert ledger.list_identities() == []
        assert sorted(tmp_path.iterdir()) == before  # no -wal or -shm beside it, nothing else
        with pytest.raises((sqlite3.OperationalError, LedgerUnavailableError)):
            database.write(lambda tx: tx.execute("DELETE FROM ledger_meta"))  # a write is refused
        assert ledger.fleet_identity() == "fleet-1"
    finally:
        ledger.close()
    assert sorted(tmp_path.iterdir()) == before


def test_a_missing_file_is_not_created(tmp_path: Path) -> None:
    with pytest.raises(LedgerUnavailableError):
        SqliteDatabase(tmp_path / "none" / "ledger.sqlite", read_only=True)
    assert list(tmp_path.iterdir()) == []


def test_a_file_of_another_schema_version_is_refused_unchanged(tmp_path: Path) -> None:
    path = written(tmp_path)
    with sqlite3.connect(path) as connection:
        connection.execute("PRAGMA user_version = 1")
    with pytest.raises(LedgerUnavailableError, match="older than this rayfleet") as older:
        SqliteDatabase(path, read_only=True)
    assert isinstance(older.value, rf.LedgerError)
    with sqlite3.connect(path) as connection:
        assert connection.execute("PRAGMA user_version").fetchone() == (1,)  # not migrated
        connection.execute("PRAGMA user_version = 999")
    with pytest.raises(LedgerSchemaError):
        SqliteDatabase(path, read_only=True)
