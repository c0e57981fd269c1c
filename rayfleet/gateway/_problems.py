"""How failures read over HTTP: a status code and the JSON body ``{"error": {type, message, field}}``.

Every answer that is not a success goes through :class:`HttpProblem`, so clients see one
shape whatever failed; rayfleet errors keep their own message (which says what to do)
and never a traceback.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pydantic

from ..errors import (
    ApprovalConflictError,
    DeadlineExceededError,
    FleetUnavailableError,
    HandlerError,
    InvalidArgumentsError,
    InvalidSpecError,
    InvalidStateError,
    LeaseLostError,
    LedgerUnavailableError,
    ModelError,
    NotAddressableError,
    NotWiredError,
    PeerCycleError,
    RayfleetError,
    RunOwnedElsewhereError,
    StaleFencingTokenError,
    StaleRunTokenError,
    StaleSequenceError,
    StorageUnavailableError,
    UnknownApprovalError,
    UnknownDeadLetterError,
    UnknownHandlerError,
    UnknownIdentityError,
    UnknownRunError,
    UnknownTurnEventError,
    UsageError,
    is_retryable,
)

RETRY_AFTER_SECONDS = 1
"""What a 503 answer suggests a client wait: about one lease renewal, after which a moved identity is served."""

MAX_VALIDATION_PROBLEMS = 5
"""Validation problems listed in one message; the rest are counted."""


class HttpProblem(Exception):
    """A request the gateway answers with an error status and the JSON error body.

    Attributes:
        status: the HTTP status code.
        type: a stable name for the kind of problem (a rayfleet error's class name, or
            a gateway name such as ``Unauthorized``).
        message: what was wrong and what to do.
        field: the request field at fault (``agents.0.agent``, ``limit``, ...), if one is.
        headers: extra response headers (``WWW-Authenticate``, ``Retry-After``).
    """

    def __init__(self, status: int, type: str, message: str, *, field: str | None = None,
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.type = type
        self.message = message
        self.field = field
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return {"error": {"type": self.type, "message": self.message, "field": self.field}}


# First match wins: subclasses before their bases.
_STATUSES: tuple[tuple[type[RayfleetError], int, str | None], ...] = (
    (InvalidArgumentsError, 400, "body"),
    (InvalidSpecError, 400, None),
    (UsageError, 400, None),
    (UnknownIdentityError, 404, "identity"),
    (UnknownHandlerError, 404, "method"),
    (UnknownRunError, 404, "run_id"),
    (UnknownDeadLetterError, 404, "letter_id"),
    (UnknownApprovalError, 404, "approval_id"),
    (UnknownTurnEventError, 400, "event_id"),
    (ApprovalConflictError, 409, "approval_id"),
    (NotAddressableError, 403, "identity"),
    (DeadlineExceededError, 504, "timeout"),
    (HandlerError, 502, None),
    (ModelError, 502, None),
    (InvalidStateError, 409, "identity"),
    (StaleFencingTokenError, 409, None),
    (StaleSequenceError, 409, "sequence"),
    (StaleRunTokenError, 409, "run_id"),
    (RunOwnedElsewhereError, 409, "run_id"),
    (PeerCycleError, 409, None),
    (NotWiredError, 409, None),
)
_UNAVAILABLE = (FleetUnavailableError, LedgerUnavailableError, StorageUnavailableError, LeaseLostError)


def problem_for(error: RayfleetError) -> HttpProblem:
    """The answer for a rayfleet error: its status, its class name as ``type``, its message.

    Errors a retry can cure (the fleet, ledger or storage unavailable now, a lease that
    moved) are 503 with ``Retry-After``; a call that timed out is 504 (it may still
    complete, so a retry should reuse its ``Idempotency-Key``); a handler that raised is
    502, the gateway having worked and the agent failed. A ``HandlerError`` carries the
    remote traceback, which stays on the server: only its type and message are sent.
    """
    name = type(error).__name__
    for kind, status, field in _STATUSES:
        if isinstance(error, kind):
            where = getattr(error, "field", None) if isinstance(error, InvalidSpecError) else field
            headers = {"Retry-After": str(RETRY_AFTER_SECONDS)} if status == 504 else None
            return HttpProblem(status, name, error.message, field=where, headers=headers)
    if isinstance(error, _UNAVAILABLE) or is_retryable(error):
        return HttpProblem(503, name, error.message, headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
    return HttpProblem(500, name, error.message)


def validation_problem(error: pydantic.ValidationError) -> HttpProblem:
    """A 400 naming the first field pydantic refused (dotted, e.g. ``agents.0.identity``) and listing the problems."""
    problems = error.errors(include_url=False, include_input=False)
    texts = []
    for problem in problems[:MAX_VALIDATION_PROBLEMS]:
        where = dotted(problem["loc"])
        texts.append(f"{where}: {problem['msg']}" if where else problem["msg"])
    more = len(problems) - MAX_VALIDATION_PROBLEMS
    if more > 0:
        texts.append(f"and {more} more problem(s)")
    field = dotted(problems[0]["loc"]) if problems else None
    return HttpProblem(400, "ValidationError", "invalid request: " + "; ".join(texts), field=field or None)


def dotted(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(part) for part in loc)
