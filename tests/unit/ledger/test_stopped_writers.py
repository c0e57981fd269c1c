"""A host stopped while it holds a SQLite ledger's write lock must not stop every writer of the fleet for as long.

The lock is a POSIX record lock of the stopped process, which the kernel frees only when
the process lets go or ends. Seen in the chaos profile: a host frozen (SIGSTOP) inside its
commit held the file's write lock for its whole 8 s freeze, and no other host could take
over its identities. These tests stop real processes holding the real lock.
"""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from polling import eventually
from processes import ended, process_state

from rayfleet.ledger._ledger import Ledger
from rayfleet.ledger._sqlite import SqliteDatabase
from rayfleet.ledger._stall_watch import StallWatch
from rayfleet.ledger._stopped_writers import StoppedWriters, process_key

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the lock holder is asked of Linux's kernel")

PATIENCE = 60.0
"""Upper bound on the waits below, so a broken build fails rather than hangs; never an expected duration."""

HOLD = """
import sqlite3, sys, time
sys.stdin.readline()
connection = sqlite3.connect(sys.argv[1], isolation_level=None)
connection.execute("BEGIN IMMEDIATE")
connection.execute("UPDATE hosts SET draining = draining")
print("holding", flush=True)
time.sleep(3600)
"""


class Writers:
    """Processes started to hold the ledger's write lock; every one is killed at the end."""

    def __init__(self, ledger: Ledger, path: Path) -> None:
        self._ledger = ledger
        self._path = path
        self.started: list[subprocess.Popen[str]] = []

    def holding(self, *, host: str | None = None, key: str | None = None, stopped: bool = True) -> int:
        """A process that holds the write lock (a transaction begun, nothing committed), stopped unless told not.

        With ``host``, it is registered under that name first, with its process id and
        key, as a host registers when it starts (or with ``key`` in place of its own).
        """
        process = subprocess.Popen([sys.executable, "-c", HOLD, str(self._path)], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, text=True)
        self.started.append(process)
        if host is not None:
            self._ledger.register_host(name=host, holder=f"{host}@1", node=socket.gethostname(), pid=process.pid,
                                       process=key or process_key(process.pid))
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write("go\n")
        process.stdin.flush()
        assert process.stdout.readline().strip() == "holding"
        if stopped:
            os.kill(process.pid, signal.SIGSTOP)
            assert eventually(lambda: process_state(process.pid) == "T", "the holder stopped", PATIENCE)
        return process.pid

    def kill_all(self) -> None:
        for process in self.started:
            if process.poll() is None:
                process.kill()
            process.wait()


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    opened = Ledger(tmp_path / "ledger.sqlite")
    yield opened
    opened.close()


@pytest.fixture
def writers(ledger: Ledger, tmp_path: Path) -> Iterator[Writers]:
    started = Writers(ledger, tmp_path / "ledger.sqlite")
    yield started
    started.kill_all()


def a_write_waits(path: Path) -> bool:
    """Whether a write finds the lock held (it gives up at once rather than wait). Asked by another process,
    since a process's own locks never stop it."""
    script = f"import sqlite3; sqlite3.connect({str(path)!r}, timeout=0.0, isolation_level=None).execute('BEGIN IMMEDIATE')"
    finished = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=PATIENCE)
    if finished.returncode == 0:
        return False
    assert "locked" in finished.stderr, finished.stderr
    return True


def test_the_store_names_the_process_holding_its_write_lock(ledger: Ledger, writers: Writers, tmp_path: Path) -> None:
    database = SqliteDatabase(tmp_path / "ledger.sqlite")
    try:
        assert database.write_lock_holder() is None
        holder = writers.holding(stopped=False)
        assert database.write_lock_holder() == holder
        writers.kill_all()
        assert database.write_lock_holder() is None
        ledger.register_host(name="h", holder="h@1", node="n", pid=7, process="boot:1")
        (host,) = ledger.hosts()
        assert (host.name, host.node, host.pid, host.process) == ("h", "n", 7, "boot:1")
    finally:
        database.close()


def test_asking_who_holds_the_lock_keeps_this_processs_own_locks(tmp_path: Path) -> None:
    # Closing any descriptor of a file drops every POSIX lock the process holds on it: the
    # descriptor the question goes through must outlive the asking.
    path = tmp_path / "ledger.sqlite"
    Ledger(path).close()
    mine = sqlite3.connect(path, isolation_level=None)
    asker = SqliteDatabase(path)
    try:
        mine.execute("BEGIN IMMEDIATE")  # this process holds the write lock
        assert asker.write_lock_holder() is None  # a process's own locks never conflict with it
        asker.close()
        assert a_write_waits(path), "asking dropped this process's write lock"
    finally:
        mine.execute("ROLLBACK")
        mine.close()


def test_a_registered_host_stopped_holding_the_lock_is_ended(
    ledger: Ledger, writers: Writers, tmp_path: Path,
) -> None:
    frozen = writers.holding(host="host-1")
    assert a_write_waits(tmp_path / "ledger.sqlite")

    assert ledger.end_stalled_sessions(older_than=3600.0) == {}  # not stopped that long: left alone
    assert process_state(frozen) == "T"
    killed = ledger.end_stalled_sessions(older_than=0.0)

    assert list(killed) == [frozen]
    assert eventually(lambda: ended(frozen), "the stopped host ended", PATIENCE)
    assert eventually(lambda: not a_write_waits(tmp_path / "ledger.sqlite"), "the write lock freed", PATIENCE)
    ledger.register_host(name="host-1", holder="host-1@2")  # the restarted host registers; nothing it left is kept
    assert [host.holder for host in ledger.hosts()] == ["host-1@2"]


@pytest.mark.parametrize("who", ["no host", "another process under a dead host's id", "a host not stopped"])
def test_a_holder_that_is_not_a_stopped_registered_host_is_left_alone(
    ledger: Ledger, writers: Writers, tmp_path: Path, who: str,
) -> None:
    if who == "no host":  # a driver, or the CLI suspended with Ctrl-Z
        holder = writers.holding()
    elif who == "another process under a dead host's id":  # the id reused, or a host of another machine
        holder = writers.holding(host="host-1", key="another-boot:12345")
    else:  # a long transaction of a running host
        holder = writers.holding(host="host-1", stopped=False)

    assert ledger.end_stalled_sessions(older_than=0.0) == {}
    assert ledger.end_stalled_sessions(older_than=0.0) == {}
    assert not ended(holder)
    assert a_write_waits(tmp_path / "ledger.sqlite")


def test_the_stall_watch_frees_a_writer_of_its_own_ledger_waiting_on_a_stopped_host(writers: Writers,
                                                                                 tmp_path: Path) -> None:
    # As in a host: the watch and the waiting writer share one ledger (one connection,
    # which the writer holds while it waits), so the watch must not wait behind it.
    host = Ledger(SqliteDatabase(tmp_path / "ledger.sqlite", busy_timeout=PATIENCE), authority=False)
    frozen = writers.holding(host="host-1")
    watch = StallWatch(host, every=0.2, older_than=0.5)
    outcome: list[Any] = []
    try:
        watch.start()
        # A host's renewal or a lease grant would wait here for as long as the holder stays stopped.
        writer = threading.Thread(target=lambda: outcome.append(host.register_host(name="host-2", holder="h2@1")),
                                  daemon=True)
        writer.start()
        writer.join(PATIENCE)

        assert outcome == [[]], "the write still waits on the stopped host's lock"
        assert eventually(lambda: watch.ended == 1, "the watch counted the host it ended", PATIENCE)
        assert eventually(lambda: ended(frozen), "the stopped host ended", PATIENCE)
    finally:
        watch.stop()
        host.close()


def test_a_host_woken_while_the_hosts_are_read_is_not_ended(ledger: Ledger, writers: Writers, tmp_path: Path) -> None:
    database = SqliteDatabase(tmp_path / "ledger.sqlite")
    frozen = writers.holding(host="host-1")
    stopped = StoppedWriters()

    def hosts_read_slowly() -> list[Any]:
        # The read a host makes takes time; meanwhile whoever stopped the host continues it.
        os.kill(frozen, signal.SIGCONT)
        eventually(lambda: process_state(frozen) != "T", "the holder continued", PATIENCE)
        return ledger.hosts()

    try:
        assert stopped.end(database.write_lock_holder, older_than=0.0, hosts=hosts_read_slowly) == {}
        assert not ended(frozen)
    finally:
        database.close()
