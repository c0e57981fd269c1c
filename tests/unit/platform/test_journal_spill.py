"""Large step outputs go to files under journal/ with only a pointer in the ledger (no Ray cluster needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pydantic
import pytest

from rayfleet.checkpoints._journal_files import JournalFileStore
from rayfleet.checkpoints._step_outputs import SPILL_THRESHOLD, decode_output, encode_output, spill_output
from rayfleet.errors import WorkflowError
from rayfleet.ledger._local import LocalLedgerClient
from rayfleet.platform._runner import LedgerJournal


class Report(pydantic.BaseModel):
    title: str
    lines: list[str]


@pytest.fixture(params=["local", "s3"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return str(tmp_path / "store") if request.param == "local" else str(request.getfixturevalue("s3_storage"))


@pytest.fixture
def files(root: str) -> JournalFileStore:
    return JournalFileStore(root)


def _big_table() -> pa.Table:
    return pa.table({"i": pa.array(range(SPILL_THRESHOLD // 4), type=pa.int64()), "tag": ["t"] * (SPILL_THRESHOLD // 4)})


LARGE = {
    "table": _big_table(),
    "batch": _big_table().to_batches()[0],
    "model": Report(title="r", lines=["line"] * (SPILL_THRESHOLD // 4)),
    "bytes": b"\x01" * (2 * SPILL_THRESHOLD),
    "object": {"nested": [b"\x02" * SPILL_THRESHOLD, 7]},
}


def _same(left: object, right: object) -> bool:
    if isinstance(right, pa.RecordBatch):
        right = pa.Table.from_batches([right])
    return bool(left.equals(right)) if isinstance(left, pa.Table) else left == right


@pytest.mark.parametrize("name", sorted(LARGE))
def test_spilled_outputs_decode_to_what_inline_decoding_gives(files: JournalFileStore, name: str) -> None:
    value = LARGE[name]
    blob = encode_output(value)
    assert len(blob) > SPILL_THRESHOLD
    pointer = spill_output(blob, files, run_id="run-1", label=name)
    assert len(pointer) < 200 and pointer[:1] == b"F"
    described = json.loads(pointer[1:])
    assert described["kind"] == blob[:1].decode() and described["size"] == len(blob)
    assert files.list_files() == [described["path"]]
    expected = ".bin" if blob[:1] == b"P" else ".arrow"
    assert described["path"].startswith(f"journal/run-1/{name}-") and described["path"].endswith(expected)
    decoded = decode_output(pointer, files)
    assert _same(decoded, value)
    assert type(decoded) is type(decode_output(blob))
    with pytest.raises(ValueError, match="no storage was given"):
        decode_output(pointer)


async def test_the_ledger_holds_a_pointer_for_large_outputs_only(
    root: str, files: JournalFileStore, tmp_path: Path,
) -> None:
    ledger = LocalLedgerClient(tmp_path / "ledger.sqlite")
    await ledger.create_run(run_id="r", workflow="wf", code_version="v1", definition=None)
    journal = LedgerJournal(ledger, files)
    token = await journal.acquire_lease("r", "engine", ttl=10.0)
    small = pa.table({"i": [1, 2, 3]})
    await journal.record_step("r", "small", small, 1, token=token)
    await journal.record_step("r", "large", LARGE["table"], 2, token=token)
    await journal.record_step("r", "model", LARGE["model"], 3, token=token)

    rows = {entry.label: entry.output for entry in (await ledger.journal("r")).steps}
    assert rows["small"][:1] == b"A"  # under the threshold: inline, as before
    assert rows["large"][:1] == b"F" and rows["model"][:1] == b"F"
    assert max(len(rows["large"]), len(rows["model"])) < 200
    assert len(files.list_files()) == 2

    state = await LedgerJournal(ledger, JournalFileStore(root)).load("r")  # another process: a store of its own
    assert state.completion_order == ("small", "large", "model")
    assert state.outputs["small"].equals(small)
    assert state.outputs["large"].equals(LARGE["table"])
    assert state.outputs["model"] == LARGE["model"]


async def test_without_storage_every_output_stays_inline(tmp_path: Path) -> None:
    ledger = LocalLedgerClient(tmp_path / "ledger.sqlite")
    await ledger.create_run(run_id="r", workflow="wf", code_version="v1", definition=None)
    journal = LedgerJournal(ledger)
    await journal.record_step("r", "large", LARGE["bytes"], 0, token=await journal.acquire_lease("r", "e", ttl=10.0))
    (entry,) = (await ledger.journal("r")).steps
    assert entry.output[:1] == b"P" and len(entry.output) > SPILL_THRESHOLD
    assert (await LedgerJournal(ledger).load("r")).outputs["large"] == LARGE["bytes"]


async def test_a_missing_spilled_file_names_the_step_and_file(files: JournalFileStore, tmp_path: Path) -> None:
    ledger = LocalLedgerClient(tmp_path / "ledger.sqlite")
    await ledger.create_run(run_id="r", workflow="wf", code_version="v1", definition=None)
    journal = LedgerJournal(ledger, files)
    await journal.record_step("r", "large", LARGE["bytes"], 0, token=await journal.acquire_lease("r", "e", ttl=10.0))
    (path,) = files.list_files()
    files.storage.delete(path)
    with pytest.raises(WorkflowError, match=r"step 'large' is a file .*journal/r/large-.*Restore the file") as caught:
        await LedgerJournal(ledger, files).load("r")
    assert caught.value.step == "large" and caught.value.run_id == "r"
    assert "test-secret" not in str(caught.value)

