"""Small States travel inline in the ledger's commit; large ones and large batches go to files (no Ray)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import cloudpickle
import pytest

import rayfleet as rf
from rayfleet.checkpoints._committer import INLINE_BATCH_ROWS, GroupCommitter
from rayfleet.checkpoints._store import SnapshotRow, SnapshotStore
from rayfleet.identity._values import LeaseDenied
from rayfleet.ledger._ledger import Ledger
from rayfleet.ledger._local import LocalLedgerClient
from rayfleet.ledger._values import Activation, SpecRecord


class Notes(rf.State):
    text: str = ""
    count: int = 0


class Notebook(rf.Agent):
    State = Notes


def register(ledger: Ledger, identity: str) -> int:
    spec = rf.AgentSpec(identity=identity, agent=Notebook)
    ledger.register(SpecRecord(identity=identity, spec=cloudpickle.dumps(spec), fingerprint=spec.fingerprint(),
                               agent_class=spec.agent_class_path))
    activation = ledger.acquire(holder="h", identities=[identity])[identity]
    assert isinstance(activation, Activation)
    return activation.grant.fencing_token


def test_an_inline_state_reads_back_equal_and_is_checked_like_a_file_row(tmp_path: Path) -> None:
    store = SnapshotStore(str(tmp_path))
    state = Notes(text="é" * 10, count=3)
    data = store.inline(store.encode([SnapshotRow(identity="n/1", version=4, state=state, extra=b"x")]), 0)
    assert store.read_inline(data, Notes, identity="n/1", version=4) == (state, b"x")
    with pytest.raises(rf.SnapshotError, match="expected 'n/1' version 5") as wrong:
        store.read_inline(data, Notes, identity="n/1", version=5)
    assert wrong.value.location == "ledger:n/1"
    with pytest.raises(rf.SnapshotError, match="the State kept in the ledger could not be read") as cut:
        store.read_inline(data[:-20], Notes, identity="n/1", version=4)
    assert "Deploy a State class that reads it" in cut.value.message
    assert store.list_files() == []


async def test_the_committer_inlines_small_states_and_files_large_ones_and_large_batches(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.sqlite")
    names = [f"n/{index}" for index in range(INLINE_BATCH_ROWS + 2)]
    tokens = {name: register(ledger, name) for name in names}
    store = SnapshotStore(str(tmp_path / "store"))
    committer = GroupCommitter(writer="h", ledger=LocalLedgerClient(ledger), snapshots=store, inline_limit=2048)
    committer.start()
    try:
        small = await committer.commit(identity="n/0", fencing_token=tokens["n/0"], version=1, state=Notes(count=1))
        large = await committer.commit(identity="n/1", fencing_token=tokens["n/1"], version=1,
                                       state=Notes(text="x" * 4096))
        assert small.in_ledger and small.inline is not None and not large.in_ledger
        assert store.list_files() == [large.file]
        # More States of one class than INLINE_BATCH_ROWS in one batch: one shared file.
        batch = await asyncio.gather(*(
            committer.commit(identity=name, fencing_token=tokens[name], version=2, state=Notes(count=2))
            for name in names
        ))
        assert {pointer.file for pointer in batch} == {batch[0].file} and not batch[0].in_ledger
    finally:
        await committer.stop()
    # What the ledger hands out: the State only where it is read (an activation), never in plain views.
    assert ledger.resolve(["n/0"])["n/0"].snapshot is not None
    view = ledger.resolve(["n/0"])["n/0"].snapshot
    assert view is not None and not view.in_ledger  # version 2 went to the shared file


async def test_the_ledger_keeps_an_inline_state_until_reset_and_never_lists_it_as_a_file(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.sqlite")
    token = register(ledger, "n/1")
    store = SnapshotStore(str(tmp_path / "store"))
    committer = GroupCommitter(writer="h", ledger=LocalLedgerClient(ledger), snapshots=store)
    committer.start()
    try:
        await committer.commit(identity="n/1", fencing_token=token, version=1, state=Notes(text="kept", count=7))
    finally:
        await committer.stop()
    plain = ledger.resolve(["n/1"])["n/1"].snapshot
    assert plain is not None and plain.in_ledger and plain.inline is None and plain.version == 1
    assert ledger.referenced_snapshot_files() == set()
    activation = ledger.acquire(holder="h2", identities=["n/1"])["n/1"]
    assert isinstance(activation, LeaseDenied)  # h holds it; take it over as the same holder
    activation = ledger.acquire(holder="h", identities=["n/1"])["n/1"]
    assert isinstance(activation, Activation) and activation.view.snapshot is not None
    assert activation.view.snapshot.inline is not None
    state, _ = store.read_inline(activation.view.snapshot.inline, Notes, identity="n/1", version=1)
    assert state == Notes(text="kept", count=7)
    [row] = ledger.latest_checkpoints()
    assert row.snapshot is not None and row.snapshot.inline == activation.view.snapshot.inline
    ledger.reset(identity="n/1", fencing_token=activation.grant.fencing_token)
    again = ledger.acquire(holder="h", identities=["n/1"])["n/1"]
    assert isinstance(again, Activation) and again.view.snapshot is None
