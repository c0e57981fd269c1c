"""The fleet marker: ``fleet.json`` at the storage root names the fleet whose snapshots live there.

Written once, when a fleet first uses the storage; read by every ledger that opens over
it, so a ledger that is empty (a new or wiped database) or belongs to another fleet is
noticed before it issues a single token.
"""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.fs as pafs

from ..errors import InvalidSpecError

MARKER = "fleet.json"


def _location(root: str) -> tuple[pafs.FileSystem, str]:
    if "://" in root:
        try:
            fs, path = pafs.FileSystem.from_uri(root)
        except (pa.ArrowException, ValueError) as error:
            raise InvalidSpecError(f"storage {root!r} is not a usable URI: {error}", field="storage") from None
        return fs, f"{path.rstrip('/')}/{MARKER}"
    return pafs.LocalFileSystem(), os.path.join(os.path.abspath(root), MARKER)


def read_fleet_id(root: str) -> str | None:
    """The fleet id recorded at ``root``, or ``None`` when the storage has no marker yet."""
    fs, path = _location(root)
    try:
        with fs.open_input_stream(path) as stream:
            content = json.loads(stream.read().decode("utf-8"))
    except FileNotFoundError:
        return None
    except OSError as error:
        if "not found" in str(error).lower() or "does not exist" in str(error).lower():
            return None
        raise
    fleet_id = content.get("fleet_id") if isinstance(content, dict) else None
    if not isinstance(fleet_id, str) or not fleet_id:
        raise InvalidSpecError(f"{path} is not a rayfleet fleet marker (no fleet_id); remove it or fix it",
                               field="storage")
    return fleet_id


def write_fleet_id(root: str, fleet_id: str) -> None:
    """Record ``fleet_id`` at ``root`` (the folder is created on local disks)."""
    fs, path = _location(root)
    if isinstance(fs, pafs.LocalFileSystem):
        os.makedirs(os.path.dirname(path), exist_ok=True)
    body = json.dumps({"fleet_id": fleet_id, "format": 1}, indent=2).encode("utf-8")
    with fs.open_output_stream(path) as stream:
        stream.write(body)
