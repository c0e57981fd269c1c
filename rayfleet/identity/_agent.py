"""What users subclass: ``Agent``, its pydantic ``State``, and the ``@handler`` decorator.

An agent class is checked when it is defined: its ``State`` must be an ``rf.State``
that builds from defaults, and each handler's parameters become a pydantic model so
arguments are validated before the handler runs, not halfway through it.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

import pydantic

from ..errors import InvalidArgumentsError, InvalidSpecError, NotInAgentContextError

if TYPE_CHECKING:
    from ._spec import AgentSpec


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


def handler(function: HandlerFunction | None = None, *, thread: bool = False) -> Any:
    """Mark an agent method as a handler that messages can call.

    One handler runs at a time per identity. Prefer ``async def`` handlers that
    ``await`` their I/O; a blocking handler stalls every agent on its host, so mark
    it ``@rf.handler(thread=True)`` to run it in a worker thread instead.

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
        target.__rayfleet_handler__ = {"thread": thread}  # type: ignore[attr-defined]
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


def _build_handler_info(name: str, function: Callable[..., Any], thread: bool) -> HandlerInfo:
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
    model = pydantic.create_model(  # type: ignore[call-overload]
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
    )


def _resolved_hints(function: Callable[..., Any]) -> dict[str, Any]:
    try:
        import typing

        return typing.get_type_hints(function)
    except Exception:  # an unresolvable forward reference: validate as Any rather than refuse
        return {}


class AgentContext(Protocol):
    """What the hosting runtime gives an agent: its identity, lease and the fleet (read-only)."""

    @property
    def identity(self) -> str: ...

    @property
    def spec(self) -> AgentSpec: ...

    @property
    def generation(self) -> int: ...

    @property
    def fence(self) -> int: ...

    @property
    def peers(self) -> tuple[str, ...]: ...

    def send(self, peer: str, method: str, /, **kwargs: Any) -> Awaitable[Any]: ...

    def checkpoint(self) -> Awaitable[int]: ...


class Agent:
    """Base class of user agents.

    Subclasses define a nested ``State(rf.State)`` and ``@rf.handler`` methods.
    Inside a handler, ``self.identity``, ``self.state``, ``self.spec``,
    ``self.generation``, ``self.fence`` and ``self.peers`` describe the agent, and
    ``await self.send(peer, method, **kw)`` and ``await self.checkpoint()`` reach
    the fleet. ``on_activate``/``on_deactivate`` run when the agent is (de)activated.
    """

    State: ClassVar[type[State]] = State
    __rayfleet_handlers__: ClassVar[dict[str, HandlerInfo]] = {}

    state: Any

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        state_class = cls.__dict__.get("State", cls.State)
        if not (isinstance(state_class, type) and issubclass(state_class, State)):
            raise InvalidSpecError(
                f"{cls.__qualname__}.State must subclass rf.State (a pydantic model), got {state_class!r}",
                field="agent",
            )
        handlers = dict(getattr(cls, "__rayfleet_handlers__", {}))
        for name, member in cls.__dict__.items():
            marker = getattr(member, "__rayfleet_handler__", None)
            if marker is not None:
                handlers[name] = _build_handler_info(name, member, marker["thread"])
        cls.__rayfleet_handlers__ = handlers

    def __init__(self) -> None:
        self._rf_context: AgentContext | None = None
        self.state = type(self).State()

    def _context(self, attribute: str) -> AgentContext:
        if self._rf_context is None:
            raise NotInAgentContextError(attribute=attribute)
        return self._rf_context

    @property
    def identity(self) -> str:
        return self._context("identity").identity

    @property
    def spec(self) -> AgentSpec:
        return self._context("spec").spec

    @property
    def generation(self) -> int:
        return self._context("generation").generation

    @property
    def fence(self) -> int:
        """The fencing token this owner holds for the identity."""
        return self._context("fence").fence

    @property
    def peers(self) -> tuple[str, ...]:
        return self._context("peers").peers

    async def send(self, peer: str, method: str, /, **kwargs: Any) -> Any:
        """Call a handler of another agent and wait for its reply."""
        return await self._context("send").send(peer, method, **kwargs)

    async def checkpoint(self) -> int:
        """Commit the current State now; returns the new checkpoint version."""
        return await self._context("checkpoint").checkpoint()

    async def on_activate(self) -> None:
        """Called after the State is loaded, before the first turn."""

    async def on_deactivate(self) -> None:
        """Called before the agent is checkpointed and released (idle, drain, retire)."""

    @classmethod
    def handler_names(cls) -> tuple[str, ...]:
        return tuple(sorted(cls.__rayfleet_handlers__))


def agent_class_path(agent_class: type[Agent]) -> str:
    """``module:QualName`` of an agent class, the form rosters use."""
    return f"{agent_class.__module__}:{agent_class.__qualname__}"


def resolve_agent_class(agent: object) -> type[Agent]:
    """Turn an agent class or a ``"pkg.module:Class"`` path into a checked agent class.

    Raises:
        InvalidSpecError: if the path cannot be imported, names nothing, or the
            class is not an ``rf.Agent`` whose State builds from defaults.
    """
    if isinstance(agent, str):
        module_name, _, attribute = agent.partition(":")
        if not module_name or not attribute:
            raise InvalidSpecError(
                f"agent class path {agent!r} must look like 'package.module:ClassName'", field="agent"
            )
        try:
            target: Any = importlib.import_module(module_name)
        except ImportError as error:
            raise InvalidSpecError(
                f"cannot import module {module_name!r} for agent class {agent!r}: {error}. "
                f"Install the package or fix the path",
                field="agent",
            ) from error
        for part in attribute.split("."):
            if not hasattr(target, part):
                raise InvalidSpecError(
                    f"module {module_name!r} has no {attribute!r} (agent class {agent!r})", field="agent"
                )
            target = getattr(target, part)
        agent = target
    if not (isinstance(agent, type) and issubclass(agent, Agent)) or agent is Agent:
        raise InvalidSpecError(
            f"{agent!r} is not an agent class: subclass rf.Agent and give it @rf.handler methods",
            field="agent",
        )
    try:
        agent.State()
    except pydantic.ValidationError as error:
        raise InvalidSpecError(
            f"{agent.__qualname__}.State cannot be built from defaults ({error.error_count()} problem(s): "
            f"{error.errors()[0]['loc']} {error.errors()[0]['msg']}); give every State field a default",
            field="agent",
        ) from None
    return agent


async def run_handler(info: HandlerInfo, agent: Agent, kwargs: dict[str, Any]) -> Any:
    """Run one handler turn the way its decorator asked (inline, awaited, or in a thread)."""
    if info.is_coroutine:
        return await info.function(agent, **kwargs)
    if info.in_thread:
        return await asyncio.to_thread(info.function, agent, **kwargs)
    return info.function(agent, **kwargs)
