"""Fixtures of the ledger's unit tests."""

from __future__ import annotations

from collections.abc import Iterator

import pg_support
import pytest


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A URL naming a fresh, empty database on the test PostgreSQL server (dropped afterwards)."""
    url = pg_support.create_database()
    yield url
    pg_support.drop_database(url)
