"""The approvals registry (table ``approvals``): requested by a waiting turn, decided once.

* A turn's request is kept once per approval id (stable across its replays); the
  request, and the suspension of the turn when it is still pending, are one fenced
  transaction, so a decision can never fall between the turn's check and its suspension.
* A decision is a compare-and-set on the status (and on the version when the decider
  read one): the second of two concurrent decisions changes nothing and is refused
  naming the first one's decider. Every request and decision is appended to the row's
  audit trail in the transaction that makes it.
* A decision makes the waiting turn due at once (through ``turns``' wake time).
"""

from __future__ import annotations

import json

from ..errors import ApprovalConflictError, InvalidSpecError, UnknownApprovalError
from . import _turns
from ._store import Row, Transaction
from ._turn_rows import ApprovalRequest, ApprovalResolved, ApprovalRow, TurnWake, TurnWrite

PENDING, APPROVED, REJECTED = "PENDING", "APPROVED", "REJECTED"
_COLUMNS = ("approval_id, identity, turn_id, run_id, position, subject, data, approvers, status, version, "
            "decided_by, comment, decision_data, created, decided, due, on_timeout, audit")


def waiting_for(approval_id: str) -> str:
    """``waiting_for`` of a turn suspended on an approval."""
    return "approval:" + approval_id


def request(
    tx: Transaction, *, identity: str, fencing_token: int, asked: ApprovalRequest, turn: TurnWrite, now: float,
) -> ApprovalRow:
    """Keep the approval (once per id) and, while it is pending, write ``turn`` (the suspension); return the row."""
    _turns.check_fence(tx, identity, fencing_token)
    tx.execute(
        f"INSERT INTO approvals ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 1, '', '', NULL, ?, NULL, ?, ?, ?) "
        "ON CONFLICT (approval_id) DO NOTHING",
        (asked.approval_id, identity, asked.turn_id, asked.run_id, asked.position, asked.subject, asked.data,
         json.dumps(list(asked.approvers)), PENDING, now, asked.due, asked.on_timeout,
         json.dumps([{"at": now, "action": "requested", "by": identity, "comment": asked.subject, "version": 1}])),
    )
    row = get(tx, asked.approval_id)
    assert row is not None  # inserted above, or there already
    if row.status == PENDING:
        _turns.write_checked(tx, identity=identity, turn=turn, now=now)
    return row


def resolve(
    tx: Transaction, *, approval_id: str, approved: bool, by: str, comment: str, data: bytes | None,
    expect_version: int | None, now: float,
) -> ApprovalResolved:
    """Decide a pending approval (compare-and-set); wake the turn waiting on it.

    Raises:
        UnknownApprovalError: no approval has that id.
        ApprovalConflictError: it is decided already, or its version is not ``expect_version``.
        InvalidSpecError: ``by`` is not one of its approvers.
    """
    current = get(tx, approval_id)
    if current is None:
        raise UnknownApprovalError(approval_id=approval_id)
    if current.status != PENDING or (expect_version is not None and expect_version != current.version):
        raise ApprovalConflictError(approval_id=approval_id, status=current.status, decided_by=current.decided_by,
                                    version=current.version)
    if current.approvers and by not in current.approvers and by != "timeout":
        raise InvalidSpecError(f"{by!r} may not decide approval {approval_id!r}: its approvers are "
                               f"{', '.join(current.approvers)}", field="by")
    status = APPROVED if approved else REJECTED
    audit = [*json.loads(current.audit), {"at": now, "action": status.lower(), "by": by, "comment": comment,
                                          "version": current.version + 1}]
    changed = tx.execute(
        "UPDATE approvals SET status = ?, version = version + 1, decided_by = ?, comment = ?, decision_data = ?, "
        "decided = ?, audit = ? WHERE approval_id = ? AND status = ? AND version = ?",
        (status, by, comment, data, now, json.dumps(audit), approval_id, PENDING, current.version)).rowcount
    if not changed:  # pragma: no cover - a serializable transaction sees no concurrent change
        raise ApprovalConflictError(approval_id=approval_id, status=current.status, decided_by=current.decided_by,
                                    version=current.version)
    woken = None
    if current.identity and _turns.wake(tx, identity=current.identity, turn_id=current.turn_id, now=now):
        (envelope,) = tx.execute("SELECT envelope FROM turns WHERE identity = ? AND turn_id = ?",
                                 (current.identity, current.turn_id)).fetchall()
        woken = TurnWake(identity=current.identity, turn_id=current.turn_id, envelope=bytes(envelope[0]),
                         waiting_for=waiting_for(approval_id), wake_at=now)
    decided = get(tx, approval_id)
    assert decided is not None
    return ApprovalResolved(approval=decided, woken=woken)


def get(tx: Transaction, approval_id: str) -> ApprovalRow | None:
    row = tx.execute(f"SELECT {_COLUMNS} FROM approvals WHERE approval_id = ?", (approval_id,)).fetchone()
    return None if row is None else _row(row)


def listing(tx: Transaction, *, status: str | None, identity: str | None, limit: int,
            run_id: str | None = None) -> list[ApprovalRow]:
    """Approvals with ``status`` (or any), of identities matching ``identity`` (a glob: ``support/*``) and
    asked in workflow run ``run_id`` (or any), oldest first."""
    where: list[str] = []
    parameters: list[object] = []
    if run_id is not None:
        where.append("run_id = ?")
        parameters.append(run_id)
    if status is not None:
        where.append("status = ?")
        parameters.append(status)
    if identity is not None:
        where.append("identity LIKE ? ESCAPE '!'")
        parameters.append(_like(identity))
    clause = f"WHERE {' AND '.join(where)} " if where else ""
    rows = tx.execute(f"SELECT {_COLUMNS} FROM approvals {clause}ORDER BY created, approval_id LIMIT ?",
                      (*parameters, limit)).fetchall()
    return [_row(row) for row in rows]


def drop(tx: Transaction, identity: str) -> None:
    """Forget the pending approvals of a deleted identity: nothing can take their decision now.

    Decided ones stay, listed and read as before: they are the audit trail of who
    decided what (a workflow's waiter is deleted when its run ends; its decisions are not).
    """
    tx.execute("DELETE FROM approvals WHERE identity = ? AND status = ?", (identity, PENDING))


def _like(pattern: str) -> str:
    """A glob (``*`` any run, ``?`` one character) as a LIKE pattern with ``!`` as its escape."""
    escaped = pattern.replace("!", "!!").replace("%", "!%").replace("_", "!_")
    return escaped.replace("*", "%").replace("?", "_")


def _row(row: Row) -> ApprovalRow:
    (approval_id, identity, turn_id, run_id, position, subject, data, approvers, status, version, decided_by,
     comment, decision_data, created, decided, due, on_timeout, audit) = row
    return ApprovalRow(
        approval_id=str(approval_id), identity=str(identity), turn_id=str(turn_id), run_id=str(run_id),
        position=int(position),
        subject=str(subject), data=bytes(data),
        approvers=tuple(json.loads(str(approvers))), status=str(status),
        version=int(version),
        decided_by=str(decided_by), comment=str(comment),
        decision_data=None if decision_data is None else bytes(decision_data),
        created=float(created),
        decided=None if decided is None else float(decided),
        due=None if due is None else float(due),
        on_timeout=str(on_timeout), audit=str(audit),
    )
