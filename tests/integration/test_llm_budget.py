"""LLM-backed agents on a real local Ray: chat usage flows into workflow token budgets.

A fake OpenAI-compatible server runs in this test process, on 127.0.0.1, in a
background thread with its own event loop; hosts are separate processes on the same
machine, so they reach it over loopback. The URL travels to the agent in the payload.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from aiohttp import web

import rayfleet as rf
from rayfleet import ChatClient, reply_with_usage
from rayfleet.testing import ScriptedModel

API_KEY = "sk-fleet-test"
WAIT = 60.0


class Assistant(rf.Agent):
    """Answers one question through an OpenAI-compatible endpoint and can undo what it answered."""

    class State(rf.State):
        asked: list[str] = []
        undone: list[str] = []

    @rf.handler
    async def ask(self, base_url: str, question: str, **_: object) -> rf.Reply:
        async with ChatClient(base_url, model="fleet-llm", api_key=API_KEY, timeout=10.0) as client:
            reply = await client.chat(
                [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": question}],
                temperature=0,
            )
        self.state.asked = [*self.state.asked, question]
        return reply_with_usage(reply)

    @rf.handler
    async def undo(self, output: str = "", **_: object) -> str:
        self.state.undone = [*self.state.undone, output]
        return f"undid {output!r}"

    @rf.handler
    async def scripted(self, question: str) -> rf.Reply:
        model = ScriptedModel(["a scripted offline answer"], tokens_per_word=2)
        return reply_with_usage(await model.chat([{"role": "user", "content": question}]))

    @rf.handler
    async def report(self) -> dict[str, Any]:
        return self.state.model_dump()


class ThreadedFakeOpenAI:
    """An OpenAI-style chat completions server on its own loop in a daemon thread.

    Echoes the last user message and reports word-count usage; ``reported`` lists the
    usage it sent back, so tests compare the budget's count with the server's own.
    """

    def __init__(self) -> None:
        self.reported: list[dict[str, int]] = []
        self.authorized: list[bool] = []
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fake-openai", daemon=True)
        self._runner: web.AppRunner | None = None
        self.port = 0

    async def _handle(self, request: web.Request) -> web.Response:
        payload = await request.json()
        messages = payload["messages"]
        question = next(m["content"] for m in reversed(messages) if m["role"] == "user")
        text = f"echo: {question}"
        usage = {"prompt_tokens": sum(len(m["content"].split()) for m in messages),
                 "completion_tokens": len(text.split())}
        with self._lock:
            self.reported.append(usage)
            self.authorized.append(request.headers.get("Authorization") == f"Bearer {API_KEY}")
        return web.json_response({
            "object": "chat.completion", "model": payload["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {**usage, "total_tokens": sum(usage.values())},
        })

    async def _start(self) -> int:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._handle)
        self._runner = web.AppRunner(app, shutdown_timeout=1.0)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        return int(self._runner.addresses[0][1])

    def __enter__(self) -> ThreadedFakeOpenAI:
        self._thread.start()
        self.port = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=10)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def tokens(self, since: int = 0) -> int:
        with self._lock:
            return sum(u["prompt_tokens"] + u["completion_tokens"] for u in self.reported[since:])


@pytest.fixture
def llm_server() -> Any:
    with ThreadedFakeOpenAI() as server:
        yield server


def two_asks(base_url: str, budget: rf.Budget) -> rf.Workflow:
    wf = rf.Workflow("llm-chain", budget=budget)
    wf.step("first", to="llm/a", call="ask",
            payload={"base_url": base_url, "question": "what is a fencing token"}).compensate("undo")
    wf.step("second", to="llm/b", call="ask",
            payload={"base_url": base_url, "question": "and why does a lease need one"}, after=["first"])
    return wf


def report(fleet: rf.Fleet, name: str) -> dict[str, Any]:
    return fleet.agent(name).call("report", timeout=WAIT)  # type: ignore[no-any-return]


@pytest.mark.timeout(120)
def test_chat_usage_is_counted_by_the_token_budget(fleet: rf.Fleet, llm_server: ThreadedFakeOpenAI) -> None:
    fleet.spawn("llm/a", Assistant)
    fleet.spawn("llm/b", Assistant)

    # A generous budget: the run completes, and its token count is exactly what the server reported.
    outcome = fleet.run(two_asks(llm_server.base_url, rf.Budget(tokens=1000)))
    assert outcome.status is rf.RunStatus.COMPLETED, outcome.error
    assert outcome.outputs["first"] == "echo: what is a fencing token"
    assert outcome.outputs["second"] == "echo: and why does a lease need one"
    assert len(llm_server.reported) == 2 and all(llm_server.authorized)
    assert outcome.usage_tokens == llm_server.tokens() > 0
    first_cost = llm_server.reported[0]["prompt_tokens"] + llm_server.reported[0]["completion_tokens"]

    # A budget the first call fits exactly: the second call breaches it, and the first is undone.
    outcome = fleet.run(two_asks(llm_server.base_url, rf.Budget(tokens=first_cost)))
    assert outcome.status is rf.RunStatus.COMPENSATED
    assert isinstance(outcome.error, rf.BudgetExceededError)
    assert outcome.error.budget == "tokens"
    assert outcome.error.ceiling == first_cost
    assert outcome.error.spent == outcome.usage_tokens == llm_server.tokens(since=2)
    assert outcome.compensated == ("first",)
    assert report(fleet, "llm/a")["undone"] == ["echo: what is a fencing token"]
    assert report(fleet, "llm/b")["undone"] == []


@pytest.mark.timeout(120)
def test_scripted_model_inside_an_agent_feeds_the_budget(fleet: rf.Fleet) -> None:
    fleet.spawn("llm/offline", Assistant)
    wf = rf.Workflow("scripted", budget=rf.Budget(tokens=100))
    wf.step("answer", to="llm/offline", call="scripted", payload={"question": "how do leases work"})
    outcome = fleet.run(wf)
    assert outcome.status is rf.RunStatus.COMPLETED, outcome.error
    assert outcome.outputs["answer"] == "a scripted offline answer"
    # 4 prompt words and 4 reply words, 2 tokens per word
    assert outcome.usage_tokens == 16

    tight = rf.Workflow("scripted-tight", budget=rf.Budget(tokens=10))
    tight.step("answer", to="llm/offline", call="scripted", payload={"question": "how do leases work"})
    outcome = fleet.run(tight)
    assert isinstance(outcome.error, rf.BudgetExceededError)
    assert (outcome.error.budget, outcome.error.spent) == ("tokens", 16)
