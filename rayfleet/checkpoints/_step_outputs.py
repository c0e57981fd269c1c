"""Step outputs as the workflow journal holds them: an encoding, and files for the large ones.

A journaled output is bytes whose first byte names its encoding (:func:`encode_output`).
Whoever journals a step encodes it the same way: the driver's engine, or the host whose
turn answered the step and journals it in the agent's checkpoint transaction.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable
from typing import Any

import cloudpickle
import pyarrow as pa
import pydantic

from ._journal_files import JournalFileStore

SPILL_THRESHOLD = 256 * 1024
"""Bytes: an encoded step output larger than this is written to a file under ``journal/`` in
storage, and the ledger journals only a pointer to it (``b"F"``). Keeps large outputs out of
the ledger's rows (and the one SQLite file) while small ones stay one ledger write."""

_MODEL_CLASS = b"rayfleet.model_class"
"""Schema metadata key of a spilled pydantic output: its class, cloudpickled."""


def encode_output(value: Any) -> bytes:
    """Tabular outputs and pydantic models as Arrow IPC, anything else with cloudpickle.

    The first byte says which: ``A`` (an Arrow table), ``M`` (a pydantic model: its
    pickled class, then a one-row table), ``P`` (cloudpickle). :func:`spill_output`
    turns any of them into ``F``, a pointer to a file.
    """
    if isinstance(value, (pa.Table, pa.RecordBatch)):
        table = value if isinstance(value, pa.Table) else pa.Table.from_batches([value])
        return b"A" + _ipc(table)
    if isinstance(value, pydantic.BaseModel):
        try:
            table = pa.Table.from_pylist([value.model_dump(mode="json")])
        except (pa.ArrowException, TypeError, ValueError):
            pass  # e.g. a list of mixed types: Arrow cannot hold it, pickle can
        else:
            header: bytes = cloudpickle.dumps(type(value))
            return b"M" + len(header).to_bytes(8, "big") + header + _ipc(table)
    pickled: bytes = cloudpickle.dumps(value)
    return b"P" + pickled


def spill_output(blob: bytes, files: JournalFileStore, *, run_id: str, label: str) -> bytes:
    """Write an encoded output to a new immutable file and return the pointer to journal instead.

    ``A`` and ``M`` outputs become Arrow IPC files (``.arrow``, readable by any Arrow
    tool; a model's class is in the schema metadata), ``P`` outputs ``.bin`` files of
    the cloudpickle bytes. The pointer is ``b"F"`` followed by the JSON
    ``{"kind": "A"|"M"|"P", "path": "journal/...", "size": <bytes of the inline encoding>}``;
    ``path`` is relative to the storage root.

    Raises:
        OSError (or ``pyarrow.ArrowException``): if the storage refuses the write.
    """
    kind, body = blob[:1], blob[1:]
    if kind == b"A":
        path = files.write_table(run_id=run_id, label=label, table=_read_ipc(body), metadata={})
    elif kind == b"M":
        size = int.from_bytes(body[:8], "big")
        path = files.write_table(
            run_id=run_id, label=label, table=_read_ipc(body[8 + size:]), metadata={_MODEL_CLASS: body[8:8 + size]},
        )
    elif kind == b"P":
        path = files.write_bytes(run_id=run_id, label=label, content=body)
    else:
        raise ValueError(f"cannot spill an encoded output of kind {kind!r}")
    pointer = {"kind": kind.decode(), "path": path, "size": len(blob)}
    return b"F" + json.dumps(pointer, separators=(",", ":")).encode()


def spilled_paths(blobs: Iterable[bytes | None]) -> list[str]:
    """The storage paths the pointers among ``blobs`` name (see :func:`spill_output`); other blobs are skipped."""
    return [str(json.loads(blob[1:])["path"]) for blob in blobs if blob and blob[:1] == b"F"]


def decode_output(blob: bytes, files: JournalFileStore | None = None) -> Any:
    """The value :func:`encode_output` (and perhaps :func:`spill_output`) encoded.

    Raises:
        ValueError: ``blob`` points at a file but no ``files`` store was given.
        FileNotFoundError, OSError, ``pyarrow.ArrowException``: the file cannot be read.
    """
    kind, body = blob[:1], blob[1:]
    if kind == b"F":
        pointer = json.loads(body)
        if files is None:
            raise ValueError(f"the output is in the file {pointer['path']!r}, and no storage was given to read it")
        if pointer["kind"] == "P":
            return cloudpickle.loads(files.read_bytes(pointer["path"]))
        table = files.read_table(pointer["path"])
        if pointer["kind"] == "A":
            return table
        model = cloudpickle.loads(table.schema.metadata[_MODEL_CLASS])
        return model.model_validate(table.to_pylist()[0])
    if kind == b"A":
        return _read_ipc(body)
    if kind == b"M":
        size = int.from_bytes(body[:8], "big")
        model = cloudpickle.loads(body[8:8 + size])
        return model.model_validate(_read_ipc(body[8 + size:]).to_pylist()[0])
    return cloudpickle.loads(body)


def _ipc(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def _read_ipc(body: bytes) -> pa.Table:
    return pa.ipc.open_stream(body).read_all()
