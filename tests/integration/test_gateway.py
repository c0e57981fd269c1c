"""The HTTP gateway over real HTTP on 127.0.0.1, in front of a real fleet: every endpoint and its refusals."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest
import ray
from gateway_support import GatewayThread

import rayfleet as rf
from rayfleet.demo import Bank, Counter
from rayfleet.gateway import build_app, serve

TOKEN = f"gw-{uuid.uuid4().hex}"
HERE = __name__  # the module name the hosts and the runner import this file by


class Flaky(rf.Agent):
    """Fails until healed: a dead letter that a replay then delivers."""

    class State(rf.State):
        healed: bool = False
        done: int = 0

    @rf.handler
    async def work(self, job: str) -> str:
        if not self.state.healed:
            raise ValueError(f"not yet able to do {job}")
        self.state.done += 1
        return f"did {job}"

    @rf.handler
    async def heal(self) -> bool:
        self.state.healed = True
        return True

    @rf.handler
    async def odd(self) -> object:
        return Opaque()


class Opaque:
    """A reply JSON has no form for."""


class Clerk(rf.Agent):
    """Waits for a signal, and asks for an approval."""

    @rf.handler
    async def wait_for(self, name: str) -> object:
        return await self.wait_signal(name)

    @rf.handler
    async def refund(self, eur: int) -> str:
        decision = await self.approval("refund", data={"eur": eur}, approvers=["alice", "bob"])
        return f"{'approved' if decision.approved else 'rejected'} by {decision.by}"

    @rf.handler
    async def plan(self) -> None:
        await self.schedule("digest", cron="0 8 * * *", tz="Europe/Paris", method="digest", team="eu")

    @rf.handler
    async def digest(self, team: str) -> str:
        return f"digest for {team}"


class Spare(rf.Agent):
    """A class no agent of the fleet runs: a roster may name it only because its module is allowed."""

    class State(rf.State):
        n: int = 0


def trip(target: str = "counter/bob", n: int = 1) -> rf.Workflow:
    """A one-step workflow, named over HTTP as ``<this module>:trip``."""
    workflow = rf.Workflow("gw-trip")
    workflow.step("add", to=target, call="add", payload={"n": n})
    return workflow


@pytest.fixture(scope="module")
def gw_fleet(ray_session: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[rf.Fleet]:
    fleet = rf.connect(storage=tmp_path_factory.mktemp("gateway") / "store", namespace=f"t-gw-{uuid.uuid4().hex[:8]}",
                       hosts=1)
    fleet.spawn("counter/alice", Counter, labels={"team": "a"})
    fleet.spawn("counter/bob", Counter, labels={"team": "b"})
    fleet.spawn("counter/carol", Counter, labels={"team": "b"})
    fleet.spawn("flaky/one", Flaky)
    fleet.spawn("bank/slow", Bank)
    fleet.spawn("clerk/eu", Clerk)
    yield fleet
    fleet.shutdown(stop_actors=True)


@pytest.fixture(scope="module")
def gateway(gw_fleet: rf.Fleet) -> Iterator[str]:
    with GatewayThread(build_app(gw_fleet, token=TOKEN, allowed_modules=(HERE,))) as server:
        yield server.url


@pytest.fixture
async def http(gateway: str) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(gateway, headers={"Authorization": f"Bearer {TOKEN}"}) as session:
        yield session


def path_of(identity: str) -> str:
    return identity.replace("/", "%2F")


async def answer(response: aiohttp.ClientResponse) -> tuple[int, Any]:
    assert response.content_type == "application/json", await response.text()
    return response.status, await response.json()


def error_of(body: Any) -> dict[str, Any]:
    assert set(body) == {"error"} and set(body["error"]) == {"type", "message", "field"}, body
    return body["error"]  # type: ignore[no-any-return]


# --------------------------------------------------------------------------- agents


async def test_call_returns_the_value_and_an_idempotency_key_makes_the_effect_once(
    http: aiohttp.ClientSession,
) -> None:
    url = f"/v1/agents/{path_of('counter/alice')}/call/add"
    status, body = await answer(await http.post(url, json={"n": 2}))
    assert (status, body) == (200, {"identity": "counter/alice", "method": "add", "value": 2})
    keyed = {"Idempotency-Key": f"k-{uuid.uuid4().hex}"}
    first = await answer(await http.post(url, json={"n": 5}, headers=keyed))
    again = await answer(await http.post(url, json={"n": 5}, headers=keyed))
    assert first == again == (200, {"identity": "counter/alice", "method": "add", "value": 7})
    _, total = await answer(await http.post(f"/v1/agents/{path_of('counter/alice')}/call/get?timeout=10"))
    assert total["value"] == 7


async def test_status_of_one_identity(http: aiohttp.ClientSession, gw_fleet: rf.Fleet) -> None:
    await http.post(f"/v1/agents/{path_of('counter/carol')}/call/get")
    status, body = await answer(await http.get(f"/v1/agents/{path_of('counter/carol')}"))
    assert status == 200
    expected = await asyncio.to_thread(gw_fleet.status, "counter/carol")
    assert body["identity"] == "counter/carol" and body["state"] == expected.state.value == "ACTIVE"
    assert body["labels"] == {"team": "b"} and body["agent_class"] == "rayfleet.demo.agents:Counter"
    assert body["lease"]["fencing_token"] == expected.lease.fencing_token  # type: ignore[union-attr]


async def test_list_agents_filters_by_label_and_pages_by_identity(http: aiohttp.ClientSession) -> None:
    _, team_b = await answer(await http.get("/v1/agents", params=[("label", "team=b")]))
    assert [agent["identity"] for agent in team_b["agents"]] == ["counter/bob", "counter/carol"]
    _, none = await answer(await http.get("/v1/agents", params=[("label", "team=b"), ("label", "role=x")]))
    assert none == {"agents": [], "next_cursor": None}
    status, body = await answer(await http.get("/v1/agents", params=[("label", "team=b"), ("label", "team=a")]))
    assert status == 400 and error_of(body)["field"] == "label.1"
    seen: list[str] = []
    cursor: str | None = None
    for _ in range(10):
        params = {"limit": "2", **({"cursor": cursor} if cursor else {})}
        status, page = await answer(await http.get("/v1/agents", params=params))
        assert status == 200 and len(page["agents"]) <= 2
        seen += [agent["identity"] for agent in page["agents"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == ["bank/slow", "clerk/eu", "counter/alice", "counter/bob", "counter/carol", "flaky/one"]
    status, body = await answer(await http.get("/v1/agents", params=[("label", "team")]))
    assert status == 400 and error_of(body)["field"] == "label.0"
    status, body = await answer(await http.get("/v1/agents", params={"limit": "5000"}))
    assert status == 400 and error_of(body)["field"] == "limit" and "1000" in error_of(body)["message"]


async def test_unknown_identity_is_404_and_a_bad_one_400(http: aiohttp.ClientSession) -> None:
    for response in (await http.get(f"/v1/agents/{path_of('counter/nobody')}"),
                     await http.post(f"/v1/agents/{path_of('counter/nobody')}/call/add", json={"n": 1}),
                     await http.get(f"/v1/agents/{path_of('counter/nobody')}/events")):
        status, body = await answer(response)
        assert status == 404 and error_of(body)["type"] == "UnknownIdentityError", body
        assert error_of(body)["field"] == "identity" and "counter/nobody" in error_of(body)["message"]
    for bad in ("a/../b", "a" * 201):
        status, body = await answer(await http.get(f"/v1/agents/{path_of(bad)}"))
        assert status == 400 and error_of(body)["field"] == "identity"


async def test_a_call_without_a_reply_in_time_is_504(http: aiohttp.ClientSession) -> None:
    # The handler sleeps 3 s; the gateway stops waiting after 0.2 s (the turn itself goes on, and ends long
    # before the fleet is shut down).
    response = await http.post(f"/v1/agents/{path_of('bank/slow')}/call/charge?timeout=0.2",
                               json={"trip": "t-1", "delay": 3})
    status, body = await answer(response)
    assert (status, error_of(body)["type"], error_of(body)["field"]) == (504, "DeadlineExceededError", "timeout")
    assert response.headers["Retry-After"] == "1"
    status, body = await answer(await http.post(f"/v1/agents/{path_of('bank/slow')}/call/charge?timeout=301",
                                                json={"trip": "t-2"}))
    assert status == 400 and error_of(body)["field"] == "timeout" and "300" in error_of(body)["message"]


async def test_unknown_method_is_404_listing_the_handlers(http: aiohttp.ClientSession) -> None:
    status, body = await answer(await http.post(f"/v1/agents/{path_of('counter/alice')}/call/nope", json={}))
    error = error_of(body)
    assert (status, error["type"], error["field"]) == (404, "UnknownHandlerError", "method")
    assert "add" in error["message"] and "get" in error["message"]
    status, body = await answer(await http.post(f"/v1/agents/{path_of('counter/alice')}/call/no-such", json={}))
    assert status == 400 and "method" in error_of(body)["message"]


async def test_bad_arguments_and_bodies_are_400_naming_the_field(http: aiohttp.ClientSession) -> None:
    url = f"/v1/agents/{path_of('counter/bob')}/call/add"
    status, body = await answer(await http.post(url, json={"n": "many"}))
    assert (status, error_of(body)["type"], error_of(body)["field"]) == (400, "InvalidArgumentsError", "body")
    status, body = await answer(await http.post(url, json=[1, 2]))
    assert status == 400 and error_of(body)["field"] == "body"
    status, body = await answer(await http.post(url, json={"n": 1, "timeout": 3}))
    assert status == 400 and error_of(body)["field"] == "body.timeout"
    status, body = await answer(await http.post(url, data=b'{"n": 1', headers={"Content-Type": "application/json"}))
    assert (status, error_of(body)["type"]) == (400, "InvalidJSON")
    status, body = await answer(await http.post(url + "?timeout=-1", json={"n": 1}))
    assert status == 400 and error_of(body)["field"] == "timeout"
    status, body = await answer(await http.post(url, json={"n": 1}, headers={"Idempotency-Key": "k" * 201}))
    assert status == 400 and error_of(body)["field"] == "Idempotency-Key"


async def test_wrong_content_type_and_oversized_bodies_are_refused_and_change_nothing(
    http: aiohttp.ClientSession, gw_fleet: rf.Fleet
) -> None:
    before = await asyncio.to_thread(gw_fleet.agent("counter/bob").call, "get")
    url = f"/v1/agents/{path_of('counter/bob')}/call/add"
    status, body = await answer(await http.post(url, data="n=1", headers={"Content-Type": "text/plain"}))
    assert (status, error_of(body)["type"]) == (415, "UnsupportedMediaType")
    status, body = await answer(await http.post(url, data=b"n=1"))  # sent as application/octet-stream
    assert status == 415
    huge = json.dumps({"n": 1, "pad": "x" * (1024 * 1024)})
    status, body = await answer(await http.post(url, data=huge, headers={"Content-Type": "application/json"}))
    assert (status, error_of(body)["type"]) == (413, "RequestEntityTooLarge")
    assert await asyncio.to_thread(gw_fleet.agent("counter/bob").call, "get") == before


async def test_auth_failures_are_401(gateway: str) -> None:
    async with aiohttp.ClientSession(gateway) as anonymous:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}):
            response = await anonymous.post(f"/v1/agents/{path_of('counter/alice')}/call/add", json={"n": 100},
                                            headers=headers)
            status, body = await answer(response)
            assert status == 401 and error_of(body)["type"] == "Unauthorized"
            assert response.headers["WWW-Authenticate"].startswith('Bearer realm="rayfleet"')
        status, document = await answer(await anonymous.get("/openapi.json"))
        assert status == 200 and document["openapi"] == "3.1.0"
    async with aiohttp.ClientSession(gateway, headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        _, total = await answer(await http.post(f"/v1/agents/{path_of('counter/alice')}/call/get"))
        assert total["value"] < 100  # the refused calls had no effect


async def test_a_reply_json_cannot_carry_is_502(http: aiohttp.ClientSession) -> None:
    status, body = await answer(await http.post(f"/v1/agents/{path_of('flaky/one')}/call/odd"))
    assert (status, error_of(body)["type"]) == (502, "UnrepresentableReply")


async def test_the_event_stream_yields_an_event_after_a_call(http: aiohttp.ClientSession) -> None:
    async with http.get(f"/v1/agents/{path_of('counter/alice')}/events") as stream:
        assert stream.status == 200 and stream.content_type == "text/event-stream"
        assert await stream.content.readline() == b": stream open\n"
        # The subscription opens on the hosts while the stream starts: call until an event arrives.
        event_line = b""
        for attempt in range(40):
            called, _ = await answer(await http.post(f"/v1/agents/{path_of('counter/alice')}/call/add", json={"n": 1},
                                                     headers={"Idempotency-Key": f"sse-{attempt}-{uuid.uuid4().hex}"}))
            assert called == 200
            try:
                while not event_line.startswith(b"event:"):
                    event_line = await asyncio.wait_for(stream.content.readline(), timeout=2.0)
                break
            except asyncio.TimeoutError:
                continue
        assert event_line.startswith(b"event: "), "no event arrived"
        kind = event_line.decode().split(":", 1)[1].strip()
        data_line = await stream.content.readline()
        event = json.loads(data_line.decode().removeprefix("data: "))
        assert event["identity"] == "counter/alice" and event["kind"] == kind
        assert kind in {member.value for member in rf.EventKind}


# --------------------------------------------------------------------------- rosters


async def test_a_roster_applies_classes_the_fleet_hosts(http: aiohttp.ClientSession, gw_fleet: rf.Fleet) -> None:
    roster = {"agents": [{"identity": "roster/one", "agent": "rayfleet.demo.agents:Counter", "labels": {"r": "1"}}]}
    status, dry = await answer(await http.post("/v1/roster?dry_run=true", json=roster))
    assert status == 200 and dry["created"] == ["roster/one"] and dry["dry_run"] is True and dry["topology"] is None
    assert (await http.get(f"/v1/agents/{path_of('roster/one')}")).status == 404
    status, applied = await answer(await http.post("/v1/roster", json=roster))
    assert status == 200 and applied["created"] == ["roster/one"] and applied["changed"] is True
    again = (await answer(await http.post("/v1/roster", json=roster)))[1]
    assert again["unchanged"] == ["roster/one"] and again["changed"] is False
    _, called = await answer(await http.post(f"/v1/agents/{path_of('roster/one')}/call/add", json={"n": 4}))
    assert called["value"] == 4
    assert (await asyncio.to_thread(gw_fleet.status, "roster/one")).labels == {"r": "1"}


async def test_a_roster_naming_a_module_not_allowed_is_refused_and_nothing_applied(
    http: aiohttp.ClientSession, gw_fleet: rf.Fleet
) -> None:
    for agent in ("rayfleet.demo.agents:Planner", "os:system", "subprocess:Popen"):
        roster = {"agents": [{"identity": "sneaky/ok", "agent": "rayfleet.demo.agents:Counter"},
                             {"identity": "sneaky/bad", "agent": agent}]}
        status, body = await answer(await http.post("/v1/roster", json=roster))
        error = error_of(body)
        assert (status, error["type"], error["field"]) == (403, "ModuleNotAllowed", "agents.1.agent")
        assert "RAYFLEET_ALLOWED_MODULES" in error["message"]
    identities = {status.identity for status in await asyncio.to_thread(gw_fleet.list_agents)}
    assert not {"sneaky/ok", "sneaky/bad"} & identities


async def test_a_roster_may_name_a_class_from_an_allowed_module(http: aiohttp.ClientSession) -> None:
    roster = {"agents": [{"identity": "spare/one", "agent": f"{HERE}:Spare"}]}
    status, dry = await answer(await http.post("/v1/roster", params={"dry_run": "true"}, json=roster))
    assert status == 200 and dry["created"] == ["spare/one"]


async def test_roster_validation_names_the_field(http: aiohttp.ClientSession) -> None:
    status, body = await answer(await http.post("/v1/roster", json={"agents": [{"identity": 5, "agent": "x:Y"}]}))
    assert status == 400 and error_of(body)["field"] == "agents.0.identity"
    status, body = await answer(await http.post("/v1/roster", json={"agents": [{"identity": "a", "agnt": "x:Y"}]}))
    assert status == 400 and error_of(body)["field"] in ("agents.0.agent", "agents.0.agnt")
    status, body = await answer(await http.post(
        "/v1/roster", json={"agents": [{"identity": "/bad", "agent": "rayfleet.demo.agents:Counter"}]}))
    assert (status, error_of(body)["type"]) == (400, "InvalidSpecError")


# --------------------------------------------------------------------------- runs


async def test_runs_submit_list_read_and_cancel(http: aiohttp.ClientSession, gw_fleet: rf.Fleet) -> None:
    run_id = f"gw-trip-{uuid.uuid4().hex[:8]}"
    submission = {"workflow": f"{HERE}:trip", "run_id": run_id, "params": {"target": "counter/carol", "n": 3}}
    status, body = await answer(await http.post("/v1/runs", json=submission))
    assert (status, body) == (202, {"run_id": run_id})
    outcome = await asyncio.to_thread(gw_fleet.runs.wait, run_id, timeout=120)
    assert outcome.status is rf.RunStatus.COMPLETED
    status, run = await answer(await http.get(f"/v1/runs/{path_of(run_id)}"))
    assert status == 200 and run["run_id"] == run_id and run["status"] == "COMPLETED" and run["submitted"] is True
    _, listed = await answer(await http.get("/v1/runs", params={"status": "COMPLETED"}))
    assert run_id in [item["run_id"] for item in listed["runs"]]
    _, first = await answer(await http.get("/v1/runs", params={"limit": "1"}))
    assert len(first["runs"]) == 1
    status, cancelled = await answer(await http.post(f"/v1/runs/{path_of(run_id)}/cancel"))
    assert (status, cancelled) == (202, {"run_id": run_id, "cancel_requested": True})
    assert (await answer(await http.get(f"/v1/runs/{path_of(run_id)}")))[1]["cancel_requested"] is True


async def test_run_refusals(http: aiohttp.ClientSession) -> None:
    for response in (await http.get("/v1/runs/no-such-run"), await http.post("/v1/runs/no-such-run/cancel")):
        status, body = await answer(response)
        assert (status, error_of(body)["type"], error_of(body)["field"]) == (404, "UnknownRunError", "run_id")
    status, body = await answer(await http.post("/v1/runs", json={"workflow": "rayfleet.demo._script:_trip"}))
    assert (status, error_of(body)["type"], error_of(body)["field"]) == (403, "ModuleNotAllowed", "workflow")
    status, body = await answer(await http.post("/v1/runs", json={"workflow": "not a path"}))
    assert status == 400 and error_of(body)["field"] == "workflow"
    status, body = await answer(await http.post("/v1/runs", json={"workflow": f"{HERE}:trip", "params": {"x": 1}}))
    assert status == 400 and error_of(body)["field"] == "params"
    status, body = await answer(await http.get("/v1/runs", params={"status": "DONE"}))
    assert status == 400 and error_of(body)["field"] == "status"


# --------------------------------------------------------------------------- topology


async def test_topology_exports_and_edges(http: aiohttp.ClientSession, gw_fleet: rf.Fleet) -> None:
    await asyncio.to_thread(gw_fleet.topology.wire, "counter/alice", "counter/bob")
    status, exported = await answer(await http.get("/v1/topology"))
    assert status == 200 and exported["format"] == "json" and exported["text"] is None
    assert {"a": "counter/alice", "b": "counter/bob", "managed": True} in exported["document"]["edges"]
    _, dot = await answer(await http.get("/v1/topology", params={"format": "dot"}))
    assert dot["text"].startswith("graph rayfleet {") and '"counter/alice" -- "counter/bob"' in dot["text"]
    _, mermaid = await answer(await http.get("/v1/topology", params={"format": "mermaid"}))
    assert mermaid["text"].startswith("graph LR")
    status, body = await answer(await http.get("/v1/topology", params={"format": "png"}))
    assert status == 400 and error_of(body)["field"] == "format"
    status, edges = await answer(await http.get("/v1/topology/edges"))
    assert status == 200 and {"a": "counter/alice", "b": "counter/bob", "managed": True} in edges["edges"]


# --------------------------------------------------------------------------- dead letters


async def test_dead_letters_list_and_replay(http: aiohttp.ClientSession) -> None:
    status, body = await answer(await http.post(f"/v1/agents/{path_of('flaky/one')}/call/work", json={"job": "j1"}))
    error = error_of(body)
    assert (status, error["type"]) == (502, "HandlerError") and "not yet able to do j1" in error["message"]
    assert "Traceback" not in json.dumps(body)
    status, listed = await answer(await http.get("/v1/dead-letters", params={"identity": "flaky/one"}))
    letters = [letter for letter in listed["dead_letters"] if letter["kwargs"] == {"job": "j1"}]
    assert status == 200 and len(letters) == 1
    letter = letters[0]
    assert (letter["method"], letter["reason"], letter["identity"]) == ("work", "REJECTED", "flaky/one")
    await http.post(f"/v1/agents/{path_of('flaky/one')}/call/heal")
    status, replayed = await answer(await http.post(f"/v1/dead-letters/{letter['id']}/replay?timeout=30"))
    assert (status, replayed) == (200, {"letter_id": letter["id"], "value": "did j1"})
    _, after = await answer(await http.get("/v1/dead-letters", params={"identity": "flaky/one"}))
    assert letter["id"] not in [item["id"] for item in after["dead_letters"]]
    status, body = await answer(await http.post(f"/v1/dead-letters/{letter['id']}/replay"))
    assert (status, error_of(body)["type"]) == (404, "UnknownDeadLetterError")
    status, body = await answer(await http.post("/v1/dead-letters/abc/replay"))
    assert status == 400 and error_of(body)["field"] == "letter_id"
    status, body = await answer(await http.get("/v1/dead-letters", params={"identity": "../x"}))
    assert status == 400 and error_of(body)["field"] == "identity"


# --------------------------------------------------------------------------- serve


async def test_a_signal_resumes_the_waiting_turn_and_bad_signals_are_refused(http: aiohttp.ClientSession) -> None:
    clerk = path_of("clerk/eu")
    waiting = asyncio.ensure_future(http.post(f"/v1/agents/{clerk}/call/wait_for", json={"name": "paid"}))
    status, body = await answer(await http.post(f"/v1/agents/{clerk}/signals/paid",
                                                json={"value": {"eur": 30}, "signal_id": "s-1"}))
    assert status == 202 and body["identity"] == "clerk/eu" and body["woken"] in (0, 1)
    status, body = await answer(await waiting)
    assert (status, body["value"]) == (200, {"eur": 30})
    status, body = await answer(await http.post(f"/v1/agents/{path_of('nobody/here')}/signals/paid", json={}))
    assert status == 404 and error_of(body)["type"] == "UnknownIdentityError"
    status, body = await answer(await http.post(f"/v1/agents/{clerk}/signals/paid", json={"valu": 1}))
    assert status == 400 and error_of(body)["field"] == "valu"


async def test_approvals_list_get_and_decide_once(http: aiohttp.ClientSession) -> None:
    clerk = path_of("clerk/eu")
    refund = asyncio.ensure_future(http.post(f"/v1/agents/{clerk}/call/refund", json={"eur": 500}))
    for _ in range(600):
        status, body = await answer(await http.get("/v1/approvals", params={"identity": "clerk/*"}))
        if body["approvals"]:
            break
        await asyncio.sleep(0.1)
    (approval,) = body["approvals"]
    assert (approval["subject"], approval["status"], approval["data"]) == ("refund", "PENDING", {"eur": 500})
    assert approval["run_id"] == ""  # asked outside any workflow run
    status, body = await answer(await http.get("/v1/approvals", params={"run_id": "no-such-run"}))
    assert status == 200 and body["approvals"] == []
    status, body = await answer(await http.get(f"/v1/approvals/{approval['id']}"))
    assert status == 200 and body["approvers"] == ["alice", "bob"] and body["audit"][0]["action"] == "requested"
    decision = f"/v1/approvals/{approval['id']}/decision"
    status, body = await answer(await http.post(decision, json={"approved": True, "by": "mallory"}))
    assert status == 400 and error_of(body)["field"] == "by"
    status, body = await answer(await http.post(decision, json={"approved": True, "by": "alice",
                                                                "expect_version": approval["version"] + 1}))
    assert status == 409 and error_of(body)["type"] == "ApprovalConflictError"
    status, body = await answer(await http.post(decision, json={"approved": True, "by": "alice"}))
    assert (status, body["status"], body["decided_by"]) == (200, "APPROVED", "alice")
    status, body = await answer(await refund)
    assert (status, body["value"]) == (200, "approved by alice")
    status, body = await answer(await http.post(decision, json={"approved": False, "by": "bob"}))
    assert status == 409 and "already approved by alice" in error_of(body)["message"]
    status, body = await answer(await http.get("/v1/approvals/no-such"))
    assert status == 404 and error_of(body)["type"] == "UnknownApprovalError"
    status, body = await answer(await http.post(decision, json={"approved": "yes", "by": "bob"}))
    assert status == 400
    status, body = await answer(await http.get("/v1/approvals", params={"status": "ALL", "identity": "clerk/*"}))
    assert [item["id"] for item in body["approvals"]] == [approval["id"]]


async def test_timers_list_fire_now_and_cancel(http: aiohttp.ClientSession) -> None:
    clerk = path_of("clerk/eu")
    status, _ = await answer(await http.post(f"/v1/agents/{clerk}/call/plan", json={}))
    assert status == 200
    status, body = await answer(await http.get("/v1/timers", params={"identity": "clerk/eu"}))
    (timer,) = body["timers"]
    assert (timer["name"], timer["kind"], timer["cron"], timer["tz"], timer["payload"]) == (
        "digest", "schedule", "0 8 * * *", "Europe/Paris", {"team": "eu"})
    status, body = await answer(await http.get("/v1/timers", params={"identity": "clerk/eu", "due_within": "1"}))
    assert (status, body["timers"]) == (200, [])
    status, body = await answer(await http.post(f"/v1/timers/{clerk}/digest/fire"))
    assert (status, body["due_now"]) == (202, True)
    for _ in range(300):  # a host's wake sweep fires it and moves it to the next 08:00
        status, body = await answer(await http.get("/v1/timers", params={"identity": "clerk/eu"}))
        if body["timers"][0]["fired"] == 1:
            break
        await asyncio.sleep(0.1)
    assert body["timers"][0]["fired"] == 1
    status, body = await answer(await http.post(f"/v1/timers/{clerk}/digest/cancel"))
    assert (status, body["cancelled"]) == (200, True)
    status, body = await answer(await http.post(f"/v1/timers/{clerk}/digest/fire"))
    assert status == 400 and error_of(body)["field"] == "name"
    status, body = await answer(await http.get("/v1/timers", params={"identity": "nobody/here"}))
    assert status == 404


def test_serve_refuses_to_start_without_a_token_off_loopback(gw_fleet: rf.Fleet) -> None:
    with pytest.raises(rf.UsageError, match="loopback"):
        serve(gw_fleet, host="0.0.0.0", port=0, token=None, insecure=True, allowed_modules=None)
    with pytest.raises(rf.UsageError, match="RAYFLEET_GATEWAY_TOKEN"):
        serve(gw_fleet, host="127.0.0.1", port=0, token=None, insecure=False, allowed_modules=None)


async def _status_over_http(url: str, identity: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession(url, headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        return await answer(await http.get(f"/v1/agents/{path_of(identity)}"))


def test_the_gateway_command_serves_until_sigterm_then_closes_cleanly(gw_fleet: rf.Fleet) -> None:
    # `rayfleet gateway` end to end: it attaches to the running fleet, serves with the
    # token from RAYFLEET_GATEWAY_TOKEN, and a SIGTERM ends it with exit 0, fleet untouched.
    address = ray.get_runtime_context().gcs_address
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "RAYFLEET_GATEWAY_TOKEN": TOKEN}
    process = subprocess.Popen(
        [sys.executable, "-m", "rayfleet.cli", "--address", address, "--storage", str(gw_fleet.storage),
         "--namespace", gw_fleet.config.namespace, "gateway", "--host", "127.0.0.1", "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment,
    )
    try:
        assert process.stdout is not None and process.stderr is not None
        line = process.stdout.readline()
        assert "listening on http://127.0.0.1:" in line, line + (process.stderr.read() if process.poll() else "")
        url = line.split("listening on ")[1].split(" ")[0]
        status, body = asyncio.run(_status_over_http(url, "counter/alice"))
        assert status == 200 and body["identity"] == "counter/alice"
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
        assert process.returncode == 0, err
        assert "Traceback" not in err
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
