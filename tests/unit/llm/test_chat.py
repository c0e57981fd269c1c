"""The chat client against a real local HTTP server speaking the OpenAI chat completions API, and the scripted model.

No Ray here: the server is an aiohttp app on 127.0.0.1 (an ephemeral port) whose
behaviour each test scripts request by request.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import FrozenInstanceError
from typing import Any

import pytest
from aiohttp import web

from rayfleet.errors import (
    InvalidSpecError,
    ModelError,
    ModelRequestError,
    ModelResponseError,
    ModelTimeoutError,
    ModelUnavailableError,
    RayfleetError,
)
from rayfleet.identity._handlers import Reply, Usage
from rayfleet.llm import _chat
from rayfleet.llm._chat import ChatClient
from rayfleet.llm._values import ChatMessage, ChatModel, ChatReply, reply_with_usage
from rayfleet.testing import ScriptedModel

Action = Callable[[web.Request], Awaitable[web.StreamResponse]]


def words(text: str) -> int:
    return len(text.split())


class FakeOpenAI:
    """POST /v1/chat/completions like OpenAI: echoes the last user message and reports word-count usage.

    ``plan`` holds actions for the next requests (a scripted failure, a slow answer, a
    bad body); once it is empty, requests get the normal echo answer.
    """

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.plan: list[Action] = []
        self.port = 0
        self.include_usage = True

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.text()
        self.requests.append({"path": request.path, "headers": dict(request.headers), "body": body})
        if self.plan:
            return await self.plan.pop(0)(request)
        payload = json.loads(body)
        messages = payload["messages"]
        question = next(m["content"] for m in reversed(messages) if m["role"] == "user")
        text = f"echo: {question}"
        answer: dict[str, Any] = {
            "id": f"chatcmpl-{len(self.requests)}",
            "object": "chat.completion",
            "model": payload["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        }
        if self.include_usage:
            prompt = sum(words(m["content"]) for m in messages)
            answer["usage"] = {"prompt_tokens": prompt, "completion_tokens": words(text),
                               "total_tokens": prompt + words(text)}
        return web.json_response(answer)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"


def status(code: int, body: str = "") -> Action:
    async def respond(request: web.Request) -> web.StreamResponse:
        return web.Response(status=code, text=body or json.dumps({"error": {"message": f"status {code}"}}))
    return respond


def raw_body(body: str) -> Action:
    async def respond(request: web.Request) -> web.StreamResponse:
        return web.Response(status=200, text=body, content_type="application/json")
    return respond


def slow(seconds: float) -> Action:
    async def respond(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(seconds)
        return web.json_response({"choices": [{"message": {"role": "assistant", "content": "late"}}]})
    return respond


@pytest.fixture
async def server() -> AsyncIterator[FakeOpenAI]:
    fake = FakeOpenAI()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", fake.handle)
    # A short shutdown grace: the timeout test leaves a slow handler running.
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    fake.port = runner.addresses[0][1]
    try:
        yield fake
    finally:
        await runner.cleanup()


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    # Same exponential schedule, shorter steps, so retry tests stay quick.
    monkeypatch.setattr(_chat, "CHAT_RETRY", dataclasses.replace(_chat.CHAT_RETRY, base_delay=0.01))


# --------------------------------------------------------------------------- the HTTP client


async def test_happy_path_sends_model_params_and_bearer_and_parses_usage(server: FakeOpenAI) -> None:
    async with ChatClient(server.base_url, model="tiny-llm", api_key="sk-test") as client:
        reply = await client.chat(
            [ChatMessage("system", "You echo."), {"role": "user", "content": "hello there"}],
            temperature=0.2, max_tokens=16,
        )
    assert reply.text == "echo: hello there"
    assert reply.usage == Usage(prompt_tokens=4, completion_tokens=3)
    assert reply.model == "tiny-llm"
    assert reply.finish_reason == "stop"
    assert reply.raw["id"] == "chatcmpl-1"
    [request] = server.requests
    assert request["path"] == "/v1/chat/completions"
    assert request["headers"]["Authorization"] == "Bearer sk-test"
    assert request["headers"]["Content-Type"] == "application/json"
    sent = json.loads(request["body"])
    assert sent == {
        "model": "tiny-llm",
        "messages": [{"role": "system", "content": "You echo."}, {"role": "user", "content": "hello there"}],
        "temperature": 0.2,
        "max_tokens": 16,
    }


async def test_no_api_key_sends_no_authorization_and_trailing_slash_is_ignored(server: FakeOpenAI) -> None:
    async with ChatClient(server.base_url + "/", model="m") as client:
        reply = await client.chat([{"role": "user", "content": "hi"}])
    assert reply.text == "echo: hi"
    assert "Authorization" not in server.requests[0]["headers"]
    assert server.requests[0]["path"] == "/v1/chat/completions"


async def test_missing_usage_counts_as_zero_tokens(server: FakeOpenAI) -> None:
    server.include_usage = False
    async with ChatClient(server.base_url, model="m") as client:
        reply = await client.chat([{"role": "user", "content": "no usage please"}])
    assert reply.usage == Usage(prompt_tokens=0, completion_tokens=0)
    assert reply.text == "echo: no usage please"


async def test_503_is_retried_then_succeeds(server: FakeOpenAI) -> None:
    server.plan = [status(503)]
    async with ChatClient(server.base_url, model="m", max_retries=2) as client:
        reply = await client.chat([{"role": "user", "content": "again"}])
    assert reply.text == "echo: again"
    assert len(server.requests) == 2


async def test_429_is_retried(server: FakeOpenAI) -> None:
    server.plan = [status(429), status(429)]
    async with ChatClient(server.base_url, model="m", max_retries=2) as client:
        reply = await client.chat([{"role": "user", "content": "slowly"}])
    assert reply.text == "echo: slowly"
    assert len(server.requests) == 3


async def test_retries_are_bounded_by_max_retries(server: FakeOpenAI) -> None:
    server.plan = [status(500, "overloaded"), status(502, "bad gateway"), status(503, "still down")]
    async with ChatClient(server.base_url, model="m", max_retries=1) as client:
        with pytest.raises(ModelUnavailableError) as caught:
            await client.chat([{"role": "user", "content": "x"}])
    assert len(server.requests) == 2
    assert "502" in str(caught.value) and "bad gateway" in str(caught.value)
    assert "2 attempt" in str(caught.value)
    assert caught.value.attempts == 2 and caught.value.url == client.url
    assert "raise max_retries" in str(caught.value)


async def test_400_is_not_retried_and_names_status_and_body(server: FakeOpenAI) -> None:
    server.plan = [status(400, '{"error": {"message": "unknown parameter: frobnicate"}}')]
    async with ChatClient(server.base_url, model="m", max_retries=3) as client:
        with pytest.raises(RayfleetError) as caught:
            await client.chat([{"role": "user", "content": "x"}], frobnicate=True)
    assert type(caught.value) is ModelRequestError
    assert "HTTP 400" in str(caught.value)
    assert "unknown parameter: frobnicate" in str(caught.value)
    assert caught.value.status == 400 and "frobnicate" in caught.value.body_excerpt
    assert caught.value.url == client.url and "Check the api key" in str(caught.value)
    assert len(server.requests) == 1


async def test_401_is_not_retried(server: FakeOpenAI) -> None:
    server.plan = [status(401, "invalid api key")]
    async with ChatClient(server.base_url, model="m", api_key="wrong") as client:
        with pytest.raises(ModelRequestError, match="HTTP 401"):
            await client.chat([{"role": "user", "content": "x"}])
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ("<html>gateway</html>", "not JSON"),
        ("[1, 2]", "JSON object"),
        ('{"object": "chat.completion"}', "choices[0]"),
        ('{"choices": []}', "choices[0]"),
        ('{"choices": [{"finish_reason": "stop"}]}', "choices[0].message"),
        ('{"choices": [{"message": {"role": "assistant"}}]}', "choices[0].message.content"),
        ('{"choices": [{"message": {"content": "ok"}}], "usage": {"prompt_tokens": "many"}}',
         "usage.prompt_tokens"),
    ],
)
async def test_malformed_response_is_a_model_response_error_naming_what_is_missing(
    server: FakeOpenAI, body: str, named: str
) -> None:
    server.plan = [raw_body(body)]
    async with ChatClient(server.base_url, model="m") as client:
        with pytest.raises(ModelResponseError, match=re.escape(named)) as caught:
            await client.chat([{"role": "user", "content": "x"}])
    assert not isinstance(caught.value, InvalidSpecError)  # the server's fault, not the caller's spec
    assert isinstance(caught.value, ValueError)
    assert caught.value.url == client.url and named in caught.value.detail
    assert "OpenAI chat completions API" in str(caught.value)
    assert len(server.requests) == 1  # a malformed answer is not retried


async def test_timeout_raises_model_timeout_and_is_not_retried(server: FakeOpenAI) -> None:
    server.plan = [slow(1.0)]
    async with ChatClient(server.base_url, model="m", timeout=0.2, max_retries=2) as client:
        with pytest.raises(ModelTimeoutError) as caught:
            await client.chat([{"role": "user", "content": "x"}])
    assert isinstance(caught.value, TimeoutError) and isinstance(caught.value, ModelError)
    assert caught.value.timeout == 0.2
    assert caught.value.url == client.url
    assert "timeout=" in str(caught.value) and "fleet.status" not in str(caught.value)
    assert len(server.requests) == 1


async def test_connection_errors_are_retried_then_reported() -> None:
    # A port that was just free: nothing listens there, so every connect is refused.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    async with ChatClient(f"http://127.0.0.1:{port}/v1", model="m", max_retries=1) as client:
        with pytest.raises(ModelUnavailableError, match="connection failed") as caught:
            await client.chat([{"role": "user", "content": "x"}])
    assert "2 attempt" in str(caught.value)
    assert caught.value.__cause__ is not None


@pytest.mark.parametrize(
    ("args", "options", "field"),
    [
        (("127.0.0.1:8000/v1",), {"model": "m"}, "base_url"),
        (("ftp://host/v1",), {"model": "m"}, "base_url"),
        (("http://host/v1",), {"model": ""}, "model"),
        (("http://host/v1",), {"model": "m", "api_key": ""}, "api_key"),
        (("http://host/v1",), {"model": "m", "timeout": 0}, "timeout"),
        (("http://host/v1",), {"model": "m", "timeout": -1.0}, "timeout"),
        (("http://host/v1",), {"model": "m", "timeout": True}, "timeout"),
        (("http://host/v1",), {"model": "m", "max_retries": -1}, "max_retries"),
        (("http://host/v1",), {"model": "m", "max_retries": 1.5}, "max_retries"),
    ],
)
def test_bad_options_are_refused_on_construction(args: tuple[Any, ...], options: dict[str, Any],
                                                 field: str) -> None:
    with pytest.raises(InvalidSpecError) as caught:
        ChatClient(*args, **options)
    assert caught.value.field == field
    assert field in str(caught.value)


@pytest.mark.parametrize(
    ("messages", "params", "field"),
    [
        ([], {}, "messages"),
        ("hello", {}, "messages"),
        ({"role": "user", "content": "hi"}, {}, "messages"),
        ([{"role": "user"}], {}, "messages"),
        ([{"role": "user", "content": 3}], {}, "messages"),
        ([42], {}, "messages"),
        ([{"role": "user", "content": "hi"}], {"model": "other"}, "model"),
        ([{"role": "user", "content": "hi"}], {"stream": True}, "stream"),
        ([{"role": "user", "content": "hi"}], {"temperature": object()}, "params"),
    ],
)
async def test_bad_messages_and_params_are_refused_before_sending(
    server: FakeOpenAI, messages: Any, params: dict[str, Any], field: str
) -> None:
    async with ChatClient(server.base_url, model="m") as client:
        with pytest.raises(InvalidSpecError) as caught:
            await client.chat(messages, **params)
    assert caught.value.field == field
    assert server.requests == []


async def test_session_is_lazy_closed_by_close_and_reopened_on_reuse(server: FakeOpenAI) -> None:
    client = ChatClient(server.base_url, model="m")
    assert client._sessions == {}  # nothing opened until the first chat
    await client.chat([{"role": "user", "content": "one"}])
    [session] = client._sessions.values()
    await client.close()
    assert session.closed and client._sessions == {}
    reply = await client.chat([{"role": "user", "content": "two"}])
    assert reply.text == "echo: two"
    await client.close()


def test_each_event_loop_gets_its_own_session() -> None:
    # An aiohttp session belongs to the loop that made it; a new loop gets its own, and a
    # session whose loop has closed is forgotten rather than reused.
    client = ChatClient("http://127.0.0.1:9/v1", model="m")

    async def open_session(close: str) -> object:
        session = client._session()
        if close == "session":
            await session.close()  # leaves the entry behind, keyed by a loop about to close
        else:
            await client.close()
        return session

    first = asyncio.run(open_session("session"))
    second = asyncio.run(open_session("client"))
    assert first is not second
    assert client._sessions == {}  # the first loop's entry was pruned, the second closed by close()


def test_repr_hides_the_api_key() -> None:
    client = ChatClient("https://api.example.com/v1", model="m", api_key="sk-secret")
    assert "sk-secret" not in repr(client)
    assert client.url == "https://api.example.com/v1/chat/completions"


# --------------------------------------------------------------------------- values and the protocol


def test_values_are_frozen_and_both_models_satisfy_the_protocol() -> None:
    message = ChatMessage("user", "hi")
    with pytest.raises(FrozenInstanceError):
        message.content = "changed"  # type: ignore[misc]
    reply = ChatReply("t", Usage(prompt_tokens=1), "m")
    with pytest.raises(FrozenInstanceError):
        reply.text = "changed"  # type: ignore[misc]
    assert reply.finish_reason is None and reply.raw == {}
    assert isinstance(ChatClient("http://h/v1", model="m"), ChatModel)
    assert isinstance(ScriptedModel(["a"]), ChatModel)
    with pytest.raises(InvalidSpecError):
        ChatMessage("", "x")


def test_reply_with_usage_carries_text_and_usage() -> None:
    usage = Usage(prompt_tokens=7, completion_tokens=5)
    reply = reply_with_usage(ChatReply("answer", usage, "m", "stop", {}))
    assert isinstance(reply, Reply)
    assert reply == Reply("answer", usage=usage)
    assert reply.usage.total_tokens == 12


# --------------------------------------------------------------------------- the scripted model


async def test_scripted_model_replies_in_order_and_cycles() -> None:
    model = ScriptedModel(["first", "second answer", "third"])
    texts = [(await model.chat([{"role": "user", "content": "q"}])).text for _ in range(5)]
    assert texts == ["first", "second answer", "third", "first", "second answer"]
    assert model.calls == 5


async def test_scripted_model_usage_arithmetic() -> None:
    model = ScriptedModel(["the answer is forty two"], tokens_per_word=3)
    reply = await model.chat(
        [ChatMessage("system", "be brief"), {"role": "user", "content": "what is  the answer?"}], temperature=0
    )
    # prompt: 2 + 4 words, completion: 5 words, each times 3 tokens per word
    assert reply.usage == Usage(prompt_tokens=18, completion_tokens=15)
    assert reply.model == "scripted" and reply.finish_reason == "stop"
    assert reply.raw["usage"]["total_tokens"] == 33
    assert reply.raw["choices"][0]["message"]["content"] == "the answer is forty two"
    assert reply_with_usage(reply).usage.total_tokens == 33


@pytest.mark.parametrize(
    ("replies", "options", "field"),
    [
        ([], {}, "replies"),
        ("just one", {}, "replies"),
        (["ok", 3], {}, "replies"),
        (["ok"], {"tokens_per_word": 0}, "tokens_per_word"),
        (["ok"], {"tokens_per_word": True}, "tokens_per_word"),
    ],
)
def test_scripted_model_bad_options(replies: Any, options: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidSpecError) as caught:
        ScriptedModel(replies, **options)
    assert caught.value.field == field


async def test_scripted_model_refuses_empty_messages() -> None:
    with pytest.raises(InvalidSpecError):
        await ScriptedModel(["a"]).chat([])
