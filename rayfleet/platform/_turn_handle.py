"""``rf.TurnHandle``: a driver's hold on one started turn, its reply and its stream.

A stream is read in two parts: the persisted events after the client's last event id
come from the ledger (every one of them, in order), then the live ones from the
identity's owner by long poll (``AgentHost.turn_events``), which include the deltas. A
poll that finds the owner's live events no longer reach back to the client's place (it
keeps the last few thousand) goes back to the ledger first, and so does a reader about
to enter a later owner's part (the earlier owner may have persisted events it never got
live), so no persisted event is missed or repeated. A failover shows as a ``reset``
event where the next owner's part begins (the reader's own, when what it saw live of the
earlier owner's part was lost and the ledger gave the next owner nothing to tell it so).
See ``docs/decisions/turn-stream-long-poll.md``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import threading
from collections.abc import AsyncIterator, Callable, Generator, Iterator
from typing import Any

import ray

from ..errors import DeadlineExceededError, UnknownTurnEventError
from ..host._messages import Envelope
from ..host._streams import ENDS, RESET, EventKey, event_id, parse_event_id
from ..ledger._contract import LedgerClient
from ..ledger._turn_rows import TurnEventRow, TurnRecord
from ..ledger._values import LeaseView, holder_host
from ..turns._values import TurnEvent, TurnInfo, TurnStatus
from ._routing import Courier, HostGone

POLL_WAIT = 5.0
"""Seconds one long poll waits at the owner for the next event."""
LEDGER_PAGE = 1000
"""Persisted events read per ledger call."""
UNKNOWN_POLLS = 3
"""Polls a reader without the turn's reply makes of an owner that knows nothing of the turn before it gives up."""


def _from_row(row: TurnEventRow) -> TurnEvent:
    return TurnEvent(id=f"{row.epoch}.{row.seq}", turn_id=row.turn_id, kind=row.kind, data=json.loads(row.data),
                     at=row.at, persisted=True)


def _from_wire(wire: tuple[str, str, str, str, float, bool]) -> TurnEvent:
    ident, turn_id, kind, data, at, persisted = wire
    return TurnEvent(id=ident, turn_id=turn_id, kind=kind, data=json.loads(data), at=at, persisted=persisted)


def _row_key(row: TurnEventRow) -> EventKey:
    return row.epoch, row.seq, 0


# What the reading loop asks its driver for, and gets back:
#   ("ledger", after): the persisted events after it
#   ("poll", after):   the owner's reply (events, state, gap)
#   ("kept", key):     whether the ledger keeps that persisted event
#   ("event", event):  hand it to the client (answered with None)


def _reading(turn_id: str, after: EventKey | None, finished: Callable[[], bool] | None
             ) -> Generator[tuple[str, Any], Any, None]:
    """The stream reader's logic, without its I/O: it yields what to do and is sent the answers.

    Besides the owners' ``reset`` events, the reader marks one seam itself: an owner
    decides its reset from the ledger alone, so when a reader got persisted events live
    from an earlier owner that never wrote them (it died or was fenced first) and the
    ledger holds nothing of that owner's part to show it, the next owner starts without a
    reset. So before the first event of a later owner, a reader whose last event came
    live (or from its caller) and is not in the ledger, or was a delta, gets a ``reset``
    of its own, id ``<later epoch>.0``, not persisted.
    """
    key = after
    unsure = after  # the last event's key while the ledger has not shown it is kept
    checked: EventKey | None = None  # the reader's place when it last read the ledger to its end
    need_ledger = True
    unknown = 0

    def passing(event: TurnEvent, event_key: EventKey) -> Generator[tuple[str, Any], Any, None]:
        """Before ``event``: the reader's own reset, if it enters a later owner's part after a lost event."""
        nonlocal unsure
        if unsure is None or event_key[0] <= unsure[0]:
            return
        doubt, unsure = unsure, None
        if event.kind == RESET:
            return
        lost = doubt[2] != 0 or not (yield "kept", doubt)
        if lost:
            yield "event", TurnEvent(id=f"{event_key[0]}.0", turn_id=turn_id, kind=RESET, data=None, at=event.at,
                                     persisted=False)

    def ledger_rows(rows: list[TurnEventRow]) -> Generator[tuple[str, Any], Any, bool]:
        """Hand on the rows after the reader's place; whether the stream ended."""
        nonlocal key, unsure
        for row in rows:
            row_key = _row_key(row)
            if key is None or row_key > key:
                event = _from_row(row)
                yield from passing(event, row_key)
                key, unsure = row_key, None
                yield "event", event
                if row.kind in ENDS:
                    return True
        return False

    def ledger_to_end() -> Generator[tuple[str, Any], Any, bool]:
        """Hand on every persisted event after the reader's place; whether the stream ended."""
        nonlocal checked
        while True:
            rows: list[TurnEventRow] = yield "ledger", key
            if (yield from ledger_rows(rows)):
                return True
            if len(rows) < LEDGER_PAGE:
                checked = key
                return False

    while True:
        if need_ledger:
            if (yield from ledger_to_end()):
                return
            need_ledger = False
        events, state, gap = yield "poll", key
        if gap:
            need_ledger = True
            continue
        for wire in events:
            event = _from_wire(wire)
            parsed = parse_event_id(event.id)
            if parsed is None or (key is not None and parsed <= key):
                continue
            if key is not None and parsed[0] > key[0] and checked != key:
                # A later owner's part: the earlier owner may have persisted events after the
                # reader's place that it never got live (it died before the reader polled
                # them), and only the ledger has them. Read now, once the later owner exists,
                # the earlier one can write nothing more (its writes are fenced).
                if (yield from ledger_to_end()):
                    return
                if parsed <= key:
                    continue  # the ledger gave it
            yield from passing(event, parsed)
            key = unsure = parsed
            yield "event", event
            if event.kind in ENDS:
                return
        if events:
            unknown = 0
            continue
        if state == "ended":
            rows = yield "ledger", key  # what the owner no longer keeps, if anything, then the end
            yield from ledger_rows(rows)
            return
        if state == "unknown":
            unknown += 1
            if (finished is not None and finished()) or (finished is None and unknown >= UNKNOWN_POLLS):
                rows = yield "ledger", key
                yield from ledger_rows(rows)
                return


def _check_after(turn_id: str, identity: str, after: str | None) -> EventKey | None:
    if after is None:
        return None
    key = parse_event_id(after)
    if key is None:
        raise UnknownTurnEventError(identity=identity, turn_id=turn_id, event_id=str(after),
                                    detail="it is not an event id (ids look like 12.3, or 12.3.4 for a delta)")
    return key


def _foreign(owner: str | None, identity: str, turn_id: str, after: str) -> None:
    if owner is not None and owner != turn_id:
        raise UnknownTurnEventError(identity=identity, turn_id=turn_id, event_id=after,
                                    detail=f"it is an event of turn {owner!r}")


def _poll_request(identity: str, turn_id: str, key: EventKey | None) -> Callable[[Any], Any]:
    after = None if key is None else event_id(key)
    return lambda host: host.turn_events.remote(identity, turn_id, after, POLL_WAIT)


def read_events(courier: Courier, identity: str, turn_id: str, after: str | None = None,
                finished: Callable[[], bool] | None = None) -> Iterator[TurnEvent]:
    """The turn's stream after event id ``after`` (blocking); ends with the turn's end event.

    ``finished`` says whether the caller already has the turn's reply; without it, a
    turn its owner never heard of ends the stream after a few polls.

    Raises:
        UnknownTurnEventError: ``after`` is not an event id, or names an event of another turn.
    """
    key = _check_after(turn_id, identity, after)
    if key is not None and after is not None:
        _foreign(courier.ledger.turn_event_owner(identity=identity, epoch=key[0], seq=key[1]).result(), identity,
                 turn_id, after)
    return _read(courier, identity, turn_id, key, finished)


def _read(courier: Courier, identity: str, turn_id: str, key: EventKey | None,
          finished: Callable[[], bool] | None) -> Iterator[TurnEvent]:
    ledger: LedgerClient = courier.ledger
    steps = _reading(turn_id, key, finished)
    answer: Any = None
    while True:
        try:
            what, argument = steps.send(answer)
        except StopIteration:
            return
        if what == "event":
            answer = None
            yield argument
        elif what == "ledger":
            epoch, seq = (0, 0) if argument is None else argument[:2]
            answer = ledger.turn_events(identity=identity, turn_id=turn_id, after_epoch=epoch, after_seq=seq,
                                        limit=LEDGER_PAGE).result()
        elif what == "kept":
            answer = ledger.turn_event_owner(identity=identity, epoch=argument[0], seq=argument[1]).result() == turn_id
        else:
            answer = courier.route_sync(identity, _poll_request(identity, turn_id, argument), method="turn_events",
                                        timeout=POLL_WAIT * 6)


def aread_events(courier: Courier, identity: str, turn_id: str, after: str | None = None,
                 finished: Callable[[], bool] | None = None) -> AsyncIterator[TurnEvent]:
    """:func:`read_events` as an async iterator; ``after`` is checked at once (one blocking ledger read).

    Raises:
        UnknownTurnEventError: ``after`` is not an event id, or names an event of another turn.
    """
    key = _check_after(turn_id, identity, after)
    if key is not None and after is not None:
        _foreign(courier.ledger.turn_event_owner(identity=identity, epoch=key[0], seq=key[1]).result(), identity,
                 turn_id, after)
    return _aread(courier, identity, turn_id, key, finished)


async def _aread(courier: Courier, identity: str, turn_id: str, key: EventKey | None,
                 finished: Callable[[], bool] | None) -> AsyncIterator[TurnEvent]:
    ledger: LedgerClient = courier.ledger
    steps = _reading(turn_id, key, finished)
    answer: Any = None
    while True:
        try:
            what, argument = steps.send(answer)
        except StopIteration:
            return
        if what == "event":
            answer = None
            yield argument
        elif what == "ledger":
            epoch, seq = (0, 0) if argument is None else argument[:2]
            answer = await ledger.turn_events(identity=identity, turn_id=turn_id, after_epoch=epoch, after_seq=seq,
                                              limit=LEDGER_PAGE)
        elif what == "kept":
            answer = await ledger.turn_event_owner(identity=identity, epoch=argument[0], seq=argument[1]) == turn_id
        else:
            answer = await courier.route_async(identity, _poll_request(identity, turn_id, argument),
                                               method="turn_events", timeout=POLL_WAIT * 6)


def cancel_turn(courier: Courier, identity: str, turn_id: str) -> bool:
    """Interrupt the turn at its owner; whether it was in progress there."""
    return bool(courier.route_sync(identity, lambda host: host.cancel_turn.remote(identity, turn_id),
                                   method="cancel_turn"))


class TurnHandle:
    """A started turn (``ref.start(...)``): its id, its reply and its stream.

    The turn runs whether or not anyone reads its stream or waits for its reply; the
    reply is the one ``ref.call`` would have returned (with the same errors). Reading
    the stream does not consume it: any number of readers, each from any event id.
    """

    __slots__ = ("_courier", "_reply", "id", "identity", "method")

    def __init__(self, *, courier: Courier, identity: str, turn_id: str, method: str,
                 reply: concurrent.futures.Future[Any]) -> None:
        self._courier = courier
        self._reply = reply
        self.id = turn_id
        """The turn's id: the id of the message that started it."""
        self.identity = identity
        self.method = method

    def __repr__(self) -> str:
        return f"TurnHandle({self.identity!r}, {self.method!r}, id={self.id!r})"

    def done(self) -> bool:
        """Whether the reply (or the turn's error) is here."""
        return self._reply.done()

    def result(self, timeout: float | None = None) -> Any:
        """The turn's value, waiting up to ``timeout`` seconds (``None``: as long as it takes).

        Raises:
            DeadlineExceededError: no reply within ``timeout``; the turn goes on.
            Whatever ``ref.call`` raises: ``HandlerError``, ``TurnInterruptedError``, ...
        """
        try:
            return self._reply.result(timeout)
        except concurrent.futures.TimeoutError:
            raise DeadlineExceededError(identity=self.identity, method=self.method, timeout=timeout or 0.0) from None

    async def wait(self) -> Any:
        """:meth:`result`, awaited (no timeout: wrap it in ``asyncio.wait_for`` for one)."""
        return await asyncio.wrap_future(self._reply)

    def events(self, after: str | None = None) -> Iterator[TurnEvent]:
        """The turn's stream from its start, or after event id ``after`` (blocking iterator).

        Every persisted event after ``after`` comes once, in order, then the live ones
        (deltas too); the iterator ends after the turn's ``completed``, ``failed`` or
        ``interrupted`` event (or, for a turn that streamed nothing, when it ended).

        Raises:
            UnknownTurnEventError: ``after`` is not an event id of this turn.
        """
        return read_events(self._courier, self.identity, self.id, after, finished=self._reply.done)

    def aevents(self, after: str | None = None) -> AsyncIterator[TurnEvent]:
        """:meth:`events`, as an async iterator."""
        return aread_events(self._courier, self.identity, self.id, after, finished=self._reply.done)

    def cancel(self) -> bool:
        """Interrupt the turn (the ``interrupt`` handling mode's path): a running turn stops at its next
        await, a suspended one ends at once, nothing of it commits, and :meth:`result` raises
        ``TurnInterruptedError``. Returns whether the turn was in progress (``False``: it ended, or has
        not started yet)."""
        return cancel_turn(self._courier, self.identity, self.id)


def start_turn(courier: Courier, envelope: Envelope, timeout: float | None,
               send: Callable[[Courier, Envelope, float | None], Any]) -> TurnHandle:
    """Send ``envelope`` from a thread of its own (as ``call`` would) and return its handle at once."""
    reply: concurrent.futures.Future[Any] = concurrent.futures.Future()
    reply.set_running_or_notify_cancel()

    def run() -> None:
        try:
            reply.set_result(send(courier, envelope, timeout))
        except BaseException as error:  # noqa: BLE001 - handed to whoever waits for the reply
            reply.set_exception(error)

    threading.Thread(target=run, name=f"rayfleet-turn-{envelope.message_id}", daemon=True).start()
    return TurnHandle(courier=courier, identity=envelope.target, turn_id=envelope.message_id,
                      method=envelope.method, reply=reply)


def turn_info(record: TurnRecord) -> TurnInfo:
    """A ledger's turn row as ``rf.TurnInfo``."""
    return TurnInfo(id=record.turn_id, identity=record.identity, method=record.method,
                    status=TurnStatus(record.status), waiting_for=record.waiting_for, wake_at=record.wake_at,
                    started=record.started, updated=record.updated, steps=record.steps, error=record.error)


RUNNING_TURN_TIMEOUT = 5.0
"""Seconds to wait for the owner host's answer to :func:`running_turn` or :func:`owner_turn` (then: none known)."""

_STATES = {"running": TurnStatus.RUNNING, "completed": TurnStatus.COMPLETED, "failed": TurnStatus.FAILED,
           "interrupted": TurnStatus.INTERRUPTED}


def _ask_owner(courier: Courier, lease: LeaseView | None, ask: Callable[[Any], Any]) -> Any:
    """What the host holding ``lease`` answers ``ask`` (one Ray call); ``None`` without a live lease, or when
    that host is gone or does not answer within :data:`RUNNING_TURN_TIMEOUT`. Activates nothing."""
    if lease is None or lease.expires_in <= 0:
        return None
    try:
        handle = courier.directory.handle(holder_host(lease.holder))
        return ray.get(ask(handle), timeout=RUNNING_TURN_TIMEOUT)
    except (HostGone, ray.exceptions.RayError):
        return None


def running_turn(courier: Courier, identity: str, lease: LeaseView | None) -> TurnInfo | None:
    """The turn of ``identity`` running on its owner host now, as that host says; ``None`` if none.

    Asks only the host that holds ``lease`` (the identity's, as its view gave it; one Ray
    call), so it activates nothing and starts no stream. An identity without a live lease
    runs nothing; a host that is gone or does not answer within
    :data:`RUNNING_TURN_TIMEOUT` counts as none.
    """
    found = _ask_owner(courier, lease, lambda handle: handle.running_turn.remote(identity))
    if found is None:
        return None
    turn_id, method = found
    return TurnInfo(id=turn_id, identity=identity, method=method, status=TurnStatus.RUNNING)


def owner_turn(courier: Courier, identity: str, lease: LeaseView | None, turn_id: str) -> TurnInfo | None:
    """Turn ``turn_id`` as the owner host of ``identity`` knows it: running there, or ended there (one of
    the last turns that did); ``None`` if it knows nothing of it. Asked as :func:`running_turn` asks."""
    found = _ask_owner(courier, lease, lambda handle: handle.turn_here.remote(identity, turn_id))
    if found is None:
        return None
    state, method = found
    return TurnInfo(id=turn_id, identity=identity, method=method, status=_STATES[state])


def turn_status(ledger: LedgerClient, identity: str, turn_id: str) -> TurnInfo | None:
    """What the ledger knows of a turn: its row if it journaled, else what its stream says; ``None`` if nothing."""
    record = ledger.turn(identity=identity, turn_id=turn_id).result()
    if record is not None:
        return turn_info(record)
    last = ledger.last_turn_event(identity=identity, turn_id=turn_id).result()
    if last is None:
        return None
    first = ledger.turn_events(identity=identity, turn_id=turn_id, limit=1).result()[0]
    opening = json.loads(first.data) if first.kind == "started" else None
    method = str(opening.get("method", "")) if isinstance(opening, dict) else ""
    status = {"completed": TurnStatus.COMPLETED, "failed": TurnStatus.FAILED, "interrupted": TurnStatus.INTERRUPTED,
              "suspended": TurnStatus.SUSPENDED}.get(last.kind, TurnStatus.RUNNING)
    data = json.loads(last.data)
    error = data.get("error", "") if isinstance(data, dict) and status is TurnStatus.FAILED else ""
    return TurnInfo(id=turn_id, identity=identity, method=method, status=status, started=first.at, updated=last.at,
                    error=str(error))
