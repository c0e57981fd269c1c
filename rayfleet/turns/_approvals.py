"""Approvals as a turn and a driver see them: stable ids, the decoded registry row, the decision.

The registry itself is the ledger's (``rayfleet.ledger._approvals``): rows with encoded
data, decided once by compare-and-set. This module turns those rows into the public
values (``rf.ApprovalInfo``, ``rf.Decision``) and back.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable
from typing import Any

from ..checkpoints._step_outputs import SPILL_THRESHOLD, decode_output, encode_output
from ..errors import InvalidSpecError, UsageError
from ..ledger._turn_rows import ApprovalRow
from ._values import ApprovalInfo, Decision

ON_TIMEOUT = ("reject", "approve")
"""What an approval's timeout decides."""

TIMEOUT_DECIDER = "timeout"
"""``Decision.by`` when the approval's timeout decided it."""


def approval_id_of(identity: str, turn_id: str, position: int) -> str:
    """The approval asked by ``identity``'s turn at ``position``: the same on every replay, short enough for a URL."""
    return hashlib.sha256(f"{identity}\x1f{turn_id}\x1f{position}".encode()).hexdigest()[:24]


def encode_value(what: str, value: Any) -> bytes:
    """``value`` as the registry keeps it (as a step's value, never spilled).

    Raises:
        InvalidSpecError: it cannot be encoded, or is over 256 KiB encoded.
    """
    try:
        blob = encode_output(value)
    except Exception as error:
        raise InvalidSpecError(f"the {what} cannot be encoded: {type(error).__name__}: {error}",
                               field="data") from error
    if len(blob) > SPILL_THRESHOLD:
        raise InvalidSpecError(f"the {what} is {len(blob)} bytes encoded, over {SPILL_THRESHOLD}; keep it in "
                               f"storage and pass where it is", field="data")
    return blob


def check_request(subject: object, approvers: Iterable[str], timeout: float | None, on_timeout: str) -> tuple[str, ...]:
    """Refuse a malformed ``self.approval(...)``; returns the approvers as a tuple.

    Raises:
        UsageError: naming the argument and what it must be.
    """
    if not isinstance(subject, str) or not subject:
        raise UsageError(f"self.approval(subject) needs a non-empty subject, got {subject!r}", api="self.approval")
    if isinstance(approvers, str):
        raise UsageError(f"self.approval(approvers=) takes a list of names, got the string {approvers!r}",
                         api="self.approval")
    names = tuple(approvers)
    if not all(isinstance(name, str) and name for name in names):
        raise UsageError(f"self.approval(approvers=) takes non-empty names, got {names!r}", api="self.approval")
    if timeout is not None and (not isinstance(timeout, (int, float)) or isinstance(timeout, bool)
                                or not math.isfinite(timeout) or timeout < 0):
        raise UsageError(f"self.approval(timeout=) must be a number of seconds >= 0 or None, got {timeout!r}",
                         api="self.approval")
    if on_timeout not in ON_TIMEOUT:
        raise UsageError(f"self.approval(on_timeout=) must be one of {', '.join(map(repr, ON_TIMEOUT))}, got "
                         f"{on_timeout!r}", api="self.approval")
    return names


def decision_of(row: ApprovalRow) -> Decision:
    """The decision a decided approval's row holds."""
    return Decision(approved=row.status == "APPROVED", by=row.decided_by, comment=row.comment,
                    data=None if row.decision_data is None else decode_output(row.decision_data, None))


def approval_info(row: ApprovalRow) -> ApprovalInfo:
    """The public view of a registry row (data decoded)."""
    return ApprovalInfo(
        id=row.approval_id, identity=row.identity, turn_id=row.turn_id, run_id=row.run_id, subject=row.subject,
        data=decode_output(row.data, None), approvers=row.approvers, status=row.status, version=row.version,
        decided_by=row.decided_by, comment=row.comment,
        decision_data=None if row.decision_data is None else decode_output(row.decision_data, None),
        created=row.created, decided=row.decided, due=row.due, on_timeout=row.on_timeout,
        audit=tuple(json.loads(row.audit)),
    )
