"""A rayfleet error raised inside a Ray task or actor reaches the caller as that type."""

from __future__ import annotations

import pytest
import ray

import rayfleet as rf


@ray.remote
def _fails() -> None:
    raise rf.LedgerUnavailableError(location="sqlite:///x", detail="gone", committed_unknown=True)


def test_a_rayfleet_error_raised_in_a_ray_task_keeps_its_type_and_fields() -> None:
    with pytest.raises(rf.LedgerUnavailableError) as raised:
        ray.get(_fails.remote())
    assert raised.value.committed_unknown is True
    assert isinstance(raised.value, ray.exceptions.RayTaskError)
