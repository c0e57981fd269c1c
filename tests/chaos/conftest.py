"""Chaos tests share the session's one local Ray (``ray_session`` in tests/conftest.py) with the integration tests."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "chaos" in item.path.parts:
            item.add_marker(pytest.mark.chaos)


@pytest.fixture(autouse=True)
def _shared_ray(ray_session: None) -> None:
    """Never a second Ray: the session's, started once for every folder that needs one."""
