"""``fleet.approvals``: the approvals registry seen from a driver — list, get, resolve."""

from __future__ import annotations

from typing import Any

from ..errors import InvalidSpecError, UnknownApprovalError
from ..ledger._contract import LedgerClient
from ..turns._approvals import approval_info, encode_value
from ..turns._values import ApprovalInfo
from ._routing import Courier
from ._wakes import deliver_wakes

STATUSES = ("PENDING", "APPROVED", "REJECTED")


class ApprovalsClient:
    """The fleet's approvals (``fleet.approvals``): what turns asked people to decide, and their decisions.

    Every approval is decided once: :meth:`resolve` is a compare-and-set in the ledger,
    so of two concurrent decisions exactly one is applied and the other is refused with
    ``rf.ApprovalConflictError`` naming who decided first.
    """

    def __init__(self, ledger: LedgerClient, courier: Courier) -> None:
        self._ledger = ledger
        self._courier = courier

    def list(self, *, status: str | None = "PENDING", identity: str | None = None,
             limit: int = 1000, run_id: str | None = None) -> list[ApprovalInfo]:
        """Approvals with ``status`` (``None``: any) of identities matching the glob ``identity``, oldest first.

        ``identity="support/*"`` lists the approvals of every identity under ``support/``;
        ``run_id`` only those asked by the steps of that workflow run.

        Raises:
            InvalidSpecError: an unknown status or a limit below 1.
        """
        if status is not None and status.upper() not in STATUSES:
            raise InvalidSpecError(f"status must be one of {', '.join(STATUSES)} or None, got {status!r}",
                                   field="status")
        rows = self._ledger.approvals(status=None if status is None else status.upper(), identity=identity,
                                      limit=limit, run_id=run_id).result()
        return [approval_info(row) for row in rows]

    def get(self, approval_id: str) -> ApprovalInfo:
        """One approval, with its audit trail.

        Raises:
            UnknownApprovalError: no approval has that id.
        """
        row = self._ledger.approval(approval_id=approval_id).result()
        if row is None:
            raise UnknownApprovalError(approval_id=approval_id)
        return approval_info(row)

    def resolve(self, approval_id: str, *, approved: bool, by: str, comment: str = "", data: Any = None,
                expect_version: int | None = None) -> ApprovalInfo:
        """Decide a pending approval and resume the turn waiting on it; returns the approval as decided.

        ``expect_version`` (from a ``get`` or ``list``) applies the decision only if the
        approval has not changed since it was read.

        Raises:
            UnknownApprovalError: no approval has that id.
            ApprovalConflictError: it was decided already (naming by whom), or changed since ``expect_version``.
            InvalidSpecError: ``by`` is empty or not one of its approvers, ``approved`` is not a
                bool, or ``data`` cannot be encoded (or is over 256 KiB encoded).
        """
        if not isinstance(approved, bool):
            raise InvalidSpecError(f"approved must be True or False, got {approved!r}", field="approved")
        if not isinstance(by, str) or not by.strip():
            raise InvalidSpecError("by must name who decides (a non-empty string)", field="by")
        resolved = self._ledger.resolve_approval(
            approval_id=approval_id, approved=approved, by=by, comment=comment,
            data=None if data is None else encode_value(f"data of the decision on {approval_id!r}", data),
            expect_version=expect_version,
        ).result()
        if resolved.woken is not None:
            deliver_wakes(self._courier, [resolved.woken])
        return approval_info(resolved.approval)

    def approve(self, approval_id: str, *, by: str, comment: str = "", data: Any = None,
                expect_version: int | None = None) -> ApprovalInfo:
        """:meth:`resolve` with ``approved=True``."""
        return self.resolve(approval_id, approved=True, by=by, comment=comment, data=data,
                            expect_version=expect_version)

    def reject(self, approval_id: str, *, by: str, comment: str = "", data: Any = None,
               expect_version: int | None = None) -> ApprovalInfo:
        """:meth:`resolve` with ``approved=False``."""
        return self.resolve(approval_id, approved=False, by=by, comment=comment, data=data,
                            expect_version=expect_version)
