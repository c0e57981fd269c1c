"""What the host runtime needs from its surroundings besides the ledger: a way to reach peers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol


class Router(Protocol):
    """How an agent reaches another agent (``await self.send(peer, ...)``)."""

    async def send(self, *, sender: str, target: str, method: str, kwargs: Mapping[str, Any]) -> Any: ...
