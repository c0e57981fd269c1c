"""The fleet marker: ``fleet.json`` at the storage root names the fleet whose snapshots live there.

Written once, when a fleet first uses the storage; read by every ledger that opens over
it, so a ledger that is empty (a new or wiped database) or belongs to another fleet is
noticed before it issues a single token.
"""

from __future__ import annotations

import json

import pyarrow as pa

from ..errors import InvalidSpecError, StorageUnavailableError
from ._files import StorageRoot, redact

MARKER = "fleet.json"


def read_fleet_id(root: str) -> str | None:
    """The fleet id recorded at ``root``, or ``None`` when the storage has no marker yet."""
    storage = StorageRoot(root, what="storage")
    try:
        content = json.loads(storage.read_bytes(MARKER).decode("utf-8"))
    except FileNotFoundError:
        return None
    except (ValueError, UnicodeDecodeError):
        content = None
    fleet_id = content.get("fleet_id") if isinstance(content, dict) else None
    if not isinstance(fleet_id, str) or not fleet_id:
        raise InvalidSpecError(
            f"{storage.display}/{MARKER} is not a rayfleet fleet marker (no fleet_id); restore it, or remove it "
            f"only if this storage holds no fleet's snapshots", field="storage",
        )
    return fleet_id


def write_fleet_id(root: str, fleet_id: str) -> None:
    """Record ``fleet_id`` at ``root``, whole or not at all.

    Raises:
        StorageUnavailableError: the storage refused the write (read-only, full, unreachable).
    """
    body = json.dumps({"fleet_id": fleet_id, "format": 1}, indent=2).encode("utf-8")

    def write(sink: pa.NativeFile) -> None:
        sink.write(body)

    storage = StorageRoot(root, what="storage")
    try:
        storage.publish(MARKER, write)
    except (OSError, pa.ArrowException) as error:
        raise StorageUnavailableError(root=storage.display, detail=redact(str(error))) from error
