"""The gateway's turn endpoints over real HTTP in front of a real fleet: start, status, SSE events, cancel."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest
from gateway_support import GatewayThread

import rayfleet as rf
from rayfleet.gateway import build_app, openapi_document

TOKEN = f"gw-{uuid.uuid4().hex}"
AGENT = "writer%2Fone"


class Writer(rf.Agent):
    @rf.handler
    async def write(self, words: list[str], wait: bool = False) -> str:
        self.emit("status", {"words": len(words)})
        if wait:  # the client is there before the deltas, which are live only
            await self.wait_signal("go")
        for word in words:
            self.emit_delta(word)
        return " ".join(words)

    @rf.handler
    async def plain(self) -> int:
        return 7  # journals and streams nothing

    @rf.handler
    async def linger(self) -> None:
        self.emit("status", "lingering")
        await asyncio.sleep(3600)


@pytest.fixture(scope="module")
def turns_fleet(ray_session: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[rf.Fleet]:
    fleet = rf.connect(storage=tmp_path_factory.mktemp("gateway-turns") / "store",
                       namespace=f"t-gwt-{uuid.uuid4().hex[:8]}", hosts=1)
    fleet.spawn("writer/one", Writer)
    yield fleet
    fleet.shutdown(stop_actors=True)


@pytest.fixture(scope="module")
def gateway(turns_fleet: rf.Fleet) -> Iterator[str]:
    with GatewayThread(build_app(turns_fleet, token=TOKEN)) as server:
        yield server.url


@pytest.fixture
async def http(gateway: str) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(gateway, headers={"Authorization": f"Bearer {TOKEN}"}) as session:
        yield session


async def answer(response: aiohttp.ClientResponse) -> tuple[int, Any]:
    assert response.content_type == "application/json", await response.text()
    return response.status, await response.json()


async def sse(http: aiohttp.ClientSession, path: str, on_suspended: Any = None, on_status: Any = None,
              **headers: str) -> list[dict[str, Any]]:
    """Every message of an event stream until it ends: ``{"id", "event", "data"}``; the callbacks
    are awaited as the first ``suspended`` or ``status`` message comes."""
    messages: list[dict[str, Any]] = []
    async with http.get(path, headers=headers) as stream:
        assert stream.status == 200 and stream.content_type == "text/event-stream"
        message: dict[str, Any] = {}
        while line := await asyncio.wait_for(stream.content.readline(), 60):
            text = line.decode().rstrip("\n")
            if not text:
                if message:
                    messages.append(message)
                    if message.get("event") == "suspended" and on_suspended is not None:
                        await on_suspended()
                    if message.get("event") == "status" and on_status is not None:
                        await on_status()
                        on_status = None
                message = {}
            elif not text.startswith(":"):
                name, _, value = text.partition(": ")
                message[name] = json.loads(value) if name == "data" else value
    return messages


async def test_a_turn_started_over_http_streams_as_sse_and_resumes_after_last_event_id(
    http: aiohttp.ClientSession,
) -> None:
    status, started = await answer(await http.post(f"/v1/agents/{AGENT}/turns/write",
                                                   json={"words": ["Hel", "lo"], "wait": True}))
    assert status == 202 and started["identity"] == "writer/one" and started["method"] == "write"
    turn_id = started["turn_id"]
    assert started["events"] == f"/v1/agents/{AGENT}/turns/{turn_id}/events"

    async def go() -> None:
        status, _ = await answer(await http.post(f"/v1/agents/{AGENT}/signals/go", json={"value": 1}))
        assert status == 202

    messages = await sse(http, started["events"], on_suspended=go)
    assert [message["event"] for message in messages] == ["started", "status", "suspended", "resumed", "delta",
                                                          "delta", "completed"]
    assert all(message["id"] == message["data"]["id"] for message in messages)
    assert messages[-1]["data"]["data"] == {"value": "Hel lo"} and messages[4]["data"]["data"] == "Hel"
    # Reconnecting with Last-Event-ID gets the persisted events after it, once (and the deltas the owner
    # still holds, which a client cannot count on).
    again = await sse(http, started["events"], **{"Last-Event-ID": messages[4]["id"]})
    assert [message["event"] for message in again if message["data"]["persisted"]] == ["completed"]
    again = await sse(http, started["events"] + f"?after={messages[0]['id']}")
    assert [message["event"] for message in again if message["data"]["persisted"]] == [
        "status", "suspended", "resumed", "completed"]
    status, turn = await answer(await http.get(f"/v1/agents/{AGENT}/turns/{turn_id}"))
    assert status == 200 and turn["status"] == "COMPLETED" and turn["value"] == "Hel lo" and turn["method"] == "write"


async def test_cancel_interrupts_a_turn_started_over_http(http: aiohttp.ClientSession) -> None:
    _, started = await answer(await http.post(f"/v1/agents/{AGENT}/turns/linger"))
    turn_id = started["turn_id"]

    async def cancel() -> None:  # once the handler runs (it said so on its stream)
        status, body = await answer(await http.post(f"/v1/agents/{AGENT}/turns/{turn_id}/cancel"))
        assert status == 200 and body["turn_id"] == turn_id and body["cancelled"] is True

    messages = await sse(http, started["events"], on_status=cancel)
    assert [message["event"] for message in messages] == ["started", "status", "interrupted"]
    for _ in range(200):
        _, turn = await answer(await http.get(f"/v1/agents/{AGENT}/turns/{turn_id}"))
        if turn["status"] != "RUNNING":
            break
        await asyncio.sleep(0.05)
    assert turn["status"] == "INTERRUPTED"
    _, body = await answer(await http.post(f"/v1/agents/{AGENT}/turns/{turn_id}/cancel"))
    assert body["cancelled"] is False


async def test_a_plain_turn_started_elsewhere_is_known_once_it_ended(http: aiohttp.ClientSession,
                                                                    turns_fleet: rf.Fleet) -> None:
    # Started from a driver, it journaled and streamed nothing: only its owner host knows it ended.
    handle = turns_fleet.agent("writer/one").start("plain")
    assert await asyncio.get_running_loop().run_in_executor(None, handle.result, 60) == 7
    status, turn = await answer(await http.get(f"/v1/agents/{AGENT}/turns/{handle.id}"))
    assert status == 200 and (turn["status"], turn["method"]) == ("COMPLETED", "plain"), turn


async def test_bad_turn_requests_are_refused_naming_the_field(http: aiohttp.ClientSession, gateway: str) -> None:
    _, first = await answer(await http.post(f"/v1/agents/{AGENT}/turns/write", json={"words": ["a"]}))
    _, second = await answer(await http.post(f"/v1/agents/{AGENT}/turns/write", json={"words": ["b"]}))
    of_first = await sse(http, first["events"])
    await sse(http, second["events"])
    status, body = await answer(await http.get(second["events"], headers={"Last-Event-ID": of_first[0]["id"]}))
    assert status == 400 and body["error"]["type"] == "UnknownTurnEventError" and "event of turn" in \
        body["error"]["message"]
    status, body = await answer(await http.get(second["events"], headers={"Last-Event-ID": "yesterday"}))
    assert status == 400 and body["error"]["type"] == "UnknownTurnEventError"
    status, body = await answer(await http.get(second["events"] + "?after=x"))
    assert status == 400 and body["error"]["field"] == "after"
    status, body = await answer(await http.post(f"/v1/agents/{AGENT}/turns/write", json=["not", "an", "object"]))
    assert status == 400 and body["error"]["field"] == "body"
    status, body = await answer(await http.post(f"/v1/agents/{AGENT}/turns/not-a-name"))
    assert status == 400 and body["error"]["field"] == "method"
    status, body = await answer(await http.post("/v1/agents/nobody%2Fhere/turns/write", json={"words": []}))
    assert status == 404 and body["error"]["type"] == "UnknownIdentityError"
    status, body = await answer(await http.get(f"/v1/agents/{AGENT}/turns/no-such-turn"))
    assert status == 404 and body["error"]["type"] == "UnknownTurnError"
    status, body = await answer(await http.post(f"/v1/agents/{AGENT}/turns/write?mode=sideways"))
    assert status == 400 and body["error"]["field"] == "mode"
    async with aiohttp.ClientSession(gateway) as anonymous:
        for method, path in (("POST", f"/v1/agents/{AGENT}/turns/write"),
                             ("GET", f"/v1/agents/{AGENT}/turns/{first['turn_id']}"),
                             ("GET", first["events"]), ("POST", f"/v1/agents/{AGENT}/turns/{first['turn_id']}/cancel")):
            status, body = await answer(await anonymous.request(method, path, headers={"Authorization": "Bearer no"}))
            assert status == 401 and body["error"]["type"] == "Unauthorized"


def test_the_turn_endpoints_are_in_the_openapi_document() -> None:
    paths = openapi_document()["paths"]
    assert set(paths["/v1/agents/{identity}/turns/{method}"]) == {"post"}
    assert "202" in paths["/v1/agents/{identity}/turns/{method}"]["post"]["responses"]
    assert set(paths["/v1/agents/{identity}/turns/{turn_id}"]) == {"get"}
    events = paths["/v1/agents/{identity}/turns/{turn_id}/events"]["get"]
    assert "text/event-stream" in events["responses"]["200"]["content"]
    assert any(parameter["name"] == "Last-Event-ID" for parameter in events["parameters"])
    assert set(paths["/v1/agents/{identity}/turns/{turn_id}/cancel"]) == {"post"}
