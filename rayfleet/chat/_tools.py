"""``@rf.tool``: an agent's own method offered to its model, with a JSON Schema from its signature and docstring.

The schema is pydantic's for a model built from the method's parameters, so the model
sees what the method takes (types, defaults, each parameter's line of the docstring's
``Args:`` section) and the call's arguments are validated by the same model before the
method runs. Arguments that do not validate never reach the method: the model is told
what was wrong, as the tool's result, and may try again.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, get_type_hints

import pydantic

from ..errors import InvalidSpecError

F = TypeVar("F", bound=Callable[..., Any])

TOOL_MARKER = "__rayfleet_tool__"
NAME_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_ARG_LINE = re.compile(r"^(?P<name>\w+)\s*(\([^)]*\))?\s*:\s*(?P<text>.*)$")


@dataclass(frozen=True, slots=True)
class ToolMarker:
    name: str | None
    description: str | None
    idempotent: bool
    approval: bool


def tool(fn: F | None = None, /, *, name: str | None = None, description: str | None = None,
         idempotent: bool = False, approval: bool = False) -> Any:
    """Offer a method of an ``rf.ChatAgent`` to its model as a tool.

    ``@rf.tool`` or ``@rf.tool(name=..., description=..., idempotent=True, approval=True)``. The
    tool's name is the method's (or ``name``), its description the docstring's first
    paragraph (or ``description``), its parameters the method's, with each one's line
    of the docstring's ``Args:`` section. Each call runs as a durable step: a call the
    journal holds completed is never run again. A call started whose outcome was never
    journaled (its host stopped) runs again when the tool is ``idempotent``; otherwise
    the model is told its outcome is unknown. A tool with ``approval=True`` runs only once
    a person approved the call (``fleet.approvals``): the turn suspends on an approval
    whose data names the tool, its arguments and the call id; a rejection is the call's
    result.

    Raises:
        InvalidSpecError: a name the protocol refuses (letters, digits, ``_`` and ``-``,
            at most 64), when the agent class is defined.
    """
    def mark(method: F) -> F:
        if not callable(method):
            raise InvalidSpecError(f"@rf.tool marks a method, got {method!r}", field="tool")
        setattr(method, TOOL_MARKER, ToolMarker(name=name, description=description, idempotent=idempotent,
                                                approval=approval))
        return method

    return mark(fn) if fn is not None else mark


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """One tool as the model sees it and the loop runs it."""

    name: str
    description: str
    parameters: dict[str, Any]
    arguments: type[pydantic.BaseModel]
    method: str
    idempotent: bool
    approval: bool
    peer: str | None = None
    """The agent whose handler ``method`` the tool calls; ``None``: the agent's own method."""
    handoff: bool = False
    """Calling it hands the conversation over to ``peer``, whose answer ends the turn."""

    def definition(self) -> dict[str, Any]:
        """The tool as a request's ``tools`` lists it."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}

    def validated(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """``arguments`` as the method takes them.

        Raises:
            ValueError: saying which arguments are wrong and why (for the model to read).
        """
        try:
            parsed = self.arguments.model_validate(dict(arguments))
        except pydantic.ValidationError as error:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}" for e in error.errors())
            raise ValueError(f"invalid arguments for tool {self.name}: {problems}") from None
        return {field: getattr(parsed, field) for field in type(parsed).model_fields}


def tools_of(cls: type) -> dict[str, ToolSpec]:
    """The tools a class declares with ``@rf.tool`` (its bases' included), by tool name.

    Raises:
        InvalidSpecError: a bad tool name, two tools of one name, or a parameter without
            an annotation pydantic can describe.
    """
    specs: dict[str, ToolSpec] = {}
    for attribute in dir(cls):
        member = inspect.getattr_static(cls, attribute, None)
        marker = getattr(member, TOOL_MARKER, None)
        if not isinstance(marker, ToolMarker):
            continue
        spec = _spec(cls, attribute, member, marker)
        if spec.name in specs:
            raise InvalidSpecError(f"{cls.__qualname__} has two tools named {spec.name!r} "
                                   f"({specs[spec.name].method} and {attribute})", field="tools")
        specs[spec.name] = spec
    return specs


def _spec(cls: type, attribute: str, method: Callable[..., Any], marker: ToolMarker) -> ToolSpec:
    name = marker.name or attribute
    where = f"{cls.__qualname__}.{attribute}"
    if not NAME_PATTERN.match(name):
        raise InvalidSpecError(f"tool {where} needs a name of letters, digits, '_' or '-' (at most 64), got {name!r}",
                               field="tools")
    summary, documented = _docstring(inspect.getdoc(method) or "")
    try:
        hints = get_type_hints(method)
    except Exception as error:  # noqa: BLE001 - any failure to resolve an annotation is the user's to fix
        raise InvalidSpecError(f"tool {where}: its annotations cannot be resolved ({error})", field="tools") from None
    fields: dict[str, Any] = {}
    for parameter in list(inspect.signature(method).parameters.values())[1:]:  # self
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            raise InvalidSpecError(f"tool {where}: *args and **kwargs cannot be described to a model; name each "
                                   f"parameter", field="tools")
        if parameter.name not in hints:
            raise InvalidSpecError(f"tool {where}: parameter {parameter.name!r} needs a type annotation (the "
                                   f"model is told its type)", field="tools")
        default = ... if parameter.default is parameter.empty else parameter.default
        fields[parameter.name] = (hints[parameter.name],
                                  pydantic.Field(default, description=documented.get(parameter.name)))
    try:
        arguments = pydantic.create_model(f"{name}_arguments", __config__=pydantic.ConfigDict(extra="forbid"),
                                          **fields)
        parameters = arguments.model_json_schema()
    except Exception as error:  # noqa: BLE001 - pydantic's own message names the type it cannot describe
        raise InvalidSpecError(f"tool {where}: its parameters cannot be described as JSON Schema ({error})",
                               field="tools") from None
    parameters.pop("title", None)
    return ToolSpec(name=name, description=marker.description or summary or name, parameters=parameters,
                    arguments=arguments, method=attribute, idempotent=marker.idempotent, approval=marker.approval)


def summary_of(doc: str) -> str:
    """The first paragraph of a docstring, on one line."""
    paragraphs = doc.strip().split("\n\n")
    return " ".join(paragraphs[0].split()) if paragraphs and paragraphs[0] else ""


def _docstring(doc: str) -> tuple[str, dict[str, str]]:
    """The first paragraph of ``doc``, and each parameter's text in its Google-style ``Args:`` section."""
    summary = summary_of(doc)
    documented: dict[str, str] = {}
    current: str | None = None
    entry_indent: int | None = None  # the indentation of the section's entries; deeper lines continue one
    in_args = False
    for line in doc.splitlines():
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if stripped in ("Args:", "Arguments:", "Parameters:") and indent == 0:
            in_args, current, entry_indent = True, None, None
            continue
        if not in_args or not stripped:
            continue
        if indent == 0:
            break  # the next section (Returns:, Raises:, ...)
        match = _ARG_LINE.match(stripped)
        if match and (entry_indent is None or indent <= entry_indent):
            entry_indent = indent
            current = match["name"]
            documented[current] = match["text"].strip()
        elif current is not None:
            documented[current] = f"{documented[current]} {stripped}".strip()
    return summary, documented
