"""Large workflow step outputs as immutable files under ``<root>/journal/`` on the fleet's storage.

The ledger journal then holds only a pointer to the file; see ``platform/_runner.py``.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping

import pyarrow as pa
import pyarrow.ipc as ipc

from ._files import StorageRoot, safe_name

JOURNAL_FOLDER = "journal"


class JournalFileStore:
    """Writes and reads step-output files ``journal/<run>/<label>-<uuid>.<ext>``.

    Every write creates a new file under a fresh name, published whole or not at all
    (:meth:`StorageRoot.publish`), and no file is ever changed afterwards: a pointer
    journaled once always reads back the same content. Safe to share between threads.
    """

    def __init__(self, root: str) -> None:
        """``root`` is the fleet's storage: a local folder or a ``pyarrow.fs`` URI.

        Raises:
            InvalidSpecError: if the URI is not understood by pyarrow.
        """
        self._storage = StorageRoot(root, what="journal storage")

    @classmethod
    def on(cls, storage: StorageRoot) -> JournalFileStore:
        """A store on a storage root already resolved (a host's snapshot storage)."""
        files = cls.__new__(cls)
        files._storage = storage
        return files

    @property
    def storage(self) -> StorageRoot:
        """The storage root the files live on."""
        return self._storage

    def _name(self, run_id: str, label: str, extension: str) -> str:
        return f"{JOURNAL_FOLDER}/{safe_name(run_id)}/{safe_name(label)}-{uuid.uuid4().hex}.{extension}"

    def write_table(self, *, run_id: str, label: str, table: pa.Table, metadata: Mapping[bytes, bytes]) -> str:
        """Write ``table`` as an Arrow IPC file with ``metadata`` added to its schema; returns its relative path.

        Raises:
            OSError (or ``pyarrow.ArrowException``): if the filesystem refuses the write.
        """
        stored = table.replace_schema_metadata({**(table.schema.metadata or {}), **metadata}) if metadata else table
        relative = self._name(run_id, label, "arrow")

        def write(sink: object) -> None:
            with ipc.new_file(sink, stored.schema) as out:
                out.write_table(stored)

        self._storage.publish(relative, write)
        return relative

    def write_bytes(self, *, run_id: str, label: str, content: bytes) -> str:
        """Write ``content`` as a ``.bin`` file; returns its relative path.

        Raises:
            OSError (or ``pyarrow.ArrowException``): if the filesystem refuses the write.
        """
        relative = self._name(run_id, label, "bin")

        def write(sink: object) -> None:
            sink.write(content)  # type: ignore[attr-defined]

        self._storage.publish(relative, write)
        return relative

    def read_table(self, relative: str) -> pa.Table:
        """The table stored at ``relative``, schema metadata included, fully validated.

        Raises:
            FileNotFoundError: if the file is missing.
            OSError, ``pyarrow.ArrowException``: if it cannot be read or is not a valid Arrow IPC file.
        """
        table = ipc.open_file(pa.py_buffer(self._storage.read_bytes(relative))).read_all()
        table.validate(full=True)
        return table

    def read_bytes(self, relative: str) -> bytes:
        """The content stored at ``relative``.

        Raises:
            FileNotFoundError: if the file is missing.
            OSError: if it cannot be read.
        """
        return self._storage.read_bytes(relative)

    def delete(self, relative: str) -> None:
        """Remove the file at ``relative`` (a step value whose journal is gone); a missing one is no error.

        Raises:
            OSError: if the filesystem refuses.
        """
        self._storage.delete(relative)

    def list_files(self) -> list[str]:
        """Relative paths of every published file under ``journal/``, sorted."""
        return sorted(
            self._storage.relative(info)
            for info in self._storage.list_files(JOURNAL_FOLDER)
            if not info.base_name.startswith(".")
        )
