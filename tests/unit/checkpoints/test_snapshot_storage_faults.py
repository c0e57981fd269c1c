"""The snapshot store when its storage fails: a full disk, a read-only folder, damaged or missing files.

The full disk and the read-only folder are a real tmpfs (see tests/support/mount_support.py):
the kernel itself answers ENOSPC and EROFS. Damage is done to real files on disk.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pydantic
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mount_support import tmpfs

import rayfleet as rf
from rayfleet.checkpoints._store import SnapshotRow, SnapshotStore
from rayfleet.errors import is_retryable


class Notes(pydantic.BaseModel):
    count: int = 0
    text: str = ""
    items: list[int] = []


def write(store: SnapshotStore, identity: str, version: int, state: Notes) -> str:
    return store.write_batch(group="g", writer="w", rows=[SnapshotRow(identity=identity, version=version, state=state)])


def leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in root.rglob("*") if p.is_file() and p.name != ".filler")


def test_a_read_only_folder_refuses_writes_with_a_retryable_error_and_keeps_serving_reads(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "mnt") as disk:
        store = SnapshotStore(str(disk.path))
        kept = write(store, "a", 1, Notes(count=1, text="before"))
        disk.read_only()
        with pytest.raises(rf.StorageUnavailableError) as caught:
            write(store, "a", 2, Notes(count=2))
        error = caught.value
        assert isinstance(error, rf.StorageError) and is_retryable(error)
        assert error.root == str(disk.path) and "Read-only file system" in error.detail
        assert "writable" in error.message and str(disk.path) in error.message
        # What was committed before stays readable (from a fresh store: no cache).
        state, _ = SnapshotStore(str(disk.path)).read_row(kept, 0, Notes, identity="a", version=1)
        assert state == Notes(count=1, text="before")
        disk.writable()
        again = write(store, "a", 2, Notes(count=2))
        assert SnapshotStore(str(disk.path)).read_row(again, 0, Notes, identity="a", version=2)[0].count == 2


def test_a_full_disk_refuses_writes_leaves_no_partial_file_and_recovers_when_space_is_freed(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "mnt", size=1024 * 1024) as disk:
        store = SnapshotStore(str(disk.path))
        kept = write(store, "a", 1, Notes(count=1))
        before = leftovers(disk.path)
        disk.fill()
        big = Notes(count=2, text="x" * 300_000, items=list(range(1000)))
        with pytest.raises(rf.StorageUnavailableError) as caught:
            write(store, "a", 2, big)
        assert "No space left on device" in caught.value.detail and is_retryable(caught.value)
        # No temp file and no half-written snapshot under a final name.
        assert leftovers(disk.path) == before
        assert SnapshotStore(str(disk.path)).read_row(kept, 0, Notes, identity="a", version=1)[0].count == 1
        disk.free()
        path = write(store, "a", 2, big)
        assert SnapshotStore(str(disk.path)).read_row(path, 0, Notes, identity="a", version=2)[0] == big


def test_a_snapshot_path_that_is_a_folder_is_a_snapshot_error(tmp_path: Path) -> None:
    store = SnapshotStore(str(tmp_path))
    path = write(store, "a", 1, Notes(count=1))
    (tmp_path / path).unlink()
    (tmp_path / path).mkdir()
    with pytest.raises(rf.SnapshotError) as caught:
        SnapshotStore(str(tmp_path)).read_row(path, 0, Notes, identity="a", version=1)
    assert caught.value.identity == "a" and f"{path}#0" in caught.value.message


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("pristine")
    store = SnapshotStore(str(root))
    path = store.write_batch(group="g", writer="w", rows=[
        SnapshotRow(identity="a", version=1, state=Notes(count=7, text="seven", items=[1, 2, 3])),
        SnapshotRow(identity="b", version=4, state=Notes(count=8, text="eight", items=[])),
    ])
    return root, path


def damaged_copy(pristine: tuple[Path, str], tmp: Path, damage: callable) -> tuple[SnapshotStore, str]:  # type: ignore[valid-type]
    root, path = pristine
    if tmp.exists():
        shutil.rmtree(tmp)
    shutil.copytree(root, tmp)
    target = tmp / path
    target.write_bytes(damage(target.read_bytes()))
    return SnapshotStore(str(tmp)), path


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.floats(min_value=0.0, max_value=0.999))
def test_every_truncation_is_a_snapshot_error(pristine: tuple[Path, str], tmp_path: Path, cut: float) -> None:
    store, path = damaged_copy(pristine, tmp_path / "copy", lambda data: data[: int(len(data) * cut)])
    for row, identity, version in ((0, "a", 1), (1, "b", 4)):
        with pytest.raises(rf.SnapshotError) as caught:
            store.read_row(path, row, Notes, identity=identity, version=version)
        assert caught.value.identity == identity and caught.value.detail


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flips=st.lists(st.tuples(st.floats(min_value=0.0, max_value=0.999), st.integers(1, 255)), min_size=1,
                      max_size=4))
def test_corrupt_bytes_give_a_snapshot_error_or_a_valid_state_never_a_crash(
    pristine: tuple[Path, str], tmp_path: Path, flips: list[tuple[float, int]]
) -> None:
    def damage(data: bytes) -> bytes:
        body = bytearray(data)
        for where, mask in flips:
            body[int(len(body) * where)] ^= mask
        return bytes(body)

    store, path = damaged_copy(pristine, tmp_path / "copy", damage)
    for row, identity, version in ((0, "a", 1), (1, "b", 4)):
        try:
            state, _ = store.read_row(path, row, Notes, identity=identity, version=version)
        except rf.SnapshotError as error:
            assert error.identity == identity and error.detail
        else:
            # Arrow IPC has no checksum: a flipped bit in a value's bytes can go unnoticed,
            # but what comes back is always a valid State.
            assert isinstance(state, Notes)


def test_the_fleet_marker_on_a_read_only_folder_is_a_retryable_storage_error(tmp_path: Path) -> None:
    from rayfleet.checkpoints._marker import read_fleet_id, write_fleet_id

    with tmpfs(tmp_path / "mnt") as disk:
        disk.read_only()
        assert read_fleet_id(str(disk.path)) is None  # reading an empty read-only folder is fine
        with pytest.raises(rf.StorageUnavailableError) as caught:
            write_fleet_id(str(disk.path), "fleet-1")
        assert is_retryable(caught.value) and "Read-only file system" in caught.value.detail
        disk.writable()
        write_fleet_id(str(disk.path), "fleet-1")
        assert read_fleet_id(str(disk.path)) == "fleet-1"
