"""How a local client runs a ledger operation: on the calling thread, or on worker threads.

With ``threads=0`` (tests, tools) each operation runs when it is called, on the calling
thread, and its reply (or refusal) comes back through a completed :class:`LedgerCall`;
awaiting it never suspends. With ``threads > 0`` operations run on a thread pool, so
an event loop awaiting them keeps serving other work while the database answers: this
is how hosts, drivers and the runner reach a PostgreSQL ledger directly.

:class:`LocalTransport` is what the generated forwards (``_generated_local.py``) call;
``LocalLedgerClient`` (``_local.py``) adds the operations that travel otherwise.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Awaitable, Callable, Generator
from pathlib import Path
from typing import Any, Generic, ParamSpec, TypeVar

from ._contract import LedgerCall
from ._ledger import Ledger

T = TypeVar("T")
P = ParamSpec("P")

OperationObserver = Callable[[str, str, float], None]
"""Hears every operation a client ran: its name, ``"OK"`` or the error's type name, and its seconds."""

LEASE_KEEPING = frozenset({"renew", "renew_holder", "arm_holder", "release"})
"""Operations that run on the lease keeper's own thread (see :class:`LocalTransport`)."""


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


class LocalTransport:
    """Runs operations of a :class:`Ledger` in this process, on the caller's thread or on worker threads.

    Args:
        ledger: the ledger to serve, or a path to a SQLite ledger file (created if missing).
        threads: run operations on this many worker threads (0: on the caller's thread);
            lease renewals and releases (:data:`LEASE_KEEPING`) run on one more thread of
            their own, so a backlog of other calls never delays them.
        observe: told of every operation once it finished (for metrics); must not block.
    """

    def __init__(
        self, ledger: Ledger | str | Path, *, threads: int = 0, observe: OperationObserver | None = None,
    ) -> None:
        self.ledger = ledger if isinstance(ledger, Ledger) else Ledger(ledger)
        self.route = "direct"
        self._observe = observe
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

    def _run(self, operation: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> LedgerCall[T]:
        """``operation`` (a bound ``Ledger`` method) on its thread: the lease keeper's, a worker's, or this one."""
        executor = self._lease_keeper if operation.__name__ in LEASE_KEEPING else self._executor
        if self._observe is not None:
            operation = _observed(operation, self._observe)
        if executor is None:
            try:
                return Completed(operation(*args, **kwargs))
            except Exception as error:  # noqa: BLE001 - handed to the awaiting caller, as a remote ledger would raise it
                return Completed(error=error)
        return Pending(executor.submit(operation, *args, **kwargs))

    def _heard(self, operation: str, outcome: str, started: float) -> None:
        """Tell the observer of an operation run outside :meth:`_run`."""
        if self._observe is not None:
            self._observe(operation, outcome, time.perf_counter() - started)

    def close(self) -> None:
        """Stop the worker threads (after the operations in flight) and close the ledger."""
        for executor in (self._executor, self._lease_keeper):
            if executor is not None:
                executor.shutdown(wait=True)
        self.ledger.close()


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
