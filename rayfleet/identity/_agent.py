"""What users subclass and declare: ``Agent`` and ``AgentSpec``, the description of one identity.

An agent class is checked when it is defined: its ``State`` must be an ``rf.State``
that builds from defaults and its handlers must bind. An ``AgentSpec`` is checked when
it is built, so a bad identity, class or option never reaches the ledger. The two live
together because each refers to the other: a spec names an agent class, and a hosted
agent reads its spec.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import json
import math
import sys
from collections.abc import Awaitable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Protocol

import pydantic

from ..errors import InvalidSpecError, NotInAgentContextError
from ..retry import RetryPolicy
from ._handlers import HandlerInfo, State, build_handler_info
from ._names import validate_identity
from ._values import DEFAULT_DEDUP_CAPACITY, Addressability, Durability, TopologyPolicy


class AgentContext(Protocol):
    """What the hosting runtime gives an agent: its identity, lease and the fleet (read-only)."""

    @property
    def identity(self) -> str: ...

    @property
    def spec(self) -> AgentSpec: ...

    @property
    def generation(self) -> int: ...

    @property
    def fencing_token(self) -> int: ...

    @property
    def peers(self) -> tuple[str, ...]: ...

    def send(self, peer: str, method: str, /, **kwargs: Any) -> Awaitable[Any]: ...

    def checkpoint(self) -> Awaitable[int]: ...


class Agent:
    """Base class of user agents.

    Subclasses define a nested ``State(rf.State)`` and ``@rf.handler`` methods.
    Inside a handler, ``self.identity``, ``self.state``, ``self.spec``,
    ``self.generation``, ``self.fencing_token`` and ``self.peers`` describe the agent, and
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
                handlers[name] = build_handler_info(name, member, marker["thread"])
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
    def fencing_token(self) -> int:
        """The fencing token this owner holds for the identity."""
        return self._context("fencing_token").fencing_token

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
    """``module:QualName`` of an agent class, the form rosters use (one interned string per class)."""
    # Interned: a host keeps this string for each of its (up to 100,000) agents.
    return sys.intern(f"{agent_class.__module__}:{agent_class.__qualname__}")


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


_LABEL_TEXT = (str, int, float, bool)


@dataclass(frozen=True, kw_only=True)
class AgentSpec:
    """The declaration of one agent: who it is, what class runs it, how it is reached.

    Validated on construction; a bad field raises :class:`~rayfleet.InvalidSpecError`
    naming the field and the fix, before anything is written.
    """

    identity: str
    """Stable name, e.g. ``orders/eu-1``."""
    agent: type[Agent] | str
    """The agent class, or its import path ``"pkg.module:Class"``."""
    addressability: Addressability = Addressability.ADDRESSABLE
    """``INTERNAL_ONLY`` agents refuse messages from outside the fleet."""
    labels: Mapping[str, str] = field(default_factory=dict)
    """Capabilities, used by ``fleet.list_agents(labels=...)`` and workflow selectors."""
    peers: tuple[str, ...] = ()
    """Identities this agent is wired to."""
    topology: TopologyPolicy = TopologyPolicy.OPEN
    """``enforced`` refuses sends to identities that are not wired peers."""
    durability: Durability = Durability.EVERY_TURN
    """When State is committed (default: after every turn, before the reply)."""
    checkpoint_interval: float = 1.0
    """Seconds between commits under ``PERIODIC`` durability."""
    display_name: str = ""
    context: Mapping[str, Any] = field(default_factory=dict)
    """Free-form application context, handed to the agent as ``self.spec.context``."""
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    """How a handler that raises a retryable error is retried (5 attempts, 200 ms base)."""
    dedup_capacity: int = DEFAULT_DEDUP_CAPACITY
    """How many idempotency keys (and their replies) the agent remembers, oldest evicted first."""

    def __post_init__(self) -> None:
        set_field = object.__setattr__
        set_field(self, "identity", validate_identity(self.identity))
        if isinstance(self.agent, str):
            resolve_agent_class(self.agent)
        elif not (isinstance(self.agent, type) and issubclass(self.agent, Agent)) or self.agent is Agent:
            raise InvalidSpecError(
                f"spec for {self.identity!r}: agent must be an rf.Agent subclass or a 'pkg.module:Class' path, "
                f"got {self.agent!r}",
                field="agent",
            )
        else:
            resolve_agent_class(self.agent)
        set_field(self, "addressability", _enum(Addressability, self.addressability, "addressability", self.identity))
        set_field(self, "topology", _enum(TopologyPolicy, self.topology, "topology", self.identity))
        set_field(self, "durability", _enum(Durability, self.durability, "durability", self.identity))
        set_field(self, "labels", _labels(self.labels, self.identity))
        set_field(self, "peers", _peers(self.peers, self.identity))
        interval = self.checkpoint_interval
        if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not 0 < interval < math.inf:
            raise InvalidSpecError(
                f"spec for {self.identity!r}: checkpoint_interval must be a positive number of seconds "
                f"(finite, not a bool), got {self.checkpoint_interval!r}",
                field="checkpoint_interval",
            )
        if not isinstance(self.display_name, str):
            raise InvalidSpecError(f"spec for {self.identity!r}: display_name must be a string", field="display_name")
        if not isinstance(self.context, Mapping):
            raise InvalidSpecError(f"spec for {self.identity!r}: context must be a mapping", field="context")
        set_field(self, "context", dict(self.context))
        if not isinstance(self.retry, RetryPolicy):
            raise InvalidSpecError(f"spec for {self.identity!r}: retry must be an rf.RetryPolicy, got {self.retry!r}",
                                   field="retry")
        if isinstance(self.dedup_capacity, bool) or not isinstance(self.dedup_capacity, int) or self.dedup_capacity < 1:
            raise InvalidSpecError(
                f"spec for {self.identity!r}: dedup_capacity must be a positive integer, got {self.dedup_capacity!r}",
                field="dedup_capacity",
            )

    @property
    def agent_class(self) -> type[Agent]:
        """The resolved agent class (imports it when the spec names a path)."""
        return resolve_agent_class(self.agent)

    @property
    def agent_class_path(self) -> str:
        return self.agent if isinstance(self.agent, str) else agent_class_path(self.agent)

    def fingerprint(self) -> str:
        """A digest of every field; two specs with equal fingerprints declare the same agent."""
        body = {
            "identity": self.identity,
            "agent": self.agent_class_path,
            "addressability": self.addressability.value,
            "labels": sorted(self.labels.items()),
            "peers": sorted(self.peers),
            "topology": self.topology.value,
            "durability": self.durability.value,
            "checkpoint_interval": self.checkpoint_interval,
            "display_name": self.display_name,
            # Keys of any types sort by their repr: comparing an int key with a str one raised TypeError.
            "context": repr(sorted(self.context.items(), key=lambda item: repr(item[0]))),
            "retry": repr(self.retry),
            "dedup_capacity": self.dedup_capacity,
        }
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:32]

    def differences(self, other: AgentSpec) -> list[str]:
        """Names of the fields in which ``other`` declares something different."""
        names = []
        for name in ("addressability", "labels", "peers", "topology", "durability", "checkpoint_interval",
                     "display_name", "context", "retry", "dedup_capacity"):
            if getattr(self, name) != getattr(other, name):
                names.append(name)
        if self.agent_class_path != other.agent_class_path:
            names.insert(0, "agent")
        return names

    def with_changes(self, **changes: Any) -> AgentSpec:
        return replace(self, **changes)


def _enum(kind: type[Any], value: object, name: str, identity: str) -> Any:
    try:
        return kind(value.value if isinstance(value, kind) else value)
    except ValueError:
        allowed = ", ".join(member.value for member in kind)
        raise InvalidSpecError(
            f"spec for {identity!r}: {name} {value!r} is not one of {allowed}", field=name
        ) from None


def _labels(labels: object, identity: str) -> dict[str, str]:
    if not isinstance(labels, Mapping):
        raise InvalidSpecError(
            f"spec for {identity!r}: labels must be a mapping such as {{'role': 'reviewer'}}, got {labels!r}",
            field="labels",
        )
    clean: dict[str, str] = {}
    for key, value in labels.items():
        if not isinstance(key, str) or not key or not isinstance(value, _LABEL_TEXT):
            raise InvalidSpecError(
                f"spec for {identity!r}: label {key!r}={value!r} must map a non-empty string to a string",
                field="labels",
            )
        clean[key] = str(value)
    return clean


def _peers(peers: object, identity: str) -> tuple[str, ...]:
    if isinstance(peers, str) or not isinstance(peers, Iterable):
        raise InvalidSpecError(f"spec for {identity!r}: peers must be a list of identities", field="peers")
    result = []
    for peer in peers:
        peer = validate_identity(peer)
        if peer == identity:
            raise InvalidSpecError(f"spec for {identity!r}: an agent cannot be its own peer", field="peers")
        result.append(peer)
    return tuple(sorted(set(result)))
