"""The gateway's middlewares over real HTTP on 127.0.0.1, without a fleet: failures leave as JSON, never tracebacks.

Requests here are refused (or fail) before any handler reaches the fleet, so the
application is built over no fleet at all; tests/integration/test_gateway.py covers
the same answers over a real one.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from rayfleet.gateway import GatewayLimits, build_app

TOKEN = "unit-token-0123456789abcdef"


@pytest.fixture
async def client() -> AsyncIterator[TestClient[web.Request, web.Application]]:
    app = build_app(None, token=TOKEN, limits=GatewayLimits(max_body_bytes=5000))  # type: ignore[arg-type]

    async def explode(request: web.Request) -> web.Response:
        raise RuntimeError("secret detail at /srv/agents.py line 3")

    # A route whose handler fails unexpectedly, as a bug would; it goes through the same middlewares.
    app.router.add_post("/v1/explode", explode)
    async with TestClient(TestServer(app, host="127.0.0.1")) as test_client:
        yield test_client


def _auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKEN}"}


async def _error(response: Any) -> dict[str, Any]:
    assert response.content_type == "application/json"
    body: dict[str, Any] = await response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"type", "message", "field"}
    return body["error"]


async def test_an_unexpected_failure_is_a_generic_500_and_logged(
    client: TestClient[web.Request, web.Application], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="rayfleet.gateway"):
        response = await client.post("/v1/explode", headers=_auth())
    assert response.status == 500
    error = await _error(response)
    assert error["type"] == "InternalServerError" and "request id" in error["message"]
    text = await response.text()
    assert "secret detail" not in text and "Traceback" not in text and "RuntimeError" not in text
    request_id = error["message"].split("request id ")[1].split(")")[0]
    assert any(request_id in record.getMessage() and record.exc_info for record in caplog.records)


async def test_missing_and_wrong_tokens_are_401_with_a_challenge(
    client: TestClient[web.Request, web.Application]
) -> None:
    missing = await client.get("/v1/agents")
    assert missing.status == 401 and missing.headers["WWW-Authenticate"] == 'Bearer realm="rayfleet"'
    assert (await _error(missing))["type"] == "Unauthorized"
    wrong = await client.get("/v1/agents", headers={"Authorization": "Bearer not-it"})
    assert wrong.status == 401
    assert wrong.headers["WWW-Authenticate"] == 'Bearer realm="rayfleet", error="invalid_token"'
    assert "wrong" in (await _error(wrong))["message"]


async def test_the_document_needs_no_token(client: TestClient[web.Request, web.Application]) -> None:
    response = await client.get("/openapi.json")
    assert response.status == 200 and (await response.json())["openapi"] == "3.1.0"


async def test_bodies_must_be_json(client: TestClient[web.Request, web.Application]) -> None:
    response = await client.post("/v1/explode", data="n=2", headers={**_auth(), "Content-Type": "text/plain"})
    assert response.status == 415
    assert (await _error(response))["field"] == "Content-Type"
    # Auth comes first: an unauthenticated client learns nothing about the body rules.
    assert (await client.post("/v1/explode", data="n=2", headers={"Content-Type": "text/plain"})).status == 401


async def test_bodies_over_the_limit_are_413_by_length_and_when_chunked(
    client: TestClient[web.Request, web.Application]
) -> None:
    big = b'{"x": "' + b"a" * 6000 + b'"}'
    response = await client.post("/v1/roster", data=big, headers={**_auth(), "Content-Type": "application/json"})
    assert response.status == 413
    assert "5000" in (await _error(response))["message"]

    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"agents": ['
        for _ in range(200):
            yield b'{"identity": "aaaaaaaaaa", "agent": "x:Y"},'
        yield b"]}"

    chunked = await client.post("/v1/roster", data=chunks(), headers={**_auth(), "Content-Type": "application/json"})
    assert chunked.status == 413
    assert (await _error(chunked))["type"] == "RequestEntityTooLarge"


async def test_unknown_routes_and_methods_are_json(client: TestClient[web.Request, web.Application]) -> None:
    missing = await client.get("/v1/nothing-here", headers=_auth())
    assert missing.status == 404 and "openapi.json" in (await _error(missing))["message"]
    wrong_method = await client.delete("/v1/agents", headers=_auth())
    assert wrong_method.status == 405 and "GET" in wrong_method.headers["Allow"]
    await _error(wrong_method)


@pytest.mark.parametrize(("body", "text"), [
    (b"{not json", "not valid JSON"),
    (b'{"agents": NaN}', "NaN is not JSON"),
    (b"\xff\xfe", "not valid JSON"),
    (b'{"agents": [], "x": "\\ud800"}', "lone surrogate"),
    (b"[" * 1500 + b"]" * 1500, None),
])
async def test_invalid_json_is_400(client: TestClient[web.Request, web.Application], body: bytes,
                                   text: str | None) -> None:
    response = await client.post("/v1/roster", data=body, headers={**_auth(), "Content-Type": "application/json"})
    assert response.status == 400
    error = await _error(response)
    if text is None:  # nested deep but valid JSON: read, then refused by the model, never a 500
        assert error["type"] in ("InvalidJSON", "ValidationError")
    else:
        assert error["type"] == "InvalidJSON" and text in error["message"] and error["field"] == "body"


async def test_unknown_query_parameters_and_bad_values_name_the_field(
    client: TestClient[web.Request, web.Application]
) -> None:
    typo = await client.post("/v1/roster?dryrun=true", json={"agents": []}, headers=_auth())
    assert typo.status == 400 and (await _error(typo))["field"] == "dryrun"
    bad = await client.post("/v1/roster?dry_run=maybe", json={"agents": []}, headers=_auth())
    assert bad.status == 400 and (await _error(bad))["field"] == "dry_run"
    no_body = await client.post("/v1/roster", headers=_auth())
    assert no_body.status == 400 and (await _error(no_body))["field"] == "body"
