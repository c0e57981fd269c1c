"""A durable turn's journal as its handler sees it: steps run once, replayed from the journal after.

One :class:`TurnContext` lives for one message on its host, across the handler's
attempts (a retry replays the journal from position 0). It reads the journal from the
ledger lazily, at the turn's first durable call, so a turn that journals nothing costs
no ledger read and no row. Every write goes through :class:`JournalPort`, which the
host implements with the identity's fencing token: a refused write stops the turn
(``LeaseLostError``), so a zombie never journals and never goes on past its first
durable call.

Encodings: a completed step's value is encoded as workflow step outputs are
(``checkpoints._step_outputs``: Arrow for tables and models, else cloudpickle), and an
encoding over ``SPILL_THRESHOLD`` is written to a file in storage with only its pointer
journaled. An error outcome is ``b"E"`` followed by the pickled exception.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import math
import pickle
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

import cloudpickle

from ..checkpoints._journal_files import JournalFileStore
from ..checkpoints._step_outputs import SPILL_THRESHOLD, decode_output, encode_output, spill_output, spilled_paths
from ..errors import (
    InvalidSpecError,
    NonDeterminismError,
    StepOutcomeUnknownError,
    StepValueError,
    UsageError,
    WaitTimeoutError,
    is_retryable,
)
from ..ledger._turn_rows import (
    ApprovalRequest,
    ApprovalRow,
    TurnEntry,
    TurnEntryKind,
    TurnEntryState,
    TurnRecord,
    TurnWrite,
)
from ._approvals import approval_id_of, check_request, decision_of, encode_value
from ._current import CURRENT_STEP_KEY
from ._values import Decision

log = logging.getLogger("rayfleet.turns")

POLICIES = ("retry", "unknown")
"""What a step started and never journaled does after a stop (see ``rf.Agent.step``)."""

_ERROR = b"E"

SLEEP_WAIT = "sleep"
"""``waiting_for`` of a turn suspended in ``self.sleep``."""


def signal_wait(name: str) -> str:
    """``waiting_for`` of a turn suspended in ``self.wait_signal(name)`` (the ledger's convention)."""
    return "signal:" + name


def encode_signal(identity: str, name: str, value: Any) -> bytes:
    """A signal's value as a waiting turn's journal keeps it (as a step's value, never spilled).

    Raises:
        InvalidSpecError: an empty name, or a value that cannot be encoded or is over
            ``SPILL_THRESHOLD`` bytes encoded (send a reference to it instead).
    """
    if not isinstance(name, str) or not name:
        raise InvalidSpecError(f"a signal needs a non-empty name, got {name!r}", field="name")
    try:
        blob = encode_output(value)
    except Exception as error:
        raise InvalidSpecError(f"the value of signal {name!r} to {identity!r} cannot be encoded: "
                               f"{type(error).__name__}: {error}", field="value") from error
    if len(blob) > SPILL_THRESHOLD:
        raise InvalidSpecError(f"the value of signal {name!r} to {identity!r} is {len(blob)} bytes encoded, over "
                               f"{SPILL_THRESHOLD}; put it in storage and send where it is", field="value")
    return blob


def steer_value(envelope: Any) -> Any:
    """What ``self.steering()`` gives for a steer message: its one argument's value, else its keyword arguments."""
    if len(envelope.args) == 1 and not envelope.kwargs:
        return envelope.args[0]
    if not envelope.args and len(envelope.kwargs) == 1:
        return next(iter(envelope.kwargs.values()))
    return {**{str(index): value for index, value in enumerate(envelope.args)}, **envelope.kwargs}


class TurnSuspended(BaseException):
    """Raised through the handler when its turn suspends: the host drops the coroutine.

    A ``BaseException``, as ``asyncio.CancelledError`` is, so that a handler's ``except
    Exception`` cannot swallow it. The suspension is already journaled when it is raised.
    """

    def __init__(self, *, waiting_for: str, wake_at: float | None) -> None:
        super().__init__(f"turn suspended waiting for {waiting_for}")
        self.waiting_for = waiting_for
        self.wake_at = wake_at


class JournalPort(Protocol):
    """How a turn reaches its journal: the host's side, fenced by the identity's token."""

    async def read(self, turn_id: str) -> TurnRecord | None:
        """The turn's row and journal, or ``None`` if it never journaled anything."""
        ...

    async def write(self, turn: TurnWrite) -> None:
        """Write the turn's row and entries under the identity's current token.

        Raises:
            LeaseLostError: the write was refused; the identity is no longer this host's.
        """
        ...

    def take_steering(self) -> list[Any]:
        """The ``steer`` messages (envelopes) sent to the running turn and not read yet."""
        ...

    async def wait_signal(self, name: str, turn: TurnWrite) -> bytes | None:
        """Take the oldest pending signal ``name`` as the outcome of ``turn``'s entry, else write ``turn``.

        Raises:
            LeaseLostError: the write was refused; the identity is no longer this host's.
        """
        ...

    async def request_approval(self, request: ApprovalRequest, turn: TurnWrite) -> ApprovalRow:
        """Keep the approval request (once per id) and, while it is pending, write ``turn`` (the suspension).

        Raises:
            LeaseLostError: the write was refused; the identity is no longer this host's.
        """
        ...

    async def decide_by_timeout(self, approval_id: str, approved: bool) -> ApprovalRow:
        """Decide a pending approval as its timeout does; the approval as it is after (a person may have won)."""
        ...

    @property
    def files(self) -> JournalFileStore | None:
        """Where values over the spill threshold go (``None``: they are refused)."""
        ...


class StreamPort(Protocol):
    """How a turn reaches its stream (``self.emit``, ``self.emit_delta``, the boundary events)."""

    def emit(self, kind: str, data: Any) -> None:
        """A persisted event; raises ``UsageError`` for a platform kind or data that is not JSON."""
        ...

    def delta(self, text: str) -> None:
        """A live-only delta."""
        ...

    def boundary(self, kind: str, data: Any = None) -> None:
        """A platform event, recorded only if the turn has a stream."""
        ...


class TurnContext:
    """The journal of one turn (one message) on its host; see the module docstring."""

    def __init__(self, *, identity: str, turn_id: str, method: str, envelope: Callable[[], bytes],
                 port: JournalPort, wall_clock: Callable[[], float] = time.time,
                 stream: StreamPort | None = None, run_id: str = "") -> None:
        self._stream = stream
        self._wall_clock = wall_clock
        self.identity = identity
        self.turn_id = turn_id
        self.method = method
        self.run_id = run_id
        """The workflow run whose step sent this turn's message (``""``: none); its approvals name it."""
        self._envelope = envelope
        self._envelope_bytes: bytes | None = None
        self._port = port
        self._journal: dict[int, TurnEntry] | None = None
        self._unwritten: list[TurnEntry] = []
        """Steering reads to journal with the next write."""
        self._steered_ids: set[str] = set()
        self._row_status: str | None = None
        """The status the turn's row has in the ledger (``None``: no row yet)."""
        self._position = 0
        self._replay_until = -1
        """The last position the journal held when it was read: the handler replays until it passes it."""
        self.journaled = False
        """Whether this turn has a row: something was journaled by it (or by an earlier run of it)."""
        self.steps_run = 0
        """Step functions this context ran (not replayed from the journal)."""

    def begin_attempt(self) -> None:
        """A handler attempt starts: its durable calls are matched against the journal from position 0."""
        self._position = 0
        if self._journal:
            self._replay_until = max(self._journal)  # a retry replays what earlier attempts journaled

    async def load(self) -> TurnRecord | None:
        """Read the turn's journal now (a resumed or recovered turn: one that has a journal); the record read."""
        record = await self._port.read(self.turn_id)
        self._adopt(record)
        return record

    def resume_from(self, entries: Sequence[TurnEntry], *, status: str) -> None:
        """Go on from a journal known without reading it: ``entries`` must be what the ledger holds
        of this turn now, and ``status`` its row's status (the host that suspended the turn kept them)."""
        self._adopt_entries(entries, status)

    def written(self) -> tuple[TurnEntry, ...] | None:
        """The journal as this context wrote and read it, oldest first: after a suspension, what the
        ledger holds of the turn. ``None`` while a steering read waits to be written with the next write."""
        if self._journal is None or self._unwritten:
            return None
        return tuple(self._journal[position] for position in sorted(self._journal))

    async def _journal_entries(self) -> dict[int, TurnEntry]:
        if self._journal is None:
            self._adopt(await self._port.read(self.turn_id))
        assert self._journal is not None
        return self._journal

    def _adopt(self, record: TurnRecord | None) -> None:
        if record is None:
            self._adopt_entries((), None)
        else:
            self._adopt_entries(record.entries, record.status)

    def _adopt_entries(self, entries: Sequence[TurnEntry], status: str | None) -> None:
        self._journal = {entry.position: entry for entry in entries}
        self._replay_until = max(self._journal, default=-1)
        self.journaled = status is not None
        self._row_status = status

    def _turn_write(self, entry: TurnEntry, *, waiting_for: str = "", wake_at: float | None = None,
                    flush: bool = True) -> TurnWrite:
        status = "SUSPENDED" if waiting_for else "RUNNING"
        # Steering reads not journaled yet go first: they come before this entry.
        entries = (*self._unwritten, entry)
        if status == "RUNNING" and self._row_status == "RUNNING":
            # The row says what it should: the next step of a running turn writes its entry only.
            return TurnWrite(turn_id=self.turn_id, method=self.method, envelope=b"", entries=entries,
                             entries_only=True, flush=flush and not self._unwritten)
        if self._envelope_bytes is None:
            self._envelope_bytes = self._envelope()
        return TurnWrite(turn_id=self.turn_id, method=self.method, envelope=self._envelope_bytes, status=status,
                         waiting_for=waiting_for, wake_at=wake_at, entries=entries)

    def steering(self) -> list[Any]:
        """The steer messages this turn received since it last asked, journaled for its replays.

        Journaled with the turn's next durable write (not at once: this is not a coroutine).
        A replay before that write reads the messages sent again, which is as good: nothing
        durable depended on the first read.
        """
        journal = self._journal if self._journal is not None else {}
        position, found = self._next(TurnEntryKind.STEERING, "steering", journal)
        if found is not None and found.state is TurnEntryState.COMPLETED and found.value is not None:
            read: list[tuple[str, Any]] = pickle.loads(found.value)
            self._steered_ids.update(message_id for message_id, _ in read)
            return [value for _, value in read]
        fresh = [(envelope.message_id, steer_value(envelope)) for envelope in self._port.take_steering()
                 if envelope.message_id not in self._steered_ids]
        self._steered_ids.update(message_id for message_id, _ in fresh)
        entry = TurnEntry(position=position, kind=TurnEntryKind.STEERING, name="steering",
                          state=TurnEntryState.COMPLETED, value=cloudpickle.dumps(fresh))
        self._unwritten.append(entry)
        if self._journal is not None:
            self._journal[position] = entry
        return [value for _, value in fresh]

    def spilled_files(self) -> list[str]:
        """The storage files holding this turn's step values (those its journal points at, as far as
        this context read or wrote it): what may be deleted once the turn's end is committed."""
        return spilled_paths(entry.value for entry in (self._journal or {}).values())

    def replaying(self) -> bool:
        """Whether the handler is still before the last entry of its journal (a replay that has not caught up)."""
        return self._position <= self._replay_until

    def emit(self, kind: str, data: Any) -> None:
        """Add a persisted event to this turn's stream (see ``rf.Agent.emit``).

        Skipped while the turn replays what its journal holds: the stream already has
        what the first run emitted there.
        """
        if self._stream is None:
            raise UsageError("this turn has no stream (it runs outside a fleet host)", api="self.emit")
        if self.replaying():
            return
        self._stream.emit(kind, data)

    def emit_delta(self, text: str) -> None:
        """Add a live-only delta to this turn's stream (see ``rf.Agent.emit_delta``); skipped in a replay."""
        if self._stream is None:
            raise UsageError("this turn has no stream (it runs outside a fleet host)", api="self.emit_delta")
        if self.replaying():
            return
        self._stream.delta(text)

    def watched_event(self, kind: str, data: Any) -> None:
        """A platform event (a model agent's tool call and its result), skipped in a replay.

        Recorded, persisted, only when the turn has a stream (a reader waits for it, or
        the turn emitted or streamed deltas), as the step boundaries are: a turn nobody
        watches writes no event rows for it.
        """
        if not self.replaying():
            self._boundary(kind, data)

    def _boundary(self, kind: str, data: Any = None) -> None:
        if self._stream is not None:
            self._stream.boundary(kind, data)

    def _journaled(self, entry: TurnEntry, *, status: str = "RUNNING") -> None:
        assert self._journal is not None  # read before any write
        self._unwritten.clear()  # written with it
        self._journal[entry.position] = entry
        self.journaled = True
        self._row_status = status

    async def _write(self, entry: TurnEntry, *, flush: bool = True) -> None:
        await self._port.write(self._turn_write(entry, flush=flush))
        self._journaled(entry)

    async def _suspend(self, entry: TurnEntry, waiting_for: str, wake_at: float | None) -> TurnSuspended:
        """Journal the wait and the turn as suspended; returns what to raise through the handler."""
        await self._port.write(self._turn_write(entry, waiting_for=waiting_for, wake_at=wake_at))
        self._journaled(entry, status="SUSPENDED")
        return TurnSuspended(waiting_for=waiting_for, wake_at=wake_at)

    def _next(self, kind: TurnEntryKind, name: str, journal: dict[int, TurnEntry]) -> tuple[int, TurnEntry | None]:
        position = self._position
        self._position += 1
        found = journal.get(position)
        if found is not None:
            self._check(found, kind, name, position)
        return position, found

    async def sleep(self, seconds: float) -> None:
        """A durable timer: the turn suspends until ``seconds`` from the first time it got here."""
        if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not math.isfinite(seconds):
            raise UsageError(f"self.sleep(seconds) needs a finite number of seconds, got {seconds!r}",
                             api="self.sleep")
        journal = await self._journal_entries()
        position, found = self._next(TurnEntryKind.SLEEP, SLEEP_WAIT, journal)
        if found is not None and found.state is TurnEntryState.COMPLETED:
            return
        if found is None:
            if seconds <= 0:
                # Nothing to wait for; journaled all the same, so a replay meets the same positions.
                await self._write(TurnEntry(position=position, kind=TurnEntryKind.SLEEP, name=SLEEP_WAIT,
                                            state=TurnEntryState.COMPLETED, value=b""))
                return
            wake_at = self._wall_clock() + seconds
            waiting = TurnEntry(position=position, kind=TurnEntryKind.SLEEP, name=SLEEP_WAIT,
                                state=TurnEntryState.WAITING, value=pickle.dumps(wake_at))
            raise await self._suspend(waiting, SLEEP_WAIT, wake_at)
        wake_at = pickle.loads(found.value) if found.value else 0.0
        if self._wall_clock() >= wake_at:
            await self._write(dataclasses.replace(found, state=TurnEntryState.COMPLETED, value=b""))
            return
        raise await self._suspend(found, SLEEP_WAIT, wake_at)  # woken early (a duplicate wake): wait on

    async def approval(self, subject: str, data: Any, approvers: Iterable[str], timeout: float | None,
                       on_timeout: str) -> Decision:
        """The decision on approval ``subject``; suspends until a person (or the timeout) decides it."""
        names = check_request(subject, approvers, timeout, on_timeout)
        journal = await self._journal_entries()
        position, found = self._next(TurnEntryKind.APPROVAL, subject, journal)
        if found is not None and found.state is TurnEntryState.COMPLETED and found.value is not None:
            decided: Decision = self._outcome(found.value)
            return decided
        if found is None:
            due = None if timeout is None else self._wall_clock() + timeout
            found = TurnEntry(position=position, kind=TurnEntryKind.APPROVAL, name=subject,
                              state=TurnEntryState.WAITING, value=pickle.dumps(due))
        due = pickle.loads(found.value) if found.value else None
        approval_id = approval_id_of(self.identity, self.turn_id, position)
        request = ApprovalRequest(approval_id=approval_id, turn_id=self.turn_id, position=position, subject=subject,
                                  data=encode_value(f"data of approval {subject!r}", data), approvers=names,
                                  due=due, on_timeout=on_timeout, run_id=self.run_id)
        waiting_for = "approval:" + approval_id
        row = await self._port.request_approval(request, self._turn_write(found, waiting_for=waiting_for,
                                                                          wake_at=due))
        if row.status == "PENDING":
            self._journaled(found, status="SUSPENDED")
            self._boundary("approval.requested", {"approval_id": approval_id, "subject": subject})
            if due is None or self._wall_clock() < due:
                raise TurnSuspended(waiting_for=waiting_for, wake_at=due)
            row = await self._port.decide_by_timeout(approval_id, on_timeout == "approve")
        decision = decision_of(row)
        await self._write(dataclasses.replace(found, state=TurnEntryState.COMPLETED, value=encode_output(decision)))
        self._boundary("approval.resolved", {"approval_id": approval_id, "approved": decision.approved,
                                              "by": decision.by})
        return decision

    async def wait_signal(self, name: str, timeout: float | None) -> Any:
        """The value of the next signal ``name`` for this identity; suspends until one comes.

        Raises:
            WaitTimeoutError: ``timeout`` seconds passed (from the first time the turn got
                here) before a signal came; journaled, so every replay raises it too.
        """
        if not isinstance(name, str) or not name:
            raise UsageError(f"self.wait_signal(name) needs a non-empty signal name, got {name!r}",
                             api="self.wait_signal")
        if timeout is not None and (not isinstance(timeout, (int, float)) or isinstance(timeout, bool)
                                    or not math.isfinite(timeout) or timeout < 0):
            raise UsageError(f"self.wait_signal(timeout=) must be a number of seconds >= 0 or None, got "
                             f"{timeout!r}", api="self.wait_signal")
        journal = await self._journal_entries()
        position, found = self._next(TurnEntryKind.SIGNAL, name, journal)
        if found is not None and found.state is TurnEntryState.COMPLETED and found.value is not None:
            return self._outcome(found.value)
        if found is None:
            deadline = None if timeout is None else self._wall_clock() + timeout
            found = TurnEntry(position=position, kind=TurnEntryKind.SIGNAL, name=name, state=TurnEntryState.WAITING,
                              value=pickle.dumps(deadline))
        deadline = pickle.loads(found.value) if found.value else None
        waiting_for = signal_wait(name)
        if deadline is not None and self._wall_clock() >= deadline:
            # Timed out, unless a signal is there: the timeout is journaled in the transaction
            # that looks for one, so a signal cannot complete the entry after the handler was
            # told the wait timed out (it is kept for the next wait instead).
            timed_out = WaitTimeoutError(identity=self.identity, turn_id=self.turn_id, waiting_for=waiting_for,
                                         timeout=timeout if timeout is not None else 0.0)
            expired = dataclasses.replace(found, state=TurnEntryState.COMPLETED, value=self._encode_error(timed_out))
            taken = await self._port.wait_signal(name, self._turn_write(expired))
            if taken is None:
                self._journaled(expired)
                raise timed_out
        else:
            taken = await self._port.wait_signal(name, self._turn_write(found, waiting_for=waiting_for,
                                                                         wake_at=deadline))
        if taken is not None:
            self._journaled(dataclasses.replace(found, state=TurnEntryState.COMPLETED, value=taken))
            return self._outcome(taken)
        self._journaled(found, status="SUSPENDED")
        raise TurnSuspended(waiting_for=waiting_for, wake_at=deadline)

    def _key(self, position: int) -> str:
        return f"{self.identity}:{self.turn_id}:{position}"

    def _check(self, found: TurnEntry, kind: TurnEntryKind, name: str, position: int) -> None:
        if found.kind is not kind or found.name != name:
            raise NonDeterminismError(identity=self.identity, turn_id=self.turn_id, position=position,
                                      journaled=f"{found.kind.value}:{found.name}", requested=f"{kind.value}:{name}")

    async def step(self, name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                   policy: str) -> Any:
        if policy not in POLICIES:
            raise UsageError(f"step policy must be one of {', '.join(map(repr, POLICIES))}, got {policy!r}",
                             api="self.step")
        if not callable(fn):
            raise UsageError(f"self.step({name!r}, fn, ...) needs a function to run, got {fn!r}", api="self.step")
        journal = await self._journal_entries()
        position, found = self._next(TurnEntryKind.STEP, name, journal)
        if found is not None:
            if found.state is TurnEntryState.COMPLETED and found.value is not None:
                return self._outcome(found.value)
            if policy == "unknown":
                unknown = StepOutcomeUnknownError(identity=self.identity, turn_id=self.turn_id, step=name,
                                                  step_key=self._key(position))
                # Journaled, so every later replay of this turn sees the same outcome.
                await self._write(self._completed(position, name, _ERROR + cloudpickle.dumps(unknown)))
                raise unknown
        elif policy == "unknown":
            await self._write(TurnEntry(position=position, kind=TurnEntryKind.STEP, name=name,
                                           state=TurnEntryState.REQUESTED))
        flush_outcome = policy != "retry"  # see the outcome's write below
        marker = CURRENT_STEP_KEY.set(self._key(position))
        self.steps_run += 1
        try:
            value = fn(*args, **kwargs)
            if inspect.isawaitable(value):
                value = await value
        except Exception as error:
            if is_retryable(error):
                raise  # not an outcome: the turn's retry runs the step again
            await self._write(self._completed(position, name, self._encode_error(error)), flush=flush_outcome)
            raise
        finally:
            CURRENT_STEP_KEY.reset(marker)
        # A retry step's outcome lost with the store's log is the step run again, as after a
        # host's death before the write: so it need not wait for the disk. An ``unknown``
        # step's must, or a replay would report a step that completed as unknown.
        await self._write(self._completed(position, name, self._encode_value(name, position, value)),
                          flush=flush_outcome)
        self._boundary("step", {"name": name, "position": position})
        return value

    @staticmethod
    def _completed(position: int, name: str, value: bytes) -> TurnEntry:
        return TurnEntry(position=position, kind=TurnEntryKind.STEP, name=name, state=TurnEntryState.COMPLETED,
                            value=value)

    def _encode_value(self, name: str, position: int, value: Any) -> bytes:
        try:
            blob = encode_output(value)
        except Exception as error:
            raise StepValueError(identity=self.identity, turn_id=self.turn_id, step=name,
                                 detail=f"{type(error).__name__}: {error}") from error
        if len(blob) <= SPILL_THRESHOLD:
            return blob
        files = self._port.files
        if files is None:
            raise StepValueError(identity=self.identity, turn_id=self.turn_id, step=name,
                                 detail=f"it is {len(blob)} bytes encoded, over {SPILL_THRESHOLD}, and this host "
                                        f"has no storage to keep it in")
        return spill_output(blob, files, run_id=f"turns/{self.identity}", label=f"{self.turn_id}-{position}")

    @staticmethod
    def _encode_error(error: Exception) -> bytes:
        try:
            pickled: bytes = cloudpickle.dumps(error)
            return _ERROR + pickled
        except Exception:  # noqa: BLE001 - an error that cannot be pickled is journaled by its type and text
            fallback: bytes = cloudpickle.dumps(RuntimeError(f"{type(error).__qualname__}: {error}"))
            return _ERROR + fallback

    def _outcome(self, blob: bytes) -> Any:
        if blob[:1] == _ERROR:
            error = pickle.loads(blob[1:])
            raise error
        return decode_output(blob, self._port.files)
