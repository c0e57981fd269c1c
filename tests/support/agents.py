"""Agents that many tests share: each test module that only needs a counter imports this one."""

from __future__ import annotations

import rayfleet as rf


class Counter(rf.Agent):
    """Adds numbers; ``add`` answers the new total, ``get`` reads it without changing anything."""

    class State(rf.State):
        total: int = 0

    @rf.handler
    async def add(self, n: int) -> int:
        self.state.total += n
        return self.state.total

    @rf.handler
    async def get(self) -> int:
        return self.state.total
