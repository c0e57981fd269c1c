"""The one error tree of rayfleet.

Every error rayfleet raises derives from :class:`RayfleetError`, grouped by the
subsystem that failed, so ``except rf.DeliveryError`` or ``except rf.ModelError``
catches one kind of failure without naming every leaf::

    RayfleetError
    ├── UsageError (also RuntimeError)                the API was used in a way it does not support
    │   └── NotInAgentContextError                    a hosted-only agent attribute used outside a host
    ├── InvalidSpecError (also ValueError)            a bad spec, identity or option (field names which)
    ├── IdentityError                                 an agent's identity, lease or checkpoint
    │   ├── UnknownIdentityError (also KeyError)      no agent of that name exists
    │   ├── InvalidStateError                         the lifecycle state forbids the operation
    │   ├── LeaseLostError                            this host no longer owns the identity
    │   ├── StaleFencingTokenError                    a write presented a superseded token
    │   ├── StaleCheckpointVersionError               a checkpoint version did not increase
    │   └── SnapshotError                             a checkpoint file is missing or corrupt
    ├── DeliveryError                                 a message to an agent
    │   ├── NotAddressableError                       an INTERNAL_ONLY agent called from outside
    │   ├── NotWiredError                             a send to a peer that is not wired
    │   ├── PeerCycleError                            a peer send back into a turn waiting on it
    │   ├── UnknownHandlerError (also AttributeError) the agent class has no such handler
    │   ├── InvalidArgumentsError (also TypeError)    handler arguments that do not fit the handler
    │   ├── HandlerError                              the user's handler raised
    │   ├── DeadlineExceededError (also TimeoutError) a call did not finish in time
    │   ├── StaleSequenceError                        a conversation's sequence went backwards
    │   ├── UnknownDeadLetterError (also KeyError)    no dead letter has that id
    │   └── RetryableError                            raised by a handler: retry this turn with backoff
    ├── TurnError                                     a durable turn: its journal, suspension or mailbox
    │   ├── NonDeterminismError                       a replayed turn reached a different step than its journal
    │   ├── StepOutcomeUnknownError                   a step was started but its outcome was never journaled
    │   ├── StepValueError                            a step's value cannot be journaled (not picklable)
    │   ├── TurnInterruptedError                      the turn was cancelled by an INTERRUPT message or cancel()
    │   ├── AgentBusyError                            a REJECT message found a turn in progress
    │   ├── WaitTimeoutError                          a durable wait (signal, approval) timed out
    │   ├── ApprovalConflictError                     an approval was already decided, or its version moved
    │   ├── UnknownApprovalError (also KeyError)      no approval has that id
    │   └── UnknownTurnEventError (also ValueError)   a stream resumed after an id that is not its turn's
    ├── WorkflowError                                 a workflow run
    │   ├── StepFailedError                           a workflow step failed
    │   ├── BudgetExceededError                       a workflow spent more than its budget
    │   ├── RunCancelledError                         a workflow run was cancelled
    │   ├── UnknownRunError (also KeyError)           no run has that id
    │   ├── RunOwnedElsewhereError                    another live engine holds the run (or its step)
    │   └── StaleRunTokenError                        an engine's run token was superseded
    ├── ModelError                                    a chat model server (url names which)
    │   ├── ModelRequestError                         the server refused the request (HTTP 4xx)
    │   ├── ModelResponseError (also ValueError)      the server answered something malformed
    │   ├── ModelTimeoutError (also TimeoutError)     one request took longer than the client's timeout
    │   └── ModelUnavailableError                     429, 5xx or connection failures outlasted the retries
    ├── LedgerError                                   the ledger database itself
    │   ├── LedgerUnavailableError (also ConnectionError) the database cannot be reached now; retry
    │   ├── LedgerSchemaError                         the database was written by a newer rayfleet
    │   └── FleetMismatchError                        the ledger and the storage belong to different fleets
    ├── StorageError                                  the checkpoint storage (snapshot files) itself
    │   └── StorageUnavailableError                   the storage refused a write (full, read-only, unreachable); retry
    ├── FleetUnavailableError                         no host could serve the request
    │   └── FleetNotFoundError                        no running fleet to attach to (connect(create=False))
    └── InternalError                                 a rayfleet bug: an invariant did not hold

Ray pickles exceptions that cross actor boundaries, so every error here carries
its typed attributes through ``__reduce__`` and round-trips through pickle.
Every message says what was wrong and what to do about it, and ``str(error)`` is
that message, also for the errors that are a ``KeyError`` too.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = [
    "AgentBusyError",
    "ApprovalConflictError",
    "BudgetExceededError",
    "DeadlineExceededError",
    "DeliveryError",
    "FleetMismatchError",
    "FleetNotFoundError",
    "FleetUnavailableError",
    "HandlerError",
    "IdentityError",
    "InternalError",
    "InvalidArgumentsError",
    "InvalidSpecError",
    "InvalidStateError",
    "LeaseLostError",
    "LedgerError",
    "LedgerSchemaError",
    "LedgerUnavailableError",
    "ModelError",
    "ModelRequestError",
    "ModelResponseError",
    "ModelTimeoutError",
    "ModelUnavailableError",
    "NonDeterminismError",
    "NotAddressableError",
    "NotInAgentContextError",
    "NotWiredError",
    "PeerCycleError",
    "RayfleetError",
    "RetryableError",
    "RunCancelledError",
    "RunOwnedElsewhereError",
    "SnapshotError",
    "StaleCheckpointVersionError",
    "StaleFencingTokenError",
    "StaleRunTokenError",
    "StaleSequenceError",
    "StepFailedError",
    "StepOutcomeUnknownError",
    "StepValueError",
    "StorageError",
    "StorageUnavailableError",
    "TurnError",
    "TurnInterruptedError",
    "UnknownApprovalError",
    "UnknownDeadLetterError",
    "UnknownHandlerError",
    "UnknownIdentityError",
    "UnknownRunError",
    "UnknownTurnEventError",
    "UsageError",
    "WaitTimeoutError",
    "WorkflowError",
    "is_retryable",
]


class RayfleetError(Exception):
    """Root of every error rayfleet raises.

    Subclasses take keyword-only, typed attributes and build their message from
    them; ``__reduce__`` replays those keywords so the error survives pickling.

    Attributes:
        message: what was wrong and what to do about it; ``str(error)`` returns it.
    """

    message: str

    def __init__(self, message: str, **attributes: Any) -> None:
        super().__init__(message)
        self.message = message
        self._attributes = attributes
        for name, value in attributes.items():
            setattr(self, name, value)

    def __reduce__(self) -> Any:
        return (_rebuild_error, (type(self), self.message, self._attributes))

    def __str__(self) -> str:
        # Defined here so it precedes KeyError.__str__, which would quote the message, in every leaf's MRO.
        return self.message

    @property
    def cause(self) -> BaseException | None:
        """The exception this one was raised from, if any."""
        return self.__dict__.get("_cause", self.__cause__)

    @cause.setter
    def cause(self, value: BaseException | None) -> None:
        # Ray wraps an error raised in a task in a subclass of both RayTaskError and the
        # error's class, whose __init__ assigns ``self.cause``; without a setter Ray gives up
        # and the caller gets a bare RayTaskError instead of the typed error.
        self.__dict__["_cause"] = value


def _rebuild_error(cls: type[RayfleetError], message: str, attributes: dict[str, Any]) -> RayfleetError:
    # Leaf constructors differ in signature; restoring the message and fields directly works for every leaf.
    error = cls.__new__(cls)
    RayfleetError.__init__(error, message, **attributes)
    return error


# --------------------------------------------------------------------------- misuse of the API


class UsageError(RayfleetError, RuntimeError):
    """The API was used in a way it does not support; the message names the supported way.

    Attributes:
        api: the function or attribute that was misused, e.g. ``"fleet.run()"``.
    """

    api: str

    def __init__(self, message: str, *, api: str) -> None:
        super().__init__(message, api=api)


class NotInAgentContextError(UsageError):
    """An agent attribute that only a hosted agent has was used outside a host.

    Attributes:
        attribute: the attribute that was read, e.g. ``"identity"``.
    """

    def __init__(self, *, attribute: str) -> None:
        super().__init__(
            f"self.{attribute} is only available while the agent is hosted by a fleet. "
            f"Spawn the agent with fleet.spawn() and call it through a ref.",
            api=f"self.{attribute}",
        )

    @property
    def attribute(self) -> str:
        return self.api.removeprefix("self.")


class InvalidSpecError(RayfleetError, ValueError):
    """An identity, spec, agent class, option or roster is not valid.

    Raised when the bad value is given, before anything is written.

    Attributes:
        field: the spec field, option or argument that is wrong, e.g. ``"identity"``
            or ``"timeout"`` (a workflow step's label for a bad step).
    """

    field: str

    def __init__(self, message: str, *, field: str) -> None:
        super().__init__(message, field=field)


# --------------------------------------------------------------------------- identities, leases, checkpoints


class IdentityError(RayfleetError):
    """An agent identity's record, lease or checkpoint did not allow the operation.

    Attributes:
        identity: the agent concerned.
    """

    identity: str


class UnknownIdentityError(IdentityError, KeyError):
    """No agent with this identity exists (never spawned, or deleted)."""

    def __init__(self, *, identity: str) -> None:
        super().__init__(
            f"unknown identity {identity!r}: no agent of that name exists. "
            f"Spawn it first with fleet.spawn({identity!r}, AgentClass).",
            identity=identity,
        )


class InvalidStateError(IdentityError):
    """The identity's lifecycle state does not allow the operation.

    Attributes:
        state: the lifecycle state the identity is in.
        operation: what was attempted, e.g. ``"call"``.
        hint: the fix given in place of the usual one for ``state``, if any.
    """

    state: str
    operation: str
    hint: str

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


class LeaseLostError(IdentityError):
    """This host no longer owns the identity; another owner may have taken over.

    Attributes:
        detail: what showed the lease was gone, if known.
    """

    detail: str

    def __init__(self, *, identity: str, detail: str = "") -> None:
        extra = f" ({detail})" if detail else ""
        super().__init__(
            f"lease lost for {identity!r}{extra}; another host may own it now. "
            f"Retry the call: the fleet re-routes it to the current owner.",
            identity=identity,
            detail=detail,
        )


class StaleFencingTokenError(IdentityError):
    """A write presented a fencing token lower than the ledger's high-water mark.

    Attributes:
        presented: the token the write carried.
        current: the ledger's high-water token for the identity.
    """

    presented: int
    current: int

    def __init__(self, *, identity: str, presented: int, current: int) -> None:
        super().__init__(
            f"fencing token {presented} for {identity!r} is stale (ledger high-water is {current}); "
            f"another owner took over this identity. Drop the agent and let the new owner serve it.",
            identity=identity,
            presented=presented,
            current=current,
        )


class StaleCheckpointVersionError(IdentityError):
    """A checkpoint did not advance the identity's checkpoint version.

    Attributes:
        presented: the version the checkpoint carried.
        current: the committed version.
    """

    presented: int
    current: int

    def __init__(self, *, identity: str, presented: int, current: int) -> None:
        super().__init__(
            f"checkpoint version {presented} for {identity!r} is not newer than the committed "
            f"version {current}. Checkpoint versions must strictly increase; reload the agent.",
            identity=identity,
            presented=presented,
            current=current,
        )


class SnapshotError(IdentityError):
    """A checkpoint (a snapshot file, or a small State kept in the ledger) is missing, corrupt, or unfit.

    Attributes:
        location: where the snapshot was looked for: ``<file>#<row>``, or
            ``ledger:<identity>`` for a State kept in the ledger.
        detail: what is wrong with it.
    """

    location: str
    detail: str

    def __init__(self, *, identity: str, location: str, detail: str) -> None:
        repair = "Deploy a State class that reads it" if location.startswith("ledger:") else "Restore the file"
        super().__init__(
            f"snapshot of {identity!r} at {location} cannot be used: {detail}. "
            f"{repair} and call fleet.respawn({identity!r}), or fleet.reset({identity!r}) "
            f"to start from a fresh State.",
            identity=identity,
            location=location,
            detail=detail,
        )


# --------------------------------------------------------------------------- delivering messages


class DeliveryError(RayfleetError):
    """A message could not be delivered to an agent, or its handler failed."""


class NotAddressableError(DeliveryError):
    """An ``INTERNAL_ONLY`` agent was called from outside the fleet.

    Attributes:
        identity: the agent that refused the message.
    """

    identity: str

    def __init__(self, *, identity: str) -> None:
        super().__init__(
            f"agent {identity!r} is INTERNAL_ONLY and refuses messages from outside the fleet. "
            f"Reach it from a peer agent or a workflow, or respawn it as ADDRESSABLE.",
            identity=identity,
        )


class NotWiredError(DeliveryError):
    """A send to an identity that is not a wired peer under enforced topology.

    Attributes:
        sender: the agent that sent.
        target: the agent it is not wired to.
    """

    sender: str
    target: str

    def __init__(self, *, sender: str, target: str) -> None:
        super().__init__(
            f"{sender!r} is not wired to {target!r} and its topology is enforced. "
            f"Wire them with fleet.topology.wire({sender!r}, {target!r}) or list the peer in the spec.",
            sender=sender,
            target=target,
        )


class PeerCycleError(DeliveryError):
    """A peer send whose target's turn is already waiting, directly or not, on the sender.

    Sending would deadlock: the target cannot take the message until its own waiting
    turn ends, and that turn waits on this send.

    Attributes:
        cycle: the identities around the loop, from the target's waiting turn to the target again.
        method: the handler the refused send named.
    """

    cycle: tuple[str, ...]
    method: str

    def __init__(self, *, cycle: tuple[str, ...], method: str) -> None:
        super().__init__(
            f"sending {method!r} to {cycle[0]!r} would wait on a turn that waits on this one "
            f"({' -> '.join(cycle)}). A handler cannot call an agent that is waiting on it: return the value "
            f"instead, or send the return leg with tell so nobody waits",
            cycle=cycle,
            method=method,
        )


class UnknownHandlerError(DeliveryError, AttributeError):
    """The agent class has no handler of that name.

    Attributes:
        identity: the agent called.
        method: the handler name asked for.
        available: the handlers the agent class has.
    """

    identity: str
    method: str
    available: tuple[str, ...]

    def __init__(self, *, identity: str, method: str, available: tuple[str, ...]) -> None:
        listing = ", ".join(available) or "none"
        super().__init__(
            f"agent {identity!r} has no handler {method!r} (handlers: {listing}). "
            f"Decorate the method with @rf.handler or call one of the listed names.",
            identity=identity,
            method=method,
            available=available,
        )


class InvalidArgumentsError(DeliveryError, TypeError):
    """Arguments given to a handler do not fit its signature or types.

    Attributes:
        identity: the agent called.
        method: the handler called.
        detail: which arguments are wrong and how.
    """

    identity: str
    method: str
    detail: str

    def __init__(self, *, identity: str, method: str, detail: str) -> None:
        super().__init__(
            f"arguments for {method!r} on {identity!r} are not valid: {detail}. "
            f"Pass keyword arguments matching the handler's signature.",
            identity=identity,
            method=method,
            detail=detail,
        )


class HandlerError(DeliveryError):
    """The user's handler raised; carries the remote type, message and traceback.

    Attributes:
        identity: the agent whose handler raised.
        method: the handler that raised.
        remote_type: the raised exception's ``module.QualifiedName``.
        remote_message: ``str()`` of the raised exception.
        remote_traceback: the formatted traceback, from the host.
    """

    identity: str
    method: str
    remote_type: str
    remote_message: str
    remote_traceback: str

    def __init__(
        self, *, identity: str, method: str, remote_type: str, remote_message: str, remote_traceback: str
    ) -> None:
        super().__init__(
            f"handler {method!r} of {identity!r} raised {remote_type}: {remote_message}",
            identity=identity,
            method=method,
            remote_type=remote_type,
            remote_message=remote_message,
            remote_traceback=remote_traceback,
        )

    @property
    def raised_retryable(self) -> bool:
        """Whether the handler raised :class:`RetryableError`: ``remote_type``'s name ends in ``RetryableError``.

        Only the type's name crosses the actor boundary, so a subclass of ``RetryableError``
        with a name not ending in ``RetryableError`` does not count.
        """
        return self.remote_type.endswith("RetryableError")


class DeadlineExceededError(DeliveryError, TimeoutError):
    """A call did not complete before its timeout or deadline.

    Attributes:
        identity: the agent called (a run id for ``fleet.runs.wait``).
        method: the handler called (``"wait"`` for ``fleet.runs.wait``).
        timeout: the seconds allowed.
    """

    identity: str
    method: str
    timeout: float

    def __init__(self, *, identity: str, method: str, timeout: float) -> None:
        super().__init__(
            f"call {method!r} on {identity!r} did not finish within {timeout:g}s. "
            f"Raise timeout= or check fleet.status({identity!r}); the call may still complete.",
            identity=identity,
            method=method,
            timeout=timeout,
        )


class UnknownDeadLetterError(DeliveryError, KeyError):
    """No dead letter has this id: it was never recorded, or was replayed or purged.

    Attributes:
        letter_id: the id asked for.
    """

    letter_id: int

    def __init__(self, *, letter_id: int) -> None:
        super().__init__(
            f"there is no dead letter {letter_id}; list them with fleet.dead_letters()",
            letter_id=letter_id,
        )


class StaleSequenceError(DeliveryError):
    """A message's conversation sequence is lower than one the agent already saw in that conversation.

    The caller's own numbering went backwards (a late or replayed message of an earlier
    exchange): the message was not run and is in the dead-letter log. Nothing is wrong
    with the agent or its owner.

    Attributes:
        identity: the agent that refused the message.
        conversation: the conversation the message named.
        presented: the sequence the message carried.
        current: the highest sequence the agent has seen in that conversation.
    """

    identity: str
    conversation: str
    presented: int
    current: int

    def __init__(self, *, identity: str, conversation: str, presented: int, current: int) -> None:
        super().__init__(
            f"sequence {presented} of conversation {conversation!r} to {identity!r} is stale: the agent has "
            f"already seen sequence {current} there, so the message was not run (it is in the dead-letter log). "
            f"Send it again with a sequence of at least {current}, or in a new conversation.",
            identity=identity,
            conversation=conversation,
            presented=presented,
            current=current,
        )


class RetryableError(DeliveryError):
    """Raise from a handler to ask for the turn to be retried with backoff.

    Timeouts and connection errors are retried too; every other exception is final and
    dead-letters the message. See :func:`is_retryable`.

    Attributes:
        retry_after: the least seconds to wait before the next attempt (a rate limit's
            ``Retry-After``, say); ``None`` leaves the wait to the retry policy. The host
            waits the longer of the two.
    """

    retry_after: float | None

    def __init__(self, message: str = "retryable failure", *, retry_after: float | None = None) -> None:
        if retry_after is not None and (isinstance(retry_after, bool) or not isinstance(retry_after, (int, float))
                                        or not 0 <= retry_after < math.inf):
            raise InvalidSpecError(
                f"retry_after must be a finite, non-negative number of seconds or None, got {retry_after!r}",
                field="retry_after",
            )
        super().__init__(message, retry_after=retry_after)


# --------------------------------------------------------------------------- durable turns


class TurnError(RayfleetError):
    """A durable turn could not go on: its journal disagreed, it was cancelled or refused, or a wait failed."""


class NonDeterminismError(TurnError):
    """A replayed turn asked for something other than what its journal holds at the same position.

    A turn that is run again (its host died, or it resumes after a suspension) must
    reach the same steps, sleeps, signals and approvals in the same order as before;
    the handler changed between the runs, or it branches on something that is not
    journaled (the clock, randomness, a read outside a step). The turn fails; nothing
    of it is committed.

    Attributes:
        identity: the agent.
        turn_id: the turn (its message id).
        position: the journal position where the runs parted.
        journaled: what the journal holds there (``kind:name``).
        requested: what the handler asked for this time (``kind:name``).
    """

    identity: str
    turn_id: str
    position: int
    journaled: str
    requested: str

    def __init__(self, *, identity: str, turn_id: str, position: int, journaled: str, requested: str) -> None:
        super().__init__(
            f"turn {turn_id!r} of {identity!r} is not deterministic: at position {position} its journal holds "
            f"{journaled!r} but the handler asked for {requested!r} this time. Keep everything a handler branches "
            f"on inside self.step(...) (clock, randomness, outside reads), and deploy a changed handler only "
            f"once no turn of the old one is in progress (fleet.turns(identity) lists them).",
            identity=identity, turn_id=turn_id, position=position, journaled=journaled, requested=requested,
        )


class StepOutcomeUnknownError(TurnError):
    """Raised inside a handler: a step with ``policy="unknown"`` was started but its outcome was never journaled.

    Its host died between starting the function and journaling the result, so the
    effect may or may not have happened. The handler decides (look the effect up by
    ``step_key``, ask a person, give up); the decision is journaled like any outcome.

    Attributes:
        identity: the agent.
        turn_id: the turn.
        step: the step's name.
        step_key: the step's stable key (``identity:turn:position``), to look the effect up by.
    """

    identity: str
    turn_id: str
    step: str
    step_key: str

    def __init__(self, *, identity: str, turn_id: str, step: str, step_key: str) -> None:
        super().__init__(
            f"step {step!r} of turn {turn_id!r} of {identity!r} was started but its outcome was never journaled "
            f"(its host stopped in between); it may or may not have taken effect. Look the effect up by its "
            f"step key {step_key!r}, or run the step with policy='retry' when running it twice is harmless.",
            identity=identity, turn_id=turn_id, step=step, step_key=step_key,
        )


class StepValueError(TurnError):
    """A step's value (or error) cannot be journaled: it cannot be serialized.

    The step ran; its outcome is not journaled and the turn fails, so a retry runs it
    again. Return something cloudpickle (or Arrow, or a pydantic model) can encode.

    Attributes:
        identity: the agent.
        turn_id: the turn.
        step: the step's name.
        detail: why the value could not be encoded.
    """

    identity: str
    turn_id: str
    step: str
    detail: str

    def __init__(self, *, identity: str, turn_id: str, step: str, detail: str) -> None:
        super().__init__(
            f"the value of step {step!r} of turn {turn_id!r} of {identity!r} cannot be journaled: {detail}. "
            f"Return a value cloudpickle can encode (plain data, a pydantic model, an Arrow table), or return "
            f"what is needed to rebuild it.",
            identity=identity, turn_id=turn_id, step=step, detail=detail,
        )


class TurnInterruptedError(TurnError):
    """The turn was cancelled by an ``INTERRUPT`` message or ``TurnHandle.cancel()``; nothing of it was committed.

    Attributes:
        identity: the agent.
        turn_id: the interrupted turn.
        by: what interrupted it (the interrupting message's id, or ``"cancel"``).
    """

    identity: str
    turn_id: str
    by: str

    def __init__(self, *, identity: str, turn_id: str, by: str) -> None:
        super().__init__(
            f"turn {turn_id!r} of {identity!r} was interrupted ({by}); its State and unfinished steps were "
            f"discarded, nothing of it was committed. Send the message again if it is still wanted.",
            identity=identity, turn_id=turn_id, by=by,
        )


class AgentBusyError(TurnError):
    """A message sent with ``mode="reject"`` found a turn of the agent in progress; it was not run.

    Attributes:
        identity: the agent.
        turn_id: the turn in progress (running or suspended).
        status: that turn's status (``RUNNING`` or ``SUSPENDED``).
    """

    identity: str
    turn_id: str
    status: str

    def __init__(self, *, identity: str, turn_id: str, status: str) -> None:
        super().__init__(
            f"{identity!r} is busy with turn {turn_id!r} ({status}); the message was refused and not run. "
            f"Send it again later, or with mode='queue' to wait its turn or mode='steer' to join the running turn.",
            identity=identity, turn_id=turn_id, status=status,
        )


class WaitTimeoutError(TurnError):
    """Raised inside a handler: a durable wait (``wait_signal``, ``approval``) reached its timeout first.

    Not a ``TimeoutError``: the turn is not retried for it (a replay would meet the same
    journaled timeout). Catch it in the handler to decide what a timeout means.

    Attributes:
        identity: the agent.
        turn_id: the turn.
        waiting_for: what it waited for (``signal:<name>`` or ``approval:<id>``).
        timeout: the timeout in seconds.
    """

    identity: str
    turn_id: str
    waiting_for: str
    timeout: float

    def __init__(self, *, identity: str, turn_id: str, waiting_for: str, timeout: float) -> None:
        super().__init__(
            f"turn {turn_id!r} of {identity!r} waited {timeout:g} s for {waiting_for} and it did not come; "
            f"catch WaitTimeoutError in the handler to decide what a timeout means.",
            identity=identity, turn_id=turn_id, waiting_for=waiting_for, timeout=timeout,
        )


class ApprovalConflictError(TurnError):
    """A decision on an approval was refused: it was decided already, or its version moved past ``expect_version``.

    Nothing was changed. The error names who decided first, so a console can say
    "already approved by alice".

    Attributes:
        approval_id: the approval.
        status: its status now (``APPROVED``, ``REJECTED``, or ``PENDING`` on a version mismatch).
        decided_by: who decided it (``""`` while pending).
        version: its version now.
    """

    approval_id: str
    status: str
    decided_by: str
    version: int

    def __init__(self, *, approval_id: str, status: str, decided_by: str, version: int) -> None:
        if status == "PENDING":
            why = f"approval {approval_id!r} changed since you read it (it is at version {version} now)"
        else:
            why = f"approval {approval_id!r} was already {status.lower()} by {decided_by or 'someone'}"
        super().__init__(
            f"{why}; your decision was not applied. Read it again with fleet.approvals.get({approval_id!r}).",
            approval_id=approval_id, status=status, decided_by=decided_by, version=version,
        )


class UnknownApprovalError(TurnError, KeyError):
    """No approval has this id.

    Attributes:
        approval_id: the id asked for.
    """

    approval_id: str

    def __init__(self, *, approval_id: str) -> None:
        super().__init__(
            f"there is no approval {approval_id!r}; list pending ones with fleet.approvals.list() "
            f"or `rayfleet approvals list`",
            approval_id=approval_id,
        )


class UnknownTurnEventError(TurnError, ValueError):
    """A stream was asked to resume after an event id that is not one of its turn's.

    Raised for an id that is not ``<epoch>.<sequence>`` (optionally ``.<delta>``), or that
    names a persisted event of another turn of the identity.

    Attributes:
        identity: the agent.
        turn_id: the turn whose stream was asked for.
        event_id: the id given.
        detail: what is wrong with it.
    """

    identity: str
    turn_id: str
    event_id: str
    detail: str

    def __init__(self, *, identity: str, turn_id: str, event_id: str, detail: str) -> None:
        super().__init__(
            f"event id {event_id!r} cannot resume the stream of turn {turn_id!r} of {identity!r}: {detail}. Pass "
            f"the id of the last event this client got from this turn's stream, or none to read it from its start",
            identity=identity, turn_id=turn_id, event_id=event_id, detail=detail,
        )


# --------------------------------------------------------------------------- workflow runs


class WorkflowError(RayfleetError):
    """A workflow run failed, was stopped, or does not exist."""


class StepFailedError(WorkflowError):
    """A workflow step failed after its retries.

    Attributes:
        step: the step's label.
        detail: why it failed.
    """

    step: str
    detail: str

    def __init__(self, *, step: str, detail: str) -> None:
        super().__init__(
            f"step {step!r} failed: {detail}",
            step=step,
            detail=detail,
        )


class BudgetExceededError(WorkflowError):
    """A workflow run spent more than one of its budgets.

    Attributes:
        budget: which budget, e.g. ``"tokens"``.
        ceiling: the budget's limit.
        spent: what the run spent.
    """

    budget: str
    ceiling: float
    spent: float

    def __init__(self, *, budget: str, ceiling: float, spent: float) -> None:
        super().__init__(
            f"budget {budget!r} exceeded: spent {spent:g} of {ceiling:g}. "
            f"Raise the budget or make the workflow cheaper.",
            budget=budget,
            ceiling=ceiling,
            spent=spent,
        )


class RunCancelledError(WorkflowError):
    """A workflow run was cancelled.

    Attributes:
        run_id: the run.
    """

    run_id: str

    def __init__(self, *, run_id: str) -> None:
        super().__init__(f"run {run_id!r} was cancelled.", run_id=run_id)


class UnknownRunError(WorkflowError, KeyError):
    """No workflow run has this id.

    Attributes:
        run_id: the id asked for.
    """

    run_id: str

    def __init__(self, *, run_id: str) -> None:
        super().__init__(f"there is no run {run_id!r}; list runs with fleet.runs.list_runs()", run_id=run_id)


class RunOwnedElsewhereError(WorkflowError):
    """A run (or one exclusive step of it) is held by another live engine; nothing was done.

    Raised when an engine asks for a run's lease while another holder's lease is live,
    and when it asks for an exclusive step's lease that another holder still has.

    Attributes:
        run_id: the run.
        owner: the holder of the lease (``driver:...`` or ``runner:<namespace>:...``).
        expires_in: seconds until that lease lapses unless its holder renews it.
        step: the exclusive step whose lease is held, or ``""`` for the run's own lease.
    """

    run_id: str
    owner: str
    expires_in: float
    step: str

    def __init__(self, *, run_id: str, owner: str, expires_in: float, step: str = "") -> None:
        what = f"step {step!r} of run {run_id!r}" if step else f"run {run_id!r}"
        super().__init__(
            f"{what} is held by {owner} (its lease lapses in {max(expires_in, 0.0):.1f} s unless renewed); "
            f"one engine executes a run at a time. Follow it with fleet.runs.wait({run_id!r}); if that engine "
            f"is gone, start the run again once its lease has lapsed.",
            run_id=run_id,
            owner=owner,
            expires_in=expires_in,
            step=step,
        )


class StaleRunTokenError(WorkflowError):
    """An engine wrote for a run with a fencing token that is no longer the run's current one.

    Another engine took the run over (its token is larger), or the lease was given up.
    The refused engine stops at once: it dispatches, compensates and records nothing more.

    Attributes:
        run_id: the run.
        presented: the token the write carried.
        current: the run's high-water token in the ledger.
    """

    run_id: str
    presented: int
    current: int

    def __init__(self, *, run_id: str, presented: int, current: int) -> None:
        if presented > current:
            why = f"token {presented} was never issued for run {run_id!r} (high-water {current})"
        elif presented == current:
            why = f"the lease of run {run_id!r} under token {presented} was given up"
        else:
            why = f"token {presented} for run {run_id!r} is stale (high-water {current}): another engine took it over"
        super().__init__(
            f"{why}; this engine stopped without writing anything more. Follow the run with "
            f"fleet.runs.get({run_id!r}).",
            run_id=run_id,
            presented=presented,
            current=current,
        )


# --------------------------------------------------------------------------- chat model servers


class ModelError(RayfleetError):
    """A chat model server failed, refused the request, or answered something unusable.

    Attributes:
        url: the endpoint the request went to.
    """

    url: str


class ModelRequestError(ModelError):
    """The server refused the request (an HTTP error other than 429 or 5xx); repeating it cannot help.

    Attributes:
        status: the HTTP status code.
        body_excerpt: the start of the response body, whitespace collapsed.
    """

    status: int
    body_excerpt: str

    def __init__(self, *, url: str, status: int, body_excerpt: str) -> None:
        super().__init__(
            f"chat completion at {url} failed with HTTP {status}: {body_excerpt!r}. "
            f"Check the api key, model name and parameters.",
            url=url,
            status=status,
            body_excerpt=body_excerpt,
        )


class ModelResponseError(ModelError, ValueError):
    """The server answered with a body that is not a chat completion.

    Attributes:
        detail: which part of the response is missing or malformed, with an excerpt.
    """

    detail: str

    def __init__(self, *, url: str, detail: str) -> None:
        super().__init__(
            f"{detail} (from {url}). Check that the server speaks the OpenAI chat completions API.",
            url=url,
            detail=detail,
        )


class ModelTimeoutError(ModelError, TimeoutError):
    """One request took longer than the client's timeout; it was not retried.

    Attributes:
        timeout: the seconds one request may take (a streamed one: the longest wait for its next chunk).
        streamed: the request was a streamed one, which stalled.
    """

    timeout: float
    streamed: bool

    def __init__(self, *, url: str, timeout: float, streamed: bool = False) -> None:
        waited = (f"sent nothing of its streamed reply for {timeout:g}s" if streamed
                  else f"did not finish within {timeout:g}s")
        super().__init__(
            f"chat completion at {url} {waited}. Raise the client's timeout= or ask for fewer tokens; it was "
            f"not retried because the server may still be generating it.",
            url=url,
            timeout=timeout,
            streamed=streamed,
        )


class ModelUnavailableError(ModelError):
    """HTTP 429, 5xx or connection failures lasted through every retry, or a stream broke off.

    Attributes:
        attempts: requests sent, the first included.
        last_failure: what the last attempt ran into.
        retry_after: the seconds the server's last ``Retry-After`` asked for, when that was
            longer than the client waits (``None`` otherwise).
    """

    attempts: int
    last_failure: str
    retry_after: float | None

    def __init__(self, *, url: str, attempts: int, last_failure: str, retry_after: float | None = None) -> None:
        advice = ("Check that the server is up, or raise max_retries." if retry_after is None else
                  f"The server asked to wait {retry_after:g}s, longer than the client's max_retry_after: try "
                  f"again then, or raise max_retry_after.")
        super().__init__(
            f"chat completion at {url} failed after {attempts} attempt(s); last: {last_failure}. {advice}",
            url=url,
            attempts=attempts,
            last_failure=last_failure,
            retry_after=retry_after,
        )


# --------------------------------------------------------------------------- the fleet itself


# --------------------------------------------------------------------------- the ledger database


class LedgerError(RayfleetError):
    """Base of failures of the ledger database itself (not refusals of a write by its rules)."""


class LedgerUnavailableError(LedgerError, ConnectionError):
    """The ledger database cannot be reached now (down, restarting, or the network failed).

    Retryable: nothing was changed, or, when ``committed_unknown`` is true, a write may
    or may not have been committed (the connection broke during the commit); a retry of
    a fenced write then meets the fencing rules, never a double effect.

    Attributes:
        location: the database (no password).
        detail: the driver's error.
        committed_unknown: the connection broke while committing.
    """

    location: str
    detail: str
    committed_unknown: bool

    def __init__(self, *, location: str, detail: str, committed_unknown: bool = False) -> None:
        outcome = " (the last write may or may not have been committed)" if committed_unknown else ""
        super().__init__(
            f"the ledger at {location} cannot be reached: {detail}{outcome}. It is retried by rayfleet where that "
            f"is safe; check that the database is up and reachable from every node",
            location=location, detail=detail, committed_unknown=committed_unknown,
        )


class LedgerSchemaError(LedgerError):
    """The ledger database has a schema version newer than this rayfleet knows.

    Attributes:
        location: the database (no password).
        found: the database's schema version.
        known: the newest version this rayfleet knows.
    """

    location: str
    found: int
    known: int

    def __init__(self, *, location: str, found: int, known: int) -> None:
        super().__init__(
            f"the ledger at {location} has schema version {found}, but this rayfleet knows only up to {known}; "
            f"upgrade rayfleet on every node (pip install -U rayfleet) to open it",
            location=location, found=found, known=known,
        )


class FleetMismatchError(LedgerError):
    """The ledger and the storage root record different fleets, or the ledger is empty over an existing fleet.

    Starting anyway would issue fencing token 1 again for identities whose snapshots
    exist, so the old owners' writes could be accepted and the state forgotten.

    Attributes:
        ledger: the ledger database (no password).
        storage: the storage root.
        ledger_fleet: the fleet id the ledger records (``None``: an empty or new database).
        storage_fleet: the fleet id the storage records.
    """

    ledger: str
    storage: str
    ledger_fleet: str | None
    storage_fleet: str | None

    def __init__(self, *, ledger: str, storage: str, ledger_fleet: str | None, storage_fleet: str | None) -> None:
        if ledger_fleet is None:
            problem = (f"the storage {storage} belongs to fleet {storage_fleet}, but the ledger {ledger} is empty "
                       f"(a new or wiped database)")
        else:
            problem = (f"the storage {storage} belongs to fleet {storage_fleet}, but the ledger {ledger} belongs to "
                       f"fleet {ledger_fleet}")
        super().__init__(
            f"{problem}; refusing to start, because fencing tokens would start again. Point connect(ledger=...) "
            f"at that fleet's ledger (or restore it from backup), or use a fresh storage folder for a new fleet",
            ledger=ledger, storage=storage, ledger_fleet=ledger_fleet, storage_fleet=storage_fleet,
        )


class StorageError(RayfleetError):
    """Base of failures of the checkpoint storage itself (not of one snapshot's content)."""


class StorageUnavailableError(StorageError):
    """The checkpoint storage refused a write: the disk is full, the folder is read-only, the store is unreachable.

    Retryable: nothing was committed. The call that needed the checkpoint did not take
    effect (its agent goes back to the last committed State), so the caller may send it
    again once the storage accepts writes.

    Attributes:
        root: the storage root (no credentials).
        detail: the filesystem's error.
    """

    root: str
    detail: str

    def __init__(self, *, root: str, detail: str) -> None:
        super().__init__(
            f"the checkpoint storage {root} refused a write: {detail}. Nothing was committed; free space or "
            f"make the storage writable again (check mounts, permissions, credentials), then retry",
            root=root, detail=detail,
        )


class FleetUnavailableError(RayfleetError):
    """No live host could serve the request.

    Attributes:
        detail: what was tried and how it failed.
    """

    detail: str

    def __init__(self, *, detail: str) -> None:
        super().__init__(
            f"the fleet cannot serve this request: {detail}. "
            f"Check that Ray is running and that rayfleet hosts are alive (fleet.hosts()).",
            detail=detail,
        )


class FleetNotFoundError(FleetUnavailableError):
    """There is no running fleet to attach to: ``connect(create=False)`` found nothing and created nothing.

    Attributes:
        missing: what was looked for and not found (a fleet marker in the storage, a Ray
            cluster, the fleet's ledger actor in the namespace).
        remedy: what to do about it.
        detail: the same as ``missing`` (as for every ``FleetUnavailableError``).
    """

    missing: str
    remedy: str

    def __init__(self, *, missing: str, remedy: str) -> None:
        RayfleetError.__init__(
            self, f"no fleet to attach to: {missing}; {remedy}", missing=missing, remedy=remedy, detail=missing,
        )


class InternalError(RayfleetError):
    """An invariant of rayfleet itself did not hold: a bug, never a usage problem.

    Attributes:
        detail: the invariant that failed.
    """

    detail: str

    def __init__(self, *, detail: str) -> None:
        super().__init__(
            f"internal error: {detail}. This is a rayfleet bug; please report it with the host log.",
            detail=detail,
        )


def is_retryable(error: BaseException, *, handler_failures: bool = False) -> bool:
    """Whether a failed attempt is worth another.

    :class:`RetryableError`, :class:`StorageUnavailableError`, any ``TimeoutError`` (so
    :class:`DeadlineExceededError` and :class:`ModelTimeoutError` too) and any
    ``ConnectionError`` (so :class:`LedgerUnavailableError` too) are; nothing else is.

    Args:
        error: what the attempt raised.
        handler_failures: also count a :class:`HandlerError` whose handler raised
            ``RetryableError``. A caller that reaches handlers through the fleet (the
            workflow engine) sees their failures only as ``HandlerError``. The host
            leaves it off: a ``HandlerError`` a handler got from a peer has already
            had that peer's own retries.
    """
    if isinstance(error, (RetryableError, StorageUnavailableError, TimeoutError, ConnectionError)):
        return True
    return handler_failures and isinstance(error, HandlerError) and error.raised_retryable
