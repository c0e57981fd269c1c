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
- it is a host registered in the ledger under that process id and that process key
  (:func:`process_key`: the kernel's boot id and the process's start time), so neither a
  host of another machine nor a later process that was given a dead host's id matches.

Any other process found holding the lock while stopped (a driver or the CLI suspended
with Ctrl-Z) is logged once and left alone: the fleet's writes wait until it resumes.
Linux only (``/proc``, the lock record's layout, pidfds); elsewhere nothing is ever ended.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable

from ._values import HostInfo

log = logging.getLogger("rayfleet.ledger")


def _stat(pid: int) -> tuple[str, str] | None:
    """Process ``pid``'s scheduler state (``R``, ``S``, ``T``, ...) and start time (clock ticks after boot), or
    ``None`` if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as stat:
            text = stat.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # "pid (command name) state ppid ...": the name may hold spaces and parentheses, so the
    # fields are counted from the last ')'; the start time is the stat file's 22nd field.
    fields = text.rpartition(")")[2].split()
    return (fields[0], fields[19]) if len(fields) > 19 else None


@functools.cache
def _boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as boot:
            return boot.read().strip()
    except OSError:
        return None


def _key(found: tuple[str, str] | None) -> str | None:
    boot = _boot_id()
    return None if found is None or boot is None else f"{boot}:{found[1]}"


def process_key(pid: int) -> str | None:
    """What tells process ``pid`` from any other process of any machine, even one later given the same id:
    the kernel's boot id and the process's start time. ``None`` off Linux or if the process is gone."""
    return _key(_stat(pid))


def _stopped_key(pid: int) -> str | None:
    """:func:`process_key` of ``pid`` if it is stopped (``T``), else ``None`` (one read of ``/proc``)."""
    found = _stat(pid)
    return _key(found) if found is not None and found[0] == "T" else None


class StoppedWriters:
    """Remembers since when the write lock's holder has been seen stopped, and ends it once that is too long.

    One per ledger; :meth:`end` may be called from any thread (one call at a time runs).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: tuple[int, float] | None = None
        """The stopped holder last seen, with the monotonic time it was first seen so."""
        self._told: set[int] = set()
        """Stopped holders that are not hosts of this fleet, logged once each."""

    def end(
        self, holder: Callable[[], int | None], *, older_than: float, hosts: Callable[[], Iterable[HostInfo]],
    ) -> dict[int, float]:
        """End the process ``holder()`` names (the write lock's holder now, or ``None``) per the module's rules.

        Returns ``{pid: seconds}`` for a process ended (seconds since it was first seen
        stopped holding the lock), else ``{}``. ``hosts`` is read only once a holder has
        been stopped for long enough. Since that read may take a while, the process is
        held by a pidfd (so the signal cannot reach a later process given its id) and
        asked again whether it still holds the lock and is still stopped, just before
        it is killed.
        """
        with self._lock:
            return self._end(holder, older_than=older_than, hosts=hosts)

    def _end(
        self, holder: Callable[[], int | None], *, older_than: float, hosts: Callable[[], Iterable[HostInfo]],
    ) -> dict[int, float]:
        pid = holder()
        key = None if pid is None else _stopped_key(pid)
        if pid is None or key is None:
            self._seen = None
            return {}
        now = time.monotonic()
        if self._seen is None or self._seen[0] != pid:
            self._seen = (pid, now)
        stopped_for = now - self._seen[1]
        if stopped_for < older_than:
            return {}
        if not any(host.pid == pid and host.process == key for host in hosts()):
            if pid not in self._told:
                self._told.add(pid)
                log.warning("process %d is stopped while it holds the ledger's write lock; it is no host of this "
                            "fleet, so it is left alone, and the fleet's writes wait until it resumes or ends", pid)
            return {}
        try:
            handle = os.pidfd_open(pid)
        except ProcessLookupError:
            return {}  # it ended meanwhile, which is all that was wanted
        except OSError as error:  # a kernel without pidfds (before Linux 5.3): never signal a pid that may be reused
            if pid not in self._told:
                self._told.add(pid)
                log.warning("host process %d is stopped while it holds the ledger's write lock, but it cannot be "
                            "ended safely here (%s); the fleet's writes wait until it resumes or ends", pid, error)
            return {}
        try:
            if holder() != pid or _stopped_key(pid) != key:
                self._seen = None
                return {}  # woken, or its lock let go, meanwhile: nothing to end
            signal.pidfd_send_signal(handle, signal.SIGKILL)
        except ProcessLookupError:
            return {}
        finally:
            os.close(handle)
        self._seen = None
        return {pid: stopped_for}
