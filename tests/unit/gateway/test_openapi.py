"""The OpenAPI document is valid OpenAPI 3.1 and describes every route with schemas from the models."""

from __future__ import annotations

import json
from typing import Any

from openapi_spec_validator import OpenAPIV31SpecValidator, validate

from rayfleet.gateway import openapi_document
from rayfleet.gateway._app import OPERATIONS


def _refs(node: Any) -> set[str]:
    if isinstance(node, dict):
        found = {node["$ref"]} if isinstance(node.get("$ref"), str) else set()
        for value in node.values():
            found |= _refs(value)
        return found
    if isinstance(node, list):
        return set().union(*(_refs(item) for item in node)) if node else set()
    return set()


def test_the_document_is_valid_openapi_3_1() -> None:
    document = openapi_document()
    assert document["openapi"].startswith("3.1")
    validate(document, cls=OpenAPIV31SpecValidator)
    json.dumps(document)  # served as JSON


def test_every_route_is_documented_once() -> None:
    paths = openapi_document()["paths"]
    documented = {(method.upper(), path) for path, entry in paths.items() for method in entry}
    routed = {(operation.method, operation.path) for operation in OPERATIONS}
    assert documented == routed
    assert len({operation.operation_id for operation in OPERATIONS}) == len(OPERATIONS)


def test_every_reference_resolves_to_a_component() -> None:
    document = openapi_document()
    schemas = document["components"]["schemas"]
    for ref in _refs(document):
        assert ref.startswith("#/components/schemas/")
        assert ref.removeprefix("#/components/schemas/") in schemas, ref


def test_errors_share_one_json_shape_and_auth_is_bearer() -> None:
    document = openapi_document()
    assert document["components"]["securitySchemes"]["bearer"] == {
        "type": "http", "scheme": "bearer",
        "description": document["components"]["securitySchemes"]["bearer"]["description"],
    }
    assert document["security"] == [{"bearer": []}]
    error = document["components"]["schemas"]["ErrorDetail"]
    assert set(error["properties"]) == {"type", "message", "field"}
    for path, entry in document["paths"].items():
        for method, operation in entry.items():
            responses = operation["responses"]
            assert "default" in responses
            for status, response in responses.items():
                if status.startswith(("4", "5")) or status == "default":
                    assert response["content"]["application/json"]["schema"] == {
                        "$ref": "#/components/schemas/ErrorBody"}, (method, path, status)
            if path.startswith("/v1/"):
                assert "401" in responses and "security" not in operation, (method, path)


def test_the_roster_body_is_the_roster_files_model() -> None:
    document = openapi_document()
    body = document["paths"]["/v1/roster"]["post"]["requestBody"]
    assert body["required"] is True
    assert body["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/RosterFile"}
    agent = document["components"]["schemas"]["RosterAgent"]
    assert {"identity", "agent"} <= set(agent["required"])


def test_query_parameters_come_from_the_query_models() -> None:
    operation = openapi_document()["paths"]["/v1/agents"]["get"]
    parameters = {parameter["name"]: parameter for parameter in operation["parameters"]}
    assert set(parameters) == {"label", "limit", "cursor"}
    assert parameters["label"]["schema"]["type"] == "array" and parameters["label"]["explode"] is True
    assert parameters["limit"]["schema"]["anyOf"][0] == {"type": "integer", "minimum": 1}
    runs = {p["name"]: p for p in openapi_document()["paths"]["/v1/runs"]["get"]["parameters"]}
    assert runs["status"]["schema"]["anyOf"][0] == {"$ref": "#/components/schemas/RunStatus"}


def test_path_parameters_match_the_route_templates() -> None:
    import re

    for operation in OPERATIONS:
        assert set(re.findall(r"{(\w+)}", operation.path)) == {p.name for p in operation.path_parameters}, operation.path
