"""Deliver one message to a host runtime's front door in a line, as the unit tests of the host do."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rayfleet import Envelope
from rayfleet.host._delivery import Delivery
from rayfleet.host._hosted import TurnResult
from rayfleet.host._runtime import HostRuntime


async def deliver(
    host: HostRuntime | Delivery,
    identity: str,
    method: str,
    args: tuple[Any, ...] = (),
    kwargs: Mapping[str, Any] | None = None,
    **fields: Any,
) -> TurnResult:
    """``host.delivery.deliver`` of an :class:`Envelope` built from these fields (a ``Delivery`` is used as is)."""
    front = host.delivery if isinstance(host, HostRuntime) else host
    return await front.deliver(Envelope(target=identity, method=method, args=tuple(args), kwargs=dict(kwargs or {}),
                                        **fields))
