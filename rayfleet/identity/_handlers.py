"""Handlers and the values they exchange: ``State``, ``@handler``, ``Reply`` and ``Usage``.

Each handler's parameters become a pydantic model when its agent class is defined, so a
message's arguments are validated before the handler runs, not halfway through it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pydantic

from ..errors import InvalidArgumentsError, InvalidSpecError


class State(pydantic.BaseModel):
    """Base class of an agent's durable state.

    Assignments are validated (``self.state.total = "x"`` raises at once), and
    unknown fields are refused, so a checkpoint always holds a valid State.
    """

    model_config = pydantic.ConfigDict(validate_assignment=True, extra="forbid", arbitrary_types_allowed=True)


@dataclass(frozen=True, slots=True, kw_only=True)
class Usage:
    """Token usage a handler reports, fed into workflow budgets."""

    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, slots=True)
class Reply:
    """A handler's return value together with the token usage it cost."""

    value: Any
    usage: Usage = field(default_factory=Usage)


HandlerFunction = TypeVar("HandlerFunction", bound=Callable[..., Any])


@dataclass(frozen=True, slots=True, kw_only=True)
class HandlerInfo:
    """How the host calls one handler (built once per class, at definition time)."""

    name: str
    function: Callable[..., Any]
    signature: inspect.Signature
    arguments_model: type[pydantic.BaseModel]
    is_coroutine: bool
    in_thread: bool
    extra_keywords: str | None = None
    """Name of the handler's ``**kwargs`` parameter, if it takes one (extras pass unvalidated)."""
    shared: bool = False
    """``@rf.handler(shared=True)``: reads State only, runs beside the exclusive turn (see ``rf.handler``)."""

    def bind(self, identity: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """Validate call arguments; return the keyword arguments to call with.

        Raises:
            InvalidArgumentsError: when the arguments do not fit the signature or types.
        """
        try:
            bound = self.signature.bind(None, *args, **kwargs)
        except TypeError as error:
            raise InvalidArgumentsError(identity=identity, method=self.name, detail=str(error)) from None
        given = {name: value for name, value in bound.arguments.items() if name != "self"}
        extras = given.pop(self.extra_keywords, {}) if self.extra_keywords else {}
        try:
            validated = self.arguments_model(**given)
        except pydantic.ValidationError as error:
            detail = "; ".join(
                f"{'.'.join(str(part) for part in item['loc'])}: {item['msg']}" for item in error.errors()
            )
            raise InvalidArgumentsError(identity=identity, method=self.name, detail=detail) from None
        return {**{name: getattr(validated, name) for name in given}, **extras}


def handler(function: HandlerFunction | None = None, *, thread: bool = False, shared: bool = False) -> Any:
    """Mark an agent method as a handler that messages can call.

    One handler runs at a time per identity. Prefer ``async def`` handlers that
    ``await`` their I/O; a blocking handler stalls every agent on its host, so mark
    it ``@rf.handler(thread=True)`` to run it in a worker thread instead.

    ``shared=True`` marks a handler that only reads State (a status query, a dashboard):
    it runs beside the exclusive turn instead of after it, and never waits behind a
    suspended turn. It sees a copy of the State as it is in memory (the running turn's
    changes included), and a shared handler that changes State is refused with
    ``rf.UsageError`` (its changes are dropped). Its turn is never durable: durable calls
    (``self.step``, waits) are refused in it.

    Raises:
        InvalidSpecError: at decoration time, if ``thread=True`` is used on an
            ``async def`` or the target is not a function.
    """

    def mark(target: HandlerFunction) -> HandlerFunction:
        if not inspect.isfunction(target):
            raise InvalidSpecError(f"@rf.handler must decorate a function, got {target!r}", field="handler")
        if thread and inspect.iscoroutinefunction(target):
            raise InvalidSpecError(
                f"handler {target.__qualname__} is async; thread=True is for blocking def handlers only",
                field="handler",
            )
        target.__rayfleet_handler__ = {"thread": thread, "shared": shared}  # type: ignore[attr-defined]
        return target

    if function is not None:
        return mark(function)
    return mark


def handler_name(method: str | Callable[..., Any]) -> str:
    """The name a message uses for ``method``: a handler's name, or a ``@rf.handler`` function itself.

    Passing the function (``ref.call(Counter.add, n=1)``) lets a type checker and an
    editor see which handler is meant; the message still carries only its name.

    Raises:
        InvalidSpecError: ``method`` is neither a string nor a ``@rf.handler`` function.
    """
    if isinstance(method, str):
        return method
    if callable(method) and hasattr(method, "__rayfleet_handler__"):
        return str(method.__name__)
    raise InvalidSpecError(
        f"method must be a handler name or a @rf.handler function (e.g. MyAgent.add), got {method!r}",
        field="method",
    )


def build_handler_info(name: str, function: Callable[..., Any], thread: bool, shared: bool = False) -> HandlerInfo:
    signature = inspect.signature(function)
    fields: dict[str, Any] = {}
    hints = _resolved_hints(function)
    extra_keywords = None
    for parameter in list(signature.parameters.values())[1:]:
        if parameter.kind is parameter.VAR_KEYWORD:
            extra_keywords = parameter.name
            continue
        if parameter.kind is parameter.VAR_POSITIONAL:
            raise InvalidSpecError(
                f"handler {function.__qualname__} takes *{parameter.name}; handlers take named parameters "
                f"(and optionally **kwargs) only",
                field="handler",
            )
        annotation = hints.get(parameter.name, Any)
        default = ... if parameter.default is parameter.empty else parameter.default
        fields[parameter.name] = (annotation, default)
    model = pydantic.create_model(
        f"{function.__qualname__}.arguments",
        __config__=pydantic.ConfigDict(arbitrary_types_allowed=True),
        **fields,
    )
    return HandlerInfo(
        name=name,
        function=function,
        signature=signature,
        arguments_model=model,
        is_coroutine=inspect.iscoroutinefunction(function),
        in_thread=thread,
        extra_keywords=extra_keywords,
        shared=shared,
    )


def _resolved_hints(function: Callable[..., Any]) -> dict[str, Any]:
    try:
        import typing

        return typing.get_type_hints(function)
    except Exception:  # noqa: BLE001 - an unresolvable forward reference: validate as Any rather than refuse
        return {}
