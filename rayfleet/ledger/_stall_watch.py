"""The stall watch: ends ledger sessions that a stopped client left holding locks, as the server would.

PostgreSQL ends a session idle inside a transaction after
``idle_in_transaction_session_timeout``, but not every session a stopped client leaves
in a transaction: one in the middle of a pipeline (statements sent, their Sync not
yet) or writing a result nobody reads stays active, and no server timeout covers
that wait (``PostgresDatabase.end_stalled_sessions`` lists the cases). Seen in the
chaos profile: a host stopped inside the ``executemany`` of a batch commit held its
agents' continuity rows for its whole freeze, and the host taking them over waited on
them (lock timeout after lock timeout) until the frozen one woke. On SQLite the same
freeze inside a commit holds the file's write lock, and the watch ends the stopped host
process itself (``_stopped_writers``). Every host runs one, so the watch lives as long
as any host does.
"""

from __future__ import annotations

import logging
import threading

from ._ledger import Ledger
from ._postgres import IDLE_IN_TRANSACTION_TIMEOUT_MS

log = logging.getLogger("rayfleet.ledger")

STALLED_AFTER = IDLE_IN_TRANSACTION_TIMEOUT_MS / 1000
"""Seconds a session may wait for its client's next message, while others wait on its locks, before it is
ended: the limit the ledger's sessions set the server for an idle transaction."""
STOPPED_AFTER = 2.0
"""Seconds a SQLite host may stay stopped holding the file's write lock before it is ended. Every writer
of the fleet waits meanwhile (and gives up after the store's busy timeout, 5 s); a pause shorter than
this (a long garbage collection, a debugger's brief stop) is waited out rather than ended."""
WATCH_EVERY = 1.0
"""Seconds between two looks: on PostgreSQL one statement, which asks for lock waits only while a session
stalls; on SQLite one question to the kernel about the file's lock, and ``/proc`` only if it is held."""


class StallWatch:
    """Every ``every`` seconds, ends what clients stopped for over ``older_than`` seconds hold that others need
    (:meth:`Ledger.end_stalled_sessions`: PostgreSQL sessions, or a SQLite file's stopped host process).

    A look that fails (the server away, the role not allowed to end sessions) is logged
    and the next one tried.
    """

    def __init__(self, ledger: Ledger, *, every: float = WATCH_EVERY, older_than: float | None = None) -> None:
        """``older_than`` defaults to :data:`STOPPED_AFTER` on SQLite, :data:`STALLED_AFTER` elsewhere."""
        self._ledger = ledger
        self._every = every
        sqlite = ledger.kind == "sqlite"
        self._older_than = older_than if older_than is not None else (STOPPED_AFTER if sqlite else STALLED_AFTER)
        self._ends = "host process" if sqlite else "ledger session"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.ended = 0
        """Sessions (PostgreSQL) or host processes (SQLite) ended so far."""

    def start(self) -> None:
        """Start looking, on a thread of its own; on a store whose sessions cannot stall, nothing is started."""
        if self._thread is not None:
            raise RuntimeError("StallWatch already started")
        if not self._ledger.sessions_can_stall:
            return
        self._thread = threading.Thread(target=self._run, name="rayfleet-stall-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        failing = False
        while not self._stop.wait(self._every):
            try:
                ended = self._ledger.end_stalled_sessions(self._older_than)
            except Exception as error:  # noqa: BLE001 - the ledger may be restarting; the next look tries again
                if not failing:
                    log.warning("the stall watch of %s cannot look at its sessions: %s", self._ledger.location, error)
                failing = True
                continue
            failing = False
            for pid, seconds in ended.items():
                self.ended += 1
                log.warning("ended %s %d: it stopped mid-transaction %.1f s ago (a frozen or stuck process) and "
                            "held locks other writers need", self._ends, pid, seconds)
