"""The Parquet export: every identity's latest committed State, one table per agent class, plus dead letters and runs.

Layout under the destination (a local folder or any ``pyarrow.fs`` URI)::

    <agent class>/part-0.parquet   one table per agent class (``module:Class`` as ``module.Class``)
    dead_letters/part-0.parquet
    runs/part-0.parquet
    _rayfleet_export.json          written last: what was exported, and that it is complete

Each agent-class table has ``identity``, ``lifecycle`` (``live``, ``retired`` or
``broken``), ``generation``, ``checkpoint_version``, ``fencing_token`` and
``committed_at`` columns, then one column per State field, as the snapshots store it
(a State field named like one of those six is exported as ``state_<name>``). Fields
Arrow cannot hold are their cloudpickle bytes, as in the snapshots.

What is and is not a row: every identity with a committed checkpoint, retired and
broken ones included (with their last committed State). An identity that never
committed a checkpoint in its generation has no committed State and no row; the
report counts it in ``uncheckpointed``. One whose snapshot (a file, or a small State
kept in the ledger) cannot be read is left out and named in ``unreadable``.

Memory: identities are read from the ledger a page at a time and written a page at a
time (one Parquet row group per page); only the list of snapshot files per class is
kept for the whole export, to settle each table's schema before writing it. The
export is not a point-in-time cut of a fleet that keeps working: each row is a
committed State as the ledger pointed at it when its page was read.
"""

from __future__ import annotations

import json
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import cloudpickle
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from ..errors import InvalidSpecError, SnapshotError, StorageUnavailableError
from ..ledger._contract import LedgerClient
from ..ledger._values import CheckpointRow, RunRecord, StoredMessage
from ._files import StorageRoot, redact, safe_name
from ._store import SnapshotStore

log = logging.getLogger("rayfleet.export")

EXPORT_PAGE = 1000
"""Identities read from the ledger, and written as one Parquet row group, at a time."""
DEAD_LETTER_LIMIT = 10_000_000
MARKER = "_rayfleet_export.json"
DEAD_LETTERS_TABLE, RUNS_TABLE = "dead_letters", "runs"
PART = "part-0.parquet"

_TIMESTAMP = pa.timestamp("us", tz="UTC")
_META_FIELDS = [
    pa.field("identity", pa.string(), nullable=False),
    pa.field("lifecycle", pa.string(), nullable=False),
    pa.field("generation", pa.int64(), nullable=False),
    pa.field("checkpoint_version", pa.int64(), nullable=False),
    pa.field("fencing_token", pa.int64(), nullable=False),
    pa.field("committed_at", _TIMESTAMP),
]
_META_NAMES = frozenset(f.name for f in _META_FIELDS)

Progress = Callable[[int, int], None]
"""Told ``(done, total)`` identities as the export goes."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ExportReport:
    """What :meth:`rayfleet.Fleet.export` wrote."""

    path: str
    """The destination, as given (credentials in a URI masked)."""
    tables: dict[str, int] = field(default_factory=dict)
    """Agent-class table name (``module.Class``, also its folder) to the rows written."""
    dead_letters: int = 0
    """Rows of the ``dead_letters`` table."""
    runs: int = 0
    """Rows of the ``runs`` table."""
    seconds: float = 0.0
    """How long the export took."""
    uncheckpointed: int = 0
    """Identities with no committed checkpoint (no State to export; no row)."""
    unreadable: tuple[str, ...] = ()
    """Identities left out because their snapshot file could not be read (see the log)."""


def table_name(agent_class: str) -> str:
    """The table (and folder) of an agent class path: ``pkg.mod:Class`` becomes ``pkg.mod.Class``."""
    return safe_name(agent_class.replace(":", "."))


def _timestamps(values: list[float | None]) -> pa.Array:
    return pa.array([None if value is None else round(value * 1_000_000) for value in values],
                    type=pa.int64()).cast(_TIMESTAMP)


def _pages(ledger: LedgerClient, agent_class: str | None) -> Iterator[list[CheckpointRow]]:
    after = ""
    while True:
        page = ledger.latest_checkpoints(after=after, limit=EXPORT_PAGE, agent_class=agent_class).result()
        if not page:
            return
        yield page
        after = page[-1].identity


@dataclass(slots=True)
class _Column:
    """How one State field is written: its exported name and type, and whether it is pickled bytes."""

    name: str
    arrow_type: pa.DataType
    pickled: bool


def _plan_columns(schemas: list[tuple[pa.Schema, frozenset[str]]]) -> dict[str, _Column]:
    """One column per State field seen in any file; conflicting types become pickled bytes."""
    types: dict[str, list[pa.DataType]] = {}
    pickled: set[str] = set()
    for schema, pickled_here in schemas:
        for state_field in schema:
            types.setdefault(state_field.name, []).append(state_field.type)
            if state_field.name in pickled_here:
                pickled.add(state_field.name)
    columns: dict[str, _Column] = {}
    for name, seen in types.items():
        exported = f"state_{name}" if name in _META_NAMES else name
        if name in pickled:
            columns[name] = _Column(exported, pa.binary(), True)
            continue
        try:
            unified = pa.unify_schemas([pa.schema([pa.field(name, kind)]) for kind in seen],
                                       promote_options="permissive").field(name).type
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
            columns[name] = _Column(exported, pa.binary(), True)
        else:
            columns[name] = _Column(exported, unified, False)
    return columns


def _conform(state: pa.Table, columns: dict[str, _Column]) -> list[pa.Array]:
    """The State columns of one file's rows in the table's planned names and types."""
    pickled_here = set(json.loads((state.schema.metadata or {}).get(b"rayfleet.pickled", b"[]")))
    arrays = []
    for name, column in columns.items():
        if name not in state.column_names:
            arrays.append(pa.nulls(state.num_rows, type=column.arrow_type))
            continue
        values = state.column(name).combine_chunks()
        if column.pickled and name not in pickled_here:
            # Typed in this file, pickled in another: the table holds pickles, so pickle these too.
            values = pa.array([cloudpickle.dumps(item) for item in values.to_pylist()], type=pa.binary())
        elif values.type != column.arrow_type:
            values = values.cast(column.arrow_type)
        arrays.append(values)
    return arrays


class _Destination:
    """The export's root: refuses a folder holding anything but an earlier export, which it replaces."""

    def __init__(self, path: str) -> None:
        self.storage = StorageRoot(path, what="export destination")
        self.storage.check()
        root = self.storage.root
        try:
            listing = self.storage.fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
        except (OSError, pa.ArrowException) as error:
            raise StorageUnavailableError(root=self.storage.display, detail=redact(str(error))) from error
        files = [info for info in listing if info.type == pafs.FileType.File]
        if files and not any(info.base_name == MARKER and info.path == f"{root}/{MARKER}" for info in files):
            raise InvalidSpecError(
                f"export destination {self.storage.display!r} holds files that are not a rayfleet export; "
                f"export to an empty or new folder (an earlier export there is replaced)", field="path",
            )
        if files:
            self.storage.fs.delete_dir_contents(root, missing_dir_ok=True)

    def writer(self, table: str, schema: pa.Schema) -> pq.ParquetWriter:
        folder = self.storage.full(table)
        if self.storage.local:
            self.storage.fs.create_dir(folder, recursive=True)
        return pq.ParquetWriter(f"{folder}/{PART}", schema, filesystem=self.storage.fs)

    def finish(self, report: ExportReport) -> None:
        body = json.dumps({
            "tables": report.tables, "dead_letters": report.dead_letters, "runs": report.runs,
            "uncheckpointed": report.uncheckpointed, "unreadable": list(report.unreadable),
            "exported_at": time.time(),
        }, indent=2).encode()
        self.storage.publish(MARKER, lambda sink: sink.write(body))


def export_fleet(
    path: str, *, ledger: LedgerClient, snapshots: SnapshotStore, progress: Progress | None = None,
) -> ExportReport:
    """Write the latest committed State of every identity, the dead letters and the runs as Parquet under ``path``.

    See the module docstring for the layout and what becomes a row. Blocking; reads
    the ledger through ``.result()``.

    Raises:
        InvalidSpecError: ``path`` is not a usable folder or URI, or holds files other
            than an earlier rayfleet export.
        StorageUnavailableError: the destination cannot be listed or written.
        LedgerUnavailableError: the ledger cannot be reached.
    """
    started = time.monotonic()
    destination = _Destination(path)
    # Pass 1: which snapshot files each class's rows live in, to settle each table's schema up front.
    files: defaultdict[str, set[str]] = defaultdict(set)
    # States kept in the ledger carry their schema; the distinct ones per class (by their bytes).
    inline_schemas: defaultdict[str, dict[bytes, tuple[pa.Schema, frozenset[str]]]] = defaultdict(dict)
    counts: defaultdict[str, int] = defaultdict(int)
    uncheckpointed = 0
    total = 0
    for page in _pages(ledger, None):
        for row in page:
            total += 1
            if row.snapshot is None:
                uncheckpointed += 1
                continue
            counts[row.agent_class] += 1
            files.setdefault(row.agent_class, set())  # a class whose States are all in the ledger has a table too
            if row.snapshot.inline is None:
                files[row.agent_class].add(row.snapshot.file)
                continue
            try:
                schema, pickled = snapshots.inline_schema(row.snapshot.inline)
            except SnapshotError as error:
                log.warning("export: %s: %s", row.identity, error.message)
                continue
            inline_schemas[row.agent_class].setdefault(schema.serialize().to_pybytes(), (schema, pickled))
    done = uncheckpointed
    if progress is not None:
        progress(done, total)
    tables: dict[str, int] = {}
    unreadable: list[str] = []
    for agent_class in sorted(files):
        schemas = []
        for file in sorted(files[agent_class]):
            try:
                schemas.append(snapshots.read_schema(file))
            except SnapshotError as error:
                log.warning("export: %s", error.message)
        schemas += inline_schemas[agent_class].values()
        columns = _plan_columns(schemas)
        schema = pa.schema([*_META_FIELDS, *(pa.field(c.name, c.arrow_type) for c in columns.values())])
        name = table_name(agent_class)
        written = 0
        with destination.writer(name, schema) as writer:
            for page in _pages(ledger, agent_class):
                rows = [row for row in page if row.snapshot is not None]
                batch, missing = _page_table(rows, columns, schema, snapshots)
                unreadable += missing
                if batch.num_rows:
                    writer.write_table(batch)
                written += batch.num_rows
                done += len(rows)
                if progress is not None:
                    progress(done, total)
        tables[name] = written
    dead_letters = _export_dead_letters(destination, ledger.dead_letters(limit=DEAD_LETTER_LIMIT).result())
    runs = _export_runs(destination, ledger.list_runs().result())
    report = ExportReport(
        path=destination.storage.display, tables=tables, dead_letters=dead_letters, runs=runs,
        seconds=time.monotonic() - started, uncheckpointed=uncheckpointed, unreadable=tuple(sorted(unreadable)),
    )
    destination.finish(report)
    return report


def _page_table(
    rows: list[CheckpointRow], columns: dict[str, _Column], schema: pa.Schema, snapshots: SnapshotStore,
) -> tuple[pa.Table, list[str]]:
    """One page's rows (in identity order) as a table of ``schema``; identities whose snapshot failed are returned."""
    by_file: defaultdict[str, list[int]] = defaultdict(list)
    in_ledger: list[int] = []
    for index, row in enumerate(rows):
        assert row.snapshot is not None
        if row.snapshot.inline is not None:
            in_ledger.append(index)
        else:
            by_file[row.snapshot.file].append(index)
    parts: list[pa.Table] = []
    order: list[int] = []
    missing: list[str] = []
    state_schema = pa.schema([pa.field(c.name, c.arrow_type) for c in columns.values()])
    # All of the page's States kept in the ledger at once; should one be unreadable, one at
    # a time, so that it leaves out only its own identity.
    try:
        tables = _inline_tables(rows, in_ledger, snapshots)
    except SnapshotError:
        tables = []
        for index in in_ledger:
            try:
                tables += _inline_tables(rows, [index], snapshots)
            except SnapshotError as error:
                log.warning("export: left out %s: %s", rows[index].identity, error.message)
                missing.append(rows[index].identity)
    for state, indexes in tables:
        parts.append(pa.Table.from_arrays(_conform(state, columns), schema=state_schema))
        order += indexes
    for file, indexes in by_file.items():
        chosen = [rows[i] for i in indexes]
        try:
            state = snapshots.read_rows(
                file, [r.snapshot.row for r in chosen if r.snapshot is not None],
                identities=[r.identity for r in chosen], versions=[r.checkpoint_version for r in chosen],
            )
        except SnapshotError as error:
            log.warning("export: left out %d identities: %s", len(chosen), error.message)
            missing += [r.identity for r in chosen]
            continue
        parts.append(pa.Table.from_arrays(_conform(state, columns), schema=state_schema))
        order += indexes
    kept = [rows[i] for i in order]
    head = [
        pa.array([r.identity for r in kept], type=pa.string()),
        pa.array([r.lifecycle for r in kept], type=pa.string()),
        pa.array([r.generation for r in kept], type=pa.int64()),
        pa.array([r.checkpoint_version for r in kept], type=pa.int64()),
        pa.array([r.fencing_token for r in kept], type=pa.int64()),
        _timestamps([r.committed_at for r in kept]),
    ]
    state_part = pa.concat_tables(parts) if parts else state_schema.empty_table()
    table = pa.Table.from_arrays([*head, *state_part.columns], schema=schema)
    # Rows were gathered file by file; put them back in identity order.
    return table.take(pa.array(sorted(range(len(kept)), key=lambda i: kept[i].identity), type=pa.int64())), missing


def _inline_tables(
    rows: list[CheckpointRow], indexes: list[int], snapshots: SnapshotStore,
) -> list[tuple[pa.Table, list[int]]]:
    """The ledger-kept States of ``rows[i]`` for ``i`` in ``indexes``: State-column tables with their row indexes."""
    if not indexes:
        return []
    chosen = [rows[i] for i in indexes]
    blobs = [r.snapshot.inline for r in chosen if r.snapshot is not None and r.snapshot.inline is not None]
    tables = snapshots.read_inline_rows(
        blobs, identities=[r.identity for r in chosen], versions=[r.checkpoint_version for r in chosen],
    )
    return [(table, [indexes[i] for i in picked]) for table, picked in tables]


def _method_of(letter: StoredMessage) -> str | None:
    try:
        return str(cloudpickle.loads(letter.envelope).method)
    except Exception:  # noqa: BLE001 - an envelope whose arguments no longer unpickle still exports, without method
        return None


_DEAD_LETTER_SCHEMA = pa.schema([
    pa.field("id", pa.int64(), nullable=False), pa.field("identity", pa.string(), nullable=False),
    pa.field("message_id", pa.string(), nullable=False), pa.field("method", pa.string()),
    pa.field("reason", pa.string(), nullable=False), pa.field("error", pa.string(), nullable=False),
    pa.field("attempts", pa.int64(), nullable=False), pa.field("dead_lettered_at", _TIMESTAMP, nullable=False),
])
_RUN_SCHEMA = pa.schema([
    pa.field("run_id", pa.string(), nullable=False), pa.field("workflow", pa.string(), nullable=False),
    pa.field("status", pa.string(), nullable=False), pa.field("detail", pa.string(), nullable=False),
    pa.field("code_version", pa.string(), nullable=False), pa.field("submitted", pa.bool_(), nullable=False),
    pa.field("owner", pa.string()), pa.field("created_at", _TIMESTAMP, nullable=False),
    pa.field("updated_at", _TIMESTAMP, nullable=False),
])


def _export_dead_letters(destination: _Destination, letters: list[StoredMessage]) -> int:
    with destination.writer(DEAD_LETTERS_TABLE, _DEAD_LETTER_SCHEMA) as writer:
        for start in range(0, len(letters), EXPORT_PAGE):
            chunk = letters[start:start + EXPORT_PAGE]
            writer.write_table(pa.Table.from_arrays([
                pa.array([x.id for x in chunk], type=pa.int64()),
                pa.array([x.identity for x in chunk], type=pa.string()),
                pa.array([x.message_id for x in chunk], type=pa.string()),
                pa.array([_method_of(x) for x in chunk], type=pa.string()),
                pa.array([x.reason for x in chunk], type=pa.string()),
                pa.array([x.error for x in chunk], type=pa.string()),
                pa.array([x.attempts for x in chunk], type=pa.int64()),
                _timestamps([x.at for x in chunk]),
            ], schema=_DEAD_LETTER_SCHEMA))
    return len(letters)


def _export_runs(destination: _Destination, runs: list[RunRecord]) -> int:
    with destination.writer(RUNS_TABLE, _RUN_SCHEMA) as writer:
        for start in range(0, len(runs), EXPORT_PAGE):
            chunk = runs[start:start + EXPORT_PAGE]
            writer.write_table(pa.Table.from_arrays([
                pa.array([x.run_id for x in chunk], type=pa.string()),
                pa.array([x.workflow for x in chunk], type=pa.string()),
                pa.array([x.status for x in chunk], type=pa.string()),
                pa.array([x.detail for x in chunk], type=pa.string()),
                pa.array([x.code_version for x in chunk], type=pa.string()),
                pa.array([x.submitted for x in chunk], type=pa.bool_()),
                pa.array([x.owner for x in chunk], type=pa.string()),
                _timestamps([x.created_at for x in chunk]),
                _timestamps([x.updated_at for x in chunk]),
            ], schema=_RUN_SCHEMA))
    return len(runs)
