"""One local Ray for the whole session; each test gets its own namespace and storage folder."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pg_support
import pytest
from user_scripts import UserSetting, as_a_user

import rayfleet as rf


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "integration" in str(item.path):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(autouse=True)
def _shared_ray(ray_session: None) -> None:
    """The session's one local Ray (``ray_session`` in tests/conftest.py, shared with tests/chaos)."""


@pytest.fixture
def storage(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def make_fleet(storage: Path) -> Iterator[object]:
    """Factory for fleets in a fresh namespace; every fleet made is shut down after the test."""
    fleets: list[rf.Fleet] = []

    def make(**options: object) -> rf.Fleet:
        options.setdefault("hosts", 2)
        options.setdefault("namespace", f"t-{uuid.uuid4().hex[:10]}")
        fleet = rf.connect(storage=options.pop("storage", storage), **options)  # type: ignore[arg-type]
        fleets.append(fleet)
        return fleet

    yield make
    for fleet in fleets:
        fleet.shutdown(stop_actors=True)


@pytest.fixture
def fleet(make_fleet: object) -> rf.Fleet:
    return make_fleet()  # type: ignore[operator]


@pytest.fixture
def postgres_ledger() -> Iterator[str]:
    """A ledger URL naming a fresh, empty database on the test PostgreSQL server (dropped afterwards)."""
    url = pg_support.create_database()
    yield url
    pg_support.drop_database(url)


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger_kind(request: pytest.FixtureRequest) -> str:
    """Runs a test once per ledger store: the embedded SQLite ledger and a PostgreSQL one."""
    return str(request.param)


@pytest.fixture
def make_any_fleet(make_fleet: Any, ledger_kind: str, request: pytest.FixtureRequest) -> Any:
    """``make_fleet`` on the store of ``ledger_kind`` (one PostgreSQL database per test)."""
    if ledger_kind == "sqlite":
        return make_fleet
    url = request.getfixturevalue("postgres_ledger")
    made: list[rf.Fleet] = []

    def make(**options: object) -> rf.Fleet:
        fleet: rf.Fleet = make_fleet(ledger=url, **options)
        made.append(fleet)
        return fleet

    def stop() -> None:
        # Before the database is dropped (finalizers run last-registered first).
        for fleet in made:
            fleet.shutdown(stop_actors=True)

    request.addfinalizer(stop)
    return make


@pytest.fixture
def any_fleet(make_any_fleet: Any) -> rf.Fleet:
    """A fleet on each ledger store in turn (see ``ledger_kind``)."""
    return make_any_fleet()  # type: ignore[no-any-return]



@pytest.fixture
def user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[UserSetting]:
    """Where a user's script runs (an example, a docs page): ``rf.connect()`` finds a fresh fleet there."""
    with as_a_user(tmp_path / "work", monkeypatch) as setting:
        yield setting
