"""The lease reads of requests waiting on their hosts, made together.

A request its host has not answered for a probe interval asks the ledger whether that
host still holds the identity's lease (see ``_routing``). When a host freezes with a
thousand requests waiting on it, each asked for its own identity: a thousand ledger
reads per probe interval, queued one behind another in the ledger's worker, so the
last requests learned of the lapse a good while after the first. Here every identity
asked on one event loop while a read is being made, or in the same loop turn, goes
into the next read: one read per wave of probes, however many requests wait.
"""

from __future__ import annotations

import asyncio

from ..ledger._contract import LedgerClient
from ..ledger._values import LeaseView


class LeaseProbes:
    """Reads of identities' live leases for one courier, coalesced per event loop.

    Guarantees: the read that answers :meth:`lease` begins after it was called (a
    request never acts on a lease seen before it asked), and each caller gets its own
    identity's lease or the read's error. A caller that is cancelled only stops
    waiting; the read goes on for the others.
    """

    def __init__(self, ledger: LedgerClient) -> None:
        self._ledger = ledger
        self._asked: dict[asyncio.AbstractEventLoop, dict[str, list[asyncio.Future[LeaseView | None]]]] = {}
        self._readers: dict[asyncio.AbstractEventLoop, asyncio.Task[None]] = {}

    async def lease(self, identity: str) -> LeaseView | None:
        """The live lease of ``identity`` now (``None``: none, lapsed, or no such identity)."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[LeaseView | None] = loop.create_future()
        self._asked.setdefault(loop, {}).setdefault(identity, []).append(answer)
        if loop not in self._readers:
            # The reader starts a loop turn later: the asks of this turn join its first read.
            self._readers[loop] = loop.create_task(self._read(loop))
        return await answer

    async def _read(self, loop: asyncio.AbstractEventLoop) -> None:
        """Read what was asked on ``loop``, then what was asked meanwhile, until nothing is left."""
        asked: dict[str, list[asyncio.Future[LeaseView | None]]] = {}
        try:
            while asked := self._asked.pop(loop, {}):
                try:
                    leases = await self._ledger.leases(list(asked))
                except Exception as error:  # noqa: BLE001 - each waiting request gets the read's error
                    _settle(asked, error=error)
                else:
                    _settle(asked, leases=leases)
        finally:
            del self._readers[loop]
            # Cancelled (the loop is closing): nobody is left to answer those asking.
            for answers in (*asked.values(), *self._asked.pop(loop, {}).values()):
                for answer in answers:
                    answer.cancel()


def _settle(
    asked: dict[str, list[asyncio.Future[LeaseView | None]]], *,
    leases: dict[str, LeaseView | None] | None = None, error: Exception | None = None,
) -> None:
    for identity, answers in asked.items():
        for answer in answers:
            if answer.done():
                continue  # its caller stopped waiting
            if error is not None:
                answer.set_exception(error)
            else:
                answer.set_result(None if leases is None else leases.get(identity))
