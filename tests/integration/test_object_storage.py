"""Object storage end to end: the README quickstart on S3 (moto's server on 127.0.0.1), and large step
outputs journaled as files under ``journal/`` on local disk and on S3.

The S3 server is the session fixture of ``tests/conftest.py``; the SQLite ledger stays on
local disk (``ledger_path=``), as the README says it must.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pydantic
import pytest
import ray
from ray_helpers import kill_actor

import rayfleet as rf
from rayfleet.checkpoints._journal_files import JournalFileStore
from rayfleet.checkpoints._step_outputs import SPILL_THRESHOLD
from rayfleet.checkpoints._store import SnapshotStore
from rayfleet.demo import Counter

WAIT = 60.0
"""Upper bound for anything the tests wait on; a healthy run finishes far sooner."""
ROWS = 64 * 1024
"""Rows of the large output: two int64 columns, 1 MiB, four times the spill threshold."""


def wait_until(predicate: Callable[[], Any], *, what: str) -> Any:
    """Bounded polling in the driver."""
    deadline = time.monotonic() + WAIT
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.05)
    return value


def large_table() -> pa.Table:
    return pa.table({"i": pa.array(range(ROWS), type=pa.int64()), "square": pa.array([i * i for i in range(ROWS)])})


class Maker(rf.Agent):
    """Returns a 1 MiB table, or waits for a release file; counts its calls."""

    class State(rf.State):
        calls: dict[str, int] = pydantic.Field(default_factory=dict)

    @rf.handler
    async def table(self) -> pa.Table:
        self.state.calls = {**self.state.calls, "table": self.state.calls.get("table", 0) + 1}
        return large_table()

    @rf.handler
    async def gate(self, touch: str, release: str) -> dict[str, bool]:
        self.state.calls = {**self.state.calls, "gate": self.state.calls.get("gate", 0) + 1}
        Path(touch).touch()
        for _ in range(int(WAIT / 0.05)):
            if os.path.exists(release):
                break
            await asyncio.sleep(0.05)
        return {"released": os.path.exists(release)}

    @rf.handler
    async def report(self) -> dict[str, int]:
        return dict(self.state.calls)


@pytest.fixture
def s3_fleet(make_fleet: Callable[..., rf.Fleet], s3_storage: str, tmp_path: Path) -> rf.Fleet:
    # Every State to an object (inline_state_bytes=0), not into the ledger.
    return make_fleet(storage=s3_storage, ledger_path=str(tmp_path / "ledger.sqlite"), inline_state_bytes=0)


@pytest.mark.timeout(180)
def test_quickstart_with_s3_storage(s3_fleet: rf.Fleet, s3_storage: str, storage: Path) -> None:
    fleet = s3_fleet
    alice = fleet.spawn("counter/alice", Counter)
    assert alice.call("add", n=2) == 2
    before = fleet.status("counter/alice")
    assert before.checkpoint_version == 1 and before.lease is not None and before.host is not None

    snapshots = SnapshotStore(s3_storage)
    first = snapshots.list_files()
    assert len(first) == 1 and first[0].startswith("snapshots/")  # the checkpoint is an object in the bucket
    assert not storage.exists()  # and nothing went to the local default storage folder

    kill_actor(before.host, fleet.config.namespace)

    # The surviving host loads the last snapshot from S3.
    assert alice.call("add", n=3) == 5
    after = fleet.status("counter/alice")
    assert after.checkpoint_version == 2
    assert after.lease is not None and after.lease.fencing_token > before.lease.fencing_token
    assert after.host is not None and after.host != before.host
    assert after.session_id == before.session_id

    # Garbage collection on S3: the superseded snapshot goes, the committed one stays.
    files = snapshots.list_files()
    assert len(files) == 2 and first[0] in files
    assert fleet.collect_garbage(min_age=3600) == []  # young files are kept
    assert fleet.collect_garbage(min_age=0) == first
    (kept,) = snapshots.list_files()
    assert kept in fleet._ledger.referenced_snapshot_files().result()
    # Deactivated, the agent comes back from exactly that object.
    assert fleet.deactivate("counter/alice")
    assert alice.call("add", n=0) == 5


def test_a_missing_bucket_fails_connect_and_creates_nothing(
    make_fleet: Callable[..., rf.Fleet], s3_storage: str, tmp_path: Path,
) -> None:
    ledger = tmp_path / "never.sqlite"
    with pytest.raises(rf.InvalidSpecError, match="the bucket 'absent' does not exist") as caught:
        make_fleet(storage=s3_storage.replace("@rayfleet-tests/", "@absent/"), ledger_path=str(ledger))
    assert "test-secret" not in str(caught.value)
    assert not ledger.exists()


@pytest.mark.timeout(240)
@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_large_step_output_is_a_file_in_storage_and_is_resumed_from_it(
    where: str, request: pytest.FixtureRequest, make_fleet: Callable[..., rf.Fleet], storage: Path, tmp_path: Path,
) -> None:
    if where == "local":
        root = str(storage)
        fleet = make_fleet()
    else:
        root = request.getfixturevalue("s3_storage")
        fleet = make_fleet(storage=root, ledger_path=str(tmp_path / "ledger.sqlite"))
    fleet.spawn("maker/1", Maker)
    started, release = tmp_path / "gate.started", tmp_path / "gate.release"
    wf = rf.Workflow("large-output")
    wf.step("load", to="maker/1", call="table")
    wf.step("gate", to="maker/1", call="gate", payload={"touch": str(started), "release": str(release)},
            after=["load"])

    run_id = fleet.submit(wf)
    try:
        wait_until(started.exists, what="the gate step to start")
        # "load" is journaled (gate runs after it): only a pointer is in the ledger.
        (entry,) = fleet._ledger.journal(run_id).result().steps
        assert entry.label == "load" and entry.output[:1] == b"F" and len(entry.output) < 200
        pointer = json.loads(entry.output[1:])
        assert pointer["kind"] == "A" and pointer["size"] > 4 * SPILL_THRESHOLD
        files = JournalFileStore(root)
        assert files.list_files() == [pointer["path"]]
        assert pointer["path"].startswith(f"journal/{run_id}/load-") and pointer["path"].endswith(".arrow")
        assert files.read_table(pointer["path"]).equals(large_table())  # a plain Arrow file
        # Kill the runner mid-run; its successor resumes from the journal, reading "load" back from storage.
        ray.kill(ray.get_actor("rayfleet-runner", namespace=fleet.config.namespace), no_restart=False)
    finally:
        release.touch()
    outcome = fleet.runs.wait(run_id, timeout=WAIT)
    assert outcome.status is rf.RunStatus.COMPLETED, outcome.error
    assert outcome.outputs["load"].equals(large_table())
    assert outcome.outputs["gate"] == {"released": True}
    assert fleet.agent("maker/1").call("report")["table"] == 1  # re-derived from the file, never re-executed

    # The driver's own fleet.run spills too, through the same store.
    single = rf.Workflow("large-output-in-driver")
    single.step("load", to="maker/1", call="table")
    driven = fleet.run(single)
    assert driven.status is rf.RunStatus.COMPLETED and driven.outputs["load"].equals(large_table())
    (entry,) = fleet._ledger.journal(driven.run_id).result().steps
    assert entry.output[:1] == b"F"
    assert len(JournalFileStore(root).list_files()) == 2

