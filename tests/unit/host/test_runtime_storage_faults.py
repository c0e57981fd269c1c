"""A host whose checkpoint storage fails mid-run: a real tmpfs that fills up or turns read-only.

Real HostRuntime, real SQLite ledger (outside the failing mount), real snapshot files; no Ray.
A call whose checkpoint cannot be written is refused with a retryable, typed error and
does not take effect; every call acknowledged before, during or after the outage is in
the State afterwards, also on a new host; the host serves again once the storage does.
"""

from __future__ import annotations

from pathlib import Path

import cloudpickle
import pytest
from delivery import deliver
from mount_support import Tmpfs, tmpfs

import rayfleet as rf
from rayfleet.checkpoints._store import SnapshotStore
from rayfleet.errors import is_retryable
from rayfleet.host._runtime import HostRuntime
from rayfleet.ledger._ledger import Ledger
from rayfleet.ledger._local import LocalLedgerClient
from rayfleet.ledger._values import SpecRecord


class Tally(rf.Agent):
    class State(rf.State):
        total: int = 0
        seen: list[int] = []

    @rf.handler
    def add(self, n: int) -> int:
        self.state.total += n
        self.state.seen.append(n)
        return self.state.total

    @rf.handler
    def get(self) -> dict[str, object]:
        return {"total": self.state.total, "seen": list(self.state.seen)}


def register(ledger: Ledger, identity: str) -> None:
    spec = rf.AgentSpec(identity=identity, agent=Tally)
    ledger.register(SpecRecord(
        identity=identity, spec=cloudpickle.dumps(spec), fingerprint=spec.fingerprint(),
        agent_class=spec.agent_class_path, labels={}, addressability=spec.addressability.value,
    ))


def host(ledger: Ledger, root: Path, name: str, *, inline_limit: int = 0) -> HostRuntime:
    """A host whose checkpoints all go to snapshot files (``inline_limit=0``), unless told otherwise."""
    return HostRuntime(name=name, ledger=LocalLedgerClient(ledger), snapshots=SnapshotStore(str(root)), incarnation=name,
                       inline_limit=inline_limit)


async def value(runtime: HostRuntime, identity: str, method: str, **kwargs: object) -> object:
    return (await deliver(runtime, identity, method, (), kwargs)).value


def break_storage(disk: Tmpfs, fault: str) -> None:
    disk.read_only() if fault == "read-only" else disk.fill()


def repair_storage(disk: Tmpfs, fault: str) -> None:
    disk.writable() if fault == "read-only" else disk.free()


@pytest.mark.parametrize("fault", ["read-only", "full"])
async def test_a_storage_outage_refuses_changes_retryably_loses_nothing_acknowledged_and_recovers(
    tmp_path: Path, fault: str
) -> None:
    ledger = Ledger(tmp_path / "ledger.sqlite")
    for identity in ("t/a", "t/b"):
        register(ledger, identity)
    with tmpfs(tmp_path / "storage", size=1024 * 1024) as disk:
        async with host(ledger, disk.path, "host-a") as runtime:
            assert await value(runtime, "t/a", "add", n=1) == 1
            assert await value(runtime, "t/b", "add", n=10) == 10
            break_storage(disk, fault)

            for attempt in range(2):  # refused every time while the fault lasts, never half-applied
                with pytest.raises(rf.StorageUnavailableError) as caught:
                    await deliver(runtime, "t/a", "add", (), {"n": 100}, idempotency_key="k-100")
                assert is_retryable(caught.value), attempt
                assert str(disk.path) in caught.value.message
            # A read needs no checkpoint: it is served, and shows no trace of the refused call.
            assert await value(runtime, "t/a", "get") == {"total": 1, "seen": [1]}
            # Other identities keep serving what needs no write.
            assert await value(runtime, "t/b", "get") == {"total": 10, "seen": [10]}
            assert ledger.resolve(["t/a"])["t/a"].lifecycle == "live"  # an outage breaks nobody

            repair_storage(disk, fault)
            # The retry of the refused call runs once, now, on the last committed State.
            retried = await deliver(runtime, "t/a", "add", (), {"n": 100}, idempotency_key="k-100")
            assert retried.value == 101 and not retried.duplicate
            again = await deliver(runtime, "t/a", "add", (), {"n": 100}, idempotency_key="k-100")
            assert again.value == 101 and again.duplicate
            assert await value(runtime, "t/b", "add", n=5) == 15

        # A new host finds exactly the acknowledged calls.
        async with host(ledger, disk.path, "host-b") as successor:
            assert await value(successor, "t/a", "get") == {"total": 101, "seen": [1, 100]}
            assert await value(successor, "t/b", "get") == {"total": 15, "seen": [10, 5]}
            assert (await deliver(successor, "t/a", "add", (), {"n": 100}, idempotency_key="k-100")).duplicate


@pytest.mark.parametrize("fault", ["read-only", "full"])
async def test_small_states_travel_in_the_ledger_and_keep_committing_while_snapshot_storage_is_down(
    tmp_path: Path, fault: str
) -> None:
    ledger = Ledger(tmp_path / "ledger.sqlite")
    register(ledger, "t/a")
    with tmpfs(tmp_path / "storage", size=1024 * 1024) as disk:
        async with host(ledger, disk.path, "host-a", inline_limit=16 * 1024) as runtime:
            assert await value(runtime, "t/a", "add", n=1) == 1
            break_storage(disk, fault)
            assert await value(runtime, "t/a", "add", n=2) == 3  # committed in the ledger; no file needed
            repair_storage(disk, fault)
        assert not list(disk.path.rglob("*.arrow"))  # no snapshot file was ever written
        pointer = ledger.resolve(["t/a"])["t/a"].snapshot
        assert pointer is not None and pointer.in_ledger and pointer.version == 2
        async with host(ledger, disk.path, "host-b", inline_limit=16 * 1024) as successor:
            assert await value(successor, "t/a", "get") == {"total": 3, "seen": [1, 2]}


async def test_a_truncated_snapshot_breaks_only_its_identity_until_restored(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.sqlite")
    for identity in ("t/a", "t/b"):
        register(ledger, identity)
    async with host(ledger, tmp_path, "host-a") as runtime:
        assert await value(runtime, "t/a", "add", n=3) == 3
        assert await value(runtime, "t/b", "add", n=4) == 4
    pointer = ledger.resolve(["t/a"])["t/a"].snapshot
    assert pointer is not None
    file = tmp_path / pointer.file
    good = file.read_bytes()
    file.write_bytes(good[: len(good) // 3])
    async with host(ledger, tmp_path, "host-b") as runtime:
        with pytest.raises(rf.SnapshotError) as caught:
            await value(runtime, "t/a", "get")
        assert caught.value.location == f"{pointer.file}#{pointer.row}"
        view = ledger.resolve(["t/a"])["t/a"]
        assert view.lifecycle == "broken" and pointer.file in view.reason
        assert await value(runtime, "t/b", "add", n=1) == 5  # the other identity is served
        file.write_bytes(good)
        await runtime.respawn("t/a")
        assert await value(runtime, "t/a", "get") == {"total": 3, "seen": [3]}


async def test_a_failed_background_checkpoint_keeps_what_was_acknowledged_for_the_next_one(tmp_path: Path) -> None:
    """PERIODIC durability replies before the commit; a commit refused by the storage must lose none of it."""
    ledger = Ledger(tmp_path / "ledger.sqlite")
    spec = rf.AgentSpec(identity="t/p", agent=Tally, durability=rf.Durability.ON_DEACTIVATE)
    ledger.register(SpecRecord(
        identity="t/p", spec=cloudpickle.dumps(spec), fingerprint=spec.fingerprint(),
        agent_class=spec.agent_class_path, labels={}, addressability=spec.addressability.value,
    ))
    with tmpfs(tmp_path / "storage", size=1024 * 1024) as disk:
        async with host(ledger, disk.path, "host-a") as runtime:
            acknowledged = await deliver(runtime, "t/p", "add", (), {"n": 4}, idempotency_key="k-4")
            assert acknowledged.value == 4
            disk.read_only()
            with pytest.raises(rf.StorageUnavailableError):
                await runtime.flush()
            disk.writable()
            assert await runtime.flush() == 1
        async with host(ledger, disk.path, "host-b") as successor:
            assert await value(successor, "t/p", "get") == {"total": 4, "seen": [4]}
            again = await deliver(successor, "t/p", "add", (), {"n": 4}, idempotency_key="k-4")
            assert again.duplicate and again.value == 4  # the key survived the refused commit
