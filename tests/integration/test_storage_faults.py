"""A real fleet whose checkpoint storage fails mid-run, or whose ledger cannot be reached at start.

The storage is a real tmpfs (tests/support/mount_support.py) remounted read-only or
filled to ENOSPC while the fleet serves; the SQLite ledger lives outside it. Calls that
need a checkpoint are refused with StorageUnavailableError through Ray; reads and other
work go on; every acknowledged call survives; service resumes once the storage does.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
from mount_support import tmpfs
from ray_helpers import kill_actor
from tcp_proxy import TcpProxy

import rayfleet as rf
from rayfleet.errors import is_retryable


class Ledgerbook(rf.Agent):
    class State(rf.State):
        total: int = 0
        entries: list[int] = []

    @rf.handler
    def add(self, n: int) -> int:
        self.state.total += n
        self.state.entries.append(n)
        return self.state.total

    @rf.handler
    def get(self) -> dict:
        return {"total": self.state.total, "entries": list(self.state.entries)}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("fault", ["read-only", "full"])
def test_storage_outage_during_calls_is_refused_retryably_and_the_fleet_recovers(
    make_fleet, tmp_path: Path, fault: str
) -> None:
    with tmpfs(tmp_path / "storage", size=2 * 1024 * 1024) as disk:
        # Every State to a file (inline_state_bytes=0): small ones would commit in the ledger alone.
        fleet: rf.Fleet = make_fleet(storage=disk.path, ledger_path=str(tmp_path / "ledger.sqlite"),
                                     inline_state_bytes=0)
        a, b = fleet.spawn("book/a", Ledgerbook), fleet.spawn("book/b", Ledgerbook)
        assert a.call("add", n=1) == 1
        assert b.call("add", n=10) == 10

        disk.read_only() if fault == "read-only" else disk.fill()
        with pytest.raises(rf.StorageUnavailableError) as caught:
            a.call("add", n=100, idempotency_key="k-100")
        assert is_retryable(caught.value) and str(disk.path) in caught.value.message
        with pytest.raises(rf.StorageUnavailableError):
            a.call("add", n=100, idempotency_key="k-100")  # the retry is refused too, not answered from memory
        assert a.call("get") == {"total": 1, "entries": [1]}
        assert b.call("get") == {"total": 10, "entries": [10]}
        assert fleet.status("book/a").state is not rf.LifecycleState.BROKEN  # an outage breaks nobody

        disk.writable() if fault == "read-only" else disk.free()
        assert a.call("add", n=100, idempotency_key="k-100") == 101
        assert b.call("add", n=5) == 15

        # Nothing acknowledged is lost: kill the owners, so the State comes from storage.
        for identity in ("book/a", "book/b"):
            owner = fleet.status(identity).host
            assert owner is not None
            kill_actor(owner, fleet.config.namespace)
        fleet.add_host()
        assert a.call("get") == {"total": 101, "entries": [1, 100]}
        assert b.call("get") == {"total": 15, "entries": [10, 5]}
        assert a.call("add", n=100, idempotency_key="k-100") == 101  # still remembered: not run twice


@pytest.mark.timeout(120)
def test_truncated_snapshot_breaks_only_its_identity_and_reset_recovers(make_fleet, storage: Path) -> None:
    fleet: rf.Fleet = make_fleet(inline_state_bytes=0)  # every State in a snapshot file
    fragile, sturdy = fleet.spawn("book/fragile", Ledgerbook), fleet.spawn("book/sturdy", Ledgerbook)
    assert fragile.call("add", n=3) == 3
    (truncated,) = (storage / "snapshots").glob("**/*.arrow")  # the fragile identity's one commit
    assert sturdy.call("add", n=4) == 4
    truncated.write_bytes(truncated.read_bytes()[:200])
    for host in fleet.hosts():  # no host keeps the good file cached
        kill_actor(host.name, fleet.config.namespace)
    fleet.add_host()

    with pytest.raises(rf.SnapshotError) as caught:
        fragile.call("get")
    relative = truncated.relative_to(storage).as_posix()
    assert caught.value.location.startswith(relative) and "not a valid Arrow IPC file" in caught.value.detail
    status = fleet.status("book/fragile")
    assert status.state is rf.LifecycleState.BROKEN and relative in status.broken_reason
    assert sturdy.call("get") == {"total": 4, "entries": [4]}  # the other identity is served
    recovered = fleet.reset("book/fragile")
    assert recovered.state is rf.LifecycleState.ACTIVE and recovered.generation == 1
    assert fragile.call("add", n=1) == 1


def test_postgresql_ledger_unreachable_at_connect_is_a_clear_retryable_error(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(rf.LedgerUnavailableError) as caught:
        rf.connect(storage=tmp_path / "s", ledger=f"postgresql://postgres:pw@127.0.0.1:{port}/rayfleet?connect_timeout=1",
                   namespace="t-unreachable", hosts=1)
    assert is_retryable(caught.value)
    assert f"127.0.0.1:{port}" in caught.value.message and ":pw@" not in caught.value.message


@pytest.mark.timeout(180)
def test_sqlite_ledger_locked_by_another_process_refuses_calls_retryably_and_recovers(
    make_fleet, tmp_path: Path
) -> None:
    ledger_file = tmp_path / "ledger.sqlite"
    fleet: rf.Fleet = make_fleet(ledger_path=str(ledger_file), hosts=1)
    a = fleet.spawn("book/a", Ledgerbook)
    assert a.call("add", n=1) == 1
    code = (
        "import sqlite3, sys\n"
        f"connection = sqlite3.connect({str(ledger_file)!r}, isolation_level=None)\n"
        "connection.execute('BEGIN EXCLUSIVE')\n"
        "print('locked', flush=True)\n"
        "sys.stdin.read()\n"
    )
    locker = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert locker.stdout is not None and locker.stdout.readline().strip() == "locked"
        with pytest.raises(rf.LedgerUnavailableError) as caught:
            a.call("add", n=100)  # waits out SQLite's busy timeout in the ledger actor, then is refused
        assert is_retryable(caught.value) and str(ledger_file) in caught.value.message
    finally:
        assert locker.stdin is not None
        locker.stdin.close()
        locker.wait(timeout=30)
    assert a.call("add", n=2) == 3  # the refused add never happened
    assert a.call("get") == {"total": 3, "entries": [1, 2]}


@pytest.mark.timeout(120)
def test_connect_over_read_only_storage_is_refused_with_a_storage_error(make_fleet, tmp_path: Path) -> None:
    with tmpfs(tmp_path / "storage") as disk:
        disk.read_only()
        options = {"storage": disk.path, "ledger_path": str(tmp_path / "ledger.sqlite"), "hosts": 1,
                   "namespace": f"t-ro-{tmp_path.name[-12:]}"}
        with pytest.raises(rf.StorageUnavailableError) as caught:
            make_fleet(**options)
        assert str(disk.path) in caught.value.message and is_retryable(caught.value)
        disk.writable()
        # The retry, in the same namespace, reuses what the refused connect started (and shuts it down after).
        fleet: rf.Fleet = make_fleet(**options)
        assert fleet.spawn("book/late", Ledgerbook).call("add", n=2) == 2


@pytest.fixture
def proxied_postgres_ledger(postgres_ledger: str):
    """The per-test PostgreSQL ledger, reached through a TCP proxy the test can cut (the server keeps running)."""
    server = urlsplit(postgres_ledger)
    proxy = TcpProxy(server.hostname or "127.0.0.1", server.port or 5432)
    netloc = f"{server.username}@127.0.0.1:{proxy.port}"
    query = f"{server.query}&connect_timeout=1" if server.query else "connect_timeout=1"
    try:
        yield urlunsplit(server._replace(netloc=netloc, query=query)), proxy
    finally:
        proxy.close()


@pytest.mark.timeout(240)
def test_postgresql_ledger_lost_mid_run_refuses_calls_retryably_and_the_fleet_recovers(
    proxied_postgres_ledger, make_fleet
) -> None:
    # Fixture order matters: the fleet shuts down (through the proxy) before the proxy closes.
    url, proxy = proxied_postgres_ledger
    fleet: rf.Fleet = make_fleet(ledger=url, hosts=1)
    a = fleet.spawn("book/a", Ledgerbook)
    assert a.call("add", n=1) == 1
    proxy.cut()
    with pytest.raises(rf.LedgerUnavailableError) as caught:
        a.call("add", n=100)
    assert is_retryable(caught.value) and "127.0.0.1" in caught.value.message
    proxy.restore()
    # Once the ledger is reachable again the fleet serves; the refused add never happened.
    assert a.call("add", n=2) == 3
    assert a.call("get") == {"total": 3, "entries": [1, 2]}
    assert fleet.status("book/a").checkpoint_version == 2
