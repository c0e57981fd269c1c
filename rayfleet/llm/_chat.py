"""An OpenAI-compatible chat client over aiohttp, reporting token usage to workflow budgets."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import aiohttp

from ..errors import (
    InvalidSpecError,
    ModelRequestError,
    ModelResponseError,
    ModelTimeoutError,
    ModelUnavailableError,
)
from ..identity._handlers import Reply, Usage
from ..retry import RetryPolicy, retry_async

if TYPE_CHECKING:
    from typing_extensions import Self

CHAT_RETRY = RetryPolicy(max_attempts=3, base_delay=0.25, max_delay=4.0, jitter=0.0)
"""Waits between retried requests: 0.25 s doubling, capped at 4 s so a large ``max_retries``
never sleeps for minutes. Each client replaces ``max_attempts`` with ``max_retries + 1``."""
_EXCERPT = 200
"""Characters of a response body quoted in an error message."""
_RESERVED_PARAMS = ("model", "messages", "stream")


# --------------------------------------------------------------------------- values


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One message of a chat conversation.

    Attributes:
        role: who speaks: ``"system"``, ``"user"``, ``"assistant"`` or another role the server knows.
        content: the text of the message.

    Raises:
        InvalidSpecError: when ``role`` is empty or either field is not a string.
    """

    role: str
    content: str

    def __post_init__(self) -> None:
        if not isinstance(self.role, str) or not self.role:
            raise InvalidSpecError(f"a chat message needs a non-empty string role, got {self.role!r}",
                                   field="messages")
        if not isinstance(self.content, str):
            raise InvalidSpecError(
                f"chat message content must be a string, got {type(self.content).__name__}", field="messages"
            )

    def to_json(self) -> dict[str, str]:
        """The message as the chat completions API expects it."""
        return {"role": self.role, "content": self.content}


@dataclass(frozen=True, slots=True)
class ChatReply:
    """What a chat model answered, with the tokens it cost.

    Attributes:
        text: the content of the first choice.
        usage: prompt and completion tokens as the server reported them (zeros if it did not).
        model: the model that answered, as the server named it.
        finish_reason: why generation stopped (``"stop"``, ``"length"``, ...), if reported.
        raw: the decoded response body, for fields this class does not surface.
    """

    text: str
    usage: Usage
    model: str
    finish_reason: str | None = None
    raw: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class ChatModel(Protocol):
    """Anything a handler can chat with: :class:`ChatClient`, :class:`ScriptedModel` or your own."""

    async def chat(self, messages: Iterable[ChatMessage | Mapping[str, Any]], **params: Any) -> ChatReply:
        """Answer ``messages``; ``params`` are model parameters such as ``temperature``."""
        ...


def reply_with_usage(reply: ChatReply) -> Reply:
    """Wrap a chat reply as a handler :class:`Reply` so workflow token budgets count it.

    Example::

        return rf.reply_with_usage(await model.chat([{"role": "user", "content": question}]))
    """
    return Reply(reply.text, usage=reply.usage)


def coerce_messages(messages: Iterable[ChatMessage | Mapping[str, Any]]) -> list[ChatMessage]:
    # A bare string or dict is iterable too; refusing them here beats sending one message per character.
    if isinstance(messages, (str, bytes, Mapping)):
        raise InvalidSpecError(
            "messages must be a list of ChatMessage or {'role': ..., 'content': ...} dicts, "
            f"got a single {type(messages).__name__}",
            field="messages",
        )
    coerced: list[ChatMessage] = []
    for index, message in enumerate(messages):
        if isinstance(message, ChatMessage):
            coerced.append(message)
        elif isinstance(message, Mapping):
            missing = [key for key in ("role", "content") if key not in message]
            if missing:
                raise InvalidSpecError(f"message {index} lacks {', '.join(missing)}: {dict(message)!r}",
                                       field="messages")
            coerced.append(ChatMessage(message["role"], message["content"]))
        else:
            raise InvalidSpecError(
                f"message {index} must be a ChatMessage or a dict, got {type(message).__name__}", field="messages"
            )
    if not coerced:
        raise InvalidSpecError("messages is empty; send at least one message", field="messages")
    return coerced


def _excerpt(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= _EXCERPT else flat[:_EXCERPT] + "..."


def _token_count(usage: Mapping[str, Any], name: str, *, url: str) -> int:
    value = usage.get(name)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ModelResponseError(
            url=url, detail=f"chat response usage.{name} must be a non-negative integer, got {value!r}"
        )
    return value


def _parse_completion(body: str, *, url: str, default_model: str) -> ChatReply:
    """Decode a chat completions response body from ``url`` into a :class:`ChatReply`.

    Raises:
        ModelResponseError: naming the part of the response that is missing or malformed.
    """
    try:
        raw = json.loads(body)
    except ValueError:
        raise ModelResponseError(url=url, detail=f"chat response is not JSON: {_excerpt(body)!r}") from None
    if not isinstance(raw, dict):
        raise ModelResponseError(url=url, detail=f"chat response must be a JSON object, got {_excerpt(body)!r}")
    choices = raw.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ModelResponseError(url=url, detail=f"chat response has no choices[0]: {_excerpt(body)!r}")
    message = choices[0].get("message")
    if not isinstance(message, dict):
        raise ModelResponseError(url=url, detail=f"chat response has no choices[0].message: {_excerpt(body)!r}")
    content = message.get("content")
    if content is None and message.get("tool_calls"):
        content = ""  # a tool-call turn legitimately carries no text
    if not isinstance(content, str):
        raise ModelResponseError(
            url=url, detail=f"chat response has no string choices[0].message.content: {_excerpt(body)!r}"
        )
    usage_json = raw.get("usage")
    if usage_json is None:
        usage = Usage()  # some compatible servers omit usage; a budget then sees zero tokens
    elif isinstance(usage_json, dict):
        usage = Usage(prompt_tokens=_token_count(usage_json, "prompt_tokens", url=url),
                      completion_tokens=_token_count(usage_json, "completion_tokens", url=url))
    else:
        raise ModelResponseError(url=url, detail=f"chat response usage must be an object, got {usage_json!r}")
    finish_reason = choices[0].get("finish_reason")
    model = raw.get("model")
    return ChatReply(
        text=content,
        usage=usage,
        model=model if isinstance(model, str) and model else default_model,
        finish_reason=finish_reason if isinstance(finish_reason, str) else None,
        raw=raw,
    )


# --------------------------------------------------------------------------- the HTTP client


class ChatClient:
    """A client for any OpenAI-compatible ``/chat/completions`` endpoint.

    Works with OpenAI, a Ray Serve or vLLM deployment, or any compatible server.
    Sessions are created lazily, one per event loop, because an aiohttp session
    is bound to the loop that made it; close them with :meth:`close` or use the
    client as ``async with ChatClient(...) as client``.

    Args:
        base_url: the API root, e.g. ``"http://127.0.0.1:8000/v1"``; ``/chat/completions`` is appended.
        model: the model name sent with every request.
        api_key: sent as ``Authorization: Bearer <api_key>`` when given.
        timeout: seconds one request may take, body included.
        max_retries: retries after the first attempt for HTTP 429, 5xx and connection errors.

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
        max_retries: int = 2,
    ) -> None:
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise InvalidSpecError(f"base_url must start with http:// or https://, got {base_url!r}",
                                   field="base_url")
        if not isinstance(model, str) or not model:
            raise InvalidSpecError(f"model must be a non-empty string, got {model!r}", field="model")
        if api_key is not None and (not isinstance(api_key, str) or not api_key):
            raise InvalidSpecError("api_key must be a non-empty string or None", field="api_key")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise InvalidSpecError(f"timeout must be a positive number of seconds, got {timeout!r}",
                                   field="timeout")
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise InvalidSpecError(f"max_retries must be an integer >= 0, got {max_retries!r}",
                                   field="max_retries")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.timeout = float(timeout)
        self.max_retries = max_retries
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

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._api_key is not None:
            headers["Authorization"] = f"Bearer {self._api_key}"
        return headers

    def _request_body(self, messages: Iterable[ChatMessage | Mapping[str, Any]], params: Mapping[str, Any]) -> str:
        reserved = sorted(set(params) & set(_RESERVED_PARAMS))
        if reserved:
            raise InvalidSpecError(
                f"chat() does not take {', '.join(reserved)} as a parameter: the model is set on the client "
                f"and streaming is not supported",
                field=reserved[0],
            )
        body = {"model": self.model, "messages": [m.to_json() for m in coerce_messages(messages)], **params}
        try:
            return json.dumps(body)
        except (TypeError, ValueError) as error:
            raise InvalidSpecError(f"chat parameters must be JSON-serialisable: {error}", field="params") from None

    async def chat(self, messages: Iterable[ChatMessage | Mapping[str, Any]], **params: Any) -> ChatReply:
        """Send ``messages`` to the chat completions endpoint and return the first choice.

        HTTP 429, 5xx and connection failures are retried up to ``max_retries`` times,
        waiting as :data:`CHAT_RETRY` says; nothing else is retried.

        Args:
            messages: ``ChatMessage`` values or ``{"role": ..., "content": ...}`` dicts.
            **params: request fields sent as given, e.g. ``temperature=0.2, max_tokens=64``.

        Raises:
            InvalidSpecError: bad messages or parameters; nothing was sent.
            ModelRequestError: the server refused the request (another HTTP error; status and body inside).
            ModelResponseError: the response lacks a required field or is not JSON.
            ModelTimeoutError: one request took longer than ``timeout``.
            ModelUnavailableError: 429/5xx/connection failures outlasted ``max_retries``.
        """
        body = self._request_body(messages, params)
        session = self._session()
        request_timeout = aiohttp.ClientTimeout(total=self.timeout)
        policy = dataclasses.replace(CHAT_RETRY, max_attempts=self.max_retries + 1)

        async def attempt() -> ChatReply:
            try:
                async with session.post(self.url, data=body, headers=self._headers(),
                                        timeout=request_timeout) as response:
                    status = response.status
                    text = await response.text(errors="replace")
            except asyncio.TimeoutError:
                # Not retried: a request that timed out may still be generating (and billing) server-side.
                raise ModelTimeoutError(url=self.url, timeout=self.timeout) from None
            if 200 <= status < 300:
                return _parse_completion(text, url=self.url, default_model=self.model)
            if status == 429 or status >= 500:
                raise _ServerBusy(status, _excerpt(text))
            # The request itself is wrong (auth, model name, parameters); repeating it cannot help.
            raise ModelRequestError(url=self.url, status=status, body_excerpt=_excerpt(text))

        try:
            return await retry_async(attempt, policy, retry_on=_is_transient)
        except _ServerBusy as busy:
            raise ModelUnavailableError(
                url=self.url, attempts=policy.max_attempts, last_failure=f"HTTP {busy.status}: {busy.excerpt!r}"
            ) from None
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as error:
            raise ModelUnavailableError(
                url=self.url, attempts=policy.max_attempts,
                last_failure=f"connection failed: {type(error).__name__}: {error}",
            ) from error


class _ServerBusy(Exception):
    """HTTP 429 or 5xx: the server may answer a later attempt."""

    def __init__(self, status: int, excerpt: str) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status
        self.excerpt = excerpt


def _is_transient(error: Exception) -> bool:
    return isinstance(error, (_ServerBusy, aiohttp.ClientConnectionError, aiohttp.ClientPayloadError))
