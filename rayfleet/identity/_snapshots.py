"""Checkpoint storage: State classes mapped to Arrow columns, kept in immutable Arrow IPC files."""

from __future__ import annotations

import contextlib
import datetime as dt
import enum
import json
import os
import re
import secrets
import threading
import time
import types
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Union, get_args, get_origin

import cloudpickle
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.ipc as ipc
import pydantic

from ..errors import InvalidSpecError, SnapshotError

__all__ = ["SnapshotRow", "SnapshotStore", "StateCodec"]

_IDENTITY, _VERSION, _EXTRA = "__identity", "__version", "__extra"
_META_CLASS, _META_PICKLED = b"rayfleet.state_class", b"rayfleet.pickled"
_SNAPSHOTS = "snapshots"
_TEMP_PREFIX = ".tmp-"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
_SCALARS: dict[type, pa.DataType] = {
    bool: pa.bool_(), int: pa.int64(), float: pa.float64(), str: pa.string(), bytes: pa.binary(), dt.date: pa.date32(),
}


class _Unencodable(Exception):
    """A value Arrow cannot hold exactly; the codec pickles its field for this batch instead."""


@dataclass(frozen=True, slots=True)
class _Mapping:
    """How one annotation travels: its Arrow type, value -> Arrow-ready value, and ``as_py`` value -> value."""

    arrow_type: pa.DataType
    encode: Callable[[Any], Any]
    decode: Callable[[Any], Any]


def _exact(kind: type) -> Callable[[Any], Any]:
    # Exact type checks (not isinstance) keep subclasses such as bool-in-int or
    # datetime-in-date from silently coming back as their base type.
    def encode(value: Any) -> Any:
        if type(value) is not kind:
            raise _Unencodable
        return value

    return encode


def _encode_utc(value: Any) -> Any:
    # Only datetime.timezone.utc round-trips exactly; naive or other zones are pickled.
    if type(value) is not dt.datetime or value.tzinfo is not dt.timezone.utc:
        raise _Unencodable
    return value


def _decode_utc(value: Any) -> Any:
    return value.replace(tzinfo=dt.timezone.utc) if isinstance(value, dt.datetime) else value


def _compile(annotation: Any, seen: frozenset[type]) -> _Mapping | None:
    """The mapping for ``annotation``, or None when any part of it cannot live in Arrow."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        return _compile(args[0], seen)
    if origin is Union or origin is types.UnionType:
        present = [arg for arg in args if arg is not type(None)]
        inner = _compile(present[0], seen) if len(present) == 1 < len(args) else None
        if inner is None:
            return None
        enc, dec = inner.encode, inner.decode
        return _Mapping(
            inner.arrow_type, lambda v: None if v is None else enc(v), lambda v: None if v is None else dec(v)
        )
    if origin is list or (origin is tuple and len(args) == 2 and args[1] is Ellipsis):
        return _compile_sequence(origin, args[0], seen)
    if origin is dict and len(args) == 2 and args[0] is str:
        return _compile_dict(args[1], seen)
    if origin is not None or not isinstance(annotation, type):
        return None
    if annotation is dt.datetime:
        return _Mapping(pa.timestamp("us", tz="UTC"), _encode_utc, _decode_utc)
    if annotation in _SCALARS:
        return _Mapping(_SCALARS[annotation], _exact(annotation), lambda v: v)
    if issubclass(annotation, enum.Enum) and issubclass(annotation, str):
        return _compile_enum(annotation)
    if issubclass(annotation, pydantic.BaseModel) and annotation not in seen:
        return _compile_model(annotation, seen | {annotation})
    return None


def _compile_sequence(container: type, item_type: Any, seen: frozenset[type]) -> _Mapping | None:
    item = _compile(item_type, seen)
    if item is None:
        return None
    enc, dec = item.encode, item.decode

    def encode(value: Any) -> Any:
        if type(value) is not container:
            raise _Unencodable
        return [enc(element) for element in value]

    def decode(value: Any) -> Any:
        return container(dec(element) for element in value) if isinstance(value, list) else value

    return _Mapping(pa.list_(item.arrow_type), encode, decode)


def _compile_dict(value_type: Any, seen: frozenset[type]) -> _Mapping | None:
    item = _compile(value_type, seen)
    if item is None:
        return None
    enc, dec = item.encode, item.decode

    def encode(value: Any) -> Any:
        if type(value) is not dict or any(type(key) is not str for key in value):
            raise _Unencodable
        return [(key, enc(element)) for key, element in value.items()]

    def decode(value: Any) -> Any:
        return {key: dec(element) for key, element in value.items()} if isinstance(value, dict) else value

    return _Mapping(pa.map_(pa.string(), item.arrow_type), encode, decode)


def _compile_enum(enum_class: type[enum.Enum]) -> _Mapping:
    def encode(value: Any) -> Any:
        if type(value) is not enum_class or type(value.value) is not str:
            raise _Unencodable
        return value.value

    return _Mapping(pa.string(), encode, lambda v: enum_class(v) if isinstance(v, str) else v)


def _compile_model(model: type[pydantic.BaseModel], seen: frozenset[type]) -> _Mapping | None:
    # Private attributes and extra fields have no column, so such models are pickled whole.
    if not model.model_fields or model.__private_attributes__:
        return None
    fields = {name: _compile(info.annotation, seen) for name, info in model.model_fields.items()}
    if any(mapping is None for mapping in fields.values()):
        return None
    mappings: dict[str, _Mapping] = {name: mapping for name, mapping in fields.items() if mapping is not None}

    def encode(value: Any) -> Any:
        if type(value) is not model or value.__pydantic_extra__:
            raise _Unencodable
        return {name: mapping.encode(getattr(value, name)) for name, mapping in mappings.items()}

    def decode(value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        data = {name: mappings[name].decode(item) if name in mappings else item for name, item in value.items()}
        return model.model_validate(data, by_name=True)

    return _Mapping(pa.struct([pa.field(name, m.arrow_type) for name, m in mappings.items()]), encode, decode)


class StateCodec:
    """Maps one pydantic State class to Arrow columns and back.

    Each top-level field whose annotation maps fully to Arrow gets a typed column;
    any other field is a ``binary`` column of ``cloudpickle.dumps(value)``. When a
    batch holds a value a typed column cannot keep exactly (an int beyond int64, a
    naive or non-``timezone.utc`` datetime, a subclass instance), that field is
    pickled for that batch only; the file's metadata records which fields were.

    Guarantee: ``from_row`` of an encoded state returns a State equal (``==``) to
    it, except for pydantic private attributes of the State itself, which are not
    stored and come back as their defaults. Pickled values are unpickled on read,
    so only read snapshots you trust.
    """

    _cache: ClassVar[weakref.WeakKeyDictionary[type, StateCodec]] = weakref.WeakKeyDictionary()
    _cache_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, state_class: type[pydantic.BaseModel]) -> None:
        """Build the mapping of ``state_class``; prefer :meth:`for_class`, which shares codecs.

        Raises:
            InvalidSpecError: if ``state_class`` is not a pydantic model class.
        """
        if not (isinstance(state_class, type) and issubclass(state_class, pydantic.BaseModel)):
            raise InvalidSpecError(f"a State must be a pydantic model class, got {state_class!r}", subject="state")
        self.state_class = state_class
        self.class_path = f"{state_class.__module__}:{state_class.__qualname__}"
        self._mappings: dict[str, _Mapping] = {}
        pickled: set[str] = set()
        fields: list[pa.Field] = []
        for name, info in state_class.model_fields.items():
            mapping = _compile(info.annotation, frozenset({state_class}))
            if mapping is None:
                pickled.add(name)
                fields.append(pa.field(name, pa.binary()))
            else:
                self._mappings[name] = mapping
                fields.append(pa.field(name, mapping.arrow_type))
        self.schema: pa.Schema = pa.schema(fields)
        self.pickled_fields: frozenset[str] = frozenset(pickled)

    @classmethod
    def for_class(cls, state_class: type[pydantic.BaseModel]) -> StateCodec:
        """The shared codec of ``state_class`` (built once; classes are weakly held)."""
        with cls._cache_lock:
            codec = cls._cache.get(state_class)
            if codec is None:
                codec = cls._cache[state_class] = cls(state_class)
            return codec

    def to_columns(self, states: list[pydantic.BaseModel]) -> tuple[dict[str, pa.Array], frozenset[str]]:
        """Encode ``states`` column-wise; returns the columns and the fields pickled in this batch.

        Raises:
            InvalidSpecError: if a state is not an instance of this codec's class.
        """
        if any(type(state) is not self.state_class for state in states):
            raise InvalidSpecError(f"every state must be a {self.class_path} instance", subject="state")
        columns: dict[str, pa.Array] = {}
        pickled = set(self.pickled_fields)
        for name in self.schema.names:
            values = [getattr(state, name) for state in states]
            mapping = self._mappings.get(name)
            if mapping is not None:
                try:
                    columns[name] = pa.array([mapping.encode(v) for v in values], type=mapping.arrow_type)
                    continue
                except (_Unencodable, pa.ArrowException, OverflowError, ValueError, TypeError):
                    pickled.add(name)
            columns[name] = pa.array([cloudpickle.dumps(v) for v in values], type=pa.binary())
        return columns, frozenset(pickled)

    def from_row(
        self, table: pa.Table, row_index: int, *, identity: str = "", location: str = ""
    ) -> pydantic.BaseModel:
        """Rebuild the State in row ``row_index`` via ``model_validate``.

        Columns missing from the table fall back to the field's default; columns
        the State does not declare are refused (the State forbids extras).

        Raises:
            SnapshotError: if the columns cannot be decoded or fail validation;
                ``identity`` and ``location`` name the snapshot in the error.
        """
        metadata = table.schema.metadata or {}
        try:
            pickled = set(json.loads(metadata.get(_META_PICKLED, b"[]")))
            data: dict[str, Any] = {}
            for name in table.column_names:
                if name.startswith("__"):
                    continue
                scalar = table.column(name)[row_index]
                if name in pickled:
                    data[name] = cloudpickle.loads(scalar.as_py())
                    continue
                value = scalar.as_py(maps_as_pydicts="strict")
                mapping = self._mappings.get(name)
                data[name] = mapping.decode(value) if mapping is not None else value
            return self.state_class.model_validate(data, by_name=True)
        except pydantic.ValidationError as error:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '<root>'}: {e['msg']}" for e in error.errors())
            detail = f"stored columns do not fit {self.class_path} ({problems})"
        except Exception as error:  # noqa: BLE001 - unpickling can raise anything; report it as corruption
            detail = f"cannot decode columns as {self.class_path} ({type(error).__name__}: {error})"
        raise SnapshotError(identity=identity, location=location, detail=detail)


@dataclass(frozen=True, slots=True, kw_only=True)
class SnapshotRow:
    """One identity's State at one checkpoint version, plus opaque runtime metadata."""

    identity: str
    version: int
    state: pydantic.BaseModel
    extra: bytes = b""


def _safe_name(name: str) -> str:
    safe = _UNSAFE.sub("_", name)
    # "." and ".." are made of allowed characters but would walk the folder tree.
    return safe if safe.strip(".") else "_" * max(len(safe), 1)


class SnapshotStore:
    """Immutable Arrow IPC snapshot files under ``<root>/snapshots/`` on a ``pyarrow.fs`` filesystem.

    A file is never changed after it is moved into place, so opened files are
    cached (LRU, keyed by path). Safe to share between threads.
    """

    cache_size: ClassVar[int] = 16

    def __init__(self, root: str) -> None:
        """``root`` is a local folder (created if missing) or a URI ``FileSystem.from_uri`` accepts.

        Raises:
            InvalidSpecError: if the URI is not understood by pyarrow.
        """
        if "://" in root:
            try:
                self._fs, path = pafs.FileSystem.from_uri(root)
            except (pa.ArrowException, ValueError) as error:
                raise InvalidSpecError(f"snapshot root {root!r} is not a usable URI: {error}", subject="root") from None
        else:
            self._fs, path = pafs.LocalFileSystem(), os.path.abspath(root)
        self._root = path.rstrip("/") or "/"
        self._local = isinstance(self._fs, pafs.LocalFileSystem)
        if self._local:
            os.makedirs(self._root, exist_ok=True)
        self._token = secrets.token_hex(6)
        self._counter = 0
        self._lock = threading.Lock()
        self._tables: OrderedDict[str, pa.Table] = OrderedDict()

    def _full(self, relative: str) -> str:
        parts = relative.split("/")
        if relative.startswith("/") or ".." in parts or "" in parts:
            raise InvalidSpecError(f"snapshot path {relative!r} must be relative to the store root", subject="path")
        return f"{self._root.rstrip('/')}/{relative}"

    def write_batch(self, *, group: str, writer: str, rows: list[SnapshotRow]) -> str:
        """Write ``rows`` as one new immutable file; returns its path relative to the root.

        Row ``i`` of the file is ``rows[i]``. The file appears under its final name
        only once complete (and, on local disks, fsynced), so a path returned here
        can be committed safely.

        Raises:
            InvalidSpecError (a ValueError): if ``rows`` is empty, mixes State
                classes, or holds a version outside int64 or non-bytes ``extra``.
            OSError: if the filesystem refuses the write.
        """
        if not rows:
            raise InvalidSpecError("write_batch needs at least one row", subject="rows")
        state_class = type(rows[0].state)
        if any(type(row.state) is not state_class for row in rows):
            raise InvalidSpecError("all rows of one batch must share one State class", subject="rows")
        for row in rows:
            if type(row.version) is not int or not -(2**63) <= row.version < 2**63 or type(row.extra) is not bytes:
                detail = f"row {row.identity!r}: version must be an int64 int and extra bytes"
                raise InvalidSpecError(detail, subject="rows")
        codec = StateCodec.for_class(state_class)
        columns, pickled = codec.to_columns([row.state for row in rows])
        head = {
            _IDENTITY: pa.array([row.identity for row in rows], type=pa.string()),
            _VERSION: pa.array([row.version for row in rows], type=pa.int64()),
            _EXTRA: pa.array([row.extra for row in rows], type=pa.binary()),
        }
        metadata = {_META_CLASS: codec.class_path.encode(), _META_PICKLED: json.dumps(sorted(pickled)).encode()}
        batch = pa.RecordBatch.from_pydict(head | columns).replace_schema_metadata(metadata)
        with self._lock:
            self._counter += 1
            name = f"{_safe_name(writer)}-{self._token}-{self._counter:08d}.arrow"
        folder = f"{_SNAPSHOTS}/{_safe_name(group)}"
        relative, temporary = f"{folder}/{name}", f"{folder}/{_TEMP_PREFIX}{name}"
        self._publish(batch, self._full(temporary), self._full(relative))
        return relative

    def _publish(self, batch: pa.RecordBatch, temporary: str, final: str) -> None:
        if not self._local:
            self._fs.create_dir(final.rsplit("/", 1)[0], recursive=True)
            with self._fs.open_output_stream(temporary) as sink, ipc.new_file(sink, batch.schema) as out:
                out.write_batch(batch)
            self._fs.move(temporary, final)
            return
        folder = os.path.dirname(final)
        os.makedirs(folder, exist_ok=True)
        try:
            with open(temporary, "wb") as sink:
                with ipc.new_file(sink, batch.schema) as out:
                    out.write_batch(batch)
                sink.flush()
                os.fsync(sink.fileno())
            os.replace(temporary, final)
        except BaseException:
            with contextlib.suppress(OSError):
                os.remove(temporary)
            raise
        # The rename itself must reach the disk before anyone commits the path.
        directory = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)

    def read_row(
        self, path: str, row: int, state_class: type[pydantic.BaseModel], *, identity: str, version: int
    ) -> tuple[pydantic.BaseModel, bytes]:
        """Return ``(state, extra)`` stored in row ``row`` of ``path``.

        Raises:
            SnapshotError: if the file is missing, not a valid Arrow IPC file, lacks
                the row, holds another identity or version there, or its columns do
                not fit ``state_class``. ``location`` is ``"<path>#<row>"``.
        """
        location = f"{path}#{row}"
        table = self._open(path, identity=identity, location=location)

        def fail(detail: str) -> SnapshotError:
            return SnapshotError(identity=identity, location=location, detail=detail)

        if not 0 <= row < table.num_rows:
            raise fail(f"row {row} is out of range (the file has {table.num_rows} rows)")
        found_identity = table.column(_IDENTITY)[row].as_py()
        found_version = table.column(_VERSION)[row].as_py()
        if found_identity != identity or found_version != version:
            raise fail(
                f"the row holds identity {found_identity!r} version {found_version}, "
                f"expected {identity!r} version {version}"
            )
        state = StateCodec.for_class(state_class).from_row(table, row, identity=identity, location=location)
        return state, table.column(_EXTRA)[row].as_py()

    def _open(self, path: str, *, identity: str, location: str) -> pa.Table:
        with self._lock:
            if path in self._tables:
                self._tables.move_to_end(path)
                return self._tables[path]
        full = self._full(path)
        try:
            if self._local:
                table = ipc.open_file(pa.memory_map(full)).read_all()
            else:
                with self._fs.open_input_file(full) as source:
                    table = ipc.open_file(source).read_all()
            # Full validation turns a corrupt body into an error here, not a crash later.
            table.validate(full=True)
        except FileNotFoundError:
            raise SnapshotError(identity=identity, location=location, detail="the file is missing") from None
        except (pa.ArrowInvalid, ValueError) as error:
            raise SnapshotError(
                identity=identity, location=location, detail=f"not a valid Arrow IPC file ({error})"
            ) from None
        except (pa.ArrowException, OSError) as error:
            raise SnapshotError(
                identity=identity, location=location, detail=f"the file could not be read ({error})"
            ) from None
        missing = ", ".join(sorted({_IDENTITY, _VERSION, _EXTRA} - set(table.column_names)))
        if missing:
            raise SnapshotError(identity=identity, location=location, detail=f"not a rayfleet snapshot (no {missing})")
        with self._lock:
            self._tables[path] = table
            while len(self._tables) > self.cache_size:
                self._tables.popitem(last=False)
        return table

    def delete(self, paths: Iterable[str]) -> None:
        """Remove the files at ``paths`` (relative to the root); missing files are ignored."""
        for path in paths:
            full = self._full(path)
            with self._lock:
                self._tables.pop(path, None)
            with contextlib.suppress(FileNotFoundError):
                self._fs.delete_file(full)

    def _listing(self) -> list[pafs.FileInfo]:
        selector = pafs.FileSelector(self._full(_SNAPSHOTS), recursive=True, allow_not_found=True)
        return [info for info in self._fs.get_file_info(selector) if info.type == pafs.FileType.File]

    def _relative(self, info: pafs.FileInfo) -> str:
        return info.path[len(self._root.rstrip("/")) + 1 :]

    def list_files(self) -> list[str]:
        """Relative paths of every published ``.arrow`` file under ``snapshots/``, sorted."""
        return sorted(
            self._relative(info)
            for info in self._listing()
            if info.base_name.endswith(".arrow") and not info.base_name.startswith(_TEMP_PREFIX)
        )

    def collect_garbage(self, referenced: set[str], *, min_age: float = 60.0) -> list[str]:
        """Delete unreferenced snapshot files and leftover temp files older than ``min_age`` seconds.

        Young files survive because they may be written but not yet committed; files
        whose age is unknown are kept. On remote stores, ``min_age`` must exceed the
        clock skew between this host and the store. Returns the deleted relative paths.
        """
        cutoff = time.time_ns() - int(min_age * 1e9)
        doomed = []
        for info in self._listing():
            relative = self._relative(info)
            is_temp = info.base_name.startswith(_TEMP_PREFIX)
            if not is_temp and (not info.base_name.endswith(".arrow") or relative in referenced):
                continue
            if info.mtime_ns is not None and info.mtime_ns < cutoff:
                doomed.append(relative)
        self.delete(doomed)
        return sorted(doomed)
