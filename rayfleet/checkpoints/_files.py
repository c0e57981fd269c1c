"""One storage root on a ``pyarrow.fs`` filesystem and the one way immutable files are published on it.

Both the snapshot store and the journal's file store sit on this, so a local folder,
``file://``, ``s3://``, ``gs://`` or ``abfs://`` root behaves the same for both.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from ..errors import InvalidSpecError

TEMP_PREFIX = ".tmp-"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/@]*@")

# Object stores make an object visible only once its upload completes (one PUT, or the
# completion of a multipart upload), so the final name can be written directly; they
# have no atomic rename (``move`` is copy + delete). Not every pyarrow build has all three.
_OBJECT_STORES: tuple[type[pafs.FileSystem], ...] = tuple(
    kind for kind in (getattr(pafs, name, None) for name in ("S3FileSystem", "GcsFileSystem", "AzureFileSystem"))
    if isinstance(kind, type)
)

Writer = Callable[[Any], None]
"""Writes a file's whole content to the binary sink it is given (a file object or a pyarrow stream)."""


def safe_name(name: str) -> str:
    """``name`` with every character outside ``[A-Za-z0-9._-]`` replaced, usable as one path component."""
    safe = _UNSAFE.sub("_", name)
    # "." and ".." are made of allowed characters but would walk the folder tree.
    return safe if safe.strip(".") else "_" * max(len(safe), 1)


def redact(root: str) -> str:
    """``root`` with the credentials of a ``scheme://key:secret@...`` URI masked, for messages and logs."""
    return _USERINFO.sub(r"\1***@", root)


class StorageRoot:
    """A folder or ``pyarrow.fs`` URI, resolved once to a filesystem and a root path.

    Files are published whole or not at all (see :meth:`publish`). Safe to share between
    threads: it holds no mutable state beyond the filesystem, which pyarrow makes
    thread-safe.
    """

    def __init__(self, root: str, *, what: str) -> None:
        """``root`` is a local folder (created if missing) or a URI ``FileSystem.from_uri`` accepts.

        ``what`` names the root in error messages (e.g. ``"snapshot root"``).

        Raises:
            InvalidSpecError: if the URI is not understood by pyarrow.
        """
        self.what = what
        self.display = redact(root)
        """``root`` with any credentials masked."""
        if "://" in root:
            try:
                self.fs, path = pafs.FileSystem.from_uri(root)
            except (pa.ArrowException, ValueError) as error:
                raise InvalidSpecError(
                    f"{what} {self.display!r} is not a usable URI: {redact(str(error))}. Give a local folder or a "
                    f"pyarrow.fs URI such as s3://bucket/prefix?region=us-east-1", field="root",
                ) from None
        else:
            self.fs, path = pafs.LocalFileSystem(), os.path.abspath(root)
        self.root: str = path.rstrip("/") or "/"
        self.local = isinstance(self.fs, pafs.LocalFileSystem)
        self.object_store = isinstance(self.fs, _OBJECT_STORES)
        if self.local:
            os.makedirs(self.root, exist_ok=True)

    def check(self) -> None:
        """Reach the storage once, so a wrong endpoint, bad credentials or a missing bucket fail now.

        Writes nothing. Without this check they would surface only as the first failed
        checkpoint, inside some agent's turn.

        Raises:
            InvalidSpecError: naming the root, what failed and what to do.
        """
        if self.local:
            return
        target = self.root.split("/", 1)[0] if self.object_store else self.root
        try:
            info = self.fs.get_file_info(target)
        except (OSError, pa.ArrowException) as error:
            raise InvalidSpecError(
                f"{self.what} {self.display!r} cannot be reached: {redact(str(error))}. Check the endpoint, the "
                f"network and the credentials (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY for s3://)", field="root",
            ) from None
        if self.object_store and info.type == pafs.FileType.NotFound:
            raise InvalidSpecError(
                f"{self.what} {self.display!r}: the bucket {target!r} does not exist. Create it first; rayfleet "
                f"never creates or deletes buckets", field="root",
            )

    def full(self, relative: str) -> str:
        """The filesystem path of ``relative``.

        Raises:
            InvalidSpecError: if ``relative`` is absolute, empty or walks up with ``..``.
        """
        parts = relative.split("/")
        if relative.startswith("/") or ".." in parts or "" in parts:
            raise InvalidSpecError(f"path {relative!r} must be relative to the {self.what}", field="path")
        return f"{self.root.rstrip('/')}/{relative}"

    def relative(self, info: pafs.FileInfo) -> str:
        """The path of a listed file relative to the root."""
        path: str = info.path
        return path[len(self.root.rstrip("/")) + 1 :]

    def list_files(self, folder: str) -> list[pafs.FileInfo]:
        """Every file (not directory) under ``folder``, recursively; nothing if it does not exist."""
        selector = pafs.FileSelector(self.full(folder), recursive=True, allow_not_found=True)
        return [info for info in self.fs.get_file_info(selector) if info.type == pafs.FileType.File]

    def publish(self, relative: str, write: Writer) -> None:
        """Write a new file at ``relative`` so that it appears under that name only once complete.

        * Local disks: written to a ``.tmp-`` sibling, fsynced, renamed into place, and
          the folder fsynced, so the rename itself is durable before anyone commits the path.
        * Object stores (S3, GCS, Azure): the content is built in memory first, then
          uploaded to the final name, which becomes visible only when the upload
          completes. A failed upload leaves nothing under the name (an interrupted
          multipart upload is invisible; a bucket lifecycle rule should abort those).
        * Other filesystems (HDFS, Python-backed): a ``.tmp-`` sibling moved into place.

        Raises:
            OSError (or ``pyarrow.ArrowException``): if the filesystem refuses the write.
        """
        final = self.full(relative)
        folder, name = final.rsplit("/", 1)
        temporary = f"{folder}/{TEMP_PREFIX}{name}"
        if self.local:
            _publish_local(write, temporary, final)
        elif self.object_store:
            # Built before the upload starts: closing a half-written S3 stream would
            # complete its upload and publish a truncated object.
            buffer = pa.BufferOutputStream()
            write(buffer)
            content = buffer.getvalue()
            with self.fs.open_output_stream(final) as sink:
                sink.write(content)
        else:
            self.fs.create_dir(folder, recursive=True)
            try:
                with self.fs.open_output_stream(temporary) as sink:
                    write(sink)
                self.fs.move(temporary, final)
            except BaseException:
                with contextlib.suppress(OSError, pa.ArrowException):
                    self.fs.delete_file(temporary)
                raise

    def read_bytes(self, relative: str) -> bytes:
        """The whole content of the file at ``relative``.

        Raises:
            FileNotFoundError: if there is none.
            OSError (or ``pyarrow.ArrowException``): if it cannot be read.
        """
        with self.fs.open_input_stream(self.full(relative)) as source:
            content: bytes = source.read()
        return content

    def delete(self, relative: str) -> None:
        """Remove the file at ``relative``; a missing file is not an error."""
        with contextlib.suppress(FileNotFoundError):
            self.fs.delete_file(self.full(relative))


def _publish_local(write: Writer, temporary: str, final: str) -> None:
    folder = os.path.dirname(final)
    os.makedirs(folder, exist_ok=True)
    try:
        with open(temporary, "wb") as sink:
            write(sink)
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
