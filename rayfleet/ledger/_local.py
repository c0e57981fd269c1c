"""``LocalLedgerClient``: the ledger contract served by a :class:`Ledger` in this process.

With ``threads=0`` (tests, tools) each operation runs when it is called, on the calling
thread, and its reply (or refusal) comes back through a completed :class:`LedgerCall`;
awaiting it never suspends. With ``threads > 0`` operations run on a thread pool, so
an event loop awaiting them keeps serving other work while the database answers: this
is how hosts, drivers and the runner reach a PostgreSQL ledger directly. A commit of one
checkpoint awaited on an event loop, on a store with awaited writes (PostgreSQL), runs on
that loop instead (:class:`Awaited`): no worker thread to hand it to and back.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Awaitable, Callable, Generator, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Generic, ParamSpec, TypeVar

from ..errors import RayfleetError
from ..identity._values import (
    ContinuityRecord,
    LeaseDenied,
    SnapshotPointer,
)
from ._contract import LedgerCall
from ._ledger import Ledger
from ._values import (
    DEFAULT_LEASE_TTL,
    Activation,
    CheckpointCommit,
    CheckpointRow,
    CommitOutcome,
    HostInfo,
    IdentityView,
    JournalRecord,
    LeaseView,
    RegisterOutcome,
    RunLease,
    RunRecord,
    RunRequests,
    RunStart,
    SpecRecord,
    StoredMessage,
    TopologyChange,
    TopologySnapshot,
)

T = TypeVar("T")
P = ParamSpec("P")

OperationObserver = Callable[[str, str, float], None]
"""Hears every operation a client ran: its name, ``"OK"`` or the error's type name, and its seconds."""


class Completed(Generic[T]):
    """A :class:`LedgerCall` that already has its reply or its error."""

    __slots__ = ("_error", "_value")

    def __init__(self, value: T | None = None, error: BaseException | None = None) -> None:
        self._value = value
        self._error = error

    def result(self, timeout: float | None = None) -> T:
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]  # None only when T admits None

    def __await__(self) -> Generator[Any, None, T]:
        return self.result()
        yield  # makes this a generator that finishes at once, as __await__ must be


class Pending(Generic[T]):
    """A :class:`LedgerCall` running on a worker thread."""

    __slots__ = ("_future",)

    def __init__(self, future: concurrent.futures.Future[T]) -> None:
        self._future = future

    def result(self, timeout: float | None = None) -> T:
        return self._future.result(timeout)

    def __await__(self) -> Generator[Any, None, T]:
        return asyncio.wrap_future(self._future).__await__()


class Awaited(Generic[T]):
    """A :class:`LedgerCall` that runs on the awaiting event loop, or on a worker thread for :meth:`result`.

    Unlike the other calls it starts when it is awaited (or :meth:`result` is called),
    not when it is made.
    """

    __slots__ = ("_awaited", "_blocking")

    def __init__(self, awaited: Callable[[], Awaitable[T]], blocking: Callable[[], LedgerCall[T]]) -> None:
        self._awaited = awaited
        self._blocking = blocking

    def result(self, timeout: float | None = None) -> T:
        return self._blocking().result(timeout)

    def __await__(self) -> Generator[Any, None, T]:
        return self._awaited().__await__()


def _run_now(operation: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> Completed[T]:
    try:
        return Completed(operation(*args, **kwargs))
    except Exception as error:  # noqa: BLE001 - handed to the awaiting caller, as a remote ledger would raise it
        return Completed(error=error)


class LocalLedgerClient:
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
        self.ledger = ledger if isinstance(ledger, Ledger) else Ledger(ledger)
        self.route = "direct"
        self._observe = observe
        self._small_commits = small_commits
        self._executor = (
            concurrent.futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="rayfleet-ledger")
            if threads > 0
            else None
        )
        # Renewing and releasing leases has a thread of its own: queued behind a host's
        # backlog of lease grants (hundreds under activation load), a renewal came back
        # after the leases it renewed had lapsed, and the host dropped every agent it held.
        self._lease_keeper = (
            concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="rayfleet-ledger-leases")
            if threads > 0
            else None
        )

    def _run(self, operation: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> LedgerCall[T]:
        return self._submit(self._executor, operation, *args, **kwargs)

    def _submit(
        self, executor: concurrent.futures.ThreadPoolExecutor | None, operation: Callable[P, T], *args: P.args,
        **kwargs: P.kwargs,
    ) -> LedgerCall[T]:
        if self._observe is not None:
            operation = _observed(operation, self._observe)
        if executor is None:
            return _run_now(operation, *args, **kwargs)
        return Pending(executor.submit(operation, *args, **kwargs))

    def close(self) -> None:
        """Stop the worker threads (after the operations in flight) and close the ledger."""
        for executor in (self._executor, self._lease_keeper):
            if executor is not None:
                executor.shutdown(wait=True)
        self.ledger.close()

    def incarnation(self) -> LedgerCall[str]:
        return Completed(self.ledger.incarnation)

    def fleet_identity(self, claim: str | None = None) -> LedgerCall[str | None]:
        return self._run(self.ledger.fleet_identity, claim)

    def register_many(self, records: Sequence[SpecRecord]) -> LedgerCall[list[RegisterOutcome]]:
        return self._run(self.ledger.register_many, records)

    def register(self, record: SpecRecord) -> LedgerCall[RegisterOutcome]:
        return self._run(self.ledger.register, record)

    def apply_specs(self, *, creates: Sequence[SpecRecord], updates: Sequence[SpecRecord]) -> LedgerCall[None]:
        return self._run(self.ledger.apply_specs, creates=creates, updates=updates)

    def resolve(self, identities: Iterable[str]) -> LedgerCall[dict[str, IdentityView]]:
        return self._run(self.ledger.resolve, identities)

    def list_identities(self, *, labels: Mapping[str, str] | None = None) -> LedgerCall[list[IdentityView]]:
        return self._run(self.ledger.list_identities, labels=labels)

    def select_identities(self, *, labels: Mapping[str, str]) -> LedgerCall[list[str]]:
        return self._run(self.ledger.select_identities, labels=dict(labels))

    def leases(self, identities: Iterable[str]) -> LedgerCall[dict[str, LeaseView | None]]:
        return self._run(self.ledger.leases, list(identities))

    def set_lifecycle(self, *, identity: str, fencing_token: int, lifecycle: str, reason: str = "") -> LedgerCall[None]:
        return self._run(
            self.ledger.set_lifecycle,
            identity=identity,
            fencing_token=fencing_token,
            lifecycle=lifecycle,
            reason=reason,
        )

    def reset(self, *, identity: str, fencing_token: int) -> LedgerCall[ContinuityRecord]:
        return self._run(self.ledger.reset, identity=identity, fencing_token=fencing_token)

    def delete(self, *, identity: str, fencing_token: int) -> LedgerCall[SnapshotPointer | None]:
        return self._run(self.ledger.delete, identity=identity, fencing_token=fencing_token)

    def acquire(
        self, *, holder: str, identities: Iterable[str], ttl: float = DEFAULT_LEASE_TTL, create_continuity: bool = True
    ) -> LedgerCall[dict[str, Activation | LeaseDenied | RayfleetError]]:
        return self._run(
            self.ledger.acquire, holder=holder, identities=identities, ttl=ttl, create_continuity=create_continuity
        )

    def renew(self, *, holder: str, tokens: Mapping[str, int]) -> LedgerCall[frozenset[str]]:
        return self._submit(self._lease_keeper, self.ledger.renew, holder=holder, tokens=tokens)

    def renew_holder(self, *, holder: str, ttl: float) -> LedgerCall[bool]:
        return self._submit(self._lease_keeper, self.ledger.renew_holder, holder=holder, ttl=ttl)

    def arm_holder(self, *, holder: str, ttl: float) -> LedgerCall[int]:
        return self._submit(self._lease_keeper, self.ledger.arm_holder, holder=holder, ttl=ttl)

    def release(self, *, holder: str, tokens: Mapping[str, int]) -> LedgerCall[int]:
        return self._submit(self._lease_keeper, self.ledger.release, holder=holder, tokens=tokens)

    def revoke_holder(self, holder: str) -> LedgerCall[list[str]]:
        return self._run(self.ledger.revoke_holder, holder)

    def check_fence(self, identity: str, token: int) -> LedgerCall[None]:
        return self._run(self.ledger.check_fence, identity, token)

    def high_water(self, identity: str) -> LedgerCall[int]:
        return self._run(self.ledger.high_water, identity)

    def commit_checkpoints(self, commits: Sequence[CheckpointCommit]) -> LedgerCall[list[CommitOutcome]]:
        if len(commits) <= self._small_commits:
            done = self._written_now("commit_checkpoints", lambda: self.ledger.commit_checkpoints_now(commits))
            if done is not None:
                return done
        if self._executor is not None and self.ledger.commits_awaited(commits) and _on_a_running_loop():
            return Awaited(lambda: self._commit_awaited(commits),
                           lambda: self._run(self.ledger.commit_checkpoints, commits))
        return self._run(self.ledger.commit_checkpoints, commits)

    async def _commit_awaited(self, commits: Sequence[CheckpointCommit]) -> list[CommitOutcome]:
        """The commit's one statement on this event loop; one that did not pass goes to the worker thread's path."""
        started = time.perf_counter()
        try:
            outcomes = await self.ledger.commit_checkpoints_awaited(commits)
        except Exception as error:
            self._heard("commit_checkpoints", type(error).__name__, started)
            raise
        if outcomes is None:
            # Refused, or not for this statement to judge: the transaction names the reason.
            return await self._run(self.ledger.commit_checkpoints, commits)
        self._heard("commit_checkpoints", "OK", started)
        return outcomes

    def _written_now(self, operation: str, write_now: Callable[[], T | None]) -> LedgerCall[T] | None:
        """The answer of ``write_now()`` (a ledger ``*_now`` write, on this thread); ``None`` if it wrote nothing."""
        started = time.perf_counter()
        try:
            result = write_now()
        except RayfleetError as error:
            self._heard(operation, type(error).__name__, started)
            return Completed(error=error)
        if result is None:
            return None
        self._heard(operation, "OK", started)
        return Completed(result)

    def _heard(self, operation: str, outcome: str, started: float) -> None:
        if self._observe is not None:
            self._observe(operation, outcome, time.perf_counter() - started)

    def latest_checkpoints(
        self, *, after: str = "", limit: int = 1000, agent_class: str | None = None
    ) -> LedgerCall[list[CheckpointRow]]:
        return self._run(self.ledger.latest_checkpoints, after=after, limit=limit, agent_class=agent_class)

    def dedup_window(self, identity: str) -> LedgerCall[list[tuple[str, bytes]]]:
        return self._run(self.ledger.dedup_window, identity)

    def referenced_snapshot_files(self) -> LedgerCall[set[str]]:
        return self._run(self.ledger.referenced_snapshot_files)

    def wired_peers(self, identities: Iterable[str]) -> LedgerCall[dict[str, tuple[str, ...]]]:
        return self._run(self.ledger.wired_peers, identities)

    def set_desired_edge(self, *, a: str, b: str, desired: bool) -> LedgerCall[None]:
        return self._run(self.ledger.set_desired_edge, a=a, b=b, desired=desired)

    def topology(self) -> LedgerCall[TopologySnapshot]:
        return self._run(self.ledger.topology)

    def apply_topology(self, change: TopologyChange) -> LedgerCall[None]:
        return self._run(self.ledger.apply_topology, change)

    def create_run(
        self, *, run_id: str, workflow: str, code_version: str, definition: bytes | None, force: bool = False
    ) -> LedgerCall[str]:
        return self._run(
            self.ledger.create_run,
            run_id=run_id,
            workflow=workflow,
            code_version=code_version,
            definition=definition,
            force=force,
        )

    def run(self, run_id: str) -> LedgerCall[RunRecord | None]:
        return self._run(self.ledger.run, run_id)

    def list_runs(self, *, statuses: Sequence[str] | None = None) -> LedgerCall[list[RunRecord]]:
        return self._run(self.ledger.list_runs, statuses=statuses)

    def run_definition(self, run_id: str) -> LedgerCall[bytes | None]:
        return self._run(self.ledger.run_definition, run_id)

    def set_run_status(
        self, *, run_id: str, fencing_token: int, status: str, detail: str | None = "", outcome: bytes | None = None,
        release_holder: str | None = None,
    ) -> LedgerCall[RunRequests]:
        return self._run(
            self.ledger.set_run_status,
            run_id=run_id,
            fencing_token=fencing_token,
            status=status,
            detail=detail,
            outcome=outcome,
            release_holder=release_holder,
        )

    def request_run(self, *, run_id: str, cancel: bool | None = None, pause: bool | None = None) -> LedgerCall[bool]:
        return self._run(self.ledger.request_run, run_id=run_id, cancel=cancel, pause=pause)

    def journal(self, run_id: str) -> LedgerCall[JournalRecord]:
        return self._run(self.ledger.journal, run_id)

    def journal_step(
        self, *, run_id: str, fencing_token: int, label: str, output: bytes, tokens: int
    ) -> LedgerCall[RunRequests]:
        if self._small_commits > 0:
            done = self._written_now("journal_step", lambda: self.ledger.journal_step_now(
                run_id=run_id, fencing_token=fencing_token, label=label, output=output, tokens=tokens))
            if done is not None:
                return done
        return self._run(
            self.ledger.journal_step,
            run_id=run_id,
            fencing_token=fencing_token,
            label=label,
            output=output,
            tokens=tokens,
        )

    def journal_compensation(
        self, *, run_id: str, fencing_token: int, label: str, ok: bool, error: str
    ) -> LedgerCall[None]:
        return self._run(
            self.ledger.journal_compensation,
            run_id=run_id,
            fencing_token=fencing_token,
            label=label,
            ok=ok,
            error=error,
        )

    def acquire_run_lease(
        self, *, run_id: str, holder: str, ttl: float = DEFAULT_LEASE_TTL, takeover_from: str | None = None
    ) -> LedgerCall[RunLease]:
        return self._run(
            self.ledger.acquire_run_lease, run_id=run_id, holder=holder, ttl=ttl, takeover_from=takeover_from
        )

    def start_run(
        self, *, run_id: str, holder: str, ttl: float = DEFAULT_LEASE_TTL, takeover_from: str | None = None
    ) -> LedgerCall[RunStart]:
        return self._run(self.ledger.start_run, run_id=run_id, holder=holder, ttl=ttl, takeover_from=takeover_from)

    def renew_run_lease(self, *, run_id: str, holder: str, token: int) -> LedgerCall[RunLease]:
        return self._run(self.ledger.renew_run_lease, run_id=run_id, holder=holder, token=token)

    def release_run_lease(self, *, run_id: str, holder: str, token: int) -> LedgerCall[bool]:
        return self._run(self.ledger.release_run_lease, run_id=run_id, holder=holder, token=token)

    def acquire_step_lease(
        self, *, run_id: str, label: str, holder: str, fencing_token: int, ttl: float
    ) -> LedgerCall[int]:
        return self._run(
            self.ledger.acquire_step_lease,
            run_id=run_id,
            label=label,
            holder=holder,
            fencing_token=fencing_token,
            ttl=ttl,
        )

    def release_step_lease(self, *, run_id: str, label: str, holder: str, token: int) -> LedgerCall[bool]:
        return self._run(self.ledger.release_step_lease, run_id=run_id, label=label, holder=holder, token=token)

    def set_paused(self, *, identity: str, fencing_token: int, paused: bool) -> LedgerCall[None]:
        return self._run(self.ledger.set_paused, identity=identity, fencing_token=fencing_token, paused=paused)

    def is_paused(self, identity: str) -> LedgerCall[bool]:
        return self._run(self.ledger.is_paused, identity)

    def park(self, *, identity: str, fencing_token: int, message_id: str, envelope: bytes) -> LedgerCall[int]:
        return self._run(
            self.ledger.park, identity=identity, fencing_token=fencing_token, message_id=message_id, envelope=envelope
        )

    def parked(self, identity: str, *, limit: int = 1000) -> LedgerCall[list[StoredMessage]]:
        return self._run(self.ledger.parked, identity, limit=limit)

    def unpark(self, *, identity: str, fencing_token: int, seq: int) -> LedgerCall[None]:
        return self._run(self.ledger.unpark, identity=identity, fencing_token=fencing_token, seq=seq)

    def cancel_parked(self, *, identity: str, fencing_token: int) -> LedgerCall[int]:
        return self._run(self.ledger.cancel_parked, identity=identity, fencing_token=fencing_token)

    def add_dead_letter(
        self, *, identity: str, message_id: str, envelope: bytes, reason: str, error: str, attempts: int
    ) -> LedgerCall[int]:
        return self._run(
            self.ledger.add_dead_letter,
            identity=identity,
            message_id=message_id,
            envelope=envelope,
            reason=reason,
            error=error,
            attempts=attempts,
        )

    def hold_tell(self, *, identity: str, message_id: str, envelope: bytes) -> LedgerCall[int]:
        return self._run(self.ledger.hold_tell, identity=identity, message_id=message_id, envelope=envelope)

    def claim_tells(self, *, min_age: float, limit: int = 100) -> LedgerCall[list[StoredMessage]]:
        return self._run(self.ledger.claim_tells, min_age=min_age, limit=limit)

    def settle_tell(
        self, *, identity: str, message_id: str, reason: str | None = None, error: str = ""
    ) -> LedgerCall[bool]:
        return self._run(self.ledger.settle_tell, identity=identity, message_id=message_id, reason=reason,
                         error=error)

    def dead_letters(self, *, identity: str | None = None, limit: int = 1000) -> LedgerCall[list[StoredMessage]]:
        return self._run(self.ledger.dead_letters, identity=identity, limit=limit)

    def dead_letter(self, letter_id: int) -> LedgerCall[StoredMessage | None]:
        return self._run(self.ledger.dead_letter, letter_id)

    def purge_dead_letters(
        self, *, identity: str | None = None, ids: Sequence[int] | None = None, before: float | None = None
    ) -> LedgerCall[int]:
        return self._run(self.ledger.purge_dead_letters, identity=identity, ids=ids, before=before)

    def register_host(
        self, *, name: str, holder: str, node: str | None = None, pid: int | None = None, process: str | None = None,
    ) -> LedgerCall[list[str]]:
        return self._run(self.ledger.register_host, name=name, holder=holder, node=node, pid=pid,
                         process=process)

    def remove_host(self, *, name: str, holder: str | None = None) -> LedgerCall[list[str]]:
        return self._run(self.ledger.remove_host, name=name, holder=holder)

    def set_host_draining(self, *, name: str, draining: bool) -> LedgerCall[None]:
        return self._run(self.ledger.set_host_draining, name=name, draining=draining)

    def hosts(self) -> LedgerCall[list[HostInfo]]:
        return self._run(self.ledger.hosts)


def _observed(operation: Callable[P, T], observe: OperationObserver) -> Callable[P, T]:
    def run(*args: P.args, **kwargs: P.kwargs) -> T:
        started = time.perf_counter()
        outcome = "OK"
        try:
            return operation(*args, **kwargs)
        except BaseException as error:
            outcome = type(error).__name__
            raise
        finally:
            observe(operation.__name__, outcome, time.perf_counter() - started)

    return run


def _on_a_running_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
