"""The runner's sweep for waiters that ended runs left behind (no Ray cluster needed)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

import rayfleet as rf
from rayfleet.ledger._ledger import Ledger
from rayfleet.ledger._local import LocalLedgerClient
from rayfleet.platform._runner import retire_leftover_waiters, waiter_record
from rayfleet.platform._shipping import spec_record
from rayfleet.workflow._waits import Wait, signal_waiter_identity, waiter_identity, waiter_runs


class Plain(rf.Agent):
    @rf.handler
    async def ping(self) -> str:
        return "pong"


def test_a_waiter_name_reads_back_to_its_run() -> None:
    assert waiter_runs(waiter_identity("orders-1a2b", Wait(kind="sleep", seconds=1.0), "cool-off")) == ["orders-1a2b"]
    assert waiter_runs(signal_waiter_identity("orders-1a2b", "paid")) == ["orders-1a2b"]
    # A run id that holds a waiter's separator reads two ways; the sweep needs both ended.
    assert waiter_runs("workflow/a/step/b/signal/paid") == ["a", "a/step/b"]
    assert waiter_runs(waiter_identity("odd run id!", Wait(kind="sleep", seconds=1.0), "x")) == []  # a digest
    assert waiter_runs("counter/alice") == []


def _ended(ledger: Ledger, run_id: str, status: str) -> None:
    ledger.create_run(run_id=run_id, workflow="wf", code_version="v1", definition=None)
    lease = ledger.acquire_run_lease(run_id=run_id, holder="engine", ttl=30.0)
    ledger.set_run_status(run_id=run_id, fencing_token=lease.token, status=status)


async def _sweep(ledger: Ledger, retire: Callable[[str], Awaitable[None]]) -> int:
    client = LocalLedgerClient(ledger)
    try:
        return await retire_leftover_waiters(client, retire)
    finally:
        client.close()


async def test_only_the_waiters_of_runs_that_ended_are_retired(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.sqlite")
    for run_id, status in (("done-1", "COMPLETED"), ("failed-1", "FAILED"), ("busy-1", "RUNNING")):
        _ended(ledger, run_id, status)
    ledger.create_run(run_id="pending-1", workflow="wf", code_version="v1", definition=None)
    waiters = {
        "completed": signal_waiter_identity("done-1", "paid"),
        "failed": waiter_identity("failed-1", Wait(kind="sleep", seconds=5.0), "cool-off"),
        "running": signal_waiter_identity("busy-1", "paid"),
        "pending": signal_waiter_identity("pending-1", "paid"),
        "no run yet": signal_waiter_identity("later-1", "paid"),  # a signal sent before its run exists
        "digest": waiter_identity("odd run id!", Wait(kind="sleep", seconds=1.0), "x"),
        "delete fails": signal_waiter_identity("done-1", "shipped"),
    }
    for identity in waiters.values():
        ledger.register(waiter_record(identity))
    ledger.register(spec_record(rf.AgentSpec(identity="workflow/done-1/step/not-a-waiter", agent=Plain)))
    retired: list[str] = []

    async def retire(identity: str) -> None:
        if identity == waiters["delete fails"]:
            raise rf.FleetUnavailableError(detail="its owner did not answer")
        retired.append(identity)

    assert await _sweep(ledger, retire) == 2
    # The ended runs' waiters; the one whose delete failed is left for the next sweep; an
    # agent named like a waiter but not one is never touched.
    assert sorted(retired) == sorted([waiters["completed"], waiters["failed"]])


@pytest.mark.parametrize("status", ["COMPLETED", "CANCELLED", "COMPENSATED"])
async def test_every_final_status_counts_as_ended(tmp_path: Path, status: str) -> None:
    ledger = Ledger(tmp_path / "ledger.sqlite")
    _ended(ledger, "r-1", status)
    ledger.register(waiter_record(signal_waiter_identity("r-1", "go")))
    retired: list[str] = []

    async def retire(identity: str) -> None:
        retired.append(identity)

    assert await _sweep(ledger, retire) == 1
    assert retired == [signal_waiter_identity("r-1", "go")]
