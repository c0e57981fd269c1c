"""The OpenAPI 3.1 document of the gateway, generated from its pydantic models and its route table."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import pydantic
from aiohttp import web
from pydantic.json_schema import models_json_schema

from ._models import ErrorBody

REF_TEMPLATE = "#/components/schemas/{model}"
OPENAPI_VERSION = "3.1.0"
ANY_JSON_OBJECT: dict[str, Any] = {"type": "object", "additionalProperties": True}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
BodySpec = type[pydantic.BaseModel] | Literal["object"] | None
"""A request body: a model, any JSON object (``"object"``), or none."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PathParameter:
    name: str
    description: str
    schema: dict[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class Operation:
    """One endpoint: how aiohttp routes it and how the OpenAPI document describes it."""

    method: str
    path: str
    """The aiohttp path, e.g. ``/v1/agents/{identity}``; also the OpenAPI path."""
    handler: Handler
    operation_id: str
    summary: str
    description: str = ""
    tag: str
    path_parameters: tuple[PathParameter, ...] = ()
    query: type[pydantic.BaseModel] | None = None
    body: BodySpec = None
    body_required: bool = False
    headers: tuple[tuple[str, str, dict[str, Any]], ...] = ()
    """Request headers: name, description, schema."""
    success: int = 200
    response: type[pydantic.BaseModel] | None = None
    response_media: str = "application/json"
    response_schema: dict[str, Any] | None = None
    """For a non-JSON success (the event stream): its schema under ``response_media``."""
    public: bool = False
    """Served without the bearer token."""
    error_statuses: tuple[int, ...] = field(default=(400, 401, 404))


ERROR_DESCRIPTIONS = {
    400: "Invalid request: a field, query parameter, header or JSON body is wrong (error.field names it).",
    401: "Missing or wrong bearer token.",
    403: "Refused by the trust boundary: the module is not allowed, or the agent is INTERNAL_ONLY.",
    404: "No such identity, handler, run or dead letter.",
    409: "The identity's state or a fencing token forbids it now.",
    413: "The request body is larger than the gateway accepts.",
    415: "The request body is not application/json.",
    502: "The agent's handler raised, or replied with something JSON cannot carry.",
    503: "The fleet, ledger or storage is unavailable now; retry after Retry-After seconds.",
    504: "No reply within the timeout; the call may still complete (retry with the same Idempotency-Key).",
}


def build_document(operations: Sequence[Operation], *, title: str, version: str) -> dict[str, Any]:
    """The OpenAPI 3.1 document for ``operations``; every schema comes from a pydantic model."""
    models: list[tuple[type[pydantic.BaseModel], Literal["validation", "serialization"]]] = [
        (ErrorBody, "serialization")
    ]
    for operation in operations:
        if operation.query is not None:
            models.append((operation.query, "validation"))
        if isinstance(operation.body, type):
            models.append((operation.body, "validation"))
        if operation.response is not None:
            models.append((operation.response, "serialization"))
    refs, top = models_json_schema(list(dict.fromkeys(models)), ref_template=REF_TEMPLATE)
    schemas: dict[str, Any] = top.get("$defs", {})
    error_ref = refs[(ErrorBody, "serialization")]

    paths: dict[str, dict[str, Any]] = {}
    for operation in operations:
        parameters: list[dict[str, Any]] = [
            {"name": p.name, "in": "path", "required": True, "description": p.description, "schema": p.schema}
            for p in operation.path_parameters
        ]
        if operation.query is not None:
            parameters += _query_parameters(operation.query, schemas)
        parameters += [
            {"name": name, "in": "header", "required": False, "description": text, "schema": schema}
            for name, text, schema in operation.headers
        ]
        entry: dict[str, Any] = {
            "operationId": operation.operation_id, "summary": operation.summary, "tags": [operation.tag],
        }
        if operation.description:
            entry["description"] = operation.description
        if parameters:
            entry["parameters"] = parameters
        if operation.body is not None:
            body_schema = ANY_JSON_OBJECT if operation.body == "object" else refs[(operation.body, "validation")]
            entry["requestBody"] = {"required": operation.body_required,
                                    "content": {"application/json": {"schema": body_schema}}}
        success_schema = (refs[(operation.response, "serialization")] if operation.response is not None
                          else operation.response_schema or {})
        responses: dict[str, Any] = {
            str(operation.success): {"description": "Success.",
                                     "content": {operation.response_media: {"schema": success_schema}}},
        }
        error_content = {"application/json": {"schema": error_ref}}
        for status in sorted(set(operation.error_statuses) | ({401} if not operation.public else set())):
            responses[str(status)] = {"description": ERROR_DESCRIPTIONS[status], "content": error_content}
        responses["default"] = {"description": "Any other error, in the same JSON shape.", "content": error_content}
        entry["responses"] = responses
        if operation.public:
            entry["security"] = []
        paths.setdefault(operation.path, {})[operation.method.lower()] = entry
    # Query models describe parameters, not bodies: they are inlined above, not components.
    for operation in operations:
        if operation.query is not None:
            schemas.pop(operation.query.__name__, None)

    return {
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": title, "version": version,
            "description": "JSON API of a rayfleet fleet: agents, rosters, runs, topology, dead letters and an "
                           "event stream. Identities and run ids that contain '/' are sent percent-encoded "
                           "(%2F) in paths.",
        },
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                           "description": "The token the gateway was started with "
                                                          "(RAYFLEET_GATEWAY_TOKEN)."}},
        },
        "security": [{"bearer": []}],
    }


def _query_parameters(model: type[pydantic.BaseModel], schemas: dict[str, Any]) -> list[dict[str, Any]]:
    """One ``in: query`` parameter per field of ``model``, with the field's schema."""
    schema = schemas[model.__name__]
    required = set(schema.get("required", ()))
    parameters = []
    for field_name, field_schema in schema.get("properties", {}).items():
        parameter: dict[str, Any] = {
            "name": field_name, "in": "query", "required": field_name in required,
            "schema": {key: value for key, value in field_schema.items() if key not in ("title", "description")},
        }
        if "description" in field_schema:
            parameter["description"] = field_schema["description"]
        if field_schema.get("type") == "array":
            parameter["style"] = "form"
            parameter["explode"] = True
        parameters.append(parameter)
    return parameters
