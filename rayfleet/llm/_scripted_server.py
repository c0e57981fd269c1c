"""A real chat completions server on 127.0.0.1 that answers from a script: model agents offline.

It speaks the protocol :class:`~rayfleet.ChatClient` speaks (tool calls, streamed SSE
deltas with tool-call argument fragments, usage, error statuses with ``Retry-After``), so
the demo, the examples and the tests run the very code a real model server would meet;
pointing ``base_url`` at vLLM, Ray Serve LLM or LiteLLM's proxy is the only change.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

from aiohttp import web

from ..errors import InvalidSpecError, UsageError
from ._values import ToolCall

if TYPE_CHECKING:
    from typing_extensions import Self

ARGUMENT_FRAGMENTS = 3
"""A streamed tool call's arguments arrive in this many pieces, as real servers split them."""


@dataclass(frozen=True, slots=True)
class ScriptedReply:
    """One answer of a :class:`ScriptedModelServer`.

    Attributes:
        text: the assistant's text.
        tool_calls: tools the reply asks for (several: parallel calls).
        status: an HTTP status other than 200 answers with an error body instead.
        retry_after: seconds sent as ``Retry-After`` (with a 429 or 503).
        delay: seconds to wait before answering (a slow model).
        body: sent as the response body as it is (a broken server), with ``status``.
        break_after: streamed only: close the connection after this many chunks, mid-reply.
    """

    text: str = ""
    tool_calls: Sequence[ToolCall] = ()
    status: int = 200
    retry_after: float | None = None
    delay: float = 0.0
    body: str | None = None
    break_after: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.text, str):
            raise InvalidSpecError(f"a scripted reply's text must be a string, got {self.text!r}", field="text")
        if not all(isinstance(call, ToolCall) for call in self.tool_calls):
            raise InvalidSpecError("a scripted reply's tool_calls must be rf.ToolCall values", field="tool_calls")
        if isinstance(self.status, bool) or not isinstance(self.status, int) or not 100 <= self.status <= 599:
            raise InvalidSpecError(f"status must be an HTTP status code, got {self.status!r}", field="status")
        if isinstance(self.delay, bool) or not isinstance(self.delay, (int, float)) or self.delay < 0:
            raise InvalidSpecError(f"delay must be a number of seconds >= 0, got {self.delay!r}", field="delay")


Script = Sequence["str | ScriptedReply"] | Callable[[dict[str, Any]], "str | ScriptedReply"]


def _words(text: str | None) -> int:
    return len(text.split()) if text else 0


class ScriptedModelServer:
    """An OpenAI-compatible ``/v1/chat/completions`` server on 127.0.0.1 answering from a script.

    ``script`` is a list of answers given in order (a string is a text reply), or a
    function from the request's JSON body to an answer. A list that runs out answers
    HTTP 500 naming how many replies it held, so a test that asks more than it scripted
    fails plainly. A request asking ``"stream": true`` gets the reply as server-sent
    events: the text word by word, each tool call's arguments in
    :data:`ARGUMENT_FRAGMENTS` pieces, and a last chunk with usage when
    ``stream_options.include_usage`` asks for it. Usage counts words: every message's
    content for the prompt, the reply's text and arguments for the completion, each
    times ``tokens_per_word``.

    The server runs on its own thread and event loop, so it serves sync and async
    callers alike: ``with ScriptedModelServer([...]) as server: ... server.url``.

    Args:
        script: the answers, as above.
        model: the model name the replies carry.
        api_key: when set, a request without ``Authorization: Bearer <api_key>`` gets 401.
        tokens_per_word: tokens counted per word, a positive integer.
        chunk_delay: seconds between streamed chunks (to watch a stream arrive).

    Raises:
        InvalidSpecError: an empty or malformed script, or a bad option.
    """

    def __init__(self, script: Script, *, model: str = "scripted", api_key: str | None = None,
                 tokens_per_word: int = 1, chunk_delay: float = 0.0) -> None:
        self._function: Callable[[dict[str, Any]], str | ScriptedReply] | None = None
        self._replies: list[str | ScriptedReply] = []
        if callable(script):
            self._function = script
        else:
            if isinstance(script, str) or not isinstance(script, Sequence) or not script:
                raise InvalidSpecError("script must be a non-empty list of replies or a function of the request",
                                       field="script")
            for index, item in enumerate(script):
                if not isinstance(item, (str, ScriptedReply)):
                    raise InvalidSpecError(f"script[{index}] must be a string or rf.testing.ScriptedReply, got "
                                           f"{type(item).__name__}", field="script")
            self._replies = list(script)
        if isinstance(tokens_per_word, bool) or not isinstance(tokens_per_word, int) or tokens_per_word < 1:
            raise InvalidSpecError(f"tokens_per_word must be a positive integer, got {tokens_per_word!r}",
                                   field="tokens_per_word")
        if isinstance(chunk_delay, bool) or not isinstance(chunk_delay, (int, float)) or chunk_delay < 0:
            raise InvalidSpecError(f"chunk_delay must be a number of seconds >= 0, got {chunk_delay!r}",
                                   field="chunk_delay")
        self.model = model
        self.tokens_per_word = tokens_per_word
        self.chunk_delay = float(chunk_delay)
        self._api_key = api_key
        self._lock = threading.Lock()
        self._requests: list[dict[str, Any]] = []
        self._received_at: list[float] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._port = 0

    # -- what it served

    @property
    def url(self) -> str:
        """The API root to give ``rf.ChatClient`` / ``rf.Model`` as ``base_url``.

        Raises:
            UsageError: the server is not running.
        """
        if self._runner is None:
            raise UsageError("the scripted model server is not running: use it as `with ScriptedModelServer(...) "
                             "as server:` or call start()", api="ScriptedModelServer.url")
        return f"http://127.0.0.1:{self._port}/v1"

    @property
    def served(self) -> int:
        """How many chat completion requests it has answered (errors included)."""
        with self._lock:
            return len(self._requests)

    @property
    def requests(self) -> list[dict[str, Any]]:
        """The JSON bodies of the requests it answered, in order (a copy)."""
        with self._lock:
            return list(self._requests)

    @property
    def received_at(self) -> list[float]:
        """``time.monotonic()`` at each request's arrival, in order (a copy)."""
        with self._lock:
            return list(self._received_at)

    # -- running

    def start(self) -> ScriptedModelServer:
        """Start serving on a free port of 127.0.0.1 (idempotent); returns the server."""
        if self._runner is not None:
            return self
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="scripted-model-server", daemon=True)
        thread.start()
        self._loop, self._thread = loop, thread
        try:
            asyncio.run_coroutine_threadsafe(self._serve(), loop).result(timeout=30)
        except BaseException:
            self._stop_loop()
            raise
        return self

    def stop(self) -> None:
        """Stop serving; requests in flight are cut off. The server may be started again."""
        if self._loop is None:
            return
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._shutdown(self._runner), self._loop).result(timeout=30)
            self._runner = None
        self._stop_loop()

    @staticmethod
    async def _shutdown(runner: web.AppRunner) -> None:
        await runner.cleanup()
        # Handlers still inside a scripted delay outlive the cleanup's grace: cut them off.
        others = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)

    def _stop_loop(self) -> None:
        loop, thread = self._loop, self._thread
        self._loop = self._thread = None
        if loop is not None and thread is not None:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=30)
            loop.close()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def __repr__(self) -> str:
        where = f"at {self.url}" if self._runner is not None else "stopped"
        return f"ScriptedModelServer({where}, served={self.served})"

    async def _serve(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._completions)
        # A short grace at stop: a scripted delay may keep a handler running.
        runner = web.AppRunner(app, shutdown_timeout=0.5)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self._port = runner.addresses[0][1]
        self._runner = runner

    # -- answering

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        if self._api_key is not None and request.headers.get("Authorization") != f"Bearer {self._api_key}":
            return _error(401, "invalid api key")
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "the request body is not JSON")
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list) or not body["messages"]:
            return _error(400, "the request needs a non-empty messages list")
        with self._lock:
            self._requests.append(body)
            self._received_at.append(time.monotonic())
            number = len(self._requests)
        if self._function is not None:
            answer = self._function(body)
        elif number > len(self._replies):
            return _error(500, f"the script held {len(self._replies)} replies and this is request {number}")
        else:
            answer = self._replies[number - 1]
        reply = ScriptedReply(text=answer) if isinstance(answer, str) else answer
        if reply.delay:
            await asyncio.sleep(reply.delay)
        if reply.body is not None or reply.status != 200:
            headers = {} if reply.retry_after is None else {"Retry-After": f"{reply.retry_after:g}"}
            if reply.body is not None:
                return web.Response(status=reply.status, text=reply.body, headers=headers,
                                    content_type="application/json")
            return _error(reply.status, f"scripted status {reply.status}", headers=headers)
        usage = self._usage(body, reply)
        completion_id = f"chatcmpl-scripted-{number}"
        if body.get("stream") is True:
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return await self._stream(request, reply, completion_id, usage if include_usage else None)
        message: dict[str, Any] = {"role": "assistant", "content": reply.text}
        if reply.tool_calls:
            message["content"] = reply.text or None
            message["tool_calls"] = [call.to_json() for call in reply.tool_calls]
        return web.json_response({
            "id": completion_id, "object": "chat.completion", "created": int(time.time()), "model": self.model,
            "choices": [{"index": 0, "message": message, "finish_reason": _finish_reason(reply)}],
            "usage": usage,
        })

    def _usage(self, body: Mapping[str, Any], reply: ScriptedReply) -> dict[str, int]:
        prompt = sum(_words(m.get("content")) for m in body["messages"] if isinstance(m, dict)
                     and isinstance(m.get("content"), str))
        completion = _words(reply.text) + sum(_words(call.arguments) for call in reply.tool_calls)
        prompt, completion = prompt * self.tokens_per_word, completion * self.tokens_per_word
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    async def _stream(self, request: web.Request, reply: ScriptedReply, completion_id: str,
                      usage: dict[str, int] | None) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        created = int(time.time())

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            return {"id": completion_id, "object": "chat.completion.chunk", "created": created, "model": self.model,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

        chunks = [chunk({"role": "assistant", "content": ""})]
        chunks += [chunk({"content": piece}) for piece in _pieces(reply.text)]
        for index, call in enumerate(reply.tool_calls):
            chunks.append(chunk({"tool_calls": [{"index": index, "id": call.id, "type": "function",
                                                 "function": {"name": call.name, "arguments": ""}}]}))
            chunks += [chunk({"tool_calls": [{"index": index, "function": {"arguments": fragment}}]})
                       for fragment in _fragments(call.arguments)]
        chunks.append(chunk({}, _finish_reason(reply)))
        if usage is not None:
            chunks.append({"id": completion_id, "object": "chat.completion.chunk", "created": created,
                           "model": self.model, "choices": [], "usage": usage})
        for sent, data in enumerate(chunks):
            if reply.break_after is not None and sent >= reply.break_after:
                # Cut off mid-reply, as a server that crashed would: no finish reason, no [DONE].
                assert request.transport is not None
                request.transport.close()
                return response
            await response.write(f"data: {json.dumps(data)}\n\n".encode())
            if self.chunk_delay:
                await asyncio.sleep(self.chunk_delay)
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


def _finish_reason(reply: ScriptedReply) -> str:
    return "tool_calls" if reply.tool_calls else "stop"


def _pieces(text: str) -> list[str]:
    """``text`` word by word, each with the space before it, as tokens stream."""
    words = text.split(" ")
    return [word if index == 0 else " " + word for index, word in enumerate(words)] if text else []


def _fragments(arguments: str) -> list[str]:
    size = max(1, -(-len(arguments) // ARGUMENT_FRAGMENTS))
    return [arguments[start:start + size] for start in range(0, len(arguments), size)]


def _error(status: int, message: str, *, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.json_response({"error": {"message": message, "type": "scripted", "code": status}}, status=status,
                             headers=dict(headers or {}))
