"""Requests one event loop sends to one host in the same loop turn go as one Ray call.

A scatter step sends a message to each of 1,000 agents at once, and an ``ask`` loop with
many in flight sends several as replies come back; each was a Ray actor call of its own,
and the driver's per-call work in Ray (argument binding, task submission, one future
per reply) cost more than the turns. Here envelope requests (``deliver`` and
``dispatch``) are queued per host and loop, and sent with ``loop.call_soon``: every
request the loop's ready callbacks submit meanwhile rides the same call.

The host serves a batch's turns concurrently, exactly as it serves separate calls, and
answers once every turn is done, or once none has finished for :data:`BATCH_STALL`
seconds: a slow turn never holds its batch-mates' replies for longer than that. Replies
come in the order the turns finished, so a gather that judges replies in arrival order
(``FirstOf``) sees them so. A turn still running when the host answers is held under a
token, and its reply is fetched with one ``collect`` call of its own.

A batch holds at most :data:`~rayfleet.host._messages.RECENT_MESSAGES` requests for one
identity; more start another batch. The host answers a batch once its turns are done, so
every turn of it may be committed while no reply has left; were the host to die then, the
router sends them all again, and the next owner recognises each re-sent message only
while the agent's message-id window still holds it (see ``HostedAgent.recent_messages``).

Guarantees are those of separate calls: each request gets its own reply, a failed batch
call (the host died) fails each member with the same error so each re-routes alone, and
a batch whose arguments cannot be serialized is sent again one call per request, so
only the request at fault gets the error. One difference: an abandoned member (its
host looked frozen and the request went elsewhere) is not cancelled on the old host;
cancelling an abandoned request is best effort anyway, and the old host's late reply is
never read.
"""

from __future__ import annotations

import asyncio
import contextlib
import pickle
import uuid
from collections import Counter as TallyOf
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Future as Finished
from dataclasses import dataclass, field
from typing import Any

import ray

from ..errors import InvalidArgumentsError
from ..host._messages import RECENT_MESSAGES, Envelope
from ._replies import RETRY, Reply

BATCH_STALL = 0.025
"""Seconds without a finished turn after which a host answers a batch with the turns that are done."""
HELD_FOR = 60.0
"""Seconds a host keeps the reply of a batch's straggler that nobody collected (the caller went away)."""

_UNSERIALIZABLE = (TypeError, ValueError, AttributeError, pickle.PicklingError)
"""What Ray raises at submission when a call's arguments cannot be serialized."""

Answered = list[tuple[int, Reply | None, str | None]]
"""A host's answer to a batch: ``(index, reply, None)`` per finished turn in finishing order, then
``(index, None, token)`` per turn still running (fetch it with ``collect(token)``)."""


@dataclass(frozen=True, slots=True)
class EnvelopeRequest:
    """One envelope for its target's owner, answered with the turn's reply; sent alone when called with a handle."""

    envelope: Envelope

    def __call__(self, host: ray.actor.ActorHandle) -> ray.ObjectRef[Any]:
        pending: ray.ObjectRef[Any] = host.deliver.remote(self.envelope.target, self.envelope.wire())
        return pending


@dataclass(slots=True)
class _Open:
    handle: ray.actor.ActorHandle
    requests: list[EnvelopeRequest] = field(default_factory=list)
    replies: list[asyncio.Future[Reply]] = field(default_factory=list)
    per_target: TallyOf[str] = field(default_factory=TallyOf)


class Batcher:
    """The courier's side: queues envelope requests per (loop, host) until the loop's next turn."""

    def __init__(self) -> None:
        self._open: dict[tuple[asyncio.AbstractEventLoop, str], _Open] = {}

    def submit(self, host: str, handle: ray.actor.ActorHandle, request: EnvelopeRequest) -> asyncio.Future[Reply]:
        """Queue ``request`` for ``host``; the future gets its reply, or the error the call to the host met."""
        loop = asyncio.get_running_loop()
        key = (loop, host)
        target = request.envelope.target
        batch = self._open.get(key)
        if batch is None or batch.per_target[target] >= RECENT_MESSAGES:
            # A full batch stays scheduled as it is; later requests ride a new one.
            batch = self._open[key] = _Open(handle)
            loop.call_soon(self._send, key, batch)
        reply: asyncio.Future[Reply] = loop.create_future()
        batch.requests.append(request)
        batch.replies.append(reply)
        batch.per_target[target] += 1
        return reply

    def _send(self, key: tuple[asyncio.AbstractEventLoop, str], batch: _Open) -> None:
        if self._open.get(key) is batch:
            del self._open[key]
        if len(batch.requests) == 1:
            _send_alone(batch.handle, batch.requests[0], batch.replies[0])
            return
        envelopes = [request.envelope.wire() for request in batch.requests]
        try:
            pending = batch.handle.serve_batch.remote(envelopes)
        except _UNSERIALIZABLE:
            # Some envelope cannot be serialized: alone, each gets its own answer (and only it the error).
            for request, reply in zip(batch.requests, batch.replies, strict=True):
                _send_alone(batch.handle, request, reply)
            return
        except Exception as error:  # noqa: BLE001 - each caller's route judges it, as if its own call had met it
            _fail_all(batch.replies, error)
            return
        _when_done(pending, asyncio.get_running_loop(), lambda done: _settle(batch, done))


def submit(
    handle: ray.actor.ActorHandle, request: Callable[[ray.actor.ActorHandle], ray.ObjectRef[Any]], identity: str,
    method: str,
) -> ray.ObjectRef[Any]:
    """Send one request alone; arguments Ray cannot serialize are the caller's error, said plainly."""
    try:
        return request(handle)
    except _UNSERIALIZABLE as error:
        raise InvalidArgumentsError(
            identity=identity, method=method, detail=f"they cannot be serialized to send to a host ({error})"
        ) from None


def _send_alone(handle: ray.actor.ActorHandle, request: EnvelopeRequest, reply: asyncio.Future[Reply]) -> None:
    try:
        pending = submit(handle, request, request.envelope.target, request.envelope.method)
    except Exception as error:  # noqa: BLE001 - raised on a loop callback, it would reach no caller: give it to one
        _fail(reply, error)
        return
    _chain(pending, reply)


def _when_done(
    pending: ray.ObjectRef[Any], loop: asyncio.AbstractEventLoop, callback: Callable[[Finished[Any]], None]
) -> None:
    """Run ``callback`` on ``loop`` with ``pending``'s finished future once Ray has the answer.

    Ray finishes the future on a thread of its own. ``asyncio.wrap_future`` would take
    two loop turns from there to a callback (one to copy the state into an asyncio
    future, one to run that future's callbacks); this takes one.
    """

    def on_ray_thread(done: Finished[Any]) -> None:
        # A loop closed meanwhile has nobody left to answer (wrap_future drops it too).
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(callback, done)

    pending.future().add_done_callback(on_ray_thread)


def _settle(batch: _Open, answered: Finished[Answered]) -> None:
    if answered.cancelled():
        for reply in batch.replies:
            reply.cancel()
        return
    error = answered.exception()
    if error is not None:
        _fail_all(batch.replies, error)
        return
    for index, value, token in answered.result():
        reply = batch.replies[index]
        if token is None:
            if not reply.done():
                reply.set_result(value)  # type: ignore[arg-type]
        elif not reply.done():
            _chain(batch.handle.collect.remote(token), reply)


def _chain(pending: ray.ObjectRef[Any], reply: asyncio.Future[Reply]) -> None:
    """Give ``reply`` what ``pending`` answers (its value, its error, or its cancellation)."""

    def copy(done: Finished[Any]) -> None:
        if reply.done():
            return
        if done.cancelled():
            reply.cancel()
        elif (error := done.exception()) is not None:
            reply.set_exception(error)
        else:
            reply.set_result(done.result())

    _when_done(pending, reply.get_loop(), copy)


def _fail(reply: asyncio.Future[Reply], error: BaseException) -> None:
    if not reply.done():
        reply.set_exception(error)


def _fail_all(replies: list[asyncio.Future[Reply]], error: BaseException) -> None:
    for reply in replies:
        _fail(reply, error)


class BatchServer:
    """The host's side: serves a batch's turns concurrently and holds its stragglers' replies."""

    def __init__(self) -> None:
        self._held: dict[str, asyncio.Future[Reply]] = {}

    async def serve(self, turns: Sequence[Callable[[], Awaitable[Reply]]]) -> Answered:
        """Run each ``turns[i]()`` (a coroutine answering a ``Reply``) concurrently; answer per :data:`Answered`."""
        order: list[int] = []

        def finished_as(index: int) -> Callable[[asyncio.Future[Reply]], None]:
            return lambda _: order.append(index)

        tasks = [asyncio.ensure_future(turn()) for turn in turns]
        for index, task in enumerate(tasks):
            task.add_done_callback(finished_as(index))
        running = set(tasks)
        while running:
            finished, running = await asyncio.wait(running, timeout=BATCH_STALL, return_when=asyncio.FIRST_COMPLETED)
            if not finished and order:
                break  # no turn finished for BATCH_STALL seconds: answer what is done
        listed = set(order)
        answered: Answered = [(index, tasks[index].result(), None) for index in order]
        for index, task in enumerate(tasks):
            if index in listed:
                continue
            # A turn that finished after the last wait has not run its done callback yet.
            answered.append((index, task.result(), None) if task.done() else (index, None, self._hold(task)))
        return answered

    def _hold(self, task: asyncio.Future[Reply]) -> str:
        token = uuid.uuid4().hex
        self._held[token] = task
        loop = asyncio.get_running_loop()
        task.add_done_callback(lambda _: loop.call_later(HELD_FOR, self._held.pop, token, None))
        return token

    async def collect(self, token: str) -> Reply:
        """The reply of a straggler named in an earlier answer, waited for if it is still running.

        An unknown token (this host restarted since, or the reply was held longer than
        :data:`HELD_FOR`) answers ``retry``: the caller routes the request again, as after
        the death of a host that was running it.
        """
        task = self._held.pop(token, None)
        if task is None:
            return RETRY, None
        return await asyncio.shield(task)
