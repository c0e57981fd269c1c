"""An OpenAI-compatible chat client over aiohttp: tools, streaming, ``Retry-After`` and timeouts.

What is retried: HTTP 429, 5xx and connection failures before a reply began, up to
``max_retries`` times. A 429 or 503 with ``Retry-After`` waits what the server asked
(when that is at most ``max_retry_after``; longer, the error carries it for the caller to
honour). Nothing else is retried: not a timeout (the server may still be generating, and
billing), not a stream that broke after it began (its deltas are already out).
"""

from __future__ import annotations

import asyncio
import email.utils
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import aiohttp

from ..errors import (
    InvalidSpecError,
    ModelRequestError,
    ModelTimeoutError,
    ModelUnavailableError,
    UsageError,
)
from ..retry import RetryPolicy
from ._completions import ReplyAssembler, excerpt, parse_completion, request_body, sse_data
from ._values import ChatDelta, ChatMessage, ChatReply

if TYPE_CHECKING:
    from typing_extensions import Self

T = TypeVar("T")

CHAT_RETRY = RetryPolicy(max_attempts=3, base_delay=0.25, max_delay=4.0, jitter=0.0)
"""Waits between retried requests without ``Retry-After``: 0.25 s doubling, capped at 4 s so a
large ``max_retries`` never sleeps for minutes. Each client replaces ``max_attempts`` with
``max_retries + 1``."""
RETRY_AFTER_STATUSES = (429, 503)
"""Statuses whose ``Retry-After`` header says when to try again (RFC 9110, section 10.2.3)."""


def _positive(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or not math.isfinite(value):
        raise InvalidSpecError(f"{name} must be a positive number of seconds, got {value!r}", field=name)
    return float(value)


def retry_after_seconds(header: str | None, *, now: float | None = None) -> float | None:
    """The seconds a ``Retry-After`` header asks to wait (delay-seconds or an HTTP date); ``None`` if absent
    or unreadable. A date in the past is 0."""
    if header is None:
        return None
    text = header.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError):
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    return max(seconds, 0.0) if math.isfinite(seconds) else None


class _ServerBusy(Exception):
    """HTTP 429 or 5xx: the server may answer a later attempt."""

    def __init__(self, status: int, excerpt: str, retry_after: float | None) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status
        self.excerpt = excerpt
        self.retry_after = retry_after


_CONNECTION_ERRORS = (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError)


class ChatClient:
    """A client for any OpenAI-compatible ``/chat/completions`` endpoint.

    Works with OpenAI, vLLM, Ray Serve LLM, LiteLLM's proxy or any compatible server.
    :meth:`chat` returns the whole reply; :meth:`stream` yields it as it is written.
    Both take the protocol's parameters (``tools``, ``tool_choice``,
    ``parallel_tool_calls``, ``temperature``, ...) as keywords, sent as given once
    ``tools`` and ``tool_choice`` are checked. Sessions are created lazily, one per
    event loop, because an aiohttp session is bound to the loop that made it; close them
    with :meth:`close` or use the client as ``async with ChatClient(...) as client``.

    Args:
        base_url: the API root, e.g. ``"http://127.0.0.1:8000/v1"``; ``/chat/completions`` is appended.
        model: the model name sent with every request.
        api_key: sent as ``Authorization: Bearer <api_key>`` when given.
        timeout: seconds one request may take, body included; for a streamed request, the
            longest wait for its reply to begin and then for each next chunk (a long
            answer may stream for minutes).
        connect_timeout: seconds to open the connection (at most ``timeout``).
        max_retries: retries after the first attempt for HTTP 429, 5xx and connection errors.
        max_retry_after: the longest ``Retry-After`` waited for; a longer one ends the call
            with ``ModelUnavailableError.retry_after`` set.

    Raises:
        InvalidSpecError: naming the option that is not valid.
    """

    def __init__(
        self,
        base_url: str,
        *,
        model: str,
        api_key: str | None = None,
        timeout: float = 60.0,
        connect_timeout: float = 10.0,
        max_retries: int = 2,
        max_retry_after: float = 60.0,
    ) -> None:
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise InvalidSpecError(f"base_url must start with http:// or https://, got {base_url!r}",
                                   field="base_url")
        if not isinstance(model, str) or not model:
            raise InvalidSpecError(f"model must be a non-empty string, got {model!r}", field="model")
        if api_key is not None and (not isinstance(api_key, str) or not api_key):
            raise InvalidSpecError("api_key must be a non-empty string or None", field="api_key")
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise InvalidSpecError(f"max_retries must be an integer >= 0, got {max_retries!r}",
                                   field="max_retries")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.timeout = _positive("timeout", timeout)
        self.connect_timeout = min(_positive("connect_timeout", connect_timeout), self.timeout)
        self.max_retries = max_retries
        self.max_retry_after = _positive("max_retry_after", max_retry_after)
        self._api_key = api_key  # kept private so repr() and logs never show it
        self._sessions: dict[asyncio.AbstractEventLoop, aiohttp.ClientSession] = {}

    @property
    def url(self) -> str:
        """The full chat completions URL requests are sent to."""
        return f"{self.base_url}/chat/completions"

    def __repr__(self) -> str:
        return f"ChatClient({self.base_url!r}, model={self.model!r}, timeout={self.timeout:g})"

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def _session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        # Sessions of loops that have since closed cannot be closed any more; just forget them.
        for stale in [other for other in self._sessions if other.is_closed()]:
            del self._sessions[stale]
        session = self._sessions.get(loop)
        if session is None or session.closed:
            session = aiohttp.ClientSession()
            self._sessions[loop] = session
        return session

    async def close(self) -> None:
        """Close the HTTP sessions this client opened; the client may be used again afterwards."""
        current = asyncio.get_running_loop()
        sessions, self._sessions = self._sessions, {}
        for loop, session in sessions.items():
            if session.closed or loop.is_closed():
                continue
            if loop is current:
                await session.close()
            else:
                # A session must be closed on its own loop; that loop runs in another thread.
                asyncio.run_coroutine_threadsafe(session.close(), loop)

    def _headers(self, *, stream: bool) -> dict[str, str]:
        headers = {"Content-Type": "application/json",
                   "Accept": "text/event-stream" if stream else "application/json"}
        if self._api_key is not None:
            headers["Authorization"] = f"Bearer {self._api_key}"
        return headers

    async def chat(self, messages: Iterable[ChatMessage | Mapping[str, Any]], **params: Any) -> ChatReply:
        """Send ``messages`` to the chat completions endpoint and return the first choice.

        Args:
            messages: ``ChatMessage`` values or the protocol's message dicts (tool calls
                and ``tool`` results included).
            **params: request fields, e.g. ``tools=[...], tool_choice="auto", temperature=0.2``.

        Raises:
            InvalidSpecError: bad messages or parameters (``stream`` among them: use
                :meth:`stream`); nothing was sent.
            ModelRequestError: the server refused the request (another HTTP error; status and body inside).
            ModelResponseError: the response lacks a required field or is not JSON.
            ModelTimeoutError: one request took longer than ``timeout``.
            ModelUnavailableError: 429/5xx/connection failures outlasted ``max_retries``,
                or a ``Retry-After`` was longer than ``max_retry_after``.
        """
        body = request_body(self.model, messages, params, stream=False)
        timeout = aiohttp.ClientTimeout(total=self.timeout, connect=self.connect_timeout)

        async def attempt() -> ChatReply:
            session = self._session()
            try:
                async with session.post(self.url, data=body, headers=self._headers(stream=False),
                                        timeout=timeout) as response:
                    text = await response.text(errors="replace")
                    _check_status(self.url, response, text)
            except asyncio.TimeoutError:
                raise ModelTimeoutError(url=self.url, timeout=self.timeout) from None
            return parse_completion(text, url=self.url, default_model=self.model)

        return await self._with_retries(attempt)

    def stream(self, messages: Iterable[ChatMessage | Mapping[str, Any]], **params: Any) -> ChatStream:
        """Send ``messages`` asking for a streamed reply; iterate the result for its deltas.

        ::

            async with client.stream(messages, tools=tools) as reply:
                async for delta in reply:
                    print(delta.text, end="")
            answer = reply.reply          # text, tool calls and usage, assembled

        The request asks for usage in the last chunk (``stream_options.include_usage``).
        Its parameters are checked now (``InvalidSpecError``); it is sent when the stream
        is entered or first iterated, and retried as :meth:`chat` is until the reply
        begins. The errors are those of :meth:`chat`, raised from the iteration; a stream
        that breaks off after it began raises ``ModelUnavailableError`` and is not retried.
        """
        return ChatStream(self, request_body(self.model, messages, params, stream=True))

    async def _with_retries(self, attempt: Callable[[], Awaitable[T]]) -> T:
        """Await ``attempt()`` until it succeeds, retrying a busy server and lost connections (see the module)."""
        attempts = self.max_retries + 1
        for number in range(1, attempts + 1):
            try:
                return await attempt()
            except _ServerBusy as busy:
                if busy.retry_after is not None and busy.retry_after > self.max_retry_after:
                    raise ModelUnavailableError(url=self.url, attempts=number, retry_after=busy.retry_after,
                                                last_failure=f"HTTP {busy.status}: {busy.excerpt!r}") from None
                if number == attempts:
                    raise ModelUnavailableError(url=self.url, attempts=number,
                                                last_failure=f"HTTP {busy.status}: {busy.excerpt!r}") from None
                delay = CHAT_RETRY.delay_for(number - 1) if busy.retry_after is None else busy.retry_after
            except _CONNECTION_ERRORS as error:
                if number == attempts:
                    raise ModelUnavailableError(
                        url=self.url, attempts=number,
                        last_failure=f"connection failed: {type(error).__name__}: {error}",
                    ) from error
                delay = CHAT_RETRY.delay_for(number - 1)
            await asyncio.sleep(delay)
        raise AssertionError("unreachable: the last attempt returns or raises")


def _check_status(url: str, response: aiohttp.ClientResponse, text: str) -> None:
    """Raise for a response that is not a success: ``_ServerBusy`` (retried) or ``ModelRequestError``."""
    status = response.status
    if 200 <= status < 300:
        return
    if status == 429 or status >= 500:
        retry_after = retry_after_seconds(response.headers.get("Retry-After")) \
            if status in RETRY_AFTER_STATUSES else None
        raise _ServerBusy(status, excerpt(text), retry_after)
    # The request itself is wrong (auth, model name, parameters); repeating it cannot help.
    raise ModelRequestError(url=url, status=status, body_excerpt=excerpt(text))


class ChatStream:
    """A streamed reply: an async iterator of :class:`ChatDelta`, and an async context manager.

    Made by :meth:`ChatClient.stream`. Leaving the ``async with`` block (or the
    iteration ending, or failing) closes the response; breaking out early is fine.
    """

    def __init__(self, client: ChatClient, body: str) -> None:
        self._client = client
        self._body = body
        self._assembler = ReplyAssembler(url=client.url, default_model=client.model)
        self._response: aiohttp.ClientResponse | None = None
        self._events: AsyncIterator[ChatDelta] | None = None
        self._reply: ChatReply | None = None

    async def __aenter__(self) -> Self:
        await self._open()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    def __aiter__(self) -> AsyncIterator[ChatDelta]:
        return self

    async def __anext__(self) -> ChatDelta:
        if self._events is None:
            await self._open()
            assert self._response is not None
            self._events = self._deltas(self._response)
        try:
            return await self._events.__anext__()
        except BaseException:
            await self.aclose()
            raise

    @property
    def reply(self) -> ChatReply:
        """The whole reply, once the stream ended.

        Raises:
            UsageError: the stream has not been read to its end.
        """
        if self._reply is None:
            raise UsageError("the streamed reply is not complete yet: iterate the stream to its end, or await "
                             "stream.finish()", api="ChatStream.reply")
        return self._reply

    async def finish(self) -> ChatReply:
        """Read the rest of the stream and return the whole reply."""
        async for _ in self:
            pass
        return self.reply

    async def aclose(self) -> None:
        """Release the connection; the reply stays readable if the stream had ended."""
        response, self._response = self._response, None
        if response is not None:
            response.release()

    async def _open(self) -> None:
        if self._response is not None or self._reply is not None:
            return
        client = self._client
        # Between chunks a stream may pause, not end: only the wait for the next read is bounded.
        timeout = aiohttp.ClientTimeout(total=None, connect=client.connect_timeout, sock_read=client.timeout)

        async def attempt() -> aiohttp.ClientResponse:
            session = client._session()
            try:
                response = await session.post(client.url, data=self._body, headers=client._headers(stream=True),
                                              timeout=timeout)
            except asyncio.TimeoutError:
                raise ModelTimeoutError(url=client.url, timeout=client.timeout, streamed=True) from None
            if not 200 <= response.status < 300:
                try:
                    text = await response.text(errors="replace")
                finally:
                    response.release()
                _check_status(client.url, response, text)
            return response

        self._response = await client._with_retries(attempt)

    async def _deltas(self, response: aiohttp.ClientResponse) -> AsyncIterator[ChatDelta]:
        assembler, url = self._assembler, self._client.url
        if "text/event-stream" not in response.headers.get("Content-Type", "text/event-stream"):
            # A server that ignored "stream": it answered the whole reply at once.
            reply = parse_completion(await response.text(errors="replace"), url=url,
                                     default_model=self._client.model)
            self._reply = reply
            if reply.text:
                yield ChatDelta(text=reply.text)
            for index, call in enumerate(reply.tool_calls):
                yield ChatDelta(tool_index=index, tool_call_id=call.id, tool_name=call.name, arguments=call.arguments)
            return
        pending = b""
        event: list[str] = []
        try:
            async for piece in response.content.iter_any():
                pending += piece
                *lines, pending = pending.split(b"\n")
                for raw in lines:
                    line = raw.decode("utf-8", errors="replace").rstrip("\r")
                    if line:
                        event.append(line)
                        continue
                    for data in sse_data(event):
                        deltas = assembler.add(data)
                        if deltas is None:
                            self._reply = assembler.reply()
                            return
                        for delta in deltas:
                            yield delta
                    event = []
        except asyncio.TimeoutError:
            raise ModelTimeoutError(url=url, timeout=self._client.timeout, streamed=True) from None
        except _CONNECTION_ERRORS as error:
            raise ModelUnavailableError(url=url, attempts=1, last_failure=f"the stream broke off after "
                                        f"{assembler.chunks} chunk(s): {type(error).__name__}: {error}") from error
        # The body ended without [DONE]: what came is whole if the server said why it stopped.
        for data in sse_data(event + ([pending.decode("utf-8", errors="replace")] if pending else [])):
            if (deltas := assembler.add(data)) is not None:
                for delta in deltas:
                    yield delta
        if not assembler.complete:
            raise ModelUnavailableError(url=url, attempts=1, last_failure=f"the stream ended after "
                                        f"{assembler.chunks} chunk(s) without a finish reason or [DONE]")
        self._reply = assembler.reply()
