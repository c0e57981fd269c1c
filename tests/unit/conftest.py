"""Unit tests never start Ray: the identity core and topology are plain asyncio."""

from __future__ import annotations

import sys

import pytest


@pytest.fixture(autouse=True)
def _forbid_ray_init(monkeypatch: pytest.MonkeyPatch) -> None:
    ray = sys.modules.get("ray")
    if ray is not None:
        def refuse(*args: object, **kwargs: object) -> None:
            raise RuntimeError("Unit tests must not start Ray; move this test to tests/integration/.")

        monkeypatch.setattr(ray, "init", refuse)
