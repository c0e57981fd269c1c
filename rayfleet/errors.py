"""The one error tree of rayfleet.

Every error rayfleet raises derives from :class:`RayfleetError`::

    RayfleetError
    ├── InvalidSpecError (also ValueError)        bad identity, spec, class, option or roster
    ├── InvalidArgumentsError (also TypeError)    handler arguments that do not fit the handler
    ├── UnknownIdentityError (also KeyError)      no agent of that name exists
    ├── UnknownHandlerError (also AttributeError) the agent class has no such handler
    ├── NotAddressableError                       an INTERNAL_ONLY agent called from outside
    ├── InvalidStateError                         the lifecycle state forbids the operation
    ├── LeaseLostError                            this host no longer owns the identity
    ├── StaleFencingTokenError                    a write presented a superseded token
    ├── StaleCheckpointVersionError               a checkpoint version did not increase
    ├── SnapshotError                             a checkpoint file is missing or corrupt
    ├── NotWiredError                             a send to a peer that is not wired
    ├── DeadlineExceededError (also TimeoutError) a call did not finish in time
    ├── BudgetExceededError                       a workflow spent more than its budget
    ├── StepFailedError                           a workflow step failed
    ├── RunCancelledError                         a workflow run was cancelled
    ├── HandlerError                              the user's handler raised
    └── FleetUnavailableError                     no host could serve the request

Ray pickles exceptions that cross actor boundaries, so every error here carries
its typed attributes through ``__reduce__`` and round-trips through pickle.
Every message says what was wrong and what to do about it.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "BudgetExceededError",
    "DeadlineExceededError",
    "FleetUnavailableError",
    "HandlerError",
    "InvalidArgumentsError",
    "InvalidSpecError",
    "InvalidStateError",
    "LeaseLostError",
    "NotAddressableError",
    "NotWiredError",
    "RayfleetError",
    "RunCancelledError",
    "SnapshotError",
    "StaleCheckpointVersionError",
    "StaleFencingTokenError",
    "StepFailedError",
    "UnknownHandlerError",
    "UnknownIdentityError",
]


class RayfleetError(Exception):
    """Root of every error rayfleet raises.

    Subclasses take keyword-only, typed attributes and build their message from
    them; ``__reduce__`` replays those keywords so the error survives pickling.
    """

    def __init__(self, message: str, **attributes: Any) -> None:
        super().__init__(message)
        self.message = message
        self._attributes = attributes
        for name, value in attributes.items():
            setattr(self, name, value)

    def __reduce__(self) -> Any:
        return (_rebuild_error, (type(self), self.message, self._attributes))

    def __str__(self) -> str:
        return self.message

    @property
    def cause(self) -> BaseException | None:
        """The exception this one was raised from, if any."""
        return self.__cause__


def _rebuild_error(cls: type[RayfleetError], message: str, attributes: dict[str, Any]) -> RayfleetError:
    error = cls.__new__(cls)
    RayfleetError.__init__(error, message, **attributes)
    return error


class InvalidSpecError(RayfleetError, ValueError):
    """An identity, spec, agent class, option or roster is not valid.

    Raised when the bad value is given, before anything is written.
    """

    def __init__(self, message: str, *, subject: str = "") -> None:
        super().__init__(message, subject=subject)


class InvalidArgumentsError(RayfleetError, TypeError):
    """Arguments given to a handler do not fit its signature or types."""

    def __init__(self, *, identity: str, method: str, detail: str) -> None:
        super().__init__(
            f"arguments for {method!r} on {identity!r} are not valid: {detail}. "
            f"Pass keyword arguments matching the handler's signature.",
            identity=identity,
            method=method,
            detail=detail,
        )


class UnknownIdentityError(RayfleetError, KeyError):
    """No agent with this identity exists (never spawned, or deleted)."""

    def __init__(self, *, identity: str) -> None:
        super().__init__(
            f"unknown identity {identity!r}: no agent of that name exists. "
            f"Spawn it first with fleet.spawn({identity!r}, AgentClass).",
            identity=identity,
        )

    def __str__(self) -> str:  # KeyError would otherwise quote the message
        return self.message


class UnknownHandlerError(RayfleetError, AttributeError):
    """The agent class has no handler of that name."""

    def __init__(self, *, identity: str, method: str, available: tuple[str, ...]) -> None:
        listing = ", ".join(available) or "none"
        super().__init__(
            f"agent {identity!r} has no handler {method!r} (handlers: {listing}). "
            f"Decorate the method with @rf.handler or call one of the listed names.",
            identity=identity,
            method=method,
            available=available,
        )


class NotAddressableError(RayfleetError):
    """An ``INTERNAL_ONLY`` agent was called from outside the fleet."""

    def __init__(self, *, identity: str) -> None:
        super().__init__(
            f"agent {identity!r} is INTERNAL_ONLY and refuses messages from outside the fleet. "
            f"Reach it from a peer agent or a workflow, or respawn it as ADDRESSABLE.",
            identity=identity,
        )


class InvalidStateError(RayfleetError):
    """The identity's lifecycle state does not allow the operation."""

    def __init__(self, *, identity: str, state: str, operation: str, hint: str = "") -> None:
        fix = hint or _STATE_HINTS.get(state, "Check fleet.status() and retry when the agent is ACTIVE or DORMANT.")
        super().__init__(
            f"cannot {operation} {identity!r} in state {state}. {fix}",
            identity=identity,
            state=state,
            operation=operation,
            hint=hint,
        )


_STATE_HINTS = {
    "RETIRING": "The agent was retired; fleet.respawn() brings it back with its state.",
    "BROKEN": "Its checkpoint cannot be used; see fleet.status() for the reason, "
    "then fleet.respawn() after repairing storage or fleet.reset() to start fresh.",
    "SUSPENDED": "A lifecycle operation is in progress; retry in a moment.",
}


class LeaseLostError(RayfleetError):
    """This host no longer owns the identity; another owner may have taken over."""

    def __init__(self, *, identity: str, detail: str = "") -> None:
        extra = f" ({detail})" if detail else ""
        super().__init__(
            f"lease lost for {identity!r}{extra}; another host may own it now. "
            f"Retry the call: the fleet re-routes it to the current owner.",
            identity=identity,
            detail=detail,
        )


class StaleFencingTokenError(RayfleetError):
    """A write presented a fencing token lower than the ledger's high-water mark."""

    def __init__(self, *, identity: str, presented: int, current: int) -> None:
        super().__init__(
            f"fencing token {presented} for {identity!r} is stale (ledger high-water is {current}); "
            f"another owner took over this identity. Drop the agent and let the new owner serve it.",
            identity=identity,
            presented=presented,
            current=current,
        )


class StaleCheckpointVersionError(RayfleetError):
    """A checkpoint did not advance the identity's checkpoint version."""

    def __init__(self, *, identity: str, presented: int, current: int) -> None:
        super().__init__(
            f"checkpoint version {presented} for {identity!r} is not newer than the committed "
            f"version {current}. Checkpoint versions must strictly increase; reload the agent.",
            identity=identity,
            presented=presented,
            current=current,
        )


class SnapshotError(RayfleetError):
    """A checkpoint file is missing, corrupt, or does not fit the agent's State."""

    def __init__(self, *, identity: str, location: str, detail: str) -> None:
        super().__init__(
            f"snapshot of {identity!r} at {location} cannot be used: {detail}. "
            f"Restore the file and call fleet.respawn({identity!r}), or fleet.reset({identity!r}) "
            f"to start from a fresh State.",
            identity=identity,
            location=location,
            detail=detail,
        )


class NotWiredError(RayfleetError):
    """A send to an identity that is not a wired peer under enforced topology."""

    def __init__(self, *, sender: str, target: str) -> None:
        super().__init__(
            f"{sender!r} is not wired to {target!r} and its topology is enforced. "
            f"Wire them with fleet.topology.wire({sender!r}, {target!r}) or list the peer in the spec.",
            sender=sender,
            target=target,
        )


class DeadlineExceededError(RayfleetError, TimeoutError):
    """A call did not complete before its timeout or deadline."""

    def __init__(self, *, identity: str, method: str, timeout: float) -> None:
        super().__init__(
            f"call {method!r} on {identity!r} did not finish within {timeout:g}s. "
            f"Raise timeout= or check fleet.status({identity!r}); the call may still complete.",
            identity=identity,
            method=method,
            timeout=timeout,
        )


class BudgetExceededError(RayfleetError):
    """A workflow run spent more than one of its budgets."""

    def __init__(self, *, budget: str, ceiling: float, spent: float) -> None:
        super().__init__(
            f"budget {budget!r} exceeded: spent {spent:g} of {ceiling:g}. "
            f"Raise the budget or make the workflow cheaper.",
            budget=budget,
            ceiling=ceiling,
            spent=spent,
        )


class StepFailedError(RayfleetError):
    """A workflow step failed after its retries."""

    def __init__(self, *, step: str, detail: str) -> None:
        super().__init__(
            f"step {step!r} failed: {detail}",
            step=step,
            detail=detail,
        )


class RunCancelledError(RayfleetError):
    """A workflow run was cancelled."""

    def __init__(self, *, run_id: str) -> None:
        super().__init__(f"run {run_id!r} was cancelled.", run_id=run_id)


class HandlerError(RayfleetError):
    """The user's handler raised; carries the remote type, message and traceback."""

    def __init__(self, *, identity: str, method: str, remote_type: str, remote_message: str, remote_traceback: str) -> None:
        super().__init__(
            f"handler {method!r} of {identity!r} raised {remote_type}: {remote_message}",
            identity=identity,
            method=method,
            remote_type=remote_type,
            remote_message=remote_message,
            remote_traceback=remote_traceback,
        )


class FleetUnavailableError(RayfleetError):
    """No live host could serve the request."""

    def __init__(self, *, detail: str) -> None:
        super().__init__(
            f"the fleet cannot serve this request: {detail}. "
            f"Check that Ray is running and that rayfleet hosts are alive (fleet.hosts()).",
            detail=detail,
        )


class Retryable(RayfleetError):
    """Raise from a handler to ask for the turn to be retried with backoff.

    Timeouts and connection errors are retried too; every other exception is final and
    dead-letters the message.
    """

    def __init__(self, message: str = "retryable failure") -> None:
        super().__init__(message)


def is_retryable(error: BaseException) -> bool:
    """Whether a handler error is worth another attempt."""
    return isinstance(error, (Retryable, TimeoutError, ConnectionError))
