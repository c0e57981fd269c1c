"""Turn streams on a host: each turn's ordered events, live to watchers, persisted by group commit.

One :class:`StreamHub` lives in each host runtime. What it guarantees:

* **Ids.** An event's id is ``<epoch>.<seq>``: ``epoch`` is the fencing token of the owner
  that wrote it and ``seq`` its place among that owner's events of the identity (one
  counter per identity and token), so an id names one event of one turn, and ids order
  a turn's whole stream across failovers (a later owner's token is larger). A delta's id
  is the id of the last persisted event before it followed by ``.<n>``: it can be resumed
  after, but it is never read again.
* **Opt-in, so a plain turn costs nothing.** A turn has a stream once its handler emits,
  or a watcher asks for its events, or it resumes with a stream in the ledger; from then
  on the platform's boundary events (started, step, suspended, resumed, approval
  requested and resolved, completed, failed, interrupted) are part of it.
* **Reset after a failover.** When a stream starts on this host while the ledger holds
  events of the same turn from an older owner whose last event is not a suspension (the
  turn was cut off running), its first event here is one ``reset``: deltas since the last
  persisted event were lost, and a client drops the partial text it showed. Ids are given
  only once that is known, so the reset always comes first.
* **Group commit, fenced.** Persisted events wait in one queue for the whole host and are
  written by one task, many identities per ledger transaction; each row is fenced by its
  epoch, so a zombie's events are refused (and dropped here, with a warning). A failed
  write is retried, in order, until it lands or the host stops.
* **Live before durable, but for the end.** Watchers get an event as soon as it is
  emitted, before its row is written: an event a client saw just before its host died
  may be missing from the ledger, which the next owner's ``reset`` marks (or, when the
  ledger held nothing of the earlier owner's part to tell it, the reader's own: see
  ``platform/_turn_handle.py``). A completed
  turn's end event is the exception: it is shown only once it is written (in the
  transaction that commits the turn's final State when there is one, else by the group
  commit), after every earlier event of the turn, and the turn's outcome waits for it.
  So a reader that saw the end finds the whole stream in the ledger, and a caller that
  has the outcome can read it there. The same holds for ``failed`` and ``interrupted``.
* **A ledger that stays down does not hold the outcome.** A turn's end waits at most
  :data:`WRITE_PATIENCE` seconds for its stream's rows. Past that, the turn goes on
  without its end event (a turn that commits State then commits without it, and fails
  as any commit does if the ledger is down); its stream stops here without an end, as
  a turn's cut off by a lost lease does, and its caller gets the outcome. The rows stay
  queued in order and are written when the ledger is back, unless the host stops first.
* **Bounded memory.** A stream keeps its last :data:`LIVE_EVENTS` events live (a watcher
  further behind reads the ledger first), and at most :data:`STREAMS_KEPT` ended or
  waiting streams are kept, oldest forgotten first.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import logging
from collections import OrderedDict, deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from ..errors import UsageError
from ..ledger._contract import LedgerClient
from ..ledger._turn_rows import TurnEventRow
from ._ports import NO_METRICS, HostMetrics

log = logging.getLogger("rayfleet.streams")

DELTA = "delta"
RESET = "reset"
STARTED = "started"
STEP = "step"
SUSPENDED = "suspended"
RESUMED = "resumed"
APPROVAL_REQUESTED = "approval.requested"
APPROVAL_RESOLVED = "approval.resolved"
TOOL_CALL = "tool_call"
TOOL_RESULT = "tool_result"
ENDS = ("completed", "failed", "interrupted")
PLATFORM_KINDS = frozenset((DELTA, RESET, STARTED, STEP, SUSPENDED, RESUMED, APPROVAL_REQUESTED, APPROVAL_RESOLVED,
                            TOOL_CALL, TOOL_RESULT, *ENDS))
"""Kinds only the platform writes: ``self.emit`` refuses them."""

MAX_EVENT_BYTES = 64 * 1024
"""The largest ``emit`` data, JSON-encoded; put larger values in storage and emit where they are."""
LIVE_EVENTS = 4096
"""Events of one stream kept in memory for watchers."""
STREAMS_KEPT = 4096
"""Streams kept that are not running here (ended, suspended, or awaited by a watcher before they start)."""
FLUSH_BATCH = 5000
"""The most events written in one ledger transaction."""
FLUSH_RETRY = 0.2
"""Seconds before a failed write of events is tried again."""
WRITE_PATIENCE = 5.0
"""Seconds a turn's end waits for its stream to be written; past that (the ledger is down) the
turn ends without its end event shown, as a turn cut off does, and the caller is not held."""
ENDED_KEPT = 16_384
"""Ids of turns that ended here, remembered so a watcher of a plain (stream-less) turn learns it ended."""

class Unread(enum.Enum):
    """A turn's latest persisted event not read yet (``None`` means read, and there is none)."""

    UNREAD = 0


UNREAD = Unread.UNREAD

EventKey = tuple[int, int, int]
"""``(epoch, seq, delta)``: the order of a stream's events (persisted events have ``delta == 0``)."""


def parse_event_id(text: str) -> EventKey | None:
    """``"e.s"`` or ``"e.s.n"`` as its key; ``None`` if it is not one."""
    parts = text.split(".") if isinstance(text, str) else []
    if len(parts) not in (2, 3) or not all(part.isdigit() for part in parts):
        return None
    epoch, seq, delta = int(parts[0]), int(parts[1]), int(parts[2]) if len(parts) == 3 else 0
    return epoch, seq, delta


def event_id(key: EventKey) -> str:
    return f"{key[0]}.{key[1]}" if key[2] == 0 else f"{key[0]}.{key[1]}.{key[2]}"


def encode_data(kind: str, data: Any) -> str:
    """``data`` as the JSON text a persisted event keeps.

    Raises:
        UsageError: it is not JSON (dicts, lists, strings, numbers, booleans, None) or
            is over :data:`MAX_EVENT_BYTES` encoded.
    """
    try:
        text = json.dumps(data, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as error:
        raise UsageError(f"the data of event {kind!r} must be JSON (dicts, lists, strings, numbers, booleans, "
                         f"None): {error}", api="self.emit") from None
    if len(text) > MAX_EVENT_BYTES:
        raise UsageError(f"the data of event {kind!r} is {len(text)} bytes as JSON, over {MAX_EVENT_BYTES}; put "
                         f"it in storage and emit where it is", api="self.emit")
    return text


@dataclass(slots=True)
class StreamEvent:
    """One event as a host keeps it: its key, kind and JSON data."""

    key: EventKey
    turn_id: str
    kind: str
    data: str
    at: float

    @property
    def persisted(self) -> bool:
        return self.key[2] == 0

    def wire(self) -> tuple[str, str, str, str, float, bool]:
        return event_id(self.key), self.turn_id, self.kind, self.data, self.at, self.persisted


@dataclass(slots=True)
class _Stream:
    identity: str
    turn_id: str
    active: bool = False
    ready: bool = False
    """Ids are given (the reset check is done); until then events wait in ``held``."""
    readied: asyncio.Event = field(default_factory=asyncio.Event)
    """Set with ``ready``: what :meth:`StreamHub.settle` waits for."""
    held: list[tuple[str, str, float, bool]] = field(default_factory=list)
    events: deque[StreamEvent] = field(default_factory=lambda: deque(maxlen=LIVE_EVENTS))
    dropped_through: EventKey = (0, 0, 0)
    """The newest event no longer kept in ``events`` (a watcher before it reads the ledger first)."""
    last_persisted: tuple[int, int] = (0, 0)
    deltas: int = 0
    ended: bool = False
    epoch: int = 0
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def append(self, event: StreamEvent) -> None:
        if len(self.events) == self.events.maxlen:
            self.dropped_through = self.events[0].key
        self.events.append(event)
        self.changed.set()


class TurnEvents:
    """The stream of one turn as its :class:`~rayfleet.turns._context.TurnContext` writes it."""

    __slots__ = ("_agent_class", "_hub", "_identity", "_turn_id")

    def __init__(self, hub: StreamHub, identity: str, turn_id: str, agent_class: str) -> None:
        self._hub, self._identity, self._turn_id, self._agent_class = hub, identity, turn_id, agent_class

    def emit(self, kind: str, data: Any) -> None:
        if not isinstance(kind, str) or not kind or kind in PLATFORM_KINDS:
            raise UsageError(f"self.emit(kind, data) needs a non-empty kind that is not one of the platform's "
                             f"({', '.join(sorted(PLATFORM_KINDS))}), got {kind!r}", api="self.emit")
        self._hub.emit(self._identity, self._turn_id, kind, encode_data(kind, data), agent_class=self._agent_class)

    def delta(self, text: str) -> None:
        if not isinstance(text, str):
            raise UsageError(f"self.emit_delta(text) needs a string, got {type(text).__name__}",
                             api="self.emit_delta")
        self._hub.delta(self._identity, self._turn_id, text, agent_class=self._agent_class)

    def boundary(self, kind: str, data: Any = None) -> None:
        self._hub.boundary(self._identity, self._turn_id, kind, data)


class StreamHub:
    """The turn streams of one host; see the module docstring.

    Args:
        ledger: where persisted events are written and read.
        token_of: the current fencing token of an identity hosted here (``None`` if not hosted).
        wall_clock: ``time.time`` for the events' ``at``.
        metrics: counts events emitted (``rayfleet_turn_events``, ``emitted`` and ``delta``).
        write_patience: seconds a turn's end waits for its stream's rows (see the module docstring).
    """

    def __init__(self, *, ledger: LedgerClient, token_of: Callable[[str], int | None],
                 wall_clock: Callable[[], float], metrics: HostMetrics = NO_METRICS,
                 write_patience: float = WRITE_PATIENCE) -> None:
        self._ledger = ledger
        self.write_patience = write_patience
        self._token_of = token_of
        self._wall_clock = wall_clock
        self._metrics = metrics
        self._streams: OrderedDict[str, _Stream] = OrderedDict()
        self._running: dict[str, tuple[str, str]] = {}
        """The turns running here: their identities and methods."""
        self._sequences: dict[str, tuple[int, int]] = {}
        self._pending: deque[TurnEventRow] = deque()
        self._wake = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None
        self._flushing = asyncio.Lock()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._ended: OrderedDict[str, tuple[str, str, str]] = OrderedDict()
        """Turns that ended here, newest last: their identities, methods and end kinds."""
        self._refused: dict[str, int] = {}
        """The newest epoch of each identity whose events the ledger refused (its owner changed)."""
        self.written = 0
        """Persisted events written to the ledger by this host."""

    # -- the turn's side ----------------------------------------------------------------

    def method_of(self, turn_id: str) -> str:
        """The handler of a turn running here (``""`` if it is not running here)."""
        return self._running.get(turn_id, ("", ""))[1]

    def turn_here(self, identity: str, turn_id: str) -> tuple[str, str] | None:
        """``(state, method)`` of turn ``turn_id`` of ``identity`` as this host knows it, or ``None``.

        ``state`` is ``running``, or how it ended here (``completed``, ``failed``,
        ``interrupted``; one of the last :data:`ENDED_KEPT` turns that ended here). A read
        of memory: a turn that journals and streams nothing is known here too.
        """
        running = self._running.get(turn_id)
        if running is not None and running[0] == identity:
            return "running", running[1]
        ended = self._ended.get(turn_id)
        if ended is not None and ended[0] == identity:
            return ended[2], ended[1]
        return None

    def has(self, turn_id: str) -> bool:
        stream = self._streams.get(turn_id)
        return stream is not None and stream.active

    def begin(self, identity: str, turn_id: str, method: str, *, started: float | None = None) -> None:
        """A turn starts running here: if a watcher waits for it, its stream starts now."""
        self._running[turn_id] = (identity, method)
        self._ended.pop(turn_id, None)
        stream = self._streams.get(turn_id)
        if stream is not None and not stream.active:
            self._activate(stream, identity, started)

    def emit(self, identity: str, turn_id: str, kind: str, data: str, *, agent_class: str = "",
             force: bool = True) -> None:
        """Add a persisted event to the turn's stream (starting the stream if ``force``)."""
        stream = self._streams.get(turn_id)
        if stream is None or not stream.active:
            if not force:
                return
            stream = self._activate(self._slot(identity, turn_id), identity, None)
        self._add(stream, kind, data, persisted=True)
        if agent_class and kind not in PLATFORM_KINDS:
            self._metrics.turn_event(agent_class, "emitted")

    def boundary(self, identity: str, turn_id: str, kind: str, data: Any = None) -> None:
        """A platform boundary event, for a turn that has a stream (nothing otherwise)."""
        stream = self._streams.get(turn_id)
        if stream is None or not stream.active:
            return
        self._add(stream, kind, json.dumps(data, default=str, separators=(",", ":")), persisted=True)

    def delta(self, identity: str, turn_id: str, text: str, *, agent_class: str = "") -> None:
        """A live-only delta (starting the stream)."""
        stream = self._streams.get(turn_id)
        if stream is None or not stream.active:
            stream = self._activate(self._slot(identity, turn_id), identity, None)
        self._add(stream, DELTA, json.dumps(text), persisted=False)
        if agent_class:
            self._metrics.turn_event(agent_class, DELTA)

    def stop(self, turn_id: str) -> None:
        """The turn stopped running here without ending (suspended, retried elsewhere, its lease lost)."""
        self._finish(turn_id, "")

    async def settle(self, turn_id: str) -> bool:
        """Wait until the turn's stream has its ids and every event queued so far is written; whether
        that happened within :attr:`write_patience`. If not, what is queued is written later, and the
        caller stops the stream (:meth:`stop`) instead of ending it. Never raises.
        """
        stream = self._streams.get(turn_id)
        if stream is None or not stream.active or (stream.ready and not self._pending):
            return True  # nothing to wait for: no task, no timer on a turn's way out
        if await self._within_patience(self._settled(stream)):
            return True
        log.warning("the stream of turn %s of %s could not be written within %g s (the ledger is down?); the turn "
                    "ends without its end event", turn_id, stream.identity, self.write_patience)
        return False

    async def settled_end(self, turn_id: str, data: Any, kind: str = "completed") -> tuple[TurnEventRow | None, bool]:
        """:meth:`settle`, then :meth:`closing`: ``(the end event or None, True)``; or ``(None, False)``
        when the ledger did not take the stream in time, and the stream is stopped here instead."""
        if not await self.settle(turn_id):
            self.stop(turn_id)
            return None, False
        return self.closing(turn_id, data, kind), True

    async def _settled(self, stream: _Stream) -> None:
        await stream.readied.wait()
        await self.flush()

    async def _within_patience(self, work: Coroutine[Any, Any, Any]) -> bool:
        """Whether ``work`` finished within :attr:`write_patience`; past that it goes on in the background
        (a flush holds its batch until the ledger takes it, and must not be cut off in the middle)."""
        task = asyncio.ensure_future(work)
        done, _ = await asyncio.wait({task}, timeout=self.write_patience)
        if done:
            task.result()
            return True
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return False

    def closing(self, turn_id: str, data: Any, kind: str = "completed") -> TurnEventRow | None:
        """The end event (``completed``, ``failed`` or ``interrupted``) of a running turn with a
        stream, given its id but neither queued nor shown: the caller writes it (in the
        transaction that ends the turn) and then passes it to :meth:`finish`. ``None`` if the
        turn has no stream, or no ids yet (see :meth:`settle`).
        """
        stream = self._streams.get(turn_id)
        token = None if stream is None else self._token_of(stream.identity)
        if stream is None or not stream.active or not stream.ready or token is None:
            return None
        epoch, seq = self._next_key(stream, token)
        return TurnEventRow(identity=stream.identity, turn_id=turn_id, epoch=epoch, seq=seq, kind=kind,
                            data=json.dumps(data, default=str, separators=(",", ":")), at=self._wall_clock())

    async def finish(self, turn_id: str, data: Any, *, kind: str = "completed",
                     written: TurnEventRow | None = None) -> None:
        """The turn ended here (``kind``): its end event is written, then shown, then the stream ends.

        ``written`` is the event :meth:`closing` gave, already in the ledger; without it the
        event is written now, through the group commit. An end event the ledger refused
        (the owner changed) is not shown: the stream just ends here. So a reader who saw
        a turn's end finds the whole stream in the ledger, whatever the host does next.
        """
        stream = self._streams.get(turn_id)
        if stream is not None and stream.ended:
            return  # ended already (a journaled turn's end was written with the turn's end)
        row = written
        if row is None and stream is not None and stream.active:
            row, settled = await self.settled_end(turn_id, data, kind)
            if not settled:
                return  # stopped: the ledger did not take the stream in time (see the module docstring)
            if row is not None:
                self._queue(row)
                if not await self._within_patience(self.flush()):
                    log.warning("the end event of turn %s of %s could not be written within %g s; not shown (written "
                                "once the ledger takes it)", turn_id, stream.identity, self.write_patience)
                    self.stop(turn_id)
                    return
        if row is not None and stream is not None and self._refused.get(row.identity, 0) < row.epoch:
            stream.append(StreamEvent(key=(row.epoch, row.seq, 0), turn_id=turn_id, kind=row.kind, data=row.data,
                                      at=row.at))
        self._finish(turn_id, kind)

    def _finish(self, turn_id: str, status: str) -> None:
        identity, method = self._running.pop(turn_id, ("", ""))
        stream = self._streams.get(turn_id)
        if status:
            self._ended[turn_id] = (identity or (stream.identity if stream is not None else ""), method, status)
            while len(self._ended) > ENDED_KEPT:
                self._ended.popitem(last=False)
        if stream is None:
            return
        if status:
            stream.ended = True
            stream.changed.set()
        self._trim()

    async def reopen(self, identity: str, turn_id: str, last: TurnEventRow | Unread | None = UNREAD) -> bool:
        """Go on with the stream of a turn with a journal if the ledger holds one; whether it has a stream now.

        ``last`` is the turn's latest persisted event when the caller read it (with the
        turn's record): then neither this nor the reset check reads the ledger again.
        """
        stream = self._streams.get(turn_id)
        if stream is not None and stream.active:
            return True
        if last is UNREAD:
            last = await self._ledger.last_turn_event(identity=identity, turn_id=turn_id)
        if last is None or last.kind in ENDS:
            return False
        self._activate(self._slot(identity, turn_id), identity, None, announce=False, last=last)
        return True

    async def resume(self, identity: str, turn_id: str, last: TurnEventRow | Unread | None = UNREAD) -> None:
        """A turn with a journal resumes here: its stream goes on (with ``resumed``) if it has one."""
        if await self.reopen(identity, turn_id, last):
            self._add(self._streams[turn_id], RESUMED, "null", persisted=True)

    # -- the watchers' side -------------------------------------------------------------

    def state(self, turn_id: str, *, in_progress: bool = False) -> str:
        """``running``, ``ended`` or ``unknown`` (to this host).

        ``running`` only while the turn runs here, or is in progress here as its owner says
        (``in_progress``: suspended with this host as its owner). A stream left open by a
        turn that stopped here without an end (its lease went; it was sent again and may
        have ended on another owner) does not make it ``running``: a reader told so when
        the identity comes back here would poll forever, while ``unknown`` sends it to the
        ledger once its caller has the reply.
        """
        stream = self._streams.get(turn_id)
        if (stream is not None and stream.ended) or turn_id in self._ended:
            return "ended"
        if turn_id in self._running or in_progress:
            return "running"
        return "unknown"

    async def watch(self, identity: str, turn_id: str, after: EventKey | None, wait: float, *,
                    in_progress: bool) -> tuple[list[tuple[str, str, str, str, float, bool]], str, bool]:
        """Events of ``turn_id`` after ``after``, waiting up to ``wait`` seconds for one.

        Returns ``(events, state, gap)``: ``state`` as :meth:`state`; ``gap`` is true when
        events after ``after`` are no longer kept here (read the ledger first). A watcher
        of a turn that is not running here yet leaves a slot its start fills; one of a turn
        that runs here (``in_progress``: running or suspended) starts its stream now.
        """
        stream = self._streams.get(turn_id)
        if stream is None:
            if turn_id in self._ended:
                return [], "ended", False
            stream = self._slot(identity, turn_id)
        if not stream.active and (in_progress or turn_id in self._running):
            self._activate(stream, identity, None)
        deadline = asyncio.get_running_loop().time() + max(0.0, wait)
        while True:
            found, gap = self._after(stream, after)
            state = self.state(turn_id, in_progress=in_progress)
            # An ended stream whose ids are not given yet (its reset check is in flight) is waited for.
            settled = stream.ready or not stream.active
            if found or gap or (settled and (stream.ended or state == "ended")):
                return [event.wire() for event in found], state, gap
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                return [], state, False
            stream.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stream.changed.wait(), remaining)

    @staticmethod
    def _after(stream: _Stream, after: EventKey | None) -> tuple[list[StreamEvent], bool]:
        if not stream.ready:
            return [], False
        floor = after or (0, 0, 0)
        if stream.dropped_through > floor:
            return [], True
        return [event for event in stream.events if event.key > floor], False

    # -- inside -------------------------------------------------------------------------

    def _slot(self, identity: str, turn_id: str) -> _Stream:
        stream = self._streams.get(turn_id)
        if stream is None:
            stream = self._streams[turn_id] = _Stream(identity=identity, turn_id=turn_id)
            self._trim()
        return stream

    def _trim(self) -> None:
        excess = len(self._streams) - STREAMS_KEPT
        if excess <= 0:
            return
        for turn_id in list(self._streams):
            if excess <= 0:
                break
            if turn_id not in self._running:
                stream = self._streams.pop(turn_id)
                stream.ended = stream.ended or stream.active
                stream.changed.set()
                excess -= 1

    def _activate(self, stream: _Stream, identity: str, started: float | None, *, announce: bool = True,
                  last: TurnEventRow | Unread | None = UNREAD) -> _Stream:
        stream.active = True
        if announce:
            method = json.dumps({"method": self.method_of(stream.turn_id)})
            stream.held.append((STARTED, method, started if started is not None else self._wall_clock(), True))
        self._spawn(self._ready(stream, last))
        return stream

    async def _ready(self, stream: _Stream, last: TurnEventRow | Unread | None = UNREAD) -> None:
        """Learn whether the stream needs a reset (one ledger read, unless ``last`` was read already), then give
        the held events their ids."""
        token = self._token_of(stream.identity)
        reset = False
        try:
            if last is UNREAD:
                last = await self._ledger.last_turn_event(identity=stream.identity, turn_id=stream.turn_id)
            reset = last is not None and token is not None and last.epoch < token and \
                last.kind != SUSPENDED and last.kind not in ENDS
        except Exception as error:  # noqa: BLE001 - without the answer the stream goes on unmarked
            log.warning("could not read the stream of turn %s of %s: %s", stream.turn_id, stream.identity, error)
        stream.ready = True
        stream.readied.set()
        held, stream.held = stream.held, []
        if reset:
            self._give_id(stream, RESET, "null", self._wall_clock(), True)
        for kind, data, at, persisted in held:
            self._give_id(stream, kind, data, at, persisted)
        stream.changed.set()

    def _add(self, stream: _Stream, kind: str, data: str, *, persisted: bool) -> None:
        at = self._wall_clock()
        if not stream.ready:
            stream.held.append((kind, data, at, persisted))
            return
        self._give_id(stream, kind, data, at, persisted)

    def _give_id(self, stream: _Stream, kind: str, data: str, at: float, persisted: bool) -> None:
        token = self._token_of(stream.identity)
        if token is None:
            return  # the identity left this host: its events are not this host's to write
        if persisted:
            epoch, seq = self._next_key(stream, token)
            key: EventKey = (epoch, seq, 0)
            self._queue(TurnEventRow(identity=stream.identity, turn_id=stream.turn_id, epoch=epoch, seq=seq,
                                     kind=kind, data=data, at=at))
        else:
            stream.deltas += 1
            key = (*stream.last_persisted, stream.deltas)
        stream.append(StreamEvent(key=key, turn_id=stream.turn_id, kind=kind, data=data, at=at))

    def _next_key(self, stream: _Stream, token: int) -> tuple[int, int]:
        """The id of the stream's next persisted event (a delta after it counts from it)."""
        epoch, seq = self._sequences.get(stream.identity, (token, 0))
        seq = seq + 1 if epoch == token else 1
        self._sequences[stream.identity] = (token, seq)
        stream.last_persisted, stream.deltas = (token, seq), 0
        return token, seq

    def _queue(self, row: TurnEventRow) -> None:
        self._pending.append(row)
        self._wake.set()
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(self._write_loop(), name="rayfleet-stream-writer")

    def forget_identity(self, identity: str) -> None:
        """The identity left this host: its sequence counter goes (a new token starts a new epoch)."""
        self._sequences.pop(identity, None)

    async def _write_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            await self.flush()

    async def flush(self) -> int:
        """Write every queued event now (in batches); returns how many were written.

        One flush at a time (the writer's, a test's, shutdown's): two would write the same
        batch and then each take it off the queue.
        """
        async with self._flushing:
            return await self._flush()

    async def _flush(self) -> int:
        written = 0
        while self._pending:
            batch = [self._pending[i] for i in range(min(FLUSH_BATCH, len(self._pending)))]
            try:
                refused = await self._ledger.append_turn_events(events=batch)
            except Exception as error:  # noqa: BLE001 - kept in order and tried again
                log.warning("could not write %d stream events (retrying): %s", len(batch), error)
                await asyncio.sleep(FLUSH_RETRY)
                continue
            for _ in batch:
                self._pending.popleft()
            for event in batch:
                if event.identity in refused:
                    self._refused[event.identity] = max(self._refused.pop(event.identity, 0), event.epoch)
                    while len(self._refused) > ENDED_KEPT:
                        del self._refused[next(iter(self._refused))]
            if refused:
                log.warning("stream events of %s refused: their owner changed", ", ".join(refused))
            written += len(batch)
        self.written += written
        return written

    def _spawn(self, work: Any) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """Write what is queued (best effort) and stop the writer."""
        with_timeout = self.flush()
        try:
            await asyncio.wait_for(with_timeout, 5.0)
        except Exception as error:  # noqa: BLE001 - the host stops anyway
            log.warning("stream events not written at shutdown: %s", error)
        for task in (self._writer, *self._tasks):
            if task is not None:
                task.cancel()
