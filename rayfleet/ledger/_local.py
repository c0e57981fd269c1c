"""``LocalLedgerClient``: the ledger contract served by a :class:`Ledger` in this process.

Every operation is forwarded by the generated :class:`LocalOperations` and runs where
:class:`~rayfleet.ledger._local_transport.LocalTransport` puts it (the calling thread or
worker threads). This class holds what travels otherwise:

- a commit of at most ``small_commits`` checkpoints, and a journaled step, are written on
  the calling thread when the store can take them without waiting (``Ledger.immediately``);
- a commit of one checkpoint awaited on an event loop, on a store with awaited writes
  (PostgreSQL), runs its one statement on that loop (:class:`Awaited`): no worker thread
  to hand it to and back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from ..errors import RayfleetError
from ._contract import LedgerCall
from ._generated_local import LocalOperations
from ._ledger import Ledger
from ._local_transport import Awaited, Completed, OperationObserver, Pending
from ._store import Statement
from ._turn_rows import TurnWrite
from ._values import CheckpointCommit, CommitOutcome, RunRequests

__all__ = ["Awaited", "Completed", "LocalLedgerClient", "OperationObserver", "Pending"]

T = TypeVar("T")


class LocalLedgerClient(LocalOperations):
    """A :class:`~rayfleet.ledger._contract.LedgerClient` over a :class:`Ledger` in the same process.

    Args:
        ledger: the ledger to serve, or a path to a SQLite ledger file (created if missing).
        threads: run operations on this many worker threads (0: on the caller's thread);
            lease renewals and releases run on one more thread of their own, so a
            backlog of other calls never delays them.
        observe: told of every operation once it finished (for metrics); must not block.
        small_commits: a ``commit_checkpoints`` of at most this many checkpoints, and
            (when this is not 0) a ``journal_step``, runs on the calling thread even with
            ``threads``, when the store can take it without waiting for a lock (else on a
            worker thread as usual). For a SQLite file on
            this machine the write (one fsync, a fraction of a millisecond) is cheaper
            than handing it to a worker thread and back, and a batch that small means
            few turns wait.
    """

    def __init__(
        self, ledger: Ledger | str | Path, *, threads: int = 0, observe: OperationObserver | None = None,
        small_commits: int = 0,
    ) -> None:
        super().__init__(ledger, threads=threads, observe=observe)
        self._small_commits = small_commits

    def incarnation(self) -> LedgerCall[str]:
        # Known without asking the store: no thread to hand it to.
        return Completed(self.ledger.incarnation())

    def commit_checkpoints(self, commits: Sequence[CheckpointCommit]) -> LedgerCall[list[CommitOutcome]]:
        if len(commits) <= self._small_commits:
            done = self._written_now("commit_checkpoints", lambda ledger: ledger.commit_checkpoints(commits))
            if done is not None:
                return done
        if self._executor is not None and self.ledger.writes_awaited and _on_a_running_loop():
            statement = self.ledger.commit_alone(commits)
            if statement is not None:
                return Awaited(lambda: self._commit_awaited(statement, commits),
                               lambda: super(LocalLedgerClient, self).commit_checkpoints(commits))
        return super().commit_checkpoints(commits)

    async def _commit_awaited(
        self, statement: Statement[list[CommitOutcome]], commits: Sequence[CheckpointCommit],
    ) -> list[CommitOutcome]:
        """The commit's one statement on this event loop; one that did not pass goes to the worker thread's path."""
        started = time.perf_counter()
        try:
            outcomes = await self.ledger.write_awaited(statement)
        except Exception as error:
            self._heard("commit_checkpoints", type(error).__name__, started)
            raise
        if outcomes is None:
            # Refused, or not for this statement to judge: the transaction names the reason.
            return await super().commit_checkpoints(commits)
        self._heard("commit_checkpoints", "OK", started)
        return outcomes

    def journal_step(
        self, *, run_id: str, fencing_token: int, label: str, output: bytes, tokens: int
    ) -> LedgerCall[RunRequests]:
        if self._small_commits > 0:
            done = self._written_now("journal_step", lambda ledger: ledger.journal_step(
                run_id=run_id, fencing_token=fencing_token, label=label, output=output, tokens=tokens))
            if done is not None:
                return done
        return super().journal_step(run_id=run_id, fencing_token=fencing_token, label=label, output=output,
                                    tokens=tokens)

    def write_turn(self, *, identity: str, fencing_token: int, turn: TurnWrite) -> LedgerCall[None]:
        # A durable turn's journal write is on the path of every step: as a small commit is
        # (see ``small_commits``), it runs on this thread or, on PostgreSQL, as one
        # statement awaited on this event loop.
        if self._small_commits > 0:
            done = self._written_now("write_turn", lambda ledger: ledger.write_turn(
                identity=identity, fencing_token=fencing_token, turn=turn))
            if done is not None:
                return done
        if self._executor is not None and self.ledger.writes_awaited and _on_a_running_loop():
            statement = self.ledger.write_turn_alone(identity=identity, fencing_token=fencing_token, turn=turn)
            if statement is not None:
                return Awaited(lambda: self._turn_awaited(statement, identity, fencing_token, turn),
                               lambda: super(LocalLedgerClient, self).write_turn(
                                   identity=identity, fencing_token=fencing_token, turn=turn))
        return super().write_turn(identity=identity, fencing_token=fencing_token, turn=turn)

    async def _turn_awaited(self, statement: Statement[bool], identity: str, fencing_token: int,
                            turn: TurnWrite) -> None:
        started = time.perf_counter()
        try:
            wrote = await self.ledger.write_awaited(statement)
        except Exception as error:
            self._heard("write_turn", type(error).__name__, started)
            raise
        if not wrote:
            # Refused: the transaction names the reason.
            await super().write_turn(identity=identity, fencing_token=fencing_token, turn=turn)
            return
        self._heard("write_turn", "OK", started)

    def _written_now(self, operation: str, write: Callable[[Ledger], T]) -> LedgerCall[T] | None:
        """``write(ledger)`` on this thread if the store takes it without waiting; ``None`` if it wrote nothing."""
        started = time.perf_counter()
        try:
            wrote, result = self.ledger.immediately(write)
        except RayfleetError as error:
            self._heard(operation, type(error).__name__, started)
            return Completed(error=error)
        if not wrote:
            return None
        self._heard(operation, "OK", started)
        return Completed(result)


def _on_a_running_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
