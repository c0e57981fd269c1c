"""A fleet's own host stopped while it holds a SQLite ledger's write lock is ended, as nothing else frees the lock.

A SQLite file has one write lock, a POSIX record lock that belongs to a process; the
kernel releases it when that process lets go of it or ends, never otherwise. A host
stopped inside its commit (SIGSTOP, a job-control stop: what the chaos profile's
freezes do) therefore stops every writer of the fleet for as long as it stays stopped:
no lease can be granted elsewhere, nothing commits. A PostgreSQL server ends such a
session itself (or the stall watch asks it to); for a file, the one remedy is to end
the process, as a cluster fences a node that stopped answering ("STONITH"). Ray
restarts the host (its actor restarts without limit), its identities fail over as
after a kill, and SQLite drops the transaction it never committed.

A process is ended only when all of these hold:

- it holds the file's write lock, and is stopped (state ``T`` in ``/proc``) at every
  look for over ``older_than`` seconds; a process stopped by a debugger (``t``) is left
  alone;
- it is a host registered in the ledger as running on this node under that process id.

Any other process found holding the lock while stopped (a driver or the CLI suspended
with Ctrl-Z) is logged once and left alone: the fleet's writes wait until it resumes.
Linux only (``/proc`` and the lock record's layout); elsewhere nothing is ever ended.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import time
from collections.abc import Callable, Iterable

from ._values import HostInfo

log = logging.getLogger("rayfleet.ledger")


def process_state(pid: int) -> str | None:
    """The one-letter scheduler state of process ``pid`` (``R``, ``S``, ``T``, ...), or ``None`` if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as stat:
            text = stat.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # "pid (command name) state ...": the name may hold spaces and parentheses, the state follows the last ')'.
    fields = text.rpartition(")")[2].split()
    return fields[0] if fields else None


class StoppedWriters:
    """Remembers since when the write lock's holder has been seen stopped, and ends it once that is too long.

    One per ledger; thread-safe only as far as one watch calls :meth:`end` at a time.
    """

    def __init__(self) -> None:
        self._seen: tuple[int, float] | None = None
        """The stopped holder last seen, with the monotonic time it was first seen so."""
        self._told: set[int] = set()
        """Stopped holders that are not this node's hosts, logged once each."""

    def end(
        self, holder: Callable[[], int | None], *, older_than: float, hosts: Callable[[], Iterable[HostInfo]],
    ) -> dict[int, float]:
        """End the process ``holder()`` names (the write lock's holder now, or ``None``) per the module's rules.

        Returns ``{pid: seconds}`` for a process ended (seconds since it was first seen
        stopped holding the lock), else ``{}``. ``hosts`` is read only once a holder has
        been stopped for long enough; since that read may take a while, the holder and
        its state are asked again just before it is ended.
        """
        pid = holder()
        if pid is None or process_state(pid) != "T":
            self._seen = None
            return {}
        now = time.monotonic()
        if self._seen is None or self._seen[0] != pid:
            self._seen = (pid, now)
        stopped_for = now - self._seen[1]
        if stopped_for < older_than:
            return {}
        node = socket.gethostname()
        if not any(host.pid == pid and host.node == node for host in hosts()):
            if pid not in self._told:
                self._told.add(pid)
                log.warning("process %d is stopped while it holds the ledger's write lock; it is no host of this "
                            "fleet on this node, so it is left alone, and the fleet's writes wait until it resumes "
                            "or ends", pid)
            return {}
        if holder() != pid or process_state(pid) != "T":
            self._seen = None
            return {}  # woken (or its lock let go) meanwhile: nothing to end
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return {}  # it ended meanwhile, which is all that was wanted
        self._seen = None
        return {pid: stopped_for}
