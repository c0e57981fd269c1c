"""Group commit: many agents' checkpoints become one Arrow file and one ledger call.

Checkpoints submitted while a commit is in flight wait and go out together in the
next one, so under load the cost of a file write and a ledger round trip is shared
by every agent that checkpointed in that window, and an idle host adds no delay.

A small batch of small States skips the file: each State travels inline in the
ledger's commit, so the turn pays one durable write (the ledger's) instead of a file,
its fsyncs and then the ledger's. Large States, and batches large enough that one
file is cheaper than many ledger rows, go to a file.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa
import pydantic

from ..errors import LedgerUnavailableError, RayfleetError
from ..identity._values import SnapshotPointer
from ..ledger._contract import LedgerClient
from ..ledger._ledger import CheckpointCommit
from ._store import SnapshotRow, SnapshotStore

INLINE_STATE_BYTES = 16 * 1024
"""Default limit: a State whose one-row Arrow encoding is at most this large may travel in the ledger's commit."""
INLINE_BATCH_ROWS = 64
"""Batches of more States of one class than this go to one file (shared by all) rather than ledger rows.

64 covers the batches of a host under load (a batch is every checkpoint taken while
the previous commit was in flight); the large group commits of bulk deactivation go
to files."""


@dataclass(slots=True)
class _Pending:
    identity: str
    fencing_token: int
    version: int
    state: pydantic.BaseModel
    extra: bytes
    dedup: tuple[tuple[str, bytes], ...]
    dedup_capacity: int
    done: asyncio.Future[SnapshotPointer]


class GroupCommitter:
    """Writes and commits checkpoints in batches; one instance per host.

    ``commit`` resolves once the pointer is durable in the ledger, or raises:

    * the ledger's refusal (``StaleFencingTokenError``, ``StaleCheckpointVersionError``,
      ...): nothing was committed;
    * the storage error: the file was not written, and the ledger was not called;
    * ``LedgerUnavailableError``: as the ledger raised it (its ``committed_unknown``
      says whether the write may have happened), or with ``committed_unknown`` for
      any other failure of the ledger call (a lost reply, a ledger actor that died
      or restarted mid-call), since the write may have happened before the reply
      was lost.

    Files are written before pointers move, so a committed pointer never names a
    file that is not there. Files are written on a worker thread: the event loop
    keeps serving turns meanwhile.
    """

    def __init__(
        self, *, writer: str, ledger: LedgerClient, snapshots: SnapshotStore,
        on_batch: Callable[[int], None] | None = None, inline_limit: int = INLINE_STATE_BYTES,
    ) -> None:
        """``on_batch`` hears the size of every batch the ledger accepted (for metrics); it must not block.

        ``inline_limit``: States of at most this many encoded bytes travel in the
        ledger's commit (in batches of at most :data:`INLINE_BATCH_ROWS` per class); 0
        writes every State to a file.
        """
        self._inline_limit = inline_limit
        self._writer = writer
        self._on_batch = on_batch
        self._ledger = ledger
        self._snapshots = snapshots
        self._queue: list[_Pending] = []
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.batches = 0
        self.checkpoints = 0

    def start(self) -> None:
        if self._task is not None:
            raise RuntimeError("GroupCommitter already started")
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"rayfleet-commit-{self._writer}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        for item in self._queue:
            if not item.done.done():
                item.done.set_exception(RuntimeError("host is shutting down; checkpoint not committed"))
        self._queue.clear()

    async def commit(
        self, *, identity: str, fencing_token: int, version: int, state: pydantic.BaseModel, extra: bytes = b"",
        dedup: tuple[tuple[str, bytes], ...] = (), dedup_capacity: int = 10_000,
    ) -> SnapshotPointer:
        """Queue one checkpoint and wait until it is committed (or refused)."""
        done: asyncio.Future[SnapshotPointer] = asyncio.get_running_loop().create_future()
        self._queue.append(_Pending(identity, fencing_token, version, state, extra, dedup, dedup_capacity, done))
        self._wakeup.set()
        return await done

    async def _run(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            # One yield lets turns that finish in the same loop iteration join this batch.
            await asyncio.sleep(0)
            batch, self._queue = self._queue, []
            if batch:
                await self._commit_batch(batch)

    async def _commit_batch(self, batch: list[_Pending]) -> None:
        groups: dict[type, list[_Pending]] = defaultdict(list)
        for item in batch:
            groups[type(item.state)].append(item)
        commits: list[CheckpointCommit] = []
        written: list[_Pending] = []
        for state_class, items in groups.items():
            rows = [SnapshotRow(identity=i.identity, version=i.version, state=i.state, extra=i.extra) for i in items]
            try:
                encoded = self._snapshots.encode(rows)
                pointers = self._inline(encoded, [row.version for row in rows])
                to_file = [row for row, pointer in enumerate(pointers) if pointer is None]
                if to_file:
                    part = encoded if len(to_file) == len(rows) else encoded.take(pa.array(to_file, type=pa.int64()))
                    path = await asyncio.to_thread(
                        self._snapshots.write_batch, group=_group_name(state_class), writer=self._writer, rows=part,
                    )
                    for file_row, row in enumerate(to_file):
                        pointers[row] = SnapshotPointer(file=path, row=file_row, version=rows[row].version)
            except Exception as error:  # noqa: BLE001 - any storage failure fails these checkpoints, not the host
                for item in items:
                    item.done.set_exception(error)
                continue
            for item, pointer in zip(items, pointers, strict=True):
                assert pointer is not None  # every row is inline or in the file written above
                commits.append(CheckpointCommit(
                    identity=item.identity, fencing_token=item.fencing_token, version=item.version, pointer=pointer,
                    dedup=item.dedup, dedup_capacity=item.dedup_capacity,
                ))
                written.append(item)
        if not commits:
            return
        try:
            outcomes = await self._ledger.commit_checkpoints(commits)
        except LedgerUnavailableError as error:
            # The ledger says whether the write may have happened; each waiter gets its word.
            for item in written:
                if not item.done.done():
                    item.done.set_exception(error)
            return
        except Exception as error:  # noqa: BLE001 - see the class docstring: the outcome is unknown
            for item in written:
                if not item.done.done():
                    unknown = LedgerUnavailableError(
                        location="the fleet ledger", detail=f"{type(error).__name__}: {error}", committed_unknown=True
                    )
                    unknown.__cause__ = error
                    item.done.set_exception(unknown)
            return
        self.batches += 1
        if self._on_batch is not None:
            self._on_batch(len(commits))
        for item, commit, outcome in zip(written, commits, outcomes, strict=True):
            if item.done.done():
                continue
            if isinstance(outcome, RayfleetError):
                item.done.set_exception(outcome)
            else:
                self.checkpoints += 1
                item.done.set_result(commit.pointer)


    def _inline(self, batch: pa.RecordBatch, versions: list[int]) -> list[SnapshotPointer | None]:
        """Per row of ``batch`` (at ``versions``): its inline pointer, or ``None`` when that row goes to a file."""
        if not 0 < batch.num_rows <= INLINE_BATCH_ROWS or self._inline_limit <= 0:
            return [None] * batch.num_rows
        pointers: list[SnapshotPointer | None] = []
        schema_message = batch.schema.serialize().to_pybytes()
        for row, version in enumerate(versions):
            data = self._snapshots.inline(batch, row, schema_message=schema_message)
            pointers.append(
                SnapshotPointer(file="", row=0, version=version, inline=data) if len(data) <= self._inline_limit
                else None
            )
        return pointers


def _group_name(state_class: type) -> str:
    owner = state_class.__qualname__.rsplit(".", 1)[0] if "." in state_class.__qualname__ else state_class.__qualname__
    return f"{state_class.__module__}.{owner}"
