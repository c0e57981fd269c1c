"""Group calls: items submitted while a ledger call is in flight go out together in the next one.

Under load the cost of a ledger round trip (a transaction, and a Ray call when the ledger
is an actor) is shared by every item submitted in that window; an idle host adds no
delay, since the first item goes out in the next turn of the event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, Generic, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")


class CallGroup(Generic[Item, Result]):
    """Submits items to ``call`` in batches of at most ``limit``, one batch in flight at a time.

    ``submit`` resolves with the item's own result, or raises what the batch's call raised
    (every item of a failed batch gets the same error: the caller judges it as if its own
    call had met it). Results come back in the order of the items, so ``call`` must answer
    one result per item, in order. When the flushing task is cancelled (shutdown), every
    item not yet answered gets ``stopped()``'s error.
    """

    def __init__(
        self, call: Callable[[list[Item]], Awaitable[Sequence[Result]]], *, limit: int,
        spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task[None]], stopped: Callable[[], Exception],
    ) -> None:
        self._call = call
        self._limit = limit
        self._spawn = spawn
        self._stopped = stopped
        self._queue: list[tuple[Item, asyncio.Future[Result]]] = []
        self._flushing: asyncio.Task[None] | None = None

    async def submit(self, item: Item) -> Result:
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        self._queue.append((item, future))
        if self._flushing is None or self._flushing.done():
            self._flushing = self._spawn(self._flush())
        return await future

    async def _flush(self) -> None:
        # Loops until the queue is empty: items that arrive while a batch is in flight go
        # out in the next batch instead of waiting for a flush nobody schedules.
        batch: list[tuple[Item, asyncio.Future[Result]]] = []
        try:
            while self._queue:
                await asyncio.sleep(0)
                batch, self._queue = self._queue[:self._limit], self._queue[self._limit:]
                try:
                    results = await self._call([item for item, _ in batch])
                except Exception as error:  # noqa: BLE001 - whatever the call raised, every waiter gets it
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(error)
                    continue
                for (_, future), result in zip(batch, results, strict=True):
                    if not future.done():
                        future.set_result(result)
                batch = []
        except asyncio.CancelledError:
            pending, self._queue = [*batch, *self._queue], []
            for _, future in pending:
                if not future.done():
                    future.set_exception(self._stopped())
            raise
