"""The delivery pipeline of a host: the gates every message passes, retries, dead letters, pause.

Order of the gates (DESIGN.md section 7, specs/delivery-and-pause.md): addressability,
lifecycle state, pause, conversation fence, dedup, deadline, then the handler with
retries, the commit per durability, and the reply.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import traceback
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import cloudpickle

from ..errors import (
    DeadlineExceededError,
    HandlerError,
    InvalidArgumentsError,
    InvalidStateError,
    LeaseLostError,
    NotAddressableError,
    RayfleetError,
    StaleCheckpointVersionError,
    StaleFencingTokenError,
    UnknownHandlerError,
    is_retryable,
)
from ..identity._agent import HandlerInfo, Reply, Usage, run_handler
from ..identity._values import Addressability, Durability, EventKind
from ._hosted import HostedAgent, TurnResult
from ._messages import DeadLetterReason, Envelope

if TYPE_CHECKING:
    from ..ledger._contract import LedgerClient

log = logging.getLogger("rayfleet.pipeline")


class DeliveryPipeline:
    """The message path of :class:`~rayfleet.identity.HostRuntime` (a mixin it inherits).

    It relies on the runtime for activation (``_activate``), leases
    (``_ensure_healthy_lease``), commits (``_commit``) and events (``_emit``).
    """

    _entries: dict[str, HostedAgent]
    _ledger: LedgerClient
    _counters: dict[str, int]
    _parked_waiters: dict[str, asyncio.Future[TurnResult]]
    _refused_internal: set[str]

    async def _activate(self, identity: str) -> HostedAgent:
        raise NotImplementedError

    async def _ensure_healthy_lease(self, entry: HostedAgent) -> None:
        raise NotImplementedError

    async def _commit(self, entry: HostedAgent) -> int:
        raise NotImplementedError

    def _emit(self, identity: str, kind: EventKind, **details: Any) -> None:
        raise NotImplementedError

    # -- turns ----------------------------------------------------------------------

    async def deliver(
        self,
        identity: str,
        method: str,
        args: tuple[Any, ...] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        sender: str | None = None,
        idempotency_key: str | None = None,
        deadline: float | None = None,
        conversation: str | None = None,
        fence: int | None = None,
    ) -> TurnResult:
        """Build an :class:`Envelope` and deliver it (see :meth:`deliver_envelope`)."""
        return await self.deliver_envelope(Envelope(
            target=identity, method=method, args=tuple(args), kwargs=dict(kwargs or {}), sender=sender,
            idempotency_key=idempotency_key, deadline=deadline, conversation=conversation, fence=fence,
        ))

    async def deliver_envelope(self, envelope: Envelope) -> TurnResult:
        """Run one message through the gates and, if it passes, one turn of its handler.

        Gates, in order (DESIGN.md section 7): addressability, lifecycle state, pause
        (park durably and wait for the resume), conversation fence, dedup (a duplicate
        gets the original reply), deadline, then the handler with retries, the commit
        per durability, and the reply. Refused and failed messages go to the dead-letter
        log with the original envelope, except addressability and lifecycle refusals,
        which the caller can act on directly.

        Raises:
            NotAddressableError: an outside caller tried an ``INTERNAL_ONLY`` agent.
            OwnedElsewhere: another live host holds the lease (internal; the caller re-routes).
            StaleFencingTokenError: the conversation fence is below one already seen.
            DeadlineExceededError: the deadline passed before the turn ran.
            UnknownIdentityError, InvalidStateError, UnknownHandlerError,
            InvalidArgumentsError, HandlerError, LeaseLostError, SnapshotError.
        """
        identity = envelope.target
        entry = self._entries.get(identity)
        if entry is None:
            try:
                entry = await self._activate(identity)
            except InvalidStateError:
                if envelope.sender is None and identity in self._refused_internal:
                    raise NotAddressableError(identity=identity) from None
                raise
        if envelope.sender is None and entry.spec.addressability is Addressability.INTERNAL_ONLY:
            raise NotAddressableError(identity=identity)
        info = entry.agent.__rayfleet_handlers__.get(envelope.method)
        if info is None:
            raise UnknownHandlerError(
                identity=identity, method=envelope.method, available=type(entry.agent).handler_names()
            )
        try:
            bound = info.bind(identity, envelope.args, envelope.kwargs)
        except InvalidArgumentsError as error:
            await self._dead_letter(envelope, DeadLetterReason.DECODE_FAILED, error.message, attempts=0)
            raise
        waiter: asyncio.Future[TurnResult] | None = None
        async with entry.turn_lock:
            if entry.dropped:
                # Deactivated or fenced while this message waited: activate again and retry.
                return await self.deliver_envelope(envelope)
            if entry.paused:
                waiter = await self._park(entry, envelope)
            else:
                return await self._turn(entry, envelope, info, bound)
        # Parked: wait, outside the turn lock, until a resume replays the message.
        return await waiter

    async def _turn(self, entry: HostedAgent, envelope: Envelope, info: HandlerInfo, bound: dict[str, Any]) -> TurnResult:
        """The gates after pause, then the handler (caller holds the turn lock)."""
        identity = envelope.target
        if envelope.fence is not None and envelope.conversation is not None:
            previous = entry.fences.high_water(envelope.conversation)
            if not entry.fences.accept(envelope.conversation, envelope.fence, time.time()):
                current = entry.fences.high_water(envelope.conversation) or 0
                error = StaleFencingTokenError(identity=identity, presented=envelope.fence, current=current)
                await self._dead_letter(envelope, DeadLetterReason.STALE_FENCE, error.message, attempts=0)
                raise error
            if previous != envelope.fence:
                # A raised high-water mark must outlive this owner even when the turn changes no State.
                entry.dirty = True
        key = envelope.dedup_key()
        if key is not None:
            original = entry.dedup.get(key)
            if original is not None:
                self._counters["duplicates"] += 1
                value, usage = cloudpickle.loads(original)
                return TurnResult(value=value, usage=usage, checkpoint_version=entry.checkpoint_version, duplicate=True)
        if envelope.deadline is not None and time.time() > envelope.deadline:
            error = DeadlineExceededError(identity=identity, method=envelope.method,
                                          timeout=max(envelope.deadline - envelope.sent_at, 0.0))
            await self._dead_letter(envelope, DeadLetterReason.DEADLINE_EXCEEDED, error.message, attempts=0)
            raise error
        await self._ensure_healthy_lease(entry)
        value, usage = await self._run_with_retries(entry, envelope, info, bound)
        if key is not None:
            reply = cloudpickle.dumps((value, usage))
            entry.dedup.insert(key, reply)
            entry.pending_dedup.append((key, reply))
            entry.dirty = True
        if entry.dirty and entry.spec.durability is Durability.EVERY_TURN:
            await self._commit(entry)
        return TurnResult(value=value, usage=usage, checkpoint_version=entry.checkpoint_version)

    async def _run_with_retries(
        self, entry: HostedAgent, envelope: Envelope, info: HandlerInfo, bound: dict[str, Any]
    ) -> tuple[Any, Usage]:
        policy = entry.spec.retry
        for attempt in range(policy.max_attempts):
            before = entry.agent.state.model_copy(deep=True)
            self._counters["turns"] += 1
            entry.last_used = self._clock()
            try:
                outcome = await run_handler(info, entry.agent, bound)
            except Exception as error:
                # A failed attempt leaves State as it was: the next one starts from the same place.
                entry.agent.state = before
                self._counters["handler_errors"] += 1
                retry = is_retryable(error) and attempt + 1 < policy.max_attempts
                if retry:
                    await asyncio.sleep(policy.delay_for(attempt))
                    continue
                failure = HandlerError(
                    identity=envelope.target,
                    method=envelope.method,
                    remote_type=f"{type(error).__module__}.{type(error).__qualname__}",
                    remote_message=str(error),
                    remote_traceback=traceback.format_exc(),
                )
                reason = DeadLetterReason.RETRIES_EXHAUSTED if is_retryable(error) else DeadLetterReason.REJECTED
                await self._dead_letter(envelope, reason, failure.message, attempts=attempt + 1)
                raise failure from None
            # A turn that changed nothing (a read) needs no checkpoint.
            if entry.agent.state != before:
                entry.dirty = True
            if isinstance(outcome, Reply):
                return outcome.value, outcome.usage
            return outcome, Usage()
        raise AssertionError("unreachable: the last attempt either returns or raises")

    async def _dead_letter(self, envelope: Envelope, reason: DeadLetterReason, error: str, *, attempts: int) -> None:
        self._counters["dead_letters"] += 1
        try:
            payload = cloudpickle.dumps(envelope)
        except Exception as problem:  # unpicklable arguments: keep what can be kept, readably
            payload = cloudpickle.dumps(dataclasses.replace(
                envelope, args=(), kwargs={"unpicklable_arguments": repr((envelope.args, envelope.kwargs))[:2000]}
            ))
            error = f"{error} (arguments could not be stored: {problem})"
        try:
            await self._ledger.add_dead_letter(
                identity=envelope.target, message_id=envelope.message_id, envelope=payload, reason=reason.value,
                error=error, attempts=attempts,
            )
        except Exception as problem:
            log.error("could not record dead letter for %s.%s: %s", envelope.target, envelope.method, problem)

    # -- pause and resume -----------------------------------------------------------

    async def _park(self, entry: HostedAgent, envelope: Envelope) -> asyncio.Future[TurnResult]:
        """Hold ``envelope`` durably (caller holds the turn lock); returns what its caller awaits."""
        waiter = self._parked_waiters.get(envelope.message_id)
        if waiter is None:
            waiter = asyncio.get_running_loop().create_future()
            self._parked_waiters[envelope.message_id] = waiter
        await self._ledger.park(
            identity=envelope.target, fencing_token=entry.grant.fencing_token, message_id=envelope.message_id,
            envelope=cloudpickle.dumps(envelope),
        )
        self._counters["parked"] += 1
        return waiter

    async def pause(self, identity: str) -> bool:
        """Park every later message of ``identity`` durably until :meth:`resume`."""
        entry = self._entries.get(identity) or await self._activate(identity)
        async with entry.turn_lock:
            await self._ledger.set_paused(identity=identity, fencing_token=entry.grant.fencing_token, paused=True)
            entry.paused = True
        self._emit(identity, EventKind.PAUSED)
        return True

    async def resume(self, identity: str) -> int:
        """Replay parked messages oldest first through the same gates, then accept new work.

        Messages that arrive during the replay are parked behind the older ones, so the
        order holds. A replayed message whose handler fails is dead-lettered like any
        other; it is never silently dropped. Returns how many messages were replayed.
        """
        entry = self._entries.get(identity) or await self._activate(identity)
        replayed = 0
        while True:
            batch = await self._ledger.parked(identity, limit=100)
            async with entry.turn_lock:
                if entry.dropped:
                    raise LeaseLostError(identity=identity, detail="the agent was dropped while resuming")
                if not batch:
                    # Nothing is parked and we hold the turn lock, so no message can park now.
                    await self._ledger.set_paused(
                        identity=identity, fencing_token=entry.grant.fencing_token, paused=False
                    )
                    entry.paused = False
                    break
                for stored in batch:
                    await self._replay(entry, stored.id, cloudpickle.loads(stored.envelope))
                    replayed += 1
        self._emit(identity, EventKind.RESUMED)
        return replayed

    async def _replay(self, entry: HostedAgent, seq: int, envelope: Envelope) -> None:
        waiter = self._parked_waiters.pop(envelope.message_id, None)
        info = entry.agent.__rayfleet_handlers__.get(envelope.method)
        try:
            if info is None:
                raise UnknownHandlerError(
                    identity=envelope.target, method=envelope.method, available=type(entry.agent).handler_names()
                )
            result = await self._turn(entry, envelope, info, info.bind(envelope.target, envelope.args, envelope.kwargs))
        except (LeaseLostError, StaleCheckpointVersionError) as error:
            # Ownership is gone: leave the message parked for the next owner.
            if waiter is not None:
                self._parked_waiters[envelope.message_id] = waiter
            raise LeaseLostError(identity=envelope.target, detail=str(error)) from error
        except RayfleetError as error:
            if isinstance(error, (UnknownHandlerError, InvalidArgumentsError)):
                await self._dead_letter(envelope, DeadLetterReason.DECODE_FAILED, error.message, attempts=0)
            if waiter is not None and not waiter.done():
                waiter.set_exception(error)
        else:
            if waiter is not None and not waiter.done():
                waiter.set_result(result)
        # Handled (or dead-lettered): only now is the parked copy forgotten.
        await self._ledger.unpark(identity=envelope.target, fencing_token=entry.grant.fencing_token, seq=seq)

    async def cancel_parked(self, identity: str) -> int:
        """Move every parked message of ``identity`` to the dead letters (reason CANCELLED)."""
        entry = self._entries.get(identity) or await self._activate(identity)
        async with entry.turn_lock:
            parked = await self._ledger.parked(identity, limit=1_000_000)
            count = await self._ledger.cancel_parked(identity=identity, fencing_token=entry.grant.fencing_token)
        for stored in parked:
            waiter = self._parked_waiters.pop(stored.message_id, None)
            if waiter is not None and not waiter.done():
                waiter.set_exception(InvalidStateError(
                    identity=identity, state="PAUSED", operation="deliver",
                    hint="The message was parked and then cancelled; it is in the dead-letter log.",
                ))
        return count
