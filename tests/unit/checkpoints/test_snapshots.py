"""Tests for State <-> Arrow mapping and the immutable snapshot file store."""

from __future__ import annotations

import datetime as dt
import enum
import os
import time
from typing import Any

import pyarrow as pa
import pydantic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rayfleet.checkpoints._codec import StateCodec
from rayfleet.checkpoints._store import SnapshotRow, SnapshotStore
from rayfleet.errors import InvalidSpecError, SnapshotError


class Color(str, enum.Enum):
    RED = "red"
    BLUE = "blue"


class Point(pydantic.BaseModel):
    x: int
    y: float = 0.0
    label: str | None = None


class Blob:
    """An arbitrary class Arrow cannot hold."""

    def __init__(self, payload: list[int]) -> None:
        self.payload = payload

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Blob) and other.payload == self.payload


class Strict(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(validate_assignment=True, extra="forbid", arbitrary_types_allowed=True)


class Rich(Strict):
    count: int = 0
    ratio: float = 0.5
    name: str = ""
    flag: bool = False
    raw: bytes = b""
    when: dt.datetime = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
    day: dt.date = dt.date(2024, 1, 1)
    color: Color = Color.RED
    origin: Point = Point(x=0)
    path: list[Point] = []
    counts: dict[str, int] = {}
    pair: tuple[int, ...] = ()
    maybe: int | None = None
    maybe_set: int | None = 5
    nested_lists: list[list[str]] = []
    points_by_name: dict[str, Point] = {}
    anything: Any = None
    tags: set[int] = set()


class Small(Strict):
    count: int = 0
    name: str = ""


class Incompatible(Strict):
    count: list[str] = []
    other: int


def rich_state() -> Rich:
    return Rich(
        count=42,
        ratio=-1.25,
        name="héllo ✓",
        flag=True,
        raw=b"\x00\xff",
        when=dt.datetime(2023, 5, 6, 7, 8, 9, 123456, tzinfo=dt.timezone.utc),
        day=dt.date(1999, 12, 31),
        color=Color.BLUE,
        origin=Point(x=1, y=2.5, label="o"),
        path=[Point(x=2), Point(x=3, label=None)],
        counts={"a": 1, "b": -2},
        pair=(1, 2, 3),
        maybe=None,
        maybe_set=7,
        nested_lists=[["a"], [], ["b", "c"]],
        points_by_name={"p": Point(x=9, y=0.1)},
        anything=Blob([1, 2]),
        tags={3, 1, 2},
    )


def write_one(store: SnapshotStore, state: pydantic.BaseModel, *, identity: str = "a", version: int = 1) -> str:
    return store.write_batch(
        group="g", writer="w", rows=[SnapshotRow(identity=identity, version=version, state=state, extra=b"meta")]
    )


def test_rich_state_round_trips_exactly(tmp_path):
    store = SnapshotStore(str(tmp_path))
    original = rich_state()
    path = write_one(store, original)
    restored, extra = SnapshotStore(str(tmp_path)).read_row(path, 0, Rich, identity="a", version=1)
    assert restored == original
    assert extra == b"meta"
    assert type(restored.pair) is tuple and type(restored.tags) is set
    assert restored.color is Color.BLUE
    assert isinstance(restored.anything, Blob)
    assert restored.when.tzinfo is dt.timezone.utc


def test_schema_types_follow_the_mapping():
    codec = StateCodec.for_class(Rich)
    schema = codec.schema
    assert schema.field("count").type == pa.int64()
    assert schema.field("ratio").type == pa.float64()
    assert schema.field("name").type == pa.string()
    assert schema.field("flag").type == pa.bool_()
    assert schema.field("raw").type == pa.binary()
    assert schema.field("when").type == pa.timestamp("us", tz="UTC")
    assert schema.field("day").type == pa.date32()
    assert schema.field("color").type == pa.string()
    assert pa.types.is_struct(schema.field("origin").type)
    assert schema.field("origin").type.field("x").type == pa.int64()
    assert schema.field("path").type == pa.list_(schema.field("origin").type)
    assert schema.field("counts").type == pa.map_(pa.string(), pa.int64())
    assert schema.field("pair").type == pa.list_(pa.int64())
    assert schema.field("maybe").type == pa.int64()
    assert schema.field("anything").type == pa.binary()
    assert schema.field("tags").type == pa.binary()
    assert codec.pickled_fields == frozenset({"anything", "tags"})
    assert StateCodec.for_class(Rich) is codec


def test_file_layout_and_metadata(tmp_path):
    store = SnapshotStore(str(tmp_path))
    path = write_one(store, rich_state())
    assert path.startswith("snapshots/g/w-") and path.endswith(".arrow")
    table = pa.ipc.open_file(str(tmp_path / path)).read_all()
    assert table.column_names[:3] == ["__identity", "__version", "__extra"]
    metadata = table.schema.metadata
    assert metadata[b"rayfleet.state_class"] == f"{Rich.__module__}:Rich".encode()
    assert b"anything" in metadata[b"rayfleet.pickled"] and b"tags" in metadata[b"rayfleet.pickled"]
    assert store.list_files() == [path]


def test_unrepresentable_values_fall_back_to_pickle_for_the_batch(tmp_path):
    store = SnapshotStore(str(tmp_path))
    naive = Rich(count=2**70, when=dt.datetime(2020, 1, 1, 12, 0))
    path = write_one(store, naive)
    restored, _ = store.read_row(path, 0, Rich, identity="a", version=1)
    assert restored == naive
    assert restored.when.tzinfo is None


def test_many_rows_in_one_batch(tmp_path):
    store = SnapshotStore(str(tmp_path))
    states = [Small(count=i, name=f"n{i}") for i in range(50)]
    rows = [SnapshotRow(identity=f"id-{i}", version=i + 10, state=s, extra=bytes([i])) for i, s in enumerate(states)]
    path = store.write_batch(group="g", writer="w", rows=rows)
    for i, state in enumerate(states):
        assert store.read_row(path, i, Small, identity=f"id-{i}", version=i + 10) == (state, bytes([i]))


def test_mixed_state_classes_and_empty_batches_are_refused(tmp_path):
    store = SnapshotStore(str(tmp_path))
    rows = [SnapshotRow(identity="a", version=1, state=Small()), SnapshotRow(identity="b", version=1, state=Rich())]
    with pytest.raises(ValueError):
        store.write_batch(group="g", writer="w", rows=rows)
    with pytest.raises(InvalidSpecError):
        store.write_batch(group="g", writer="w", rows=[])


def test_identity_and_version_mismatch(tmp_path):
    store = SnapshotStore(str(tmp_path))
    path = write_one(store, Small(count=1), identity="alice", version=3)
    with pytest.raises(SnapshotError) as caught:
        store.read_row(path, 0, Small, identity="bob", version=3)
    assert "'alice'" in caught.value.detail and caught.value.location == f"{path}#0"
    with pytest.raises(SnapshotError) as caught:
        store.read_row(path, 0, Small, identity="alice", version=4)
    assert "version 3" in caught.value.detail
    with pytest.raises(SnapshotError, match="out of range"):
        store.read_row(path, 1, Small, identity="alice", version=3)


def test_missing_file(tmp_path):
    store = SnapshotStore(str(tmp_path))
    with pytest.raises(SnapshotError) as caught:
        store.read_row("snapshots/g/nope.arrow", 0, Small, identity="a", version=1)
    assert caught.value.identity == "a"
    assert "missing" in caught.value.detail
    assert "snapshots/g/nope.arrow#0" in str(caught.value)


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty"])
def test_corrupt_files(tmp_path, damage):
    store = SnapshotStore(str(tmp_path))
    path = write_one(store, rich_state())
    full = tmp_path / path
    if damage == "truncate":
        full.write_bytes(full.read_bytes()[: full.stat().st_size // 2])
    elif damage == "garbage":
        full.write_bytes(os.urandom(4096))
    else:
        full.write_bytes(b"")
    with pytest.raises(SnapshotError) as caught:
        SnapshotStore(str(tmp_path)).read_row(path, 0, Rich, identity="a", version=1)
    assert f"{path}#0" in str(caught.value)


def test_columns_that_do_not_fit_the_state_class(tmp_path):
    store = SnapshotStore(str(tmp_path))
    path = write_one(store, Small(count=3, name="x"))
    with pytest.raises(SnapshotError) as caught:
        store.read_row(path, 0, Incompatible, identity="a", version=1)
    assert "do not fit" in caught.value.detail
    assert not isinstance(caught.value.__cause__, pydantic.ValidationError)


def test_garbage_collection_keeps_referenced_and_young_files(tmp_path):
    store = SnapshotStore(str(tmp_path))
    referenced = write_one(store, Small(count=1))
    stale = write_one(store, Small(count=2))
    young = write_one(store, Small(count=3))
    temp = tmp_path / "snapshots" / "g" / ".tmp-w-leftover.arrow"
    temp.write_bytes(b"partial")
    old = time.time() - 3600
    for name in (referenced, stale):
        os.utime(tmp_path / name, (old, old))
    os.utime(temp, (old, old))
    deleted = store.collect_garbage({referenced}, min_age=60.0)
    assert sorted(deleted) == sorted([stale, "snapshots/g/.tmp-w-leftover.arrow"])
    assert sorted(store.list_files()) == sorted([referenced, young])
    assert store.read_row(referenced, 0, Small, identity="a", version=1)[0] == Small(count=1)


def test_delete_ignores_missing_files(tmp_path):
    store = SnapshotStore(str(tmp_path))
    path = write_one(store, Small())
    store.delete([path, "snapshots/g/never.arrow"])
    assert store.list_files() == []
    with pytest.raises(SnapshotError, match="missing"):
        store.read_row(path, 0, Small, identity="a", version=1)


def test_odd_group_and_writer_names_are_sanitized(tmp_path):
    store = SnapshotStore(str(tmp_path / "new" / "root"))
    path = store.write_batch(
        group="../team a/é", writer="host:1/../x", rows=[SnapshotRow(identity="a", version=1, state=Small())]
    )
    folder, name = path.split("/")[1:]
    assert path.startswith("snapshots/") and path.count("/") == 2
    assert folder == ".._team_a__" and name.startswith("host_1_.._x-")
    dots = store.write_batch(group="..", writer=".", rows=[SnapshotRow(identity="a", version=1, state=Small())])
    assert ".." not in dots.split("/")
    assert (tmp_path / "new" / "root" / path).is_file()


def test_two_stores_with_the_same_writer_never_collide(tmp_path):
    first, second = SnapshotStore(str(tmp_path)), SnapshotStore(f"file://{tmp_path}")
    paths = {write_one(store, Small(count=i)) for i, store in enumerate([first, second, first, second])}
    assert len(paths) == 4
    assert len(first.list_files()) == 4


states = st.builds(
    lambda count, name, ratio, items, labels, maybe: Property(
        count=count, name=name, ratio=ratio, items=items, labels=labels, maybe=maybe
    ),
    st.integers(),
    st.text(),
    st.floats(allow_nan=False),
    st.lists(st.integers(min_value=-(2**63), max_value=2**63 - 1)),
    st.dictionaries(st.text(), st.text()),
    st.none() | st.integers(min_value=-(2**63), max_value=2**63 - 1),
)


class Property(Strict):
    count: int
    name: str
    ratio: float
    items: list[int]
    labels: dict[str, str]
    maybe: int | None


@settings(max_examples=75, deadline=None)
@given(batch=st.lists(states, min_size=1, max_size=5))
def test_round_trip_property(tmp_path_factory, batch):
    store = SnapshotStore(str(tmp_path_factory.mktemp("prop")))
    rows = [SnapshotRow(identity=f"i{i}", version=i, state=s) for i, s in enumerate(batch)]
    path = store.write_batch(group="p", writer="w", rows=rows)
    for i, state in enumerate(batch):
        assert store.read_row(path, i, Property, identity=f"i{i}", version=i) == (state, b"")
