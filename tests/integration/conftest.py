"""One local Ray for the whole session; each test gets its own namespace and storage folder."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray

import rayfleet as rf


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "integration" in str(item.path):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session", autouse=True)
def ray_session() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, namespace="rayfleet-tests", log_to_driver=False)
    yield
    ray.shutdown()


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

