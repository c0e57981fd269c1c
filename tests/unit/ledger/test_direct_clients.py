"""Processes beside a SQLite ledger open its file themselves: no lock-delay from them, and their operations counted."""

from __future__ import annotations

import concurrent.futures
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import cloudpickle
import pytest

import rayfleet as rf
from rayfleet.identity._values import SnapshotPointer
from rayfleet.ledger import RunRequests
from rayfleet.ledger._contract import LedgerCall
from rayfleet.ledger._ledger import Ledger
from rayfleet.ledger._local import Completed, LocalLedgerClient
from rayfleet.ledger._values import Activation, CheckpointCommit, SpecRecord
from rayfleet.testing import ManualClock

T = TypeVar("T")
TTL = 10.0


class Plain(rf.Agent):
    pass


def acquire(ledger: Ledger, holder: str) -> Activation | object:
    return ledger.acquire(holder=holder, identities=["a"], ttl=TTL)["a"]


def test_a_direct_opening_is_not_a_restart_and_does_not_delay_a_dead_holders_lease(tmp_path: Path) -> None:
    clock = ManualClock()
    path = tmp_path / "ledger.sqlite"
    authority = Ledger(path, clock=clock)
    spec = rf.AgentSpec(identity="a", agent=Plain)
    authority.register(SpecRecord(identity="a", spec=cloudpickle.dumps(spec), fingerprint=spec.fingerprint(),
                                  agent_class=spec.agent_class_path))
    assert isinstance(acquire(authority, "dead-host"), Activation)
    clock.advance(TTL - 1)
    # A host starting beside the ledger opens the file: the dead holder's lease still ends on time.
    beside = Ledger(path, clock=clock, authority=False)
    clock.advance(1.01)
    assert isinstance(acquire(beside, "live-host"), Activation)
    # The same opening as the authority (a restarted ledger actor) does apply lock-delay:
    # the live host's lease, 1 s from its end, is extended by one TTL.
    clock.advance(TTL - 1)
    restarted = Ledger(path, clock=clock)
    clock.advance(1.01)
    assert not isinstance(acquire(restarted, "third-host"), Activation)
    for ledger in (authority, beside, restarted):
        ledger.close()


def test_a_direct_client_reports_every_operation_with_its_outcome(tmp_path: Path) -> None:
    heard: list[tuple[str, str]] = []
    client = LocalLedgerClient(Ledger(tmp_path / "ledger.sqlite"), threads=2,
                               observe=lambda name, outcome, seconds: heard.append((name, outcome)))
    try:
        assert client.route == "direct"
        client.fleet_identity().result()
        with pytest.raises(rf.UnknownIdentityError):
            client.set_lifecycle(identity="nobody", fencing_token=1, lifecycle="live").result()
    finally:
        client.close()
    assert heard == [("fleet_identity", "OK"), ("set_lifecycle", "UnknownIdentityError")]


def written_once_unlocked(path: Path, write: Callable[[], LedgerCall[T]]) -> T:
    """Start ``write()`` while another process holds the file's write lock; its result once the lock is free.

    Asserts that the write waits on a worker thread (the caller gets a pending call at
    once) rather than failing or blocking the caller.
    """
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
    waiting = write()
    assert not isinstance(waiting, Completed)
    with pytest.raises(concurrent.futures.TimeoutError):
        waiting.result(timeout=0.3)  # waits on a worker thread, not on the caller's
    other.execute("ROLLBACK")
    other.close()
    return waiting.result(timeout=5)


def test_a_small_commit_is_written_at_once_and_waits_on_a_worker_thread_only_while_the_file_is_locked(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ledger.sqlite"
    ledger = Ledger(path)
    spec = rf.AgentSpec(identity="a", agent=Plain)
    ledger.register(SpecRecord(identity="a", spec=cloudpickle.dumps(spec), fingerprint=spec.fingerprint(),
                               agent_class=spec.agent_class_path))
    activation = acquire(ledger, "h")
    assert isinstance(activation, Activation)
    token = activation.grant.fencing_token
    client = LocalLedgerClient(ledger, threads=2, small_commits=8)

    def commit(version: int) -> CheckpointCommit:
        pointer = SnapshotPointer(file="", row=0, version=version, inline=b"state")
        return CheckpointCommit(identity="a", fencing_token=token, version=version, pointer=pointer)

    try:
        done = client.commit_checkpoints([commit(1)])
        assert isinstance(done, Completed) and done.result() == [None]  # no thread hand-off
        assert written_once_unlocked(path, lambda: client.commit_checkpoints([commit(2)])) == [None]
        assert ledger.resolve(["a"])["a"].snapshot == SnapshotPointer(file="", row=0, version=2)
    finally:
        client.close()


def ledger_with_a_run(tmp_path: Path) -> tuple[Path, Ledger, int]:
    """A SQLite ledger file holding run ``r``, and the run lease's token (held by ``E1``)."""
    path = tmp_path / "ledger.sqlite"
    ledger = Ledger(path)
    ledger.create_run(run_id="r", workflow="wf", code_version="v1", definition=None)
    return path, ledger, ledger.acquire_run_lease(run_id="r", holder="E1", ttl=30.0).token


def test_a_journal_write_is_written_at_once_and_waits_on_a_worker_thread_only_while_the_file_is_locked(
    tmp_path: Path,
) -> None:
    path, ledger, token = ledger_with_a_run(tmp_path)
    client = LocalLedgerClient(ledger, threads=2, small_commits=8)
    try:
        done = client.journal_step(run_id="r", fencing_token=token, label="a", output=b"1", tokens=0)
        assert isinstance(done, Completed) and done.result() == RunRequests()  # no thread hand-off
        refused = client.journal_step(run_id="r", fencing_token=token - 1, label="b", output=b"2", tokens=0)
        assert isinstance(refused, Completed)
        with pytest.raises(rf.StaleRunTokenError):
            refused.result()
        written = written_once_unlocked(
            path, lambda: client.journal_step(run_id="r", fencing_token=token, label="c", output=b"3", tokens=0))
        assert written == RunRequests()
        assert [entry.label for entry in ledger.journal("r").steps] == ["a", "c"]
    finally:
        client.close()


def test_a_refused_write_leaves_no_statement_open_so_the_next_write_waits_for_another_processs_lock(
    tmp_path: Path,
) -> None:
    # A statement left open by a refused write (its cursor kept alive by the error's
    # traceback) kept the connection's read snapshot, and SQLite then failed the next
    # write at once instead of waiting for the writer holding the file's lock.
    path, ledger, token = ledger_with_a_run(tmp_path)
    with pytest.raises(rf.StaleRunTokenError) as refused:
        ledger.journal_step(run_id="r", fencing_token=token - 1, label="a", output=b"1", tokens=0)
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")  # another process writes for a moment
    other.execute("UPDATE runs SET pause_requested = 0 WHERE run_id = 'r'")
    releaser = threading.Timer(0.3, lambda: other.execute("COMMIT"))
    releaser.start()
    try:
        assert ledger.journal_step(run_id="r", fencing_token=token, label="b", output=b"2", tokens=0) == RunRequests()
    finally:
        releaser.join()
    assert [entry.label for entry in ledger.journal("r").steps] == ["b"]
    assert refused.value.run_id == "r"
