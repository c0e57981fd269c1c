"""The snapshot store: immutable Arrow IPC files on a ``pyarrow.fs`` filesystem."""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import ClassVar

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.ipc as ipc
import pydantic

from ..errors import InvalidSpecError, SnapshotError, StorageUnavailableError
from ._codec import (
    EXTRA_COLUMN,
    IDENTITY_COLUMN,
    META_CLASS,
    META_PICKLED,
    VERSION_COLUMN,
    StateCodec,
)
from ._files import TEMP_PREFIX, StorageRoot, redact, safe_name

_SNAPSHOTS = "snapshots"


@dataclass(frozen=True, slots=True, kw_only=True)
class SnapshotRow:
    """One identity's State at one checkpoint version, plus opaque runtime metadata."""

    identity: str
    version: int
    state: pydantic.BaseModel
    extra: bytes = b""


def _state_part(schema: pa.Schema) -> tuple[pa.Schema, frozenset[str]]:
    metadata = schema.metadata or {}
    pickled = frozenset(json.loads(metadata.get(META_PICKLED, b"[]")))
    state = pa.schema([field for field in schema if field.name not in (IDENTITY_COLUMN, VERSION_COLUMN, EXTRA_COLUMN)],
                      metadata=metadata)
    return state, pickled


class SnapshotStore:
    """Immutable Arrow IPC snapshot files under ``<root>/snapshots/`` on a ``pyarrow.fs`` filesystem.

    A file is never changed after it is published, so opened files are cached (LRU,
    keyed by path). Safe to share between threads.
    """

    cache_size: ClassVar[int] = 16

    def __init__(self, root: str) -> None:
        """``root`` is a local folder (created if missing) or a URI ``FileSystem.from_uri`` accepts.

        Raises:
            InvalidSpecError: if the URI is not understood by pyarrow.
        """
        self._storage = StorageRoot(root, what="snapshot root")
        self._token = secrets.token_hex(6)
        self._counter = 0
        self._lock = threading.Lock()
        self._tables: OrderedDict[str, pa.Table] = OrderedDict()

    @property
    def storage(self) -> StorageRoot:
        """The storage root the files live on."""
        return self._storage

    def encode(self, rows: list[SnapshotRow]) -> pa.RecordBatch:
        """``rows`` as one record batch (row ``i`` is ``rows[i]``), as :meth:`write_batch` stores it.

        Raises:
            InvalidSpecError (a ValueError): if ``rows`` is empty, mixes State
                classes, or holds a version outside int64 or non-bytes ``extra``.
        """
        if not rows:
            raise InvalidSpecError("a snapshot batch needs at least one row", field="rows")
        state_class = type(rows[0].state)
        if any(type(row.state) is not state_class for row in rows):
            raise InvalidSpecError("all rows of one batch must share one State class", field="rows")
        for row in rows:
            if type(row.version) is not int or not -(2**63) <= row.version < 2**63 or type(row.extra) is not bytes:
                detail = f"row {row.identity!r}: version must be an int64 int and extra bytes"
                raise InvalidSpecError(detail, field="rows")
        codec = StateCodec.for_class(state_class)
        columns, pickled = codec.to_columns([row.state for row in rows])
        head = {
            IDENTITY_COLUMN: pa.array([row.identity for row in rows], type=pa.string()),
            VERSION_COLUMN: pa.array([row.version for row in rows], type=pa.int64()),
            EXTRA_COLUMN: pa.array([row.extra for row in rows], type=pa.binary()),
        }
        metadata = {META_CLASS: codec.class_path.encode(), META_PICKLED: json.dumps(sorted(pickled)).encode()}
        return pa.RecordBatch.from_pydict(head | columns).replace_schema_metadata(metadata)

    def write_batch(self, *, group: str, writer: str, rows: list[SnapshotRow] | pa.RecordBatch) -> str:
        """Write ``rows`` (or a batch :meth:`encode` made) as one new immutable file; returns its relative path.

        Row ``i`` of the file is ``rows[i]``. The file appears under its final name
        only once complete (on local disks fsynced; on object stores uploaded in one
        piece), so a path returned here can be committed safely.

        Raises:
            InvalidSpecError (a ValueError): as :meth:`encode`.
            StorageUnavailableError: if the filesystem refuses the write (full, read-only,
                unreachable); nothing is left under the final name.
        """
        batch = rows if isinstance(rows, pa.RecordBatch) else self.encode(rows)
        with self._lock:
            self._counter += 1
            name = f"{safe_name(writer)}-{self._token}-{self._counter:08d}.arrow"
        relative = f"{_SNAPSHOTS}/{safe_name(group)}/{name}"

        def write(sink: object) -> None:
            with ipc.new_file(sink, batch.schema) as out:
                out.write_batch(batch)

        try:
            self._storage.publish(relative, write)
        except (OSError, pa.ArrowException) as error:
            raise StorageUnavailableError(root=self._storage.display, detail=redact(str(error))) from error
        return relative

    @staticmethod
    def inline(batch: pa.RecordBatch, row: int, *, schema_message: bytes | None = None) -> bytes:
        """Row ``row`` of ``batch`` as a self-contained Arrow IPC stream: a State that travels in the ledger.

        The stream is the schema message, the row's record batch message and the
        end-of-stream marker, as ``pyarrow.ipc.new_stream`` writes it; a caller encoding
        many rows of one batch passes ``batch.schema.serialize()`` once as ``schema_message``.
        """
        head = schema_message if schema_message is not None else batch.schema.serialize().to_pybytes()
        data: bytes = head + batch.slice(row, 1).serialize().to_pybytes() + _END_OF_STREAM
        return data

    def read_inline(
        self, data: bytes, state_class: type[pydantic.BaseModel], *, identity: str, version: int
    ) -> tuple[pydantic.BaseModel, bytes]:
        """Return ``(state, extra)`` from a State :meth:`inline` encoded, checked as :meth:`read_row` checks a file row.

        Raises:
            SnapshotError: the bytes are not a rayfleet snapshot of ``identity`` at
                ``version``, or do not fit ``state_class``. ``location`` is ``"ledger:<identity>"``.
        """
        location = f"ledger:{identity}"
        table = _checked(lambda: ipc.open_stream(pa.py_buffer(data)).read_all(), identity=identity, location=location,
                         what=_IN_LEDGER)
        return self._state_of(table, 0, state_class, identity=identity, version=version, location=location)

    def inline_schema(self, data: bytes) -> tuple[pa.Schema, frozenset[str]]:
        """The State columns of an inline State and the fields pickled in it (as :meth:`read_schema`)."""
        try:
            schema = ipc.open_stream(pa.py_buffer(data)).schema
        except (pa.ArrowException, ValueError) as error:
            raise SnapshotError(identity="", location="ledger", detail=f"not an Arrow IPC stream ({error})") from None
        return _state_part(schema)

    def read_inline_rows(
        self, blobs: list[bytes], *, identities: list[str], versions: list[int],
    ) -> list[tuple[pa.Table, list[int]]]:
        """Inline States as tables of State columns: one table per distinct schema, with which of ``blobs`` it holds.

        The schema's metadata is kept (it says which fields were pickled).

        Raises:
            SnapshotError: a blob is not a rayfleet snapshot of its identity at its version.
        """
        groups: dict[pa.Schema, tuple[list[pa.Table], list[int]]] = {}
        for index, (data, identity, version) in enumerate(zip(blobs, identities, versions, strict=True)):
            location = f"ledger:{identity}"
            table = _checked(lambda data=data: ipc.open_stream(pa.py_buffer(data)).read_all(),  # type: ignore[misc]
                             identity=identity, location=location, what=_IN_LEDGER)
            _check_row(table, 0, identity=identity, version=version, location=location)
            parts, indexes = groups.setdefault(table.schema, ([], []))
            parts.append(table)
            indexes.append(index)
        return [
            (pa.concat_tables(parts).drop_columns([IDENTITY_COLUMN, VERSION_COLUMN, EXTRA_COLUMN]), indexes)
            for parts, indexes in groups.values()
        ]

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
        return self._state_of(table, row, state_class, identity=identity, version=version, location=location)

    @staticmethod
    def _state_of(
        table: pa.Table, row: int, state_class: type[pydantic.BaseModel], *, identity: str, version: int, location: str,
    ) -> tuple[pydantic.BaseModel, bytes]:
        _check_row(table, row, identity=identity, version=version, location=location)
        state = StateCodec.for_class(state_class).from_row(table, row, identity=identity, location=location)
        return state, table.column(EXTRA_COLUMN)[row].as_py()

    def read_schema(self, path: str) -> tuple[pa.Schema, frozenset[str]]:
        """The State columns of snapshot file ``path`` (metadata columns left out) and the fields pickled in it.

        Reads only the file's footer when it is not cached.

        Raises:
            SnapshotError: the file is missing, unreadable or not a rayfleet snapshot.
        """
        with self._lock:
            cached = self._tables.get(path)
        if cached is not None:
            schema = cached.schema
        else:
            full = self._storage.full(path)
            try:
                if self._storage.local:
                    schema = ipc.open_file(pa.memory_map(full)).schema
                else:
                    with self._storage.fs.open_input_file(full) as source:
                        schema = ipc.open_file(source).schema
            except FileNotFoundError:
                raise SnapshotError(identity="", location=path, detail="the file is missing") from None
            except (pa.ArrowException, OSError, ValueError) as error:
                detail = f"the file could not be read ({error})"
                raise SnapshotError(identity="", location=path, detail=detail) from None
        return _state_part(schema)

    def read_rows(self, path: str, rows: list[int], *, identities: list[str], versions: list[int]) -> pa.Table:
        """Rows ``rows`` of snapshot file ``path`` as a table of State columns, checked against the ledger.

        Row ``i`` of the result is ``rows[i]`` of the file, which must hold
        ``identities[i]`` at ``versions[i]``. The schema's metadata is kept (it says
        which fields the file pickled).

        Raises:
            SnapshotError: the file cannot be read, or a row is missing or holds another identity or version.
        """
        first = identities[0] if identities else ""
        table = self._open(path, identity=first, location=path)
        for row, identity in zip(rows, identities, strict=True):
            if not 0 <= row < table.num_rows:
                raise SnapshotError(identity=identity, location=f"{path}#{row}",
                                    detail=f"row {row} is out of range (the file has {table.num_rows} rows)")
        taken = table.take(pa.array(rows, type=pa.int64()))
        found = zip(taken.column(IDENTITY_COLUMN).to_pylist(), taken.column(VERSION_COLUMN).to_pylist(), strict=True)
        for (found_identity, found_version), row, identity, version in zip(found, rows, identities, versions,
                                                                           strict=True):
            if found_identity != identity or found_version != version:
                raise SnapshotError(
                    identity=identity, location=f"{path}#{row}",
                    detail=f"the row holds identity {found_identity!r} version {found_version}, "
                    f"expected {identity!r} version {version}",
                )
        return taken.drop_columns([IDENTITY_COLUMN, VERSION_COLUMN, EXTRA_COLUMN])

    def _open(self, path: str, *, identity: str, location: str) -> pa.Table:
        with self._lock:
            if path in self._tables:
                self._tables.move_to_end(path)
                return self._tables[path]
        full = self._storage.full(path)

        def load() -> pa.Table:
            if self._storage.local:
                return ipc.open_file(pa.memory_map(full)).read_all()
            with self._storage.fs.open_input_file(full) as source:
                return ipc.open_file(source).read_all()

        table = _checked(load, identity=identity, location=location)
        with self._lock:
            self._tables[path] = table
            while len(self._tables) > self.cache_size:
                self._tables.popitem(last=False)
        return table

    def delete(self, paths: Iterable[str]) -> None:
        """Remove the files at ``paths`` (relative to the root); missing files are ignored."""
        for path in paths:
            self._storage.full(path)  # refuses a path outside the root before touching the cache
            with self._lock:
                self._tables.pop(path, None)
            self._storage.delete(path)

    def _listing(self) -> list[pafs.FileInfo]:
        return self._storage.list_files(_SNAPSHOTS)

    def _relative(self, info: pafs.FileInfo) -> str:
        return self._storage.relative(info)

    def list_files(self) -> list[str]:
        """Relative paths of every published ``.arrow`` file under ``snapshots/``, sorted."""
        return sorted(
            self._relative(info)
            for info in self._listing()
            if info.base_name.endswith(".arrow") and not info.base_name.startswith(TEMP_PREFIX)
        )

    def collect_garbage(self, referenced: set[str], *, min_age: float = 60.0) -> list[str]:
        """Delete unreferenced snapshot files and leftover temp files older than ``min_age`` seconds.

        Young files survive because they may be written but not yet committed; files
        whose age is unknown are kept. On remote stores the age comes from the store's
        clock (on S3, ``LastModified``: the start of the upload, in whole seconds), so
        ``min_age`` must exceed the clock skew between this host and the store plus the
        longest upload. Only ``snapshots/`` is examined. Returns the deleted relative paths.
        """
        cutoff = time.time_ns() - int(min_age * 1e9)
        doomed = []
        for info in self._listing():
            relative = self._relative(info)
            is_temp = info.base_name.startswith(TEMP_PREFIX)
            if not is_temp and (not info.base_name.endswith(".arrow") or relative in referenced):
                continue
            if info.mtime_ns is not None and info.mtime_ns < cutoff:
                doomed.append(relative)
        self.delete(doomed)
        return sorted(doomed)


_IN_LEDGER = "the State kept in the ledger"
_END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"
"""The IPC stream's end marker: a continuation token followed by a zero message length."""
_ROW_COLUMNS = frozenset({IDENTITY_COLUMN, VERSION_COLUMN, EXTRA_COLUMN})


def _checked(load: Callable[[], pa.Table], *, identity: str, location: str, what: str = "the file") -> pa.Table:
    """``load()``'s table, fully validated, with the row columns every rayfleet snapshot has.

    Raises:
        SnapshotError: ``what`` (the file, or a State kept in the ledger) is missing,
            unreadable, not Arrow IPC, or not a rayfleet snapshot.
    """
    try:
        table = load()
        # Full validation turns a corrupt body into an error here, not a crash later.
        table.validate(full=True)
    except FileNotFoundError:
        raise SnapshotError(identity=identity, location=location, detail=f"{what} is missing") from None
    except (pa.ArrowInvalid, ValueError) as error:
        kind = "file" if what == "the file" else "stream"
        detail = f"{what} is not a valid Arrow IPC {kind} ({error})"
        raise SnapshotError(identity=identity, location=location, detail=detail) from None
    except (pa.ArrowException, OSError) as error:
        raise SnapshotError(
            identity=identity, location=location, detail=f"{what} could not be read ({error})"
        ) from None
    missing = ", ".join(sorted(_ROW_COLUMNS - set(table.column_names)))
    if missing:
        raise SnapshotError(identity=identity, location=location, detail=f"not a rayfleet snapshot (no {missing})")
    return table


def _check_row(table: pa.Table, row: int, *, identity: str, version: int, location: str) -> None:
    """Raise ``SnapshotError`` unless row ``row`` of ``table`` exists and holds ``identity`` at ``version``."""
    if not 0 <= row < table.num_rows:
        raise SnapshotError(identity=identity, location=location,
                            detail=f"row {row} is out of range (the file has {table.num_rows} rows)")
    found_identity = table.column(IDENTITY_COLUMN)[row].as_py()
    found_version = table.column(VERSION_COLUMN)[row].as_py()
    if found_identity != identity or found_version != version:
        raise SnapshotError(
            identity=identity, location=location,
            detail=f"the row holds identity {found_identity!r} version {found_version}, "
            f"expected {identity!r} version {version}",
        )
