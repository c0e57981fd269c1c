"""The delivery path of a host: the gates every message passes, retries, dead letters, pause and resume.

Every message meets the same gates, in this order:

1. addressability: an outside caller (``sender is None``) never reaches an
   ``INTERNAL_ONLY`` agent, and learns nothing else about it;
2. lifecycle state: activation refuses a retired or broken identity;
3. the handler exists and the arguments bind to it;
4. pause and the mailbox: while the agent is paused, or a suspended turn or a running
   durable one (it journaled) holds the mailbox, the message is parked durably in the
   ledger and its caller waits until a resume or that turn's end replays it; behind a
   plain running turn it waits in memory for the turn lock;
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
import copy
import dataclasses
import json
import logging
import time
import traceback
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import cloudpickle

from ..checkpoints._journal_files import JournalFileStore
from ..checkpoints._step_outputs import SPILL_THRESHOLD, encode_output, spilled_paths
from ..errors import (
    AgentBusyError,
    ApprovalConflictError,
    DeadlineExceededError,
    HandlerError,
    InvalidArgumentsError,
    InvalidStateError,
    LeaseLostError,
    NotAddressableError,
    RayfleetError,
    StaleSequenceError,
    TurnInterruptedError,
    UnknownApprovalError,
    UnknownHandlerError,
    UsageError,
    is_retryable,
)
from ..identity._agent import run_handler
from ..identity._handlers import HandlerInfo, Reply, Usage
from ..identity._values import Addressability, Durability, EventKind
from ..ledger._turn_rows import ApprovalRequest, ApprovalRow, TurnEnd, TurnEventRow, TurnRecord, TurnWrite
from ..ledger._values import StepEntry, StepJournaled
from ..turns._approvals import TIMEOUT_DECIDER
from ..turns._context import TurnContext, TurnSuspended
from ..turns._current import CURRENT_TURN
from ..turns._values import TurnStatus
from ._hosted import HostDraining, HostedAgent, OwnedElsewhere, TurnResult, held_journal
from ._messages import RECENT_REPLY_LIMIT, DeadLetterReason, Envelope
from ._ports import NO_METRICS, HostMetrics, MessageOutcome
from ._streams import RESET, SUSPENDED, UNREAD, StreamHub, TurnEvents, Unread, parse_event_id

if TYPE_CHECKING:
    from ..ledger._contract import LedgerClient
    from ._ports import ActivationPort

log = logging.getLogger("rayfleet.pipeline")

T = TypeVar("T")

PARKED_REPLAY_BATCH = 100
"""Parked messages read from the ledger per round of a resume."""

LOCAL_WAKE_HORIZON = 60.0
"""A turn suspended until at most this many seconds from now is woken by a timer on its host, on
time; a later wake is left to the fleet's wake sweep, so a long wait holds nothing on the host."""

WAITER_CHECK_INTERVAL = 1.0
"""How often a caller waiting for a suspended turn checks that its host still holds the identity."""


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


class _HostJournal:
    """A turn's journal on this host: reads from the ledger, writes fenced by the entry's token."""

    __slots__ = ("_delivery", "_entry")

    def __init__(self, delivery: Delivery, entry: HostedAgent) -> None:
        self._delivery = delivery
        self._entry = entry

    @property
    def files(self) -> JournalFileStore | None:
        return self._delivery._journal_files

    async def read(self, turn_id: str) -> TurnRecord | None:
        return await self._delivery._ledger.turn(identity=self._entry.spec.identity, turn_id=turn_id)

    async def write(self, turn: TurnWrite) -> None:
        ledger, identity = self._delivery._ledger, self._entry.spec.identity
        await self._delivery._activations.fenced_write(self._entry, "journal", lambda token: ledger.write_turn(
            identity=identity, fencing_token=token, turn=turn))

    async def request_approval(self, request: ApprovalRequest, turn: TurnWrite) -> ApprovalRow:
        ledger, identity = self._delivery._ledger, self._entry.spec.identity
        return await self._delivery._activations.fenced_write(
            self._entry, "request an approval", lambda token: ledger.request_approval(
                identity=identity, fencing_token=token, request=request, turn=turn))

    async def decide_by_timeout(self, approval_id: str, approved: bool) -> ApprovalRow:
        ledger = self._delivery._ledger
        try:
            resolved = await ledger.resolve_approval(approval_id=approval_id, approved=approved, by=TIMEOUT_DECIDER,
                                                     comment="decided by its timeout")
        except ApprovalConflictError:
            decided = await ledger.approval(approval_id=approval_id)  # a person decided first: theirs stands
            if decided is None:
                raise UnknownApprovalError(approval_id=approval_id) from None
            return decided
        return resolved.approval

    def take_steering(self) -> list[Envelope]:
        return self._delivery._take_steering(self._entry)

    async def wait_signal(self, name: str, turn: TurnWrite) -> bytes | None:
        ledger, identity = self._delivery._ledger, self._entry.spec.identity
        return await self._delivery._activations.fenced_write(
            self._entry, "wait for a signal", lambda token: ledger.wait_signal(
                identity=identity, fencing_token=token, name=name, turn=turn))


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
        journal_files: where durable turns keep step values over the spill threshold.
        streams: the host's turn streams (a new hub over ``ledger`` if not given).
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
        journal_files: JournalFileStore | None = None,
        streams: StreamHub | None = None,
    ) -> None:
        self._entries = entries
        self.streams = streams if streams is not None else StreamHub(
            ledger=ledger, token_of=lambda identity: _token_of(entries, identity), wall_clock=wall_clock,
            metrics=metrics)
        self._journal_files = journal_files
        self._metrics = metrics
        self._ledger = ledger
        self._activations = activations
        self._clock = clock
        self._wall_clock = wall_clock
        # Callers of parked messages, by message id. Kept across a failed replay so the
        # caller still gets the answer when a later resume on this host replays it.
        self._parked_waiters: dict[str, asyncio.Future[TurnResult]] = {}
        # Callers of suspended turns, by turn id: answered when the turn ends on this host.
        self._turn_waiters: dict[str, asyncio.Future[TurnResult]] = {}
        # Wakes and drains running in the background (strong references until done).
        self._background: set[asyncio.Task[Any]] = set()
        self.counters = DeliveryCounters()

    # -- turns ----------------------------------------------------------------------

    async def deliver(self, envelope: Envelope) -> TurnResult:
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
        if envelope.wake is True:
            # Answered once taken: the turn may run for long after its wake, and its own
            # caller (not the waker) gets the reply. Checked first, as _admit checks any
            # other message: a forged wake must be refused, not run in the background. The
            # owner is found (activating it here if none holds it) before the answer, so a
            # wake that reached another host is redirected to the owner (OwnedElsewhere),
            # not lost here in the background while its sender keeps a stale route.
            envelope.check()
            await self._addressable_entry(envelope)
            self._in_background(self._wake(envelope), name=f"wake {envelope.target} {envelope.message_id}")
            return TurnResult(value=None, usage=Usage(), checkpoint_version=0, suspended=True)
        # Timed and counted once per message, here: the retries below go to _admit.
        started = self._clock()
        # Looked up before and after: the first message activates the entry, a lost lease drops it.
        before = self._entries.get(envelope.target)
        try:
            result = await self._admit(envelope)
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

    async def _admit(self, envelope: Envelope) -> TurnResult:
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
        if info.shared:
            return await self._shared(entry, envelope, info, bound)
        mode = envelope.mode or entry.spec.on_busy
        if mode != "queue" and not envelope.wake:
            busy = _turn_in_progress(entry, envelope)
            if busy is not None and mode == "reject":
                raise AgentBusyError(identity=identity, turn_id=busy[0], status=busy[1])
            if busy is not None and mode == "interrupt" and busy[1] == TurnStatus.RUNNING.value:
                self._interrupt_running(entry, busy[0], by=envelope.message_id)
            if busy is not None and mode == "steer" and busy[1] == TurnStatus.RUNNING.value:
                joined = await self._steer(entry, envelope)
                if joined is not None:
                    return joined
        if mode == "queue" and not envelope.wake and _parks_behind_running(entry, envelope):
            return await self._park_behind_running(entry, envelope)
        interrupted = False
        entry.lock_waiters += 1
        try:
            await entry.turn_lock.acquire()
        finally:
            entry.lock_waiters -= 1
        try:
            if entry.dropped:
                # Deactivated or fenced while this message waited: activate again and retry.
                return await self._admit(envelope)
            if entry.suspended_turn not in (None, envelope.message_id) and envelope.dedup_key() is not None \
                    and envelope.dedup_key() == await self._suspended_key(entry):
                # A keyed retry of the suspended turn (its caller gave up waiting): the same
                # turn, so it waits for that turn's end instead of running it again.
                envelope = dataclasses.replace(envelope, message_id=entry.suspended_turn)
            if mode == "interrupt" and entry.suspended_turn not in (None, envelope.message_id):
                await self._interrupt_suspended(entry, by=envelope.message_id)
                interrupted = True
            if interrupted:
                # It runs in the interrupted turn's place; what waited behind that turn runs after it.
                try:
                    return await self._ended(entry, envelope, self._turn(entry, envelope, info, bound))
                finally:
                    if entry.suspended_turn is None:
                        self._open_mailbox(entry)
            if entry.paused or entry.draining_parked or entry.suspended_turn not in (None, envelope.message_id):
                # Paused, or a suspended turn holds the mailbox (or the messages parked behind
                # a turn are being replayed): wait behind them, durably, in order.
                parked = await self._park(entry, envelope)
                suspended = None
            else:
                result = await self._ended(entry, envelope, self._turn(entry, envelope, info, bound))
                if not result.suspended or envelope.wake:
                    return result
                suspended = self._turn_waiter(envelope.message_id)
        finally:
            entry.turn_lock.release()
        if suspended is not None:
            # Waited for outside the turn lock: the turn's wake takes it to resume the turn.
            return await self._outlive(entry, envelope, suspended)
        # Parked: wait outside the turn lock, so the resume that replays it can take the lock.
        return await parked

    # -- suspended turns ---------------------------------------------------------------

    def _forget_spilled(self, identity: str, paths: list[str]) -> None:
        """Delete the storage files of step values whose journal is gone (its turn's end committed).

        In the background, after the end: a host that dies first, or a storage that refuses,
        leaves the files behind (logged), never a journal pointing at a missing file.
        """
        files = self._journal_files
        if not paths or files is None:
            return

        def delete() -> None:
            for path in paths:
                files.delete(path)

        async def forget() -> None:
            try:
                await asyncio.to_thread(delete)
            except Exception as error:  # noqa: BLE001 - the turn is over either way; see the docstring
                log.warning("could not delete %d spilled step values of %s: %s", len(paths), identity, error)

        self._in_background(forget(), name=f"forget spilled values of {identity}")

    def _in_background(self, work: Coroutine[Any, Any, None], *, name: str) -> None:
        task = asyncio.get_running_loop().create_task(work, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- handling modes, steering and shared handlers ------------------------------------

    def _interrupt_running(self, entry: HostedAgent, turn_id: str, *, by: str) -> None:
        """Stop the running turn at its next await: it ends ``INTERRUPTED``, its caller gets ``TurnInterruptedError``.

        A plain (non-async, non-thread) handler has no await to stop at: it finishes, and
        the interrupting message runs after it.
        """
        entry.interrupts[turn_id] = by
        if entry.handler_task is not None and entry.running_turn == turn_id:
            entry.handler_task.cancel()

    async def _interrupt_suspended(self, entry: HostedAgent, *, by: str) -> None:
        """End the suspended turn as ``INTERRUPTED`` (caller holds the turn lock); its callers get the error."""
        turn_id = entry.suspended_turn
        assert turn_id is not None
        interrupted = TurnInterruptedError(identity=entry.spec.identity, turn_id=turn_id, by=by)
        record = await self._ledger.turn(identity=entry.spec.identity, turn_id=turn_id)
        await self._reopen_stream(entry, turn_id, UNREAD if record is None else record.last_event)
        await self._write_end(entry, turn_id, TurnStatus.INTERRUPTED, interrupted.message, {"by": by})
        if record is not None:
            self._forget_spilled(entry.spec.identity, spilled_paths(step.value for step in record.entries))
        entry.suspended_turn = None
        entry.suspended_key = None
        self._metrics.turn_event(entry.agent_class, "interrupted")
        self._settle(turn_id, error=interrupted)

    async def _reopen_stream(self, entry: HostedAgent, turn_id: str,
                             last: TurnEventRow | Unread | None = UNREAD) -> bool:
        try:
            return await self.streams.reopen(entry.spec.identity, turn_id, last)
        except Exception as error:  # noqa: BLE001 - the stream misses its end; the turn's outcome stands
            log.warning("could not read the stream of turn %s of %s: %s", turn_id, entry.spec.identity, error)
            return False

    async def watch_turn(self, identity: str, turn_id: str, after: str | None,
                         wait: float) -> tuple[list[tuple[str, str, str, str, float, bool]], str, bool]:
        """The events of turn ``turn_id`` after event id ``after`` that this host has, waiting up to ``wait``.

        The identity is activated here if it is hosted nowhere (``OwnedElsewhere`` if another
        host owns it). Watching a turn starts its stream (with its boundary events) from
        now on. Returns ``(events, state, gap)`` as ``StreamHub.watch`` does: events as
        ``(id, turn id, kind, JSON data, at, persisted)``.
        """
        entry = await self._entry(identity)
        key = None if after is None else parse_event_id(after)
        if entry.suspended_turn == turn_id and entry.running_turn != turn_id:
            await self._reopen_stream(entry, turn_id)
        in_progress = turn_id in (entry.running_turn, entry.suspended_turn)
        return await self.streams.watch(identity, turn_id, key, wait, in_progress=in_progress)

    def turn_here(self, identity: str, turn_id: str) -> tuple[str, str] | None:
        """``(state, method)`` of a turn of ``identity`` as this host knows it (see ``StreamHub.turn_here``).

        A read of this host's memory, activating nothing: it knows a turn that journals
        and streams nothing while it runs here and, once it ended here, how it ended.
        """
        return self.streams.turn_here(identity, turn_id)

    def running_turn(self, identity: str) -> tuple[str, str] | None:
        """``(turn id, method)`` of the turn of ``identity`` running on this host now, or ``None``.

        A read of this host's memory: it activates nothing and starts no stream, so it
        also sees a turn that journals and streams nothing.
        """
        entry = self._entries.get(identity)
        if entry is None or entry.running_turn is None:
            return None
        return entry.running_turn, self.streams.method_of(entry.running_turn)

    async def cancel_turn(self, identity: str, turn_id: str) -> bool:
        """Interrupt turn ``turn_id`` of ``identity`` if it is in progress here (``TurnHandle.cancel``).

        A running turn stops at its next await and a suspended one ends at once, both as an
        ``INTERRUPTED`` turn whose caller gets ``TurnInterruptedError`` (the ``interrupt``
        handling mode's path); what was queued behind a suspended turn then runs. Returns
        whether the turn was in progress here (``False``: not started yet, ended, or elsewhere).

        Raises:
            LeaseLostError: the end of a suspended turn was refused (the identity moved).
        """
        entry = await self._entry(identity)
        if entry.running_turn == turn_id:
            self._interrupt_running(entry, turn_id, by="cancel")
            return True
        if entry.suspended_turn != turn_id:
            return False
        async with entry.turn_lock:
            if entry.suspended_turn != turn_id:
                return False
            await self._interrupt_suspended(entry, by="cancel")
            self._open_mailbox(entry)
        return True

    async def _steer(self, entry: HostedAgent, envelope: Envelope) -> TurnResult | None:
        """Give ``envelope`` to the running turn (``self.steering()``); the reply of the turn it joined.

        ``None`` when the turn ended without reading it: the message then runs as a
        queued one, in its own turn.
        """
        waiter: asyncio.Future[TurnResult | None] = asyncio.get_running_loop().create_future()
        entry.steering.append((envelope, waiter))
        return await self._outlive(entry, envelope, waiter)

    def _take_steering(self, entry: HostedAgent) -> list[Envelope]:
        """The steer messages the running turn has not read yet; from now on their callers wait for its reply."""
        taken, entry.steering = entry.steering, []
        entry.steered.extend(taken)
        return [envelope for envelope, _ in taken]

    def _end_steering(self, entry: HostedAgent, turn_id: str, *, result: TurnResult | None = None,
                      error: BaseException | None = None) -> None:
        """The running turn stopped: answer the steer messages it read, let the others run on their own."""
        read, entry.steered = entry.steered, []
        unread, entry.steering = entry.steering, []
        for _, waiter in unread:
            if not waiter.done():
                waiter.set_result(None)
        for _, waiter in read:
            if waiter.done():
                continue
            if result is not None and result.suspended:
                _answer_with(waiter, self._turn_waiter(turn_id))  # they joined it: its end answers them
            elif error is not None:
                waiter.set_exception(error)
            else:
                waiter.set_result(result)

    async def _shared(self, entry: HostedAgent, envelope: Envelope, info: HandlerInfo,
                      bound: dict[str, Any]) -> TurnResult:
        """Run a shared (read-only) handler beside the exclusive turn, on a copy of the State.

        Raises:
            UsageError: the handler changed State (its changes are dropped).
            HandlerError: the handler raised (dead-lettered as ``REJECTED``).
        """
        reader = copy.copy(entry.agent)
        reader.state = entry.agent.state.model_copy(deep=True)
        before = reader.state.model_copy(deep=True)
        self.counters.turns += 1
        entry.last_used = self._clock()
        outside = CURRENT_TURN.set(None)  # no durable calls: a shared turn is never journaled
        try:
            outcome = await run_handler(info, reader, bound)
        except Exception as error:
            if isinstance(error, UsageError):
                raise
            self.counters.handler_errors += 1
            failure = HandlerError(identity=envelope.target, method=envelope.method,
                                   remote_type=f"{type(error).__module__}.{type(error).__qualname__}",
                                   remote_message=str(error), remote_traceback=traceback.format_exc())
            await self._dead_letter(envelope, DeadLetterReason.REJECTED, failure.message, attempts=1)
            raise failure from None
        finally:
            CURRENT_TURN.reset(outside)
        if reader.state != before:
            raise UsageError(f"handler {envelope.method!r} of {envelope.target!r} is shared (read-only) but changed "
                             f"State; its changes were dropped. Drop shared=True, or only read State in it",
                             api="@rf.handler(shared=True)")
        value, usage = (outcome.value, outcome.usage) if isinstance(outcome, Reply) else (outcome, Usage())
        return TurnResult(value=value, usage=usage, checkpoint_version=entry.checkpoint_version)

    async def _wake(self, envelope: Envelope) -> None:
        """Resume a woken suspended turn here; its outcome goes to its callers. Never raises."""
        try:
            await self._admit(envelope)
        except Exception as error:  # noqa: BLE001 - its callers got the outcome; the next wake retries
            log.info("the wake of turn %s of %s ended with %s: %s", envelope.message_id, envelope.target,
                     type(error).__name__, error)

    def _turn_waiter(self, turn_id: str) -> asyncio.Future[TurnResult]:
        """What the callers of suspended turn ``turn_id`` wait for on this host (one future for all of them)."""
        waiter = self._turn_waiters.get(turn_id)
        if waiter is None or waiter.done():
            waiter = asyncio.get_running_loop().create_future()
            self._turn_waiters[turn_id] = waiter
        return waiter

    async def _outlive(self, entry: HostedAgent, envelope: Envelope, waiter: asyncio.Future[T]) -> T:
        """Wait for a turn (suspended, or joined by a steer message) to end on this host.

        Raises:
            LeaseLostError: the identity left this host meanwhile (deactivated, moved); the
                caller sends the message again, which resumes the turn at its new owner.
        """
        while True:
            done, _ = await asyncio.wait({waiter}, timeout=WAITER_CHECK_INTERVAL)
            if done:
                return waiter.result()
            if entry.dropped:
                raise LeaseLostError(
                    identity=envelope.target,
                    detail="the identity left this host while the message waited for a turn; send the message "
                    "again: its new owner resumes the turn from its journal",
                )

    def _settle(self, turn_id: str, *, result: TurnResult | None = None, error: BaseException | None = None) -> None:
        """Answer the callers waiting here for ``turn_id``'s end."""
        waiter = self._turn_waiters.pop(turn_id, None)
        if waiter is None or waiter.done():
            return
        if error is not None:
            waiter.set_exception(error)
        else:
            waiter.set_result(result)  # type: ignore[arg-type]

    async def _ended(self, entry: HostedAgent, envelope: Envelope, turn: Awaitable[TurnResult]) -> TurnResult:
        """Run ``turn`` (the caller holds the turn lock); when it ends, answer its waiters and open the mailbox."""
        turn_id = envelope.message_id
        try:
            result = await turn
        except Exception as error:
            if not entry.dropped:
                # Dropped: its waiters learn it and re-send, which resumes the turn elsewhere.
                if entry.suspended_turn == turn_id and isinstance(error, HandlerError):
                    self._open_mailbox(entry)  # it failed for good: the turn is over
                self._settle(turn_id, error=error)
                self._after_running(entry)
            raise
        if not result.suspended:
            if entry.suspended_turn == turn_id:
                self._open_mailbox(entry)
            self._settle(turn_id, result=result)
        self._after_running(entry)
        return result

    def _after_running(self, entry: HostedAgent) -> None:
        """A turn stopped running here: replay what parked behind it (a suspended turn holds it instead)."""
        if entry.parks_behind_running and entry.suspended_turn is None and not entry.draining_parked:
            self._open_mailbox(entry)

    async def _park_behind_running(self, entry: HostedAgent, envelope: Envelope) -> TurnResult:
        """Park ``envelope`` behind the durable turn running now, without waiting for the turn lock.

        The park is written at once, so the message is durable while the turn runs (for
        minutes, for a model loop); the turn's end replays it, in the order parked.

        Raises:
            LeaseLostError: the park was refused, or the identity left this host while the
                message waited; its caller sends it again (a parked copy left behind is
                replayed by the next owner, and its message id makes the second one a duplicate).
        """
        entry.parks_behind_running = True  # before any await: a later message parks behind this one
        parking = asyncio.ensure_future(self._park(entry, envelope))
        entry.parking.add(parking)
        parking.add_done_callback(entry.parking.discard)
        return await self._outlive(entry, envelope, await parking)

    async def _suspended_key(self, entry: HostedAgent) -> str | None:
        """The dedup key of the suspended turn: known if it suspended here, else read from its journal's row."""
        if entry.suspended_key is None and entry.suspended_turn is not None:
            record = await self._ledger.turn(identity=entry.spec.identity, turn_id=entry.suspended_turn)
            if record is not None:
                entry.suspended_key = cloudpickle.loads(record.envelope).dedup_key()
        return entry.suspended_key

    def _suspend(self, entry: HostedAgent, envelope: Envelope, suspended: TurnSuspended) -> None:
        """The turn of ``envelope`` suspended (journaled already): it holds the mailbox until it ends."""
        entry.suspended_turn = envelope.message_id
        entry.suspended_key = envelope.dedup_key()
        self._metrics.turn_event(entry.agent_class, "suspended")
        if suspended.wake_at is None:
            return
        delay = max(0.0, suspended.wake_at - self._wall_clock())
        if delay <= LOCAL_WAKE_HORIZON:
            asyncio.get_running_loop().call_later(delay, self._wake_here, entry, envelope)

    def _wake_here(self, entry: HostedAgent, envelope: Envelope) -> None:
        """A local timer fired for a suspended turn: resume it, if it is still suspended here."""
        if entry.dropped or entry.suspended_turn != envelope.message_id:
            return  # ended, or the identity left: the fleet's wake sweep finds it wherever it is
        self._in_background(self._wake(dataclasses.replace(envelope, wake=True)),
                            name=f"wake {envelope.target} {envelope.message_id}")

    def _open_mailbox(self, entry: HostedAgent) -> None:
        """The turn that held the mailbox ended: replay what parked behind it, oldest first, then take new ones."""
        entry.suspended_turn = None
        entry.suspended_key = None
        entry.held_journal = None
        entry.parks_behind_running = False  # from now on a new message parks under the turn lock, behind these
        if not entry.paused:
            entry.draining_parked = True
            self._in_background(self._drain(entry), name=f"drain {entry.spec.identity}")

    async def _drain(self, entry: HostedAgent) -> None:
        """Replay what was parked behind a turn, until none is left or another turn suspends.

        New messages park while this runs (``draining_parked``), so the order holds; the
        final empty read and the end of the drain happen under the turn lock, after every
        park begun behind a running turn was written. Never raises:
        what could not be replayed stays parked for the next drain (the next turn that
        ends, or the next owner's).
        """
        identity = entry.spec.identity
        try:
            while True:
                async with entry.turn_lock:
                    if entry.dropped or entry.paused or entry.suspended_turn is not None:
                        return
                    while entry.parking:
                        await asyncio.wait(set(entry.parking))
                    batch = await self._ledger.parked(identity, limit=PARKED_REPLAY_BATCH)
                    if not batch:
                        return
                    for stored in batch:
                        await self._replay(entry, stored.id, cloudpickle.loads(stored.envelope))
                        if entry.dropped or entry.suspended_turn is not None:
                            return
        except Exception as error:  # noqa: BLE001 - see the docstring
            log.warning("replaying the messages parked behind a turn of %s stopped: %s", identity, error)
        finally:
            entry.draining_parked = False

    async def _addressable_entry(self, envelope: Envelope) -> HostedAgent:
        """The addressability and lifecycle gates: the hosted entry of the target, activated if needed."""
        identity = envelope.target
        entry = self._entries.get(identity)
        if entry is None:
            try:
                entry = await self._entry(identity)
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
        if entry.suspended_turn != envelope.message_id:
            # A suspended turn resumes whenever it is woken: "a call that times out leaves the turn running".
            await self._check_deadline(envelope)
        else:
            self._metrics.turn_event(entry.agent_class, "resumed")
        await self._activations.ensure_healthy_lease(entry)
        turn_id, streams = envelope.message_id, self.streams
        turn = TurnContext(identity=envelope.target, turn_id=turn_id, method=envelope.method,
                           envelope=lambda: cloudpickle.dumps(dataclasses.replace(envelope, wake=False,
                                                                                  woken_with=None)),
                           port=_HostJournal(self, entry), wall_clock=self._wall_clock,
                           stream=TurnEvents(streams, envelope.target, turn_id, entry.agent_class),
                           run_id=envelope.workflow_run())
        entry.running_context = turn
        streams.begin(envelope.target, turn_id, envelope.method, started=envelope.sent_at)
        if turn_id in (entry.suspended_turn, entry.recovered_turn):
            held, entry.held_journal = entry.held_journal, None
            # A turn with a journal: known before it runs, so a replay's steering reads come from it too.
            resumed = None if held is None else held.resumed(turn_id, entry.grant.fencing_token, envelope.woken_with)
            if resumed is not None and held is not None:
                # Suspended here under this token: the journal this host wrote, with what the wake applied.
                turn.resume_from(resumed, status=TurnStatus.SUSPENDED.value)
                await streams.resume(envelope.target, turn_id, UNREAD if held.streamed else None)
            else:
                record = await turn.load()
                # The stream's last event came with the journal: going on with it reads nothing more.
                await streams.resume(envelope.target, turn_id, UNREAD if record is None else record.last_event)
        try:
            value, usage = await self._run_with_retries(entry, envelope, info, bound, turn)
        except TurnSuspended as suspended:
            entry.held_journal = held_journal(turn_id, entry.grant.fencing_token, turn.written(),
                                              streamed=streams.has(turn_id))
            self._suspend(entry, envelope, suspended)
            streams.boundary(envelope.target, turn_id, SUSPENDED,
                             {"waiting_for": suspended.waiting_for, "wake_at": suspended.wake_at})
            streams.stop(turn_id)
            result = TurnResult(value=None, usage=Usage(), checkpoint_version=entry.checkpoint_version,
                                suspended=True)
            self._end_steering(entry, envelope.message_id, result=result)
            return result
        except BaseException as error:
            ended = _stream_end(error)
            if ended:
                # Shown once written, as a completed turn's end (a journaled turn's was
                # written with its end already, and this finds its stream closed).
                await streams.finish(turn_id, {"error": str(error)[:2000]}, kind=ended)
            else:
                streams.stop(turn_id)
            self._end_steering(entry, envelope.message_id, error=error)
            raise
        finally:
            entry.running_context = None
            entry.interrupts.pop(envelope.message_id, None)
            if turn.steps_run:
                self._metrics.turn_event(entry.agent_class, "step", turn.steps_run)
        if entry.dropped:
            # The lease went while the handler ran: its State is not this host's to reply with.
            streams.stop(turn_id)
            raise LeaseLostError(identity=envelope.target, detail="the lease was lost during the turn; retry the call")
        # A durable turn commits at its end whatever the durability: its completion (and
        # the end of its journal) is written in the transaction of its final State.
        durable = turn.journaled
        every_turn = durable or entry.spec.durability is Durability.EVERY_TURN
        streamed = streams.has(turn_id)
        closing = None
        settled = True
        if streamed and every_turn and (durable or entry.dirty):
            # The stream's end event goes in the same transaction, after the rest of the
            # stream: a committed turn always has its end in the ledger. If the ledger did
            # not take the stream in time, the turn commits (or fails to, as any commit while
            # the ledger is down) without its end, and the stream stops.
            closing, settled = await streams.settled_end(turn_id, _completed_data(value))
        if durable or closing is not None:
            entry.dirty = True
            entry.pending_turn_end = TurnEnd(turn_id=envelope.message_id, events=() if closing is None else (closing,))
        if durable:
            self._metrics.turn_event(entry.agent_class, "completed")
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
            try:
                step = await self._activations.commit(entry)
            except BaseException as error:
                streams.stop(turn_id)
                self._end_steering(entry, envelope.message_id, error=error)
                raise
            if durable:
                self._forget_spilled(envelope.target, turn.spilled_files())
        if settled:
            await streams.finish(turn_id, _completed_data(value) if streamed else None, written=closing)
        result = TurnResult(value=value, usage=usage, checkpoint_version=entry.checkpoint_version, step=step)
        self._end_steering(entry, envelope.message_id, result=result)
        return result

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
        self, entry: HostedAgent, envelope: Envelope, info: HandlerInfo, bound: dict[str, Any], turn: TurnContext,
    ) -> tuple[Any, Usage]:
        """Run the handler until it succeeds, fails for good, or the policy's attempts are used up.

        Each attempt runs as ``turn``: its durable calls replay what the journal holds.
        A durable turn that fails for good is ended as ``FAILED`` in the ledger.

        Raises:
            HandlerError: the last attempt failed; the message is dead-lettered as
                ``RETRIES_EXHAUSTED`` (retryable error) or ``REJECTED`` (any other).
            LeaseLostError: the identity was lost during the turn (a refused journal write,
                a lost lease); nothing of the turn is committed.
        """
        policy = entry.spec.retry
        for attempt in range(policy.max_attempts):
            if entry.dropped:
                # The lease went during the wait before this retry: the new owner runs the message.
                raise LeaseLostError(identity=envelope.target, detail="the lease was lost between attempts; retry")
            before = entry.agent.state.model_copy(deep=True)
            self.counters.turns += 1
            entry.last_used = self._clock()
            turn.begin_attempt()
            current = CURRENT_TURN.set(turn)
            try:
                outcome = await _run_stoppable(entry, info, bound)
            except _StoppedForLostLease:
                entry.agent.state = before
                raise LeaseLostError(
                    identity=envelope.target,
                    detail="the lease was lost while the handler ran; it was stopped at its next await and its "
                    "State discarded. Retry the call: the new owner runs it",
                ) from None
            except (asyncio.CancelledError, TurnSuspended) as stopped:
                # Nothing of an unfinished turn commits: a resumed turn replays from this State.
                entry.agent.state = before
                by = entry.interrupts.get(envelope.message_id)
                if by is not None and isinstance(stopped, asyncio.CancelledError):
                    interrupted = TurnInterruptedError(identity=envelope.target, turn_id=envelope.message_id, by=by)
                    self._metrics.turn_event(entry.agent_class, "interrupted")
                    if turn.journaled and await self._end_turn(entry, envelope.message_id, TurnStatus.INTERRUPTED,
                                                               interrupted):
                        self._forget_spilled(envelope.target, turn.spilled_files())
                    raise interrupted from None
                raise
            except Exception as error:
                # A failed attempt leaves State as it was: the next one starts from the same place.
                entry.agent.state = before
                if entry.dropped:
                    # A journal write was refused (or the lease lapsed): not the handler's failure.
                    raise LeaseLostError(
                        identity=envelope.target,
                        detail="the identity was lost during the turn; nothing of it was committed. Retry the "
                        "call: the new owner resumes it from its journal",
                    ) from error
                self.counters.handler_errors += 1
                retry = is_retryable(error) and attempt + 1 < policy.max_attempts
                if retry:
                    # The retry replays the journal; what the failed attempt streamed after it is void.
                    self.streams.boundary(envelope.target, envelope.message_id, RESET, {"retry": attempt + 1})
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
                if turn.journaled:
                    self._metrics.turn_event(entry.agent_class, "failed")
                    if await self._end_turn(entry, envelope.message_id, TurnStatus.FAILED, failure):
                        self._forget_spilled(envelope.target, turn.spilled_files())
                raise failure from None
            finally:
                CURRENT_TURN.reset(current)
            # A turn that changed nothing (a read) needs no checkpoint.
            if entry.agent.state != before:
                entry.dirty = True
            if isinstance(outcome, Reply):
                return outcome.value, outcome.usage
            return outcome, Usage()
        raise AssertionError("unreachable: the last attempt either returns or raises")

    async def _end_turn(self, entry: HostedAgent, turn_id: str, status: TurnStatus, error: RayfleetError) -> bool:
        """End a durable turn that commits nothing (failed, interrupted); whether it was ended. Never raises.

        Its stream's end event is written in the same transaction, and shown after it. A
        turn that could not be ended stays in the ledger as it was, its stream stopped
        without an end, and the next delivery of its message resumes it from its journal;
        the caller already has its outcome, which must not be replaced by the ledger's.
        """
        try:
            await self._write_end(entry, turn_id, status, error.message, {"error": str(error)[:2000]})
        except Exception as problem:  # noqa: BLE001 - see the docstring
            log.warning("could not end turn %s of %s: %s", turn_id, entry.spec.identity, problem)
            return False
        return True

    async def _write_end(self, entry: HostedAgent, turn_id: str, status: TurnStatus, error: str,
                         data: dict[str, Any]) -> None:
        """Write the end of a turn that commits nothing, with its stream's end event (``data``) in the
        same write; the event is shown only after it.

        Raises what the write raised (``LeaseLostError`` for a refused token); the stream
        then stops without an end.
        """
        kind = status.value.lower()
        closing, settled = None, True
        if self.streams.has(turn_id):
            # Not taken by the ledger in time: the turn ends without its end event, its stream stopped.
            closing, settled = await self.streams.settled_end(turn_id, data, kind)
        try:
            await self._activations.fenced_write(entry, f"end turn ({kind})", lambda token: self._ledger.end_turn(
                identity=entry.spec.identity, fencing_token=token,
                ended=TurnEnd(turn_id=turn_id, status=status.value, error=error[:2000],
                              events=() if closing is None else (closing,)),
            ))
        except BaseException:
            self.streams.stop(turn_id)
            raise
        if settled:
            await self.streams.finish(turn_id, data, kind=kind, written=closing)

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
        entry = self._entries.get(identity)
        if entry is None:
            entry = await self._activations.activate(identity)
            self._replay_left(entry)
        return entry

    def _replay_left(self, entry: HostedAgent) -> None:
        """Just activated: replay the messages the last owner left parked, unless a pause or a
        suspended turn still holds them (its end, or the resume, replays them).

        Messages parked behind a durable turn its host was cut off running wait for that
        turn: it holds the mailbox as a suspended turn does and is resumed here at once from
        its journal (its caller may never send it again), and its end replays them. A paused
        agent runs nothing until it is resumed; its cut-off turn then runs when sent again.
        """
        if entry.parked_left:
            entry.parked_left = False
            if entry.suspended_turn is not None or entry.draining_parked:
                return
            if entry.recovered_turn is not None and not entry.paused:
                entry.suspended_turn = entry.recovered_turn
                self._in_background(self._resume_cut_off(entry, entry.recovered_turn),
                                    name=f"resume {entry.spec.identity} {entry.recovered_turn}")
            else:
                self._open_mailbox(entry)

    async def _resume_cut_off(self, entry: HostedAgent, turn_id: str) -> None:
        """Resume turn ``turn_id``, cut off running on its last owner, ahead of what parked behind it. Never raises.

        Its end (or its failure in the handler) opens the mailbox, as a woken turn's does;
        if it cannot run at all (its journal unreadable, its message refused before it
        ran), the mailbox opens anyway: the messages behind it are not held for a turn
        nobody resumes, which then runs when it is sent again, as before.
        """
        try:
            record = await self._ledger.turn(identity=entry.spec.identity, turn_id=turn_id)
            if record is None or record.status != TurnStatus.RUNNING.value:
                raise LookupError(f"the turn is {record.status if record else 'gone'} in the ledger")
            await self._admit(dataclasses.replace(cloudpickle.loads(record.envelope), wake=True))
        except Exception as error:  # noqa: BLE001 - see the docstring
            log.info("turn %s of %s, cut off on its last owner, did not resume ahead of the messages parked behind "
                     "it: %s", turn_id, entry.spec.identity, error)
            if not entry.dropped and entry.suspended_turn == turn_id:
                self._open_mailbox(entry)

    async def _park(self, entry: HostedAgent, envelope: Envelope) -> asyncio.Future[TurnResult]:
        """Hold ``envelope`` durably (caller holds the turn lock, or parks behind the running turn);
        returns what its caller awaits.

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
                # Behind a suspended turn nothing is replayed: its end replays what is parked.
                batch = [] if entry.suspended_turn is not None else await self._ledger.parked(
                    identity, limit=PARKED_REPLAY_BATCH)
                if not batch:
                    await self._activations.fenced_write(entry, "resume", lambda token: self._ledger.set_paused(
                        identity=identity, fencing_token=token, paused=False
                    ))
                    entry.paused = False
                    break
                for stored in batch:
                    await self._replay(entry, stored.id, cloudpickle.loads(stored.envelope))
                    replayed += 1
                    if entry.suspended_turn is not None:
                        break
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
            result = await self._ended(entry, envelope, self._turn(
                entry, envelope, info, info.bind(envelope.target, envelope.args, envelope.kwargs)))
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
            if result.suspended:
                if waiter is not None:
                    # Its caller now waits for the turn's end; the turn's row holds the message.
                    _answer_with(waiter, self._turn_waiter(envelope.message_id))
            elif waiter is not None and not waiter.done():
                waiter.set_result(result)
        # Handled, suspended (its turn's row keeps it) or dead-lettered: only now is the parked copy forgotten.
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


def _token_of(entries: Mapping[str, HostedAgent], identity: str) -> int | None:
    entry = entries.get(identity)
    return None if entry is None or entry.dropped else entry.grant.fencing_token


def _stream_end(error: BaseException) -> str:
    """How a turn that raised ends its stream: ``interrupted``, ``failed``, or ``""`` (not over: it is retried)."""
    if isinstance(error, TurnInterruptedError):
        return "interrupted"
    if isinstance(error, (HandlerError, UnknownHandlerError, InvalidArgumentsError, UsageError)):
        return "failed"
    return ""


COMPLETED_VALUE_BYTES = 16 * 1024
"""The largest reply (as JSON) a stream's ``completed`` event carries; a larger or non-JSON one is left out."""


def _completed_data(value: Any) -> dict[str, Any]:
    try:
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return {}
    return {"value": value} if len(text) <= COMPLETED_VALUE_BYTES else {}


def _answer_with(waiter: asyncio.Future[TurnResult], source: asyncio.Future[TurnResult]) -> None:
    """Settle ``waiter`` as ``source`` settles."""
    def copy(done: asyncio.Future[TurnResult]) -> None:
        if waiter.done():
            return
        if done.cancelled():
            waiter.cancel()
        elif (error := done.exception()) is not None:
            waiter.set_exception(error)
        else:
            waiter.set_result(done.result())
    source.add_done_callback(copy)


def _parks_behind_running(entry: HostedAgent, envelope: Envelope) -> bool:
    """Whether a queued message parks behind the running turn now instead of waiting for the turn lock.

    It does behind a durable turn (one that journaled) and behind messages already parked
    that way, so a long turn's waiting messages survive its host. It waits in memory when
    messages that came before it wait there (it must not overtake them), and under the
    lock when a pause, a suspended turn or a replay holds the mailbox (it parks there).
    """
    if entry.paused or entry.draining_parked or entry.suspended_turn is not None:
        return False
    if entry.parks_behind_running:
        return True
    running = entry.running_context
    return (running is not None and running.journaled and entry.running_turn != envelope.message_id
            and entry.lock_waiters == 0)


def _turn_in_progress(entry: HostedAgent, envelope: Envelope) -> tuple[str, str] | None:
    """The turn of ``entry`` in progress other than ``envelope``'s own: ``(turn id, RUNNING or SUSPENDED)``."""
    if entry.running_turn is not None and entry.running_turn != envelope.message_id:
        return entry.running_turn, TurnStatus.RUNNING.value
    if entry.suspended_turn is not None and entry.suspended_turn != envelope.message_id:
        return entry.suspended_turn, TurnStatus.SUSPENDED.value
    return None
