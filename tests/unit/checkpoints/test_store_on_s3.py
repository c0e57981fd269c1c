"""Snapshot and journal files on a real S3-compatible server (moto, on 127.0.0.1), next to local disk."""

from __future__ import annotations

import socket
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pydantic
import pytest

from rayfleet.checkpoints._files import StorageRoot, redact
from rayfleet.checkpoints._journal_files import JournalFileStore
from rayfleet.checkpoints._store import SnapshotRow, SnapshotStore
from rayfleet.errors import InvalidSpecError, SnapshotError


class Tally(pydantic.BaseModel):
    total: int = 0
    notes: list[str] = []


@pytest.fixture(params=["local", "s3"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "local":
        return str(tmp_path / "store")
    storage: str = request.getfixturevalue("s3_storage")
    return storage


def _objects(root: str) -> list[str]:
    """Every file under ``root``, as the filesystem itself lists it (temp files included)."""
    storage = StorageRoot(root, what="test root")
    return sorted(storage.relative(info) for info in storage.fs.get_file_info(
        pafs.FileSelector(storage.root, recursive=True, allow_not_found=True)) if info.type == pafs.FileType.File)


def test_snapshots_round_trip_and_leave_no_temp_files(root: str) -> None:
    store = SnapshotStore(root)
    rows = [SnapshotRow(identity=f"tally/{i}", version=i + 1, state=Tally(total=i, notes=["x"] * i), extra=b"e%d" % i)
            for i in range(3)]
    path = store.write_batch(group="Tally", writer="host-0", rows=rows)
    assert path.startswith("snapshots/Tally/host-0-") and path.endswith(".arrow")
    assert store.list_files() == [path]
    assert _objects(root) == [path]  # nothing else was written: no temp object, no leftovers

    fresh = SnapshotStore(root)  # another host: nothing cached
    for i in range(3):
        state, extra = fresh.read_row(path, i, Tally, identity=f"tally/{i}", version=i + 1)
        assert state == Tally(total=i, notes=["x"] * i) and extra == b"e%d" % i
    with pytest.raises(SnapshotError, match="holds identity 'tally/0' version 1"):
        fresh.read_row(path, 0, Tally, identity="tally/0", version=2)
    with pytest.raises(SnapshotError, match="the file is missing"):
        fresh.read_row(path.replace("host-0", "host-9"), 0, Tally, identity="tally/0", version=1)


def test_garbage_collection_keeps_referenced_young_and_journal_files(root: str) -> None:
    store = SnapshotStore(root)
    kept = store.write_batch(group="Tally", writer="h", rows=[SnapshotRow(identity="a", version=1, state=Tally())])
    dropped = store.write_batch(group="Tally", writer="h", rows=[SnapshotRow(identity="b", version=1, state=Tally())])
    storage = store.storage
    # A temp file another kind of filesystem would leave behind after a crash.
    storage.publish("snapshots/Tally/.tmp-h-crashed.arrow", lambda sink: sink.write(b"partial"))
    journal = JournalFileStore(root).write_bytes(run_id="r", label="big", content=b"x" * 10)

    # Young files survive: the store's clock says they were just written.
    assert store.collect_garbage({kept}, min_age=3600) == []
    assert store.collect_garbage({kept}, min_age=0) == sorted([dropped, "snapshots/Tally/.tmp-h-crashed.arrow"])
    assert store.list_files() == [kept]
    assert _objects(root) == sorted([kept, journal])  # journal/ is never the snapshot GC's business
    assert store.read_row(kept, 0, Tally, identity="a", version=1)[0] == Tally()


def test_a_failed_write_publishes_nothing(root: str) -> None:
    storage = StorageRoot(root, what="test root")

    def half_then_fail(sink: object) -> None:
        sink.write(b"half a file")  # type: ignore[attr-defined]
        raise RuntimeError("the encoder broke")

    with pytest.raises(RuntimeError, match="the encoder broke"):
        storage.publish("snapshots/g/broken.arrow", half_then_fail)
    assert _objects(root) == []
    storage.publish("snapshots/g/whole.bin", lambda sink: sink.write(b"whole"))
    assert storage.read_bytes("snapshots/g/whole.bin") == b"whole"


def test_journal_files_round_trip(root: str) -> None:
    files = JournalFileStore(root)
    table = pa.table({"n": list(range(1000)), "s": ["v"] * 1000}).replace_schema_metadata({b"mine": b"1"})
    path = files.write_table(run_id="run/1", label="load", table=table, metadata={b"extra": b"2"})
    assert path.startswith("journal/run_1/load-") and path.endswith(".arrow")
    back = files.read_table(path)
    assert back.schema.metadata == {b"mine": b"1", b"extra": b"2"}
    assert back.replace_schema_metadata(None).equals(table.replace_schema_metadata(None))
    blob = files.write_bytes(run_id="run/1", label="load", content=b"\x00pickle")
    assert blob.endswith(".bin") and blob != path
    assert files.read_bytes(blob) == b"\x00pickle"
    assert files.list_files() == sorted([path, blob])
    with pytest.raises(FileNotFoundError):
        files.read_bytes(blob.replace(".bin", "-gone.bin"))


def test_a_missing_bucket_is_refused_with_the_bucket_named_and_secrets_hidden(s3_storage: str) -> None:
    elsewhere = s3_storage.replace("@rayfleet-tests/", "@no-such-bucket/")
    storage = StorageRoot(elsewhere, what="snapshot root")
    with pytest.raises(InvalidSpecError, match="the bucket 'no-such-bucket' does not exist. Create it first") as caught:
        storage.check()
    assert "test-secret" not in str(caught.value) and "***@no-such-bucket" in str(caught.value)
    StorageRoot(s3_storage, what="snapshot root").check()  # the real bucket passes


def test_a_uri_pyarrow_refuses_is_a_clear_error_without_the_secret() -> None:
    with pytest.raises(InvalidSpecError, match="is not a usable URI") as caught:
        SnapshotStore("s3://key:hush@bucket/p?no_such_option=1")
    assert "hush" not in str(caught.value)
    assert caught.value.field == "root"
    assert redact("s3://key:hush@bucket/p") == "s3://***@bucket/p"
    assert redact("/plain/folder") == "/plain/folder"


def test_an_unreachable_endpoint_is_refused_with_what_to_check() -> None:
    with socket.socket() as probe:  # a port nothing listens on: bound, never listening
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        storage = StorageRoot(f"s3://k:hush@bucket/p?endpoint_override=127.0.0.1:{port}&scheme=http&region=us-east-1",
                              what="snapshot root")
        with pytest.raises(InvalidSpecError, match="cannot be reached: .*Check the endpoint") as caught:
            storage.check()
    assert "hush" not in str(caught.value)
