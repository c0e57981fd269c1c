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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pydantic

from ..errors import LedgerUnavailableError, RayfleetError
from ..identity._values import DEFAULT_DEDUP_CAPACITY, SnapshotPointer
from ..ledger._contract import LedgerClient
from ..ledger._turn_rows import TurnEnd
from ..ledger._values import CheckpointCommit, StepEntry, StepJournaled
from ._store import SnapshotRow, SnapshotStore

INLINE_STATE_BYTES = 16 * 1024
"""Default limit: a State whose one-row Arrow encoding is at most this large may travel in the ledger's commit."""
INLINE_BATCH_ROWS = 64
"""Batches of more States of one class than this go to one file (shared by all) rather than ledger rows.

64 covers the batches of a host under load (a batch is every checkpoint taken while
the previous commit was in flight); the large group commits of bulk deactivation go
to files."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Checkpoint:
    """One agent's checkpoint to commit: its State at ``version``, written under ``fencing_token``.

    ``dedup`` holds the idempotency keys (with pickled replies) of the turns it covers;
    they are remembered in the same ledger transaction, keeping the last
    ``dedup_capacity`` of the identity.
    """

    identity: str
    fencing_token: int
    version: int
    state: pydantic.BaseModel
    extra: bytes = b""
    dedup: tuple[tuple[str, bytes], ...] = ()
    dedup_capacity: int = DEFAULT_DEDUP_CAPACITY
    step: StepEntry | None = None
    """A workflow step's output to journal in the same ledger transaction (see ``CheckpointCommit.step``)."""
    turn_end: TurnEnd | None = None
    """A durable turn this checkpoint completes, in the same transaction (see ``CheckpointCommit.turn_end``)."""


@dataclass(frozen=True, slots=True)
class Committed:
    """A checkpoint the ledger accepted: its pointer, and what became of the step it carried (if any)."""

    pointer: SnapshotPointer
    step: StepJournaled | None = None


Outcome = Committed | Exception
"""What one checkpoint came to: :class:`Committed`, or the error :meth:`GroupCommitter.commit` raises for it."""

_UNSETTLED: Any = object()


class _Waiter:
    """One caller's checkpoints: resolved with every outcome once the last one is settled."""

    __slots__ = ("future", "open", "outcomes")

    def __init__(self, size: int) -> None:
        self.future: asyncio.Future[list[Outcome]] = asyncio.get_running_loop().create_future()
        self.outcomes: list[Outcome] = [_UNSETTLED] * size
        self.open = size

    def settle(self, index: int, outcome: Outcome) -> None:
        if self.future.done() or self.outcomes[index] is not _UNSETTLED:
            return  # the caller was cancelled, or this checkpoint's word is already in
        self.outcomes[index] = outcome
        self.open -= 1
        if self.open == 0:
            self.future.set_result(self.outcomes)


@dataclass(slots=True)
class _Pending:
    checkpoint: Checkpoint
    waiter: _Waiter
    index: int

    def settle(self, outcome: Outcome) -> None:
        self.waiter.settle(self.index, outcome)


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
        self._in_flight: list[_Pending] = []
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
            item.settle(RuntimeError("host is shutting down; checkpoint not committed"))
        for item in self._in_flight:
            # Its ledger call was cancelled on the way: it may or may not have landed.
            item.settle(LedgerUnavailableError(location="the fleet ledger", detail="the host stopped during the commit",
                                               committed_unknown=True))
        self._queue.clear()
        self._in_flight = []

    async def commit(
        self, *, identity: str, fencing_token: int, version: int, state: pydantic.BaseModel, extra: bytes = b"",
        dedup: tuple[tuple[str, bytes], ...] = (), dedup_capacity: int = DEFAULT_DEDUP_CAPACITY,
    ) -> SnapshotPointer:
        """Queue one :class:`Checkpoint` and wait until it is committed (or refused); raises as the class says."""
        (outcome,) = await self.commit_many([Checkpoint(
            identity=identity, fencing_token=fencing_token, version=version, state=state, extra=extra, dedup=dedup,
            dedup_capacity=dedup_capacity,
        )])
        if isinstance(outcome, Exception):
            raise outcome
        return outcome.pointer

    async def commit_many(self, checkpoints: Sequence[Checkpoint]) -> list[Outcome]:
        """Queue many checkpoints and wait until each is committed or refused.

        Returns one outcome per checkpoint, in order: its pointer, or the error
        :meth:`commit` would raise for it. They travel with whatever else is queued,
        so this is a group commit with one waiter instead of one per checkpoint.
        """
        if not checkpoints:
            return []
        waiter = _Waiter(len(checkpoints))
        self._queue.extend(_Pending(checkpoint, waiter, index) for index, checkpoint in enumerate(checkpoints))
        self._wakeup.set()
        return await waiter.future

    async def _run(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            # One yield lets turns that finish in the same loop iteration join this batch.
            await asyncio.sleep(0)
            batch, self._queue = self._queue, []
            if batch:
                self._in_flight = batch
                await self._commit_batch(batch)
                self._in_flight = []

    async def _commit_batch(self, batch: list[_Pending]) -> None:
        groups: dict[type, list[_Pending]] = defaultdict(list)
        for item in batch:
            groups[type(item.checkpoint.state)].append(item)
        commits: list[CheckpointCommit] = []
        written: list[_Pending] = []
        for state_class, items in groups.items():
            checkpoints = [item.checkpoint for item in items]
            rows = [SnapshotRow(identity=c.identity, version=c.version, state=c.state, extra=c.extra)
                    for c in checkpoints]
            try:
                encoded = self._snapshots.encode(rows)
                pointers = self._inline(encoded, [c.version for c in checkpoints])
                to_file = [row for row, pointer in enumerate(pointers) if pointer is None]
                if to_file:
                    part = encoded if len(to_file) == len(rows) else encoded.take(pa.array(to_file, type=pa.int64()))
                    path = await asyncio.to_thread(
                        self._snapshots.write_batch, group=_group_name(state_class), writer=self._writer, rows=part,
                    )
                    for file_row, row in enumerate(to_file):
                        pointers[row] = SnapshotPointer(file=path, row=file_row, version=checkpoints[row].version)
            except Exception as error:  # noqa: BLE001 - any storage failure fails these checkpoints, not the host
                for item in items:
                    item.settle(error)
                continue
            for checkpoint, pointer in zip(checkpoints, pointers, strict=True):
                assert pointer is not None  # every row is inline or in the file written above
                commits.append(CheckpointCommit(
                    identity=checkpoint.identity, fencing_token=checkpoint.fencing_token, version=checkpoint.version,
                    pointer=pointer, dedup=checkpoint.dedup, dedup_capacity=checkpoint.dedup_capacity,
                    step=checkpoint.step, turn_end=checkpoint.turn_end,
                ))
            written.extend(items)
        if not commits:
            return
        try:
            outcomes = await self._ledger.commit_checkpoints(commits)
        except LedgerUnavailableError as error:
            # The ledger says whether the write may have happened; each waiter gets its word.
            for item in written:
                item.settle(error)
            return
        except Exception as error:  # noqa: BLE001 - see the class docstring: the outcome is unknown
            for item in written:
                unknown = LedgerUnavailableError(
                    location="the fleet ledger", detail=f"{type(error).__name__}: {error}", committed_unknown=True
                )
                unknown.__cause__ = error
                item.settle(unknown)
            return
        self.batches += 1
        if self._on_batch is not None:
            self._on_batch(len(commits))
        for item, commit, outcome in zip(written, commits, outcomes, strict=True):
            if isinstance(outcome, RayfleetError):
                item.settle(outcome)
            else:
                self.checkpoints += 1
                item.settle(Committed(commit.pointer, outcome))

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
