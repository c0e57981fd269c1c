"""The delivery path of a host: the gates every message passes, retries, dead letters, pause and resume.

Every message meets the same gates, in this order:

1. addressability: an outside caller (``sender is None``) never reaches an
   ``INTERNAL_ONLY`` agent, and learns nothing else about it;
2. lifecycle state: activation refuses a retired or broken identity;
3. the handler exists and the arguments bind to it;
4. pause: while the agent is paused the message is parked durably in the ledger
   and its caller waits until a resume replays it;
5. conversation sequence: a sequence below the conversation's high-water mark is refused;
6. dedup: a repeated idempotency key of the same sender, or a message id a
   state-changing turn already committed (a router's re-send after the host it sent
   the message to died), gets the original reply without running the handler;
7. deadline: a message whose deadline has passed is not run;
8. the handler, retried per the agent's ``RetryPolicy`` while it raises retryable
   errors; each failed attempt leaves State as it was before the attempt;
9. the commit, at once for ``EVERY_TURN`` durability, later for the others;
   under ``EVERY_TURN`` a key's reply is remembered only once its commit landed,
   so a turn whose commit failed is never answered as a duplicate. A workflow
   step's message (``Envelope.journal``) to an ``EVERY_TURN`` agent has its reply
   journaled as the step's output in that same commit, while the run's token is
   current: the step costs one durable write, and the engine journals it only when
   told nothing was (another durability, a duplicate, a large output, a stale token);
10. the reply.

A message refused for its arguments, a stale sequence or a passed deadline, or whose
handler fails for good, goes to the dead-letter log with its original envelope and
the reason. Addressability, lifecycle and unknown-handler refusals are not
dead-lettered: the caller gets a typed error it can act on at once. A replayed
parked message may have no caller left to tell, so there an unknown handler is
dead-lettered too. A lost lease is not dead-lettered: the caller retries with the
new owner, and a parked message stays parked for it.

Turns of one identity run one at a time under its turn lock; turns of different
identities run concurrently. Deadlines and sequence ages are wall-clock seconds because
they are compared with values other processes wrote (``Envelope.deadline`` is a
``time.time()`` value, sequence high-water marks travel with the checkpoint to the next
owner); idle accounting uses the runtime's monotonic clock. Both clocks are injected
so the gates can be tested without sleeping.

``Delivery`` holds no agents and takes no leases: it reads the runtime's entries and
asks the runtime, through :class:`~rayfleet.host._ports.ActivationPort`, to activate,
keep a lease healthy, checkpoint and publish events.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import traceback
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import cloudpickle

from ..checkpoints._step_outputs import SPILL_THRESHOLD, encode_output
from ..errors import (
    DeadlineExceededError,
    HandlerError,
    InvalidArgumentsError,
    InvalidStateError,
    LeaseLostError,
    NotAddressableError,
    RayfleetError,
    StaleSequenceError,
    UnknownHandlerError,
    is_retryable,
)
from ..identity._agent import run_handler
from ..identity._handlers import HandlerInfo, Reply, Usage
from ..identity._values import Addressability, Durability, EventKind
from ..ledger._values import StepEntry, StepJournaled
from ._hosted import HostDraining, HostedAgent, OwnedElsewhere, TurnResult
from ._messages import RECENT_REPLY_LIMIT, DeadLetterReason, Envelope
from ._ports import NO_METRICS, HostMetrics, MessageOutcome

if TYPE_CHECKING:
    from ..ledger._contract import LedgerClient
    from ._ports import ActivationPort

log = logging.getLogger("rayfleet.pipeline")

PARKED_REPLAY_BATCH = 100
"""Parked messages read from the ledger per round of a resume."""


@dataclasses.dataclass(slots=True)
class DeliveryCounters:
    """What the delivery path has counted since its host started (part of ``HostStatistics``)."""

    turns: int = 0
    """Handler attempts, retries included."""
    handler_errors: int = 0
    """Attempts that raised."""
    duplicates: int = 0
    """Messages answered from the dedup window without running the handler."""
    dead_letters: int = 0
    """Messages sent to the dead-letter log, counted even when recording one failed."""
    parked: int = 0
    """Messages parked because their agent was paused."""


UNKNOWN_AGENT_CLASS = "unknown"
"""The agent class a message is counted under when its target could not be hosted here."""


def message_outcome(error: BaseException) -> MessageOutcome:
    """The outcome a message that raised ``error`` is counted under."""
    if isinstance(error, HandlerError):
        return MessageOutcome.HANDLER_ERROR
    if isinstance(error, LeaseLostError):
        return MessageOutcome.LEASE_LOST
    if isinstance(error, (OwnedElsewhere, HostDraining)):
        return MessageOutcome.REDIRECTED
    if isinstance(error, DeadlineExceededError):
        return MessageOutcome.REFUSED  # the deadline gate: dead-lettered, like the other refusals
    if isinstance(error, RayfleetError) and not is_retryable(error):
        return MessageOutcome.REFUSED
    return MessageOutcome.ERROR


class _StoppedForLostLease(Exception):
    """A handler was cancelled because its agent was dropped for a lost lease."""


async def _run_stoppable(entry: HostedAgent, info: HandlerInfo, bound: dict[str, Any]) -> Any:
    """Run one handler attempt so that losing the lease stops it at its next ``await``.

    Handlers that can wait (coroutines, thread handlers) run as a task recorded on the
    entry; the runtime cancels it when it drops the entry for a lost lease. A plain
    function has no ``await`` to stop at, so it runs inline and the turn checks the
    lease after it returns. A thread handler's thread cannot be interrupted: its result
    is discarded with the dropped entry.

    Raises:
        _StoppedForLostLease: the handler was cancelled because the entry was dropped.
    """
    if not (info.is_coroutine or info.in_thread):
        return await run_handler(info, entry.agent, bound)
    task = asyncio.ensure_future(run_handler(info, entry.agent, bound))
    entry.handler_task = task
    try:
        await asyncio.wait({task})
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        entry.handler_task = None
    if task.cancelled() and entry.dropped:
        raise _StoppedForLostLease
    return task.result()


def _step_entry(journal: tuple[str, str, int], value: Any, usage: Usage) -> StepEntry | None:
    """The step output to journal with a turn's checkpoint, or ``None`` to leave the journaling to the engine.

    Encoded as the engine's journal encodes it, so a resumed run reads it back the same.
    An output too large for a ledger row (the engine writes it to a file first) or one
    that cannot be encoded is left to the engine, which reports the problem as a step failure.
    """
    run_id, label, run_token = journal
    try:
        output = encode_output(value)
    except Exception as error:  # noqa: BLE001 - the engine encodes it again and reports why it cannot
        log.debug("the output of step %r of run %r is left to the engine: %s", label, run_id, error)
        return None
    if len(output) > SPILL_THRESHOLD:
        return None
    return StepEntry(run_id=run_id, run_token=run_token, label=label, output=output,
                     tokens=max(0, usage.total_tokens))


class Delivery:
    """Runs messages through the gates and their handlers; one instance per host.

    Args:
        entries: the agents hosted now, by identity. The runtime adds and removes
            entries; delivery only reads the mapping, so it must be the runtime's live one.
        ledger: where parked messages, dead letters and the pause flag are kept.
        activations: the runtime's side of delivery (activation, lease health,
            checkpoints, events).
        clock: monotonic seconds, stamped on an entry when a turn starts so the
            runtime can deactivate idle agents.
        wall_clock: wall-clock seconds for deadlines and conversation sequences;
            ``time.time`` unless a test moves time by hand.
        metrics: where messages, dead letters and parked messages are counted.
    """

    def __init__(
        self,
        *,
        entries: Mapping[str, HostedAgent],
        ledger: LedgerClient,
        activations: ActivationPort,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        metrics: HostMetrics = NO_METRICS,
    ) -> None:
        self._entries = entries
        self._metrics = metrics
        self._ledger = ledger
        self._activations = activations
        self._clock = clock
        self._wall_clock = wall_clock
        # Callers of parked messages, by message id. Kept across a failed replay so the
        # caller still gets the answer when a later resume on this host replays it.
        self._parked_waiters: dict[str, asyncio.Future[TurnResult]] = {}
        self.counters = DeliveryCounters()

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
        sequence: int | None = None,
    ) -> TurnResult:
        """Build an :class:`Envelope` and deliver it (see :meth:`deliver_envelope`).

        Raises:
            InvalidSpecError: the message is malformed (see :class:`Envelope`).
        """
        return await self.deliver_envelope(Envelope(
            target=identity, method=method, args=tuple(args), kwargs=dict(kwargs or {}), sender=sender,
            idempotency_key=idempotency_key, deadline=deadline, conversation=conversation, sequence=sequence,
        ))

    async def deliver_envelope(self, envelope: Envelope) -> TurnResult:
        """Run one message through the gates and, if it passes, one turn of its handler.

        The gates run in the order the module describes. A paused agent parks the
        message durably and this call returns only when a resume has replayed it (or
        a cancel has dead-lettered it). An entry deactivated or fenced while the
        message waited for its turn is activated again and the message retried there.

        Raises:
            InvalidSpecError: a field of the envelope is malformed.
            NotAddressableError: an outside caller tried an ``INTERNAL_ONLY`` agent.
            OwnedElsewhere: another live host holds the lease (internal; the caller re-routes).
            HostDraining: this host takes no new activations (internal; the caller re-routes).
            StaleSequenceError: the conversation's sequence is below one already seen.
            DeadlineExceededError: the deadline passed before the turn ran.
            UnknownIdentityError, InvalidStateError, UnknownHandlerError,
            InvalidArgumentsError, HandlerError, LeaseLostError, SnapshotError.
        """
        # Timed and counted once per message, here: the retries below go to _deliver.
        started = self._clock()
        # Looked up before and after: the first message activates the entry, a lost lease drops it.
        before = self._entries.get(envelope.target)
        try:
            result = await self._deliver(envelope)
        except BaseException as error:
            entry = self._entries.get(envelope.target) or before
            self._metrics.message(UNKNOWN_AGENT_CLASS if entry is None else entry.agent_class,
                                  message_outcome(error), self._clock() - started)
            raise
        entry = self._entries.get(envelope.target) or before
        self._metrics.message(UNKNOWN_AGENT_CLASS if entry is None else entry.agent_class,
                              MessageOutcome.DUPLICATE if result.duplicate else MessageOutcome.OK,
                              self._clock() - started)
        return result

    async def _deliver(self, envelope: Envelope) -> TurnResult:
        envelope.check()  # it may come unpickled from another process, never validated here
        identity = envelope.target
        entry = await self._addressable_entry(envelope)
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
                return await self._deliver(envelope)
            if entry.paused:
                waiter = await self._park(entry, envelope)
            else:
                return await self._turn(entry, envelope, info, bound)
        # Parked: wait outside the turn lock, so the resume that replays it can take the lock.
        return await waiter

    async def _addressable_entry(self, envelope: Envelope) -> HostedAgent:
        """The addressability and lifecycle gates: the hosted entry of the target, activated if needed."""
        identity = envelope.target
        entry = self._entries.get(identity)
        if entry is None:
            try:
                entry = await self._activations.activate(identity)
            except InvalidStateError:
                # Addressability is checked first even when the agent cannot be activated,
                # so an outside caller does not learn the lifecycle of an internal agent.
                if envelope.sender is None and self._activations.is_internal_only(identity):
                    raise NotAddressableError(identity=identity) from None
                raise
        if envelope.sender is None and entry.spec.addressability is Addressability.INTERNAL_ONLY:
            raise NotAddressableError(identity=identity)
        return entry

    async def _turn(
        self, entry: HostedAgent, envelope: Envelope, info: HandlerInfo, bound: dict[str, Any]
    ) -> TurnResult:
        """The gates after pause, then the handler, the commit and the reply (caller holds the turn lock)."""
        await self._check_sequence(entry, envelope)
        key = envelope.dedup_key()
        remembered = self._remembered_reply(entry, envelope.message_key() if key is None else key)
        if remembered is not None:
            return remembered
        await self._check_deadline(envelope)
        await self._activations.ensure_healthy_lease(entry)
        value, usage = await self._run_with_retries(entry, envelope, info, bound)
        if entry.dropped:
            # The lease went while the handler ran: its State is not this host's to reply with.
            raise LeaseLostError(identity=envelope.target, detail="the lease was lost during the turn; retry the call")
        every_turn = entry.spec.durability is Durability.EVERY_TURN
        if key is not None:
            reply = cloudpickle.dumps((value, usage))
            entry.pending_dedup.append((key, reply))
            entry.dirty = True
            if not every_turn:
                # Answered before it is durable: the key is exactly as durable as the
                # State it guards, and both are committed together later.
                entry.dedup.insert(key, reply)
        elif entry.dirty:
            self._remember_message(entry, envelope, value, usage, every_turn=every_turn)
        step: StepJournaled | None = None
        if entry.dirty and every_turn:
            if key is not None and envelope.journal is not None:
                entry.pending_step = _step_entry(envelope.journal, value, usage)
            # The commit puts the key in the dedup window once it is durable; a failed
            # commit leaves no remembered reply for a turn that never happened.
            step = await self._activations.commit(entry)
        return TurnResult(value=value, usage=usage, checkpoint_version=entry.checkpoint_version, step=step)

    async def _check_sequence(self, entry: HostedAgent, envelope: Envelope) -> None:
        """Refuse (and dead-letter) a conversation sequence below the high-water mark; an equal one passes."""
        if envelope.sequence is None or envelope.conversation is None:
            return
        previous = entry.sequences.high_water(envelope.conversation)
        if not entry.sequences.accept(envelope.conversation, envelope.sequence, self._wall_clock()):
            current = entry.sequences.high_water(envelope.conversation) or 0
            error = StaleSequenceError(identity=envelope.target, conversation=envelope.conversation,
                                       presented=envelope.sequence, current=current)
            await self._dead_letter(envelope, DeadLetterReason.STALE_SEQUENCE, error.message, attempts=0)
            raise error
        if previous != envelope.sequence:
            # A raised high-water mark must outlive this owner even when the turn changes no State.
            entry.dirty = True

    @staticmethod
    def _remember_message(
        entry: HostedAgent, envelope: Envelope, value: Any, usage: Usage, *, every_turn: bool,
    ) -> None:
        """Remember the reply of a turn without a key that left unsaved State under its message key.

        That is a turn that changed State, and under ``PERIODIC`` or ``ON_DEACTIVATE`` any
        turn while a checkpoint is pending (see ``HostedAgent.recent_messages``).

        A reply too large to carry in every checkpoint is remembered in the ledger's
        dedup window instead, as an idempotency key would be.
        """
        key, reply = envelope.message_key(), cloudpickle.dumps((value, usage))
        if len(reply) <= RECENT_REPLY_LIMIT:
            entry.recent_messages.insert(key, reply)
            return
        entry.pending_dedup.append((key, reply))
        if not every_turn:
            entry.dedup.insert(key, reply)

    def _remembered_reply(self, entry: HostedAgent, key: str) -> TurnResult | None:
        """The original reply to ``key`` if the dedup window or the message-id window holds it, else ``None``."""
        original = entry.dedup.get(key) or entry.recent_messages.get(key)
        if original is None:
            return None
        self.counters.duplicates += 1
        value, usage = cloudpickle.loads(original)
        return TurnResult(value=value, usage=usage, checkpoint_version=entry.checkpoint_version, duplicate=True)

    async def _check_deadline(self, envelope: Envelope) -> None:
        """Refuse (and dead-letter) a message whose wall-clock deadline has passed."""
        if envelope.deadline is None or self._wall_clock() <= envelope.deadline:
            return
        error = DeadlineExceededError(identity=envelope.target, method=envelope.method,
                                      timeout=max(envelope.deadline - envelope.sent_at, 0.0))
        await self._dead_letter(envelope, DeadLetterReason.DEADLINE_EXCEEDED, error.message, attempts=0)
        raise error

    async def _run_with_retries(
        self, entry: HostedAgent, envelope: Envelope, info: HandlerInfo, bound: dict[str, Any]
    ) -> tuple[Any, Usage]:
        """Run the handler until it succeeds, fails for good, or the policy's attempts are used up.

        Raises:
            HandlerError: the last attempt failed; the message is dead-lettered as
                ``RETRIES_EXHAUSTED`` (retryable error) or ``REJECTED`` (any other).
        """
        policy = entry.spec.retry
        for attempt in range(policy.max_attempts):
            if entry.dropped:
                # The lease went during the wait before this retry: the new owner runs the message.
                raise LeaseLostError(identity=envelope.target, detail="the lease was lost between attempts; retry")
            before = entry.agent.state.model_copy(deep=True)
            self.counters.turns += 1
            entry.last_used = self._clock()
            try:
                outcome = await _run_stoppable(entry, info, bound)
            except _StoppedForLostLease:
                entry.agent.state = before
                raise LeaseLostError(
                    identity=envelope.target,
                    detail="the lease was lost while the handler ran; it was stopped at its next await and its "
                    "State discarded. Retry the call: the new owner runs it",
                ) from None
            except asyncio.CancelledError:
                entry.agent.state = before
                raise
            except Exception as error:  # noqa: BLE001 - user code may raise anything; it becomes a HandlerError
                # A failed attempt leaves State as it was: the next one starts from the same place.
                entry.agent.state = before
                self.counters.handler_errors += 1
                retry = is_retryable(error) and attempt + 1 < policy.max_attempts
                if retry:
                    await asyncio.sleep(policy.delay_after(error, attempt))
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
        """Record ``envelope`` in the dead-letter log; never raises.

        A dead letter that cannot be recorded is logged instead: the caller is already
        getting the original error, which must not be replaced by the ledger's.
        """
        self.counters.dead_letters += 1
        entry = self._entries.get(envelope.target)
        self._metrics.dead_letter(UNKNOWN_AGENT_CLASS if entry is None else entry.agent_class, reason.value)
        try:
            payload = cloudpickle.dumps(envelope)
        except Exception as problem:  # noqa: BLE001 - unpicklable arguments: keep what can be kept, readably
            payload = cloudpickle.dumps(dataclasses.replace(
                envelope, args=(), kwargs={"unpicklable_arguments": repr((envelope.args, envelope.kwargs))[:2000]}
            ))
            error = f"{error} (arguments could not be stored: {problem})"
        try:
            await self._ledger.add_dead_letter(
                identity=envelope.target, message_id=envelope.message_id, envelope=payload, reason=reason.value,
                error=error, attempts=attempts,
            )
        except Exception as problem:  # noqa: BLE001 - see the docstring: the original error wins
            log.error("could not record dead letter for %s.%s: %s", envelope.target, envelope.method, problem)

    # -- pause and resume -----------------------------------------------------------

    async def _entry(self, identity: str) -> HostedAgent:
        """The hosted entry of ``identity``, activating it here if needed."""
        return self._entries.get(identity) or await self._activations.activate(identity)

    async def _park(self, entry: HostedAgent, envelope: Envelope) -> asyncio.Future[TurnResult]:
        """Hold ``envelope`` durably (caller holds the turn lock); returns what its caller awaits.

        Raises:
            LeaseLostError: the park was refused; the entry is dropped and nothing is parked.
        """
        waiter = self._parked_waiters.get(envelope.message_id)
        created = waiter is None
        if waiter is None:
            waiter = asyncio.get_running_loop().create_future()
            self._parked_waiters[envelope.message_id] = waiter
        payload = cloudpickle.dumps(envelope)
        try:
            await self._activations.fenced_write(entry, "park", lambda token: self._ledger.park(
                identity=envelope.target, fencing_token=token, message_id=envelope.message_id, envelope=payload,
            ))
        except BaseException:
            if created:
                self._parked_waiters.pop(envelope.message_id, None)
            raise
        self.counters.parked += 1
        self._metrics.parked(entry.agent_class)
        return waiter

    async def pause(self, identity: str) -> bool:
        """Park every later message of ``identity`` durably until :meth:`resume`.

        The pause flag is in the ledger, so it holds for the next owner too. A turn
        already running finishes first. A pause that takes effect while a
        :meth:`resume` runs wins: that resume stops and the agent stays paused.
        Returns ``True``.

        Raises:
            LeaseLostError: the ledger refused the write; the entry is dropped.
        """
        entry = await self._entry(identity)
        async with entry.turn_lock:
            await self._activations.fenced_write(entry, "pause", lambda token: self._ledger.set_paused(
                identity=identity, fencing_token=token, paused=True
            ))
            entry.paused = True
            entry.pause_generation += 1
        self._activations.emit(identity, EventKind.PAUSED)
        return True

    async def resume(self, identity: str) -> int:
        """Replay parked messages oldest first through the same gates, then accept new work.

        Each batch of parked messages is read and replayed under the turn lock, and a
        message can only park under that lock, so the final empty read and clearing
        the pause flag happen with nothing able to park in between. Messages that
        arrive during the replay wait for the lock, find the agent still paused, and
        park behind the older ones, so the order holds. A replayed message whose
        handler fails is dead-lettered like any other; it is never silently dropped.

        A :meth:`pause` that takes effect while this resume runs wins: the resume
        stops before its next batch, what is still parked stays parked, and the
        agent stays paused (no ``RESUMED`` event). Returns how many messages were
        replayed.

        Raises:
            LeaseLostError: ownership was lost (or the agent taken out of service)
                during the replay; the messages not yet handled stay parked for the
                next owner, and the agent stays paused.
            LedgerUnavailableError: a replayed turn's checkpoint did not land or its
                outcome is unknown (a storage error is raised as it came); that
                message stays parked, as above.
        """
        entry = await self._entry(identity)
        generation = entry.pause_generation
        replayed = 0
        while True:
            async with entry.turn_lock:
                if entry.dropped:
                    raise LeaseLostError(identity=identity, detail="the agent was dropped while resuming")
                if entry.pause_generation != generation:
                    return replayed
                batch = await self._ledger.parked(identity, limit=PARKED_REPLAY_BATCH)
                if not batch:
                    await self._activations.fenced_write(entry, "resume", lambda token: self._ledger.set_paused(
                        identity=identity, fencing_token=token, paused=False
                    ))
                    entry.paused = False
                    break
                for stored in batch:
                    await self._replay(entry, stored.id, cloudpickle.loads(stored.envelope))
                    replayed += 1
        self._activations.emit(identity, EventKind.RESUMED)
        return replayed

    async def _replay(self, entry: HostedAgent, seq: int, envelope: Envelope) -> None:
        """Run one parked message (turn lock held) and answer its caller if it waits on this host."""
        waiter = self._parked_waiters.pop(envelope.message_id, None)
        info = entry.agent.__rayfleet_handlers__.get(envelope.method)
        try:
            if info is None:
                raise UnknownHandlerError(
                    identity=envelope.target, method=envelope.method, available=type(entry.agent).handler_names()
                )
            result = await self._turn(entry, envelope, info, info.bind(envelope.target, envelope.args, envelope.kwargs))
        except Exception as error:
            if entry.dropped or not isinstance(error, RayfleetError):
                # Out of service, or an outcome this turn cannot vouch for: the message
                # stays parked for the next owner (or the next resume) and its caller waits.
                if waiter is not None:
                    self._parked_waiters[envelope.message_id] = waiter
                raise
            if isinstance(error, (UnknownHandlerError, InvalidArgumentsError)):
                await self._dead_letter(envelope, DeadLetterReason.DECODE_FAILED, error.message, attempts=0)
            if waiter is not None and not waiter.done():
                waiter.set_exception(error)
        else:
            if waiter is not None and not waiter.done():
                waiter.set_result(result)
        # Handled (or dead-lettered): only now is the parked copy forgotten.
        await self._activations.fenced_write(entry, "unpark", lambda token: self._ledger.unpark(
            identity=envelope.target, fencing_token=token, seq=seq
        ))

    async def cancel_parked(self, identity: str) -> int:
        """Move every parked message of ``identity`` to the dead letters (reason ``CANCELLED``).

        Callers still waiting on this host get ``InvalidStateError``. The agent stays
        paused. Returns how many messages were cancelled.

        Raises:
            LeaseLostError: the ledger refused the write; the entry is dropped.
        """
        entry = await self._entry(identity)
        async with entry.turn_lock:
            parked = await self._ledger.parked(identity, limit=1_000_000)
            count = await self._activations.fenced_write(
                entry, "cancel parked", lambda token: self._ledger.cancel_parked(identity=identity, fencing_token=token)
            )
        for _ in range(count):
            self._metrics.dead_letter(entry.agent_class, DeadLetterReason.CANCELLED.value)
        for stored in parked:
            waiter = self._parked_waiters.pop(stored.message_id, None)
            if waiter is not None and not waiter.done():
                waiter.set_exception(InvalidStateError(
                    identity=identity, state="PAUSED", operation="deliver",
                    hint="The message was parked and then cancelled; it is in the dead-letter log.",
                ))
        return count
