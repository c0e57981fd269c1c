"""The gateway's aiohttp application: routes, the auth and JSON middlewares, and the handlers.

Every handler reaches the fleet without blocking the event loop: calls go through
``AgentRef.ask`` (async), everything else through ``asyncio.to_thread`` (the fleet's
methods wait on Ray). Failures become :class:`HttpProblem` answers in one middleware;
anything unexpected is logged with a request id and answered 500 without details.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import typing
import urllib.parse
import uuid
from collections import OrderedDict
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

import pydantic
from aiohttp import web
from pydantic_core import PydanticSerializationError, to_jsonable_python

from .. import __version__
from ..errors import RayfleetError, TurnInterruptedError
from ..identity._agent import AgentSpec
from ..identity._names import validate_identity
from ..identity._values import IdentityEvent
from ..platform._fleet import Fleet
from ..platform._turn_handle import TurnHandle
from ..roster._roster import RosterFile
from ..turns._values import TurnEvent, TurnInfo, TurnStatus
from ._auth import bearer_token_matches
from ._limits import GatewayLimits
from ._models import (
    AgentPage,
    AgentStatusModel,
    ApplyReportModel,
    ApplyRosterQuery,
    ApprovalList,
    ApprovalModel,
    ApprovalsQuery,
    CallQuery,
    CallResult,
    DeadLetterList,
    DeadLetterModel,
    DeadLettersQuery,
    DecisionRequest,
    EdgeList,
    ListAgentsQuery,
    ListRunsQuery,
    LiveEdgeModel,
    ReplayResult,
    RunCancelRequested,
    RunModel,
    RunPage,
    RunSubmitted,
    SignalRequest,
    SignalSent,
    StartTurnQuery,
    SubmitRunRequest,
    TimerChanged,
    TimerList,
    TimerModel,
    TimersQuery,
    TopologyExport,
    TopologyQuery,
    TurnCancelled,
    TurnEventsQuery,
    TurnModel,
    TurnStarted,
)
from ._openapi import Operation, PathParameter, build_document
from ._problems import HttpProblem, problem_for, validation_problem
from ._trust import ModulePolicy, known_agent_classes, specs_from_roster, workflow_from_path

log = logging.getLogger("rayfleet.gateway")

JSON_MEDIA = "application/json"
IDEMPOTENCY_HEADER = "Idempotency-Key"
CALL_OPTIONS = frozenset({"timeout", "idempotency_key", "deadline", "conversation", "sequence", "mode"})
"""Keywords ``AgentRef.ask`` takes as call options, so a handler argument cannot have these names over HTTP."""
MAX_PATH_VALUE = 400
"""Longest identity, run id or method accepted in a path (identities stop at 200 anyway)."""

Model = TypeVar("Model", bound=pydantic.BaseModel)
Result = TypeVar("Result")
Item = TypeVar("Item")


@dataclass(frozen=True, slots=True, kw_only=True)
class _Gateway:
    fleet: Fleet
    token: str | None
    policy: ModulePolicy
    limits: GatewayLimits
    closing: asyncio.Event
    turns: OrderedDict[tuple[str, str], TurnHandle] = field(default_factory=OrderedDict)
    """Turns this gateway started, by (identity, turn id): their replies and streams (the last ``TURNS_KEPT``)."""


TURNS_KEPT = 10_000
"""Turns started over HTTP whose handles (their replies) the gateway keeps; older ones are read from the ledger."""

GATEWAY = web.AppKey("gateway", _Gateway)


def build_app(
    fleet: Fleet,
    *,
    token: str | None,
    allowed_modules: tuple[str, ...] | None = None,
    limits: GatewayLimits | None = None,
) -> web.Application:
    """The gateway as an aiohttp application over ``fleet``, ready for an ``AppRunner`` or a test server.

    Args:
        fleet: the fleet every request acts on.
        token: the bearer token every ``/v1`` request must carry; ``None`` serves them
            without one (:func:`serve` allows that only on a loopback address).
        allowed_modules: modules (and their submodules) whose agent classes a roster and
            whose workflows a run submission may name; ``None``: only agent classes the
            fleet already hosts, and no workflows.
        limits: body size, timeouts and page sizes (:class:`GatewayLimits` defaults).
    """
    limits = limits or GatewayLimits()
    # One byte over the limit is enough for aiohttp to refuse the body with 413.
    app = web.Application(client_max_size=limits.max_body_bytes,
                          middlewares=[_problems_middleware, _auth_middleware, _json_only_middleware])
    app[GATEWAY] = _Gateway(fleet=fleet, token=token, policy=ModulePolicy(allowed_modules=allowed_modules),
                            limits=limits, closing=asyncio.Event())
    for operation in OPERATIONS:
        app.router.add_route(operation.method, operation.path, operation.handler)

    async def stop_streams(app: web.Application) -> None:
        app[GATEWAY].closing.set()

    app.on_shutdown.append(stop_streams)
    return app


def openapi_document() -> dict[str, Any]:
    """The gateway's OpenAPI 3.1 document, as served at ``GET /openapi.json``."""
    return build_document(OPERATIONS, title="rayfleet gateway", version=__version__)


# --------------------------------------------------------------------------- middlewares

_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def problem_response(problem: HttpProblem) -> web.Response:
    return web.json_response(problem.body(), status=problem.status, headers=problem.headers)


@web.middleware
async def _problems_middleware(request: web.Request, handler: _Handler) -> web.StreamResponse:
    """Every failure leaves as the JSON error body; nothing else (no traceback, no HTML page) ever does."""
    try:
        return await handler(request)
    except HttpProblem as problem:
        return problem_response(problem)
    except RayfleetError as error:
        return problem_response(problem_for(error))
    except pydantic.ValidationError as error:
        return problem_response(validation_problem(error))
    except web.HTTPException as error:
        if error.status < 400:
            raise
        # aiohttp's own answers: no route (404), wrong method (405), body over client_max_size (413).
        kind = error.reason.replace(" ", "")
        message = {
            404: f"no endpoint {request.path!r}; GET /openapi.json lists them (an identity or run id with '/' "
                 f"goes in a path percent-encoded, e.g. counter%2Falice)",
            405: f"{request.method} is not allowed on {request.path!r}; GET /openapi.json lists the methods",
            413: f"the request body is larger than the gateway accepts ({request.app[GATEWAY].limits.max_body_bytes} "
                 f"bytes); send less",
        }.get(error.status, error.text or error.reason)
        headers = {"Allow": error.headers["Allow"]} if "Allow" in error.headers else None
        return problem_response(HttpProblem(error.status, kind, message, headers=headers))
    except asyncio.CancelledError:
        raise
    except Exception:  # the one place an unexpected failure is turned into a generic 500
        request_id = uuid.uuid4().hex[:12]
        log.exception("gateway: %s %s failed (request id %s)", request.method, request.path, request_id)
        return problem_response(HttpProblem(
            500, "InternalServerError",
            f"the gateway failed to handle this request (request id {request_id}); the gateway's log has the details",
        ))


@web.middleware
async def _auth_middleware(request: web.Request, handler: _Handler) -> web.StreamResponse:
    token = request.app[GATEWAY].token
    if token is not None and request.path.startswith("/v1/"):
        header = request.headers.get("Authorization")
        if not bearer_token_matches(header, token):
            challenge = 'Bearer realm="rayfleet"' + (', error="invalid_token"' if header else "")
            raise HttpProblem(
                401, "Unauthorized",
                "a valid bearer token is required: send 'Authorization: Bearer <token>' with the token the gateway "
                "was started with (RAYFLEET_GATEWAY_TOKEN)" if not header else
                "the bearer token is wrong; send the token the gateway was started with (RAYFLEET_GATEWAY_TOKEN)",
                headers={"WWW-Authenticate": challenge},
            )
    return await handler(request)


@web.middleware
async def _json_only_middleware(request: web.Request, handler: _Handler) -> web.StreamResponse:
    """Bodies must be JSON and small: refused by their headers, before a byte is read."""
    if request.body_exists:
        if request.content_type != JSON_MEDIA:
            raise HttpProblem(
                415, "UnsupportedMediaType",
                f"request bodies must be JSON: send 'Content-Type: {JSON_MEDIA}' (got {request.content_type!r})",
                field="Content-Type",
            )
        limit = request.app[GATEWAY].limits.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            raise HttpProblem(413, "RequestEntityTooLarge",
                              f"the request body has {request.content_length} bytes; the gateway accepts at most "
                              f"{limit}. Send less")
    return await handler(request)


# --------------------------------------------------------------------------- request parts


def _gateway(request: web.Request) -> _Gateway:
    return request.app[GATEWAY]


async def _body(request: web.Request, *, required: bool) -> Any:
    """The request's JSON body, or ``None`` when it has none and none is required.

    JSON is parsed with the standard library only; nothing in a body is ever unpickled.
    """
    if not request.body_exists:
        if required:
            raise HttpProblem(400, "ValidationError", "this endpoint needs a JSON body", field="body")
        return None
    raw = await request.read()  # aiohttp refuses more than client_max_size here (413), chunked bodies too

    def refuse_constant(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    try:
        data = json.loads(raw, parse_constant=refuse_constant)
        # A \ud800 escape decodes to a lone surrogate, which no store can encode: refused here, not at a commit.
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise HttpProblem(400, "InvalidJSON", "the body contains a lone surrogate escape (\\ud800-\\udfff), "
                          "which is not text; send valid Unicode", field="body") from None
    except (ValueError, UnicodeDecodeError) as error:
        raise HttpProblem(400, "InvalidJSON", f"the body is not valid JSON: {error}", field="body") from None
    except RecursionError:
        raise HttpProblem(400, "InvalidJSON", "the body nests too deeply to be read", field="body") from None
    return data


def _query(request: web.Request, model: type[Model]) -> Model:
    """The query string validated by ``model``; unknown parameters are refused (a typo must not pass silently)."""
    values: dict[str, Any] = {}
    for name in request.query:
        field = model.model_fields.get(name)
        is_list = field is not None and typing.get_origin(field.annotation) is list
        values[name] = request.query.getall(name) if is_list else request.query[name]
    try:
        return model.model_validate(values)
    except pydantic.ValidationError as error:
        raise validation_problem(error) from None


def _validated(model: type[Model], data: Any) -> Model:
    try:
        return model.model_validate(data)
    except pydantic.ValidationError as error:
        raise validation_problem(error) from None


def _identity(request: web.Request, name: str = "identity") -> str:
    value = request.match_info[name]
    if len(value) > MAX_PATH_VALUE:
        raise HttpProblem(400, "ValidationError", f"{name} is longer than {MAX_PATH_VALUE} characters", field=name)
    try:
        return validate_identity(value)
    except RayfleetError as error:
        raise HttpProblem(400, "InvalidSpecError", error.message, field=name) from None


def _path_text(request: web.Request, name: str) -> str:
    value = request.match_info[name]
    if not value or len(value) > MAX_PATH_VALUE:
        raise HttpProblem(400, "ValidationError", f"{name} must have 1 to {MAX_PATH_VALUE} characters", field=name)
    return value


def _timeout(query: CallQuery, limits: GatewayLimits) -> float:
    if query.timeout is None:
        return limits.default_timeout
    if query.timeout > limits.max_timeout:
        raise HttpProblem(400, "ValidationError",
                          f"timeout {query.timeout:g} exceeds the gateway's maximum of {limits.max_timeout:g} seconds",
                          field="timeout")
    return query.timeout


def _page_size(limit: int | None, limits: GatewayLimits) -> int:
    if limit is None:
        return limits.default_page_size
    if limit > limits.max_page_size:
        raise HttpProblem(400, "ValidationError",
                          f"limit {limit} exceeds the gateway's maximum page of {limits.max_page_size}", field="limit")
    return limit


def _jsonable(value: Any, *, what: str) -> Any:
    """``value`` as JSON-ready data; a reply JSON cannot carry is the agent's answer the gateway cannot relay (502)."""
    try:
        data = to_jsonable_python(value)
        json.dumps(data, allow_nan=False)
    except (PydanticSerializationError, TypeError, ValueError) as error:
        raise HttpProblem(502, "UnrepresentableReply",
                          f"{what} returned a value JSON cannot carry ({type(value).__name__}: {error}); return "
                          f"JSON-compatible values (dicts, lists, str, numbers, pydantic models) from handlers "
                          f"called over HTTP") from None
    return data


def _respond(model: pydantic.BaseModel, *, status: int = 200) -> web.Response:
    return web.Response(text=model.model_dump_json(), status=status, content_type=JSON_MEDIA)


async def _off_loop(function: Callable[..., Result], *args: Any, **kwargs: Any) -> Result:
    """Run a blocking fleet method on a worker thread, keeping the event loop free."""
    return await asyncio.to_thread(function, *args, **kwargs)


# --------------------------------------------------------------------------- agents


async def call_agent(request: web.Request) -> web.Response:
    gateway = _gateway(request)
    identity = _identity(request)
    method = _path_text(request, "method")
    timeout = _timeout(_query(request, CallQuery), gateway.limits)
    key = request.headers.get(IDEMPOTENCY_HEADER)
    if key is not None and not (0 < len(key) <= gateway.limits.max_idempotency_key_length and key.isascii()
                                and key.isprintable()):
        raise HttpProblem(400, "ValidationError", f"{IDEMPOTENCY_HEADER} must be 1 to "
                          f"{gateway.limits.max_idempotency_key_length} printable ASCII characters",
                          field=IDEMPOTENCY_HEADER)
    body = await _body(request, required=False)
    arguments = {} if body is None else body
    if not isinstance(arguments, dict):
        raise HttpProblem(400, "ValidationError",
                          f"the body must be a JSON object of the handler's keyword arguments, got "
                          f"{type(arguments).__name__}", field="body")
    reserved = sorted(set(arguments) & CALL_OPTIONS)
    if reserved:
        raise HttpProblem(400, "ValidationError",
                          f"handler arguments named {', '.join(reserved)} cannot be passed over HTTP: these names are "
                          f"call options (use the {IDEMPOTENCY_HEADER} header and the timeout query parameter)",
                          field=f"body.{reserved[0]}")
    mode = _query(request, CallQuery).mode
    value = await gateway.fleet.agent(identity).ask(method, timeout=timeout, idempotency_key=key, mode=mode,
                                                    **arguments)
    return _respond(CallResult(identity=identity, method=method,
                               value=_jsonable(value, what=f"handler {method!r} of {identity!r}")))


async def agent_status(request: web.Request) -> web.Response:
    identity = _identity(request)
    status = await _off_loop(_gateway(request).fleet.status, identity)
    return _respond(AgentStatusModel.of(status))


async def list_agents(request: web.Request) -> web.Response:
    gateway = _gateway(request)
    query = _query(request, ListAgentsQuery)
    size = _page_size(query.limit, gateway.limits)
    labels: dict[str, str] = {}
    for index, item in enumerate(query.label):
        key, equals, value = item.partition("=")
        if not equals or not key:
            raise HttpProblem(400, "ValidationError", f"label filter {item!r} must look like key=value",
                              field=f"label.{index}")
        if labels.get(key, value) != value:
            raise HttpProblem(400, "ValidationError", f"label {key!r} is filtered on twice, with {labels[key]!r} "
                              f"and {value!r}; an agent has one value per label", field=f"label.{index}")
        labels[key] = value
    statuses = await _off_loop(gateway.fleet.list_agents, labels or None)
    ordered = sorted(statuses, key=lambda status: status.identity)
    if query.cursor is not None:
        ordered = [status for status in ordered if status.identity > query.cursor]
    page = ordered[:size]
    next_cursor = page[-1].identity if len(ordered) > size else None
    return _respond(AgentPage(agents=[AgentStatusModel.of(status) for status in page], next_cursor=next_cursor))


async def agent_events(request: web.Request) -> web.StreamResponse:
    """Server-Sent Events: one ``event: KIND`` / ``data: {json}`` message per identity event."""
    gateway = _gateway(request)
    identity = _identity(request)
    await _off_loop(gateway.fleet.status, identity)  # an unknown identity is a JSON 404, not an empty stream
    stream = typing.cast(AsyncGenerator[IdentityEvent, None], gateway.fleet.subscribe(identity))
    return await _serve_sse(request, stream, _sse_message)


async def _serve_sse(request: web.Request, stream: AsyncGenerator[Item, None],
                     encode: Callable[[Item], bytes]) -> web.StreamResponse:
    """Answer ``request`` with Server-Sent Events: each item of ``stream``, as ``encode`` writes it.

    Ends when the stream does, the client leaves or the gateway closes; ``stream`` is
    closed in every case. A comment line every ``sse_heartbeat`` seconds keeps an idle
    connection open through proxies, and finds a client that left. An error the
    stream raises after the response opened ends the response (its status is sent).
    """
    gateway = _gateway(request)
    pending: asyncio.Future[Any] = asyncio.ensure_future(stream.__anext__())
    closing: asyncio.Future[Any] = asyncio.ensure_future(gateway.closing.wait())
    try:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                               "X-Accel-Buffering": "no"})
        await response.prepare(request)
        await response.write(b": stream open\n\n")
        while True:
            done, _ = await asyncio.wait({pending, closing}, timeout=gateway.limits.sse_heartbeat,
                                         return_when=asyncio.FIRST_COMPLETED)
            if closing in done:
                break
            if pending not in done:
                await response.write(b": keep-alive\n\n")  # also finds a client that left
                continue
            try:
                item = pending.result()
            except StopAsyncIteration:
                break
            await response.write(encode(item))
            pending = asyncio.ensure_future(stream.__anext__())
    except (ConnectionResetError, ConnectionError):
        pass  # the client went away; the stream is closed below
    finally:
        closing.cancel()
        pending.cancel()
        with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration, RayfleetError):
            await pending
        await stream.aclose()
    return response


_HANDLER_NAME = PathParameter(name="method", description="The handler's name.",
                              schema={"type": "string", "minLength": 1, "maxLength": 200})


async def start_turn(request: web.Request) -> web.Response:
    gateway = _gateway(request)
    identity = _identity(request)
    method = _path_text(request, "method")
    if not method.isidentifier():
        raise HttpProblem(400, "ValidationError", f"method must be a handler name, got {method!r}", field="method")
    query = _query(request, StartTurnQuery)
    body = await _body(request, required=False)
    arguments = {} if body is None else body
    if not isinstance(arguments, dict):
        raise HttpProblem(400, "ValidationError", f"the body must be a JSON object of the handler's keyword "
                          f"arguments, got {type(arguments).__name__}", field="body")
    reserved = sorted(set(arguments) & CALL_OPTIONS)
    if reserved:
        raise HttpProblem(400, "ValidationError", f"handler arguments named {', '.join(reserved)} cannot be passed "
                          f"over HTTP: these names are call options", field=f"body.{reserved[0]}")
    await _off_loop(gateway.fleet.status, identity)  # an unknown identity is a 404 now, not a failed turn later
    handle = gateway.fleet.agent(identity).start(method, mode=query.mode, **arguments)
    gateway.turns[(identity, handle.id)] = handle
    while len(gateway.turns) > TURNS_KEPT:
        gateway.turns.popitem(last=False)
    path = f"/v1/agents/{urllib.parse.quote(identity, safe='')}/turns/{handle.id}/events"
    return _respond(TurnStarted(identity=identity, method=method, turn_id=handle.id, events=path), status=202)


def _unknown_turn(identity: str, turn_id: str) -> HttpProblem:
    return HttpProblem(404, "UnknownTurnError", f"no turn {turn_id!r} of {identity!r} is known: it was not started "
                       f"here, has no journal or stream in the ledger (or they passed their retention), and the "
                       f"identity's owner host does not know it",
                       field="turn_id")


REPLY_AFTER_END_WAIT = 10.0
"""Seconds a GET of a turn started here waits for its reply once the ledger says it ended
(the end is written before the reply is sent, so the reply follows at once)."""


def _await_reply(handle: TurnHandle, timeout: float) -> None:
    """Wait up to ``timeout`` for ``handle``'s reply, whatever it is (the caller reads it)."""
    with contextlib.suppress(Exception):  # an error or a timeout: the caller sees handle.done()
        handle.result(timeout=timeout)


async def get_turn(request: web.Request) -> web.Response:
    gateway = _gateway(request)
    identity = _identity(request)
    turn_id = _path_text(request, "turn_id")
    handle = gateway.turns.get((identity, turn_id))
    info = await _off_loop(gateway.fleet.turn, identity, turn_id)
    if handle is not None and not handle.done() and info is not None and info.status.ended:
        # Ended in the ledger, so its reply is on its way here: answer with it, not without.
        await _off_loop(_await_reply, handle, REPLY_AFTER_END_WAIT)
    if handle is not None and handle.done():
        try:
            value = _jsonable(handle.result(timeout=0), what=f"handler {handle.method!r} of {identity!r}")
        except RayfleetError as error:
            status = TurnStatus.INTERRUPTED if isinstance(error, TurnInterruptedError) else TurnStatus.FAILED
            failed = TurnInfo(id=turn_id, identity=identity, method=handle.method, status=status, error=str(error))
            return _respond(TurnModel.of(failed))
        ended = TurnInfo(id=turn_id, identity=identity, method=handle.method, status=TurnStatus.COMPLETED,
                         started=0.0 if info is None else info.started, updated=0.0 if info is None else info.updated,
                         steps=0 if info is None else info.steps)
        return _respond(TurnModel.of(ended, value))
    if info is None:
        if handle is None:
            raise _unknown_turn(identity, turn_id)
        info = TurnInfo(id=turn_id, identity=identity, method=handle.method, status=TurnStatus.RUNNING)
    return _respond(TurnModel.of(info))


async def turn_events(request: web.Request) -> web.StreamResponse:
    """Server-Sent Events of one turn: ``id: <event id>``, ``event: <kind>``, ``data: <JSON of rf.TurnEvent>``."""
    gateway = _gateway(request)
    identity = _identity(request)
    turn_id = _path_text(request, "turn_id")
    after = request.headers.get("Last-Event-ID") or _query(request, TurnEventsQuery).after
    handle = gateway.turns.get((identity, turn_id))
    await _off_loop(gateway.fleet.status, identity)  # an unknown identity is a JSON 404, not an empty stream
    # ``after`` is checked here, before the stream opens: an id of another turn is a JSON 400.
    stream = await _off_loop(handle.aevents, after) if handle is not None else await _off_loop(
        gateway.fleet.aturn_events, identity, turn_id, after=after)
    return await _serve_sse(request, typing.cast(AsyncGenerator[TurnEvent, None], stream), _turn_sse)


def _turn_sse(event: TurnEvent) -> bytes:
    data = json.dumps(to_jsonable_python(asdict(event)), separators=(",", ":"))
    return f"id: {event.id}\nevent: {event.kind}\ndata: {data}\n\n".encode()


async def cancel_turn(request: web.Request) -> web.Response:
    gateway = _gateway(request)
    identity = _identity(request)
    turn_id = _path_text(request, "turn_id")
    await _off_loop(gateway.fleet.status, identity)
    cancelled = await _off_loop(gateway.fleet.cancel_turn, identity, turn_id)
    return _respond(TurnCancelled(identity=identity, turn_id=turn_id, cancelled=cancelled))


def _sse_message(event: IdentityEvent) -> bytes:
    data = json.dumps(to_jsonable_python(asdict(event)), separators=(",", ":"))
    return f"event: {event.kind.value}\ndata: {data}\n\n".encode()


# --------------------------------------------------------------------------- rosters


async def apply_roster(request: web.Request) -> web.Response:
    gateway = _gateway(request)
    query = _query(request, ApplyRosterQuery)
    roster = _validated(RosterFile, await _body(request, required=True))

    def apply() -> ApplyReportModel:
        fleet = gateway.fleet
        # One spec per class the fleet runs: the fleet's own class objects, never imported by the client's word.
        by_class: dict[str, str] = {}
        for status in fleet.list_agents():
            by_class.setdefault(status.agent_class, status.identity)
        specs: list[AgentSpec] = [fleet.spec(identity) for identity in by_class.values()]
        checked = specs_from_roster(roster, known_classes=known_agent_classes(specs), policy=gateway.policy)
        return ApplyReportModel.of(fleet.apply(checked, dry_run=query.dry_run, prune=query.prune))

    return _respond(await _off_loop(apply))


# --------------------------------------------------------------------------- runs


async def submit_run(request: web.Request) -> web.Response:
    gateway = _gateway(request)
    submission = _validated(SubmitRunRequest, await _body(request, required=True))

    def submit() -> str:
        workflow = workflow_from_path(submission.workflow, submission.params, policy=gateway.policy)
        return gateway.fleet.submit(workflow, run_id=submission.run_id)

    return _respond(RunSubmitted(run_id=await _off_loop(submit)), status=202)


async def list_runs(request: web.Request) -> web.Response:
    gateway = _gateway(request)
    query = _query(request, ListRunsQuery)
    size = _page_size(query.limit, gateway.limits)
    offset = int(query.cursor or 0)
    runs = await _off_loop(gateway.fleet.runs.list_runs, query.status)
    page = runs[offset:offset + size]
    next_cursor = str(offset + size) if len(runs) > offset + size else None
    return _respond(RunPage(runs=[RunModel.of(info) for info in page], next_cursor=next_cursor))


async def get_run(request: web.Request) -> web.Response:
    info = await _off_loop(_gateway(request).fleet.runs.get, _path_text(request, "run_id"))
    return _respond(RunModel.of(info))


async def cancel_run(request: web.Request) -> web.Response:
    run_id = _path_text(request, "run_id")
    await _off_loop(_gateway(request).fleet.runs.cancel, run_id)
    return _respond(RunCancelRequested(run_id=run_id, cancel_requested=True), status=202)


# --------------------------------------------------------------------------- topology


async def export_topology(request: web.Request) -> web.Response:
    query = _query(request, TopologyQuery)
    text = await _off_loop(_gateway(request).fleet.topology.export, query.format)
    if query.format == "json":
        return _respond(TopologyExport(format="json", document=json.loads(text), text=None))
    return _respond(TopologyExport(format=query.format, document=None, text=text))


async def topology_edges(request: web.Request) -> web.Response:
    edges = await _off_loop(_gateway(request).fleet.topology.edges)
    return _respond(EdgeList(edges=[LiveEdgeModel.of(edge) for edge in edges]))


# --------------------------------------------------------------------------- dead letters


async def list_dead_letters(request: web.Request) -> web.Response:
    gateway = _gateway(request)
    query = _query(request, DeadLettersQuery)
    size = _page_size(query.limit, gateway.limits)
    identity = None
    if query.identity is not None:
        try:
            identity = validate_identity(query.identity)
        except RayfleetError as error:
            raise HttpProblem(400, "InvalidSpecError", error.message, field="identity") from None
    letters = await _off_loop(gateway.fleet.dead_letters, identity, limit=size)
    return _respond(DeadLetterList(dead_letters=[DeadLetterModel.of(letter) for letter in letters]))


async def replay_dead_letter(request: web.Request) -> web.Response:
    gateway = _gateway(request)
    raw = _path_text(request, "letter_id")
    if not raw.isdigit() or len(raw) > 18:
        raise HttpProblem(400, "ValidationError", f"letter_id must be a dead letter's number, got {raw!r}",
                          field="letter_id")
    letter_id = int(raw)
    timeout = _timeout(_query(request, CallQuery), gateway.limits)
    value = await _off_loop(gateway.fleet.replay_dead_letter, letter_id, timeout=timeout)
    return _respond(ReplayResult(letter_id=letter_id, value=_jsonable(value, what=f"the replay of letter {letter_id}")))


# --------------------------------------------------------------------------- signals and approvals


async def send_signal(request: web.Request) -> web.Response:
    gateway = _gateway(request)
    identity = _identity(request)
    name = _path_text(request, "name")
    body = await _body(request, required=False)
    signal = _validated(SignalRequest, {} if body is None else body)
    woken = await _off_loop(gateway.fleet.signal, identity, name, signal.value, signal_id=signal.signal_id)
    return _respond(SignalSent(identity=identity, name=name, woken=woken), status=202)


async def list_approvals(request: web.Request) -> web.Response:
    gateway = _gateway(request)
    query = _query(request, ApprovalsQuery)
    size = _page_size(query.limit, gateway.limits)
    found = await _off_loop(gateway.fleet.approvals.list, status=None if query.status == "ALL" else query.status,
                            identity=query.identity, limit=size, run_id=query.run_id)
    return _respond(ApprovalList(approvals=[ApprovalModel.of(info) for info in found]))


async def get_approval(request: web.Request) -> web.Response:
    info = await _off_loop(_gateway(request).fleet.approvals.get, _path_text(request, "approval_id"))
    return _respond(ApprovalModel.of(info))


async def decide_approval(request: web.Request) -> web.Response:
    approval_id = _path_text(request, "approval_id")
    decision = _validated(DecisionRequest, await _body(request, required=True))
    info = await _off_loop(_gateway(request).fleet.approvals.resolve, approval_id, approved=decision.approved,
                           by=decision.by, comment=decision.comment, data=decision.data,
                           expect_version=decision.expect_version)
    return _respond(ApprovalModel.of(info))


async def list_timers(request: web.Request) -> web.Response:
    gateway = _gateway(request)
    query = _query(request, TimersQuery)
    size = _page_size(query.limit, gateway.limits)
    found = await _off_loop(gateway.fleet.timers, query.identity, due_within=query.due_within, limit=size)
    return _respond(TimerList(timers=[TimerModel.of(info) for info in found]))


async def fire_timer(request: web.Request) -> web.Response:
    identity, name = _identity(request), _path_text(request, "name")
    await _off_loop(_gateway(request).fleet.fire_timer, identity, name)
    return _respond(TimerChanged(identity=identity, name=name, due_now=True), status=202)


async def cancel_timer(request: web.Request) -> web.Response:
    identity, name = _identity(request), _path_text(request, "name")
    cancelled = await _off_loop(_gateway(request).fleet.cancel_timer, identity, name)
    return _respond(TimerChanged(identity=identity, name=name, cancelled=cancelled))


# --------------------------------------------------------------------------- the document


async def openapi_json(request: web.Request) -> web.Response:
    return web.json_response(openapi_document())


_IDENTITY = PathParameter(
    name="identity", description="The agent's identity; a '/' in it is sent as %2F.",
    schema={"type": "string", "minLength": 1, "maxLength": 200, "pattern": "^[A-Za-z0-9._:/-]+$"},
)
_RUN_ID = PathParameter(name="run_id", description="The run's id; a '/' in it is sent as %2F.",
                        schema={"type": "string", "minLength": 1, "maxLength": MAX_PATH_VALUE})
_APPROVAL_ID = PathParameter(name="approval_id", description="The approval's id (from the listing).",
                             schema={"type": "string", "minLength": 1, "maxLength": MAX_PATH_VALUE})
_TIMER_NAME = PathParameter(name="name", description="The timer's name.",
                            schema={"type": "string", "minLength": 1, "maxLength": 200})
_TIMEOUT_ERRORS = (400, 401, 404, 409, 413, 415, 502, 503, 504)
_EVENT_SCHEMA: Mapping[str, Any] = {
    "type": "string",
    "description": "Server-Sent Events: 'event: <EventKind>' and 'data: <JSON of rf.IdentityEvent>' per event "
                   "(identity, kind, state, fencing_token, checkpoint_version, host, at); comment lines keep "
                   "the stream alive.",
}

_TURN_ID = PathParameter(name="turn_id", description="The turn's id (from its start).",
                         schema={"type": "string", "minLength": 1, "maxLength": MAX_PATH_VALUE})
_TURN_EVENT_SCHEMA: Mapping[str, Any] = {
    "type": "string",
    "description": "Server-Sent Events: 'id: <event id>', 'event: <kind>' and 'data: <JSON of rf.TurnEvent>' "
                   "(id, turn_id, kind, data, at, persisted) per event; comment lines keep the stream alive.",
}

OPERATIONS: tuple[Operation, ...] = (
    Operation(method="GET", path="/openapi.json", handler=openapi_json, operation_id="openapi", tag="meta",
              summary="This OpenAPI 3.1 document.", response_schema={"type": "object"}, public=True,
              error_statuses=()),
    Operation(method="GET", path="/v1/agents", handler=list_agents, operation_id="listAgents", tag="agents",
              summary="List agents, filtered by labels, a page at a time (by identity).", query=ListAgentsQuery,
              response=AgentPage, error_statuses=(400, 503)),
    Operation(method="GET", path="/v1/agents/{identity}", handler=agent_status, operation_id="getAgent",
              tag="agents", summary="The status of one identity.", path_parameters=(_IDENTITY,),
              response=AgentStatusModel, error_statuses=(400, 404, 503)),
    Operation(method="POST", path="/v1/agents/{identity}/call/{method}", handler=call_agent,
              operation_id="callAgent", tag="agents",
              summary="Call a handler; the body is a JSON object of its keyword arguments.",
              description="Calls with the same Idempotency-Key have their effect once; a repeat gets the first "
                          "reply. All HTTP clients share one sender, so keys should be unique per effect.",
              path_parameters=(_IDENTITY, PathParameter(name="method", description="The handler's name.",
                                                        schema={"type": "string", "minLength": 1,
                                                                "maxLength": 200})),
              query=CallQuery, body="object",
              headers=((IDEMPOTENCY_HEADER, "Makes the call's effect happen once per key.",
                        {"type": "string", "minLength": 1, "maxLength": 200}),),
              response=CallResult, error_statuses=(*_TIMEOUT_ERRORS, 403)),
    Operation(method="GET", path="/v1/agents/{identity}/events", handler=agent_events, operation_id="agentEvents",
              tag="agents", summary="Server-Sent Events of one identity, from now on.",
              path_parameters=(_IDENTITY,), response_media="text/event-stream", response_schema=dict(_EVENT_SCHEMA),
              error_statuses=(400, 404, 503)),
    Operation(method="POST", path="/v1/agents/{identity}/turns/{method}", handler=start_turn,
              operation_id="startTurn", tag="turns",
              summary="Start a turn of a handler (the body is a JSON object of its keyword arguments); 202 with its "
                      "id, at once.",
              path_parameters=(_IDENTITY, _HANDLER_NAME), query=StartTurnQuery, body="object", success=202,
              response=TurnStarted, error_statuses=(400, 401, 404, 413, 415, 503)),
    Operation(method="GET", path="/v1/agents/{identity}/turns/{turn_id}", handler=get_turn, operation_id="getTurn",
              tag="turns", summary="One turn's status (and its value once completed, for turns started here).",
              path_parameters=(_IDENTITY, _TURN_ID), response=TurnModel, error_statuses=(400, 401, 404, 502, 503)),
    Operation(method="GET", path="/v1/agents/{identity}/turns/{turn_id}/events", handler=turn_events,
              operation_id="turnEvents", tag="turns",
              summary="Server-Sent Events of one turn: every persisted event after Last-Event-ID, then live ones.",
              description="Each message has 'id: <epoch>.<seq>' (deltas: '<epoch>.<seq>.<n>'), 'event: <kind>' and "
                          "'data: <JSON of rf.TurnEvent>'. Reconnect with the Last-Event-ID header (or ?after=) to "
                          "resume; an id of another turn is refused with 400. The stream ends after the turn's "
                          "completed, failed or interrupted event.",
              path_parameters=(_IDENTITY, _TURN_ID), query=TurnEventsQuery,
              headers=(("Last-Event-ID", "Resume after this event id.",
                        {"type": "string", "maxLength": 100}),),
              response_media="text/event-stream", response_schema=dict(_TURN_EVENT_SCHEMA),
              error_statuses=(400, 401, 404, 503)),
    Operation(method="POST", path="/v1/agents/{identity}/turns/{turn_id}/cancel", handler=cancel_turn,
              operation_id="cancelTurn", tag="turns",
              summary="Interrupt a turn in progress: it ends INTERRUPTED and nothing of it commits.",
              path_parameters=(_IDENTITY, _TURN_ID), response=TurnCancelled, error_statuses=(400, 401, 404, 503)),
    Operation(method="POST", path="/v1/agents/{identity}/signals/{name}", handler=send_signal,
              operation_id="sendSignal", tag="agents",
              summary="Send a durable signal: it resumes the turn waiting for it, or is kept until one waits.",
              path_parameters=(_IDENTITY, PathParameter(name="name", description="The signal's name.",
                                                        schema={"type": "string", "minLength": 1,
                                                                "maxLength": 200})),
              body=SignalRequest, success=202, response=SignalSent, error_statuses=(400, 404, 413, 415, 503)),
    Operation(method="GET", path="/v1/approvals", handler=list_approvals, operation_id="listApprovals",
              tag="approvals", summary="Approvals by status and identity glob, oldest first.", query=ApprovalsQuery,
              response=ApprovalList, error_statuses=(400, 503)),
    Operation(method="GET", path="/v1/approvals/{approval_id}", handler=get_approval, operation_id="getApproval",
              tag="approvals", summary="One approval with its data and audit trail.",
              path_parameters=(_APPROVAL_ID,), response=ApprovalModel, error_statuses=(400, 404, 503)),
    Operation(method="POST", path="/v1/approvals/{approval_id}/decision", handler=decide_approval,
              operation_id="decideApproval", tag="approvals",
              summary="Approve or reject a pending approval, once; the waiting turn resumes.",
              description="A compare-and-set: a second decision, or one with a stale expect_version, is refused "
                          "with 409 naming who decided first.",
              path_parameters=(_APPROVAL_ID,), body=DecisionRequest, body_required=True, response=ApprovalModel,
              error_statuses=(400, 404, 409, 413, 415, 503)),
    Operation(method="GET", path="/v1/timers", handler=list_timers, operation_id="listTimers", tag="timers",
              summary="Reminders and schedules, soonest due first, with their fired, missed and late counts.",
              query=TimersQuery, response=TimerList, error_statuses=(400, 404, 503)),
    Operation(method="POST", path="/v1/timers/{identity}/{name}/fire", handler=fire_timer,
              operation_id="fireTimer", tag="timers", summary="Make a timer due now; a host fires it within a second.",
              path_parameters=(_IDENTITY, _TIMER_NAME), success=202, response=TimerChanged,
              error_statuses=(400, 404, 503)),
    Operation(method="POST", path="/v1/timers/{identity}/{name}/cancel", handler=cancel_timer,
              operation_id="cancelTimer", tag="timers", summary="Remove a timer.",
              path_parameters=(_IDENTITY, _TIMER_NAME), response=TimerChanged, error_statuses=(400, 404, 503)),
    Operation(method="POST", path="/v1/roster", handler=apply_roster, operation_id="applyRoster", tag="roster",
              summary="Make the fleet match a roster (the roster file's model, as JSON).",
              description="Agent classes must be ones the fleet already hosts or come from a module the operator "
                          "allows (RAYFLEET_ALLOWED_MODULES); otherwise 403 and nothing is applied.",
              query=ApplyRosterQuery, body=RosterFile, body_required=True, response=ApplyReportModel,
              error_statuses=(400, 403, 409, 413, 415, 503)),
    Operation(method="POST", path="/v1/runs", handler=submit_run, operation_id="submitRun", tag="runs",
              summary="Submit a workflow, named by import path, to the fleet's runner.",
              body=SubmitRunRequest, body_required=True, success=202, response=RunSubmitted,
              error_statuses=(400, 403, 409, 413, 415, 503)),
    Operation(method="GET", path="/v1/runs", handler=list_runs, operation_id="listRuns", tag="runs",
              summary="List runs in creation order, a page at a time.", query=ListRunsQuery, response=RunPage,
              error_statuses=(400, 503)),
    Operation(method="GET", path="/v1/runs/{run_id}", handler=get_run, operation_id="getRun", tag="runs",
              summary="One run's status.", path_parameters=(_RUN_ID,), response=RunModel,
              error_statuses=(400, 404, 503)),
    Operation(method="POST", path="/v1/runs/{run_id}/cancel", handler=cancel_run, operation_id="cancelRun",
              tag="runs", summary="Ask a run to stop; it compensates what it completed and ends CANCELLED.",
              path_parameters=(_RUN_ID,), success=202, response=RunCancelRequested,
              error_statuses=(400, 404, 503)),
    Operation(method="GET", path="/v1/topology", handler=export_topology, operation_id="exportTopology",
              tag="topology", summary="The topology as a JSON document, DOT or Mermaid.", query=TopologyQuery,
              response=TopologyExport, error_statuses=(400, 503)),
    Operation(method="GET", path="/v1/topology/edges", handler=topology_edges, operation_id="topologyEdges",
              tag="topology", summary="Live edges, and whether the platform manages each.", response=EdgeList,
              error_statuses=(503,)),
    Operation(method="GET", path="/v1/dead-letters", handler=list_dead_letters, operation_id="listDeadLetters",
              tag="dead-letters", summary="Messages that could not be handled, oldest first.",
              query=DeadLettersQuery, response=DeadLetterList, error_statuses=(400, 503)),
    Operation(method="POST", path="/v1/dead-letters/{letter_id}/replay", handler=replay_dead_letter,
              operation_id="replayDeadLetter", tag="dead-letters",
              summary="Send a dead letter's message again and return the reply.",
              path_parameters=(PathParameter(name="letter_id", description="The dead letter's id.",
                                             schema={"type": "string", "pattern": "^[0-9]{1,18}$"}),),
              query=CallQuery, response=ReplayResult, error_statuses=_TIMEOUT_ERRORS),
)
