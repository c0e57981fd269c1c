"""GatewayLimits refuses bounds that could not work."""

from __future__ import annotations

import pytest

import rayfleet as rf
from rayfleet.gateway import GatewayLimits


def test_defaults_are_consistent() -> None:
    limits = GatewayLimits()
    assert limits.max_body_bytes == 1024 * 1024
    assert limits.default_timeout <= limits.max_timeout
    assert limits.default_page_size <= limits.max_page_size


@pytest.mark.parametrize(("changes", "field"), [
    ({"max_body_bytes": 0}, "max_body_bytes"),
    ({"max_body_bytes": True}, "max_body_bytes"),
    ({"max_page_size": -1}, "max_page_size"),
    ({"max_timeout": 0.0}, "max_timeout"),
    ({"sse_heartbeat": float("inf")}, "sse_heartbeat"),
    ({"default_timeout": 10.0, "max_timeout": 5.0}, "default_timeout"),
    ({"default_page_size": 50, "max_page_size": 10}, "default_page_size"),
])
def test_bad_bounds_are_refused_naming_the_field(changes: dict[str, object], field: str) -> None:
    with pytest.raises(rf.InvalidSpecError) as caught:
        GatewayLimits(**changes)  # type: ignore[arg-type]
    assert caught.value.field == field
    assert field in str(caught.value)
