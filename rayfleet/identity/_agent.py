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
import json
import math
import pkgutil
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Protocol

import pydantic

from ..errors import InvalidSpecError, NotInAgentContextError, UsageError
from ..ledger._turn_rows import TimerSpec
from ..retry import RetryPolicy
from ..turns._current import current_step_key, current_turn
from ..turns._timers import reminder, schedule
from ..turns._values import HandlingMode
from ._handlers import HandlerInfo, State, build_handler_info, handler_name
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

    def send_keyed(self, peer: str, method: str, idempotency_key: str, kwargs: Mapping[str, Any]) -> Awaitable[Any]:
        """As :meth:`send`, under ``idempotency_key``: a re-send with the same key gets the first reply."""
        ...

    def peer_handler(self, peer: str, method: str) -> Awaitable[HandlerInfo | None]:
        """How ``peer``'s handler ``method`` is called (its arguments model), or ``None`` when it has none.

        Raises ``UnknownIdentityError`` when no agent has that identity."""
        ...

    def checkpoint(self) -> Awaitable[int]: ...

    def set_timer(self, timer: TimerSpec) -> Awaitable[None]:
        """Register ``timer`` for this identity (fenced)."""
        ...

    def forget_timer(self, name: str) -> Awaitable[bool]:
        """Remove this identity's timer ``name`` (fenced); whether there was one."""
        ...


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
                handlers[name] = build_handler_info(name, member, marker["thread"], marker.get("shared", False))
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

    async def step(self, name: str, fn: Callable[..., Any], /, *args: Any, policy: str = "retry",
                   **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` once per turn and journal its outcome; return its value.

        The outcome (value or error) is journaled, fenced, before this returns. A turn
        that runs again (its host died, a retry, a resumption) gets the journaled outcome
        back here without running ``fn``. ``fn`` may be a function or a coroutine function;
        a plain function runs on the host's event loop, so hand blocking work to
        ``asyncio.to_thread`` inside it. Inside ``fn``, ``self.step_key`` is a key stable
        across replays (``identity:turn:position``) to make an outside effect idempotent.

        ``policy`` decides what happens to a step that was started and whose outcome was
        never journaled (its host stopped in between): ``"retry"`` (the default) runs it
        again; ``"unknown"`` journals that it started before running it, and after such
        a stop raises ``rf.StepOutcomeUnknownError`` here instead of running it again.
        A retryable error (``rf.RetryableError``) is not journaled: the turn is retried
        by the agent's retry policy and the step runs again.

        Raises:
            NonDeterminismError: the journal holds something else at this position.
            StepOutcomeUnknownError: see ``policy``.
            StepValueError: the value cannot be encoded; the turn fails.
            LeaseLostError: this host no longer owns the identity; the turn stops.
            UsageError: called outside a handler's turn, or with an unknown policy.
            Whatever ``fn`` raised (journaled: a replay raises it again).
        """
        return await current_turn("step").step(name, fn, args, kwargs, policy)

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` durably: the turn suspends and no host holds it meanwhile.

        The wake time is journaled the first time the turn gets here, so a replay waits
        only for what is left. While suspended, the turn holds no coroutine or memory on
        any host and the identity may be deactivated; at the wake time the platform
        delivers the turn to the identity's owner (activating it anywhere), which replays
        it from its journal up to here and goes on. Later messages to the identity wait
        behind the suspended turn, in order; the turn's caller keeps waiting for its
        reply (up to its own timeout). ``sleep(0)`` returns at once.

        Raises:
            UsageError: ``seconds`` is not a finite number, or this runs outside a turn.
            LeaseLostError: this host no longer owns the identity; the turn stops.
        """
        await current_turn("sleep").sleep(seconds)

    async def wait_signal(self, name: str, *, timeout: float | None = None) -> Any:
        """The value of the next signal ``name`` sent to this identity (``fleet.signal``); suspends until one comes.

        Signals are durable and each is taken by one wait, oldest first: one sent before
        the turn got here is taken at once. While waiting the turn is suspended, as in
        :meth:`sleep`. ``timeout`` (seconds, from the first time the turn got here) is a
        durable timer.

        Raises:
            WaitTimeoutError: the timeout came first (journaled: a replay raises it again).
            UsageError: an empty name or a bad timeout, or this runs outside a turn.
            LeaseLostError: this host no longer owns the identity; the turn stops.
        """
        return await current_turn("wait_signal").wait_signal(name, timeout)

    async def approval(self, subject: str, *, data: Any = None, approvers: Iterable[str] = (),
                       timeout: float | None = None, on_timeout: str = "reject") -> Any:
        """Ask for a person's decision on ``subject`` and wait for it durably; returns an ``rf.Decision``.

        The request goes to the fleet's approvals registry (``fleet.approvals``, ``rayfleet
        approvals``, ``/v1/approvals``) with ``data`` for the approvers to see, and the turn
        suspends as in :meth:`sleep` until someone in ``approvers`` (anyone, if empty)
        decides it. Each approval is decided once: a second decision is refused. After
        ``timeout`` seconds (from the first time the turn got here) the timeout decides
        it: rejected (``on_timeout="reject"``, the default) or approved (``"approve"``),
        with ``Decision.by == "timeout"``; whoever decided first wins.

        Raises:
            UsageError: an empty subject, bad approvers, timeout or on_timeout, or this
                runs outside a turn.
            InvalidSpecError: ``data`` cannot be encoded or is over 256 KiB encoded.
            LeaseLostError: this host no longer owns the identity; the turn stops.
        """
        return await current_turn("approval").approval(subject, data, approvers, timeout, on_timeout)

    def steering(self) -> list[Any]:
        """The ``steer`` messages sent to this turn since it last asked, oldest first.

        A message sent with ``mode="steer"`` while a turn of this agent runs joins that
        turn: the turn reads it here (a message with one argument reads as that argument's
        value, e.g. the text of ``ref.call(Assistant.chat, text="in French", mode="steer")``; one
        with more as its keyword arguments), and its caller gets the turn's reply. A turn
        that never reads it leaves it to run after the turn, as a queued message. What a
        turn read is journaled, so its replays read the same.

        Raises:
            UsageError: called outside a handler's turn.
        """
        return current_turn("steering").steering()

    def emit(self, kind: str, data: Any = None) -> None:
        """Add an event to this turn's stream, persisted: every client reading the stream gets it once.

        Drivers read it with ``ref.start(...).events()`` / ``.aevents()`` or ``ref.stream(...)``,
        HTTP clients as server-sent events. Its id is ``<owner epoch>.<sequence>``; a client
        that reconnects after its last id gets every persisted event after it. The event is
        delivered live at once and written to the ledger by the host's group commit, fenced
        by this owner's token (a host that lost the identity cannot append). Not journaled,
        but a turn replaying its journal (resumed after a suspension, or on a new owner)
        emits nothing until it passes its last journaled step or wait: the stream already
        has those events. What a turn cut off by a failover emitted after that point it
        emits again on its new owner, after one ``reset`` event.

        Raises:
            UsageError: outside a handler's turn; ``kind`` empty or one the platform writes
                (``started``, ``step``, ``completed``, ``delta``, ``reset``, ...); ``data`` not
                JSON or over 64 KiB encoded.
        """
        current_turn("emit").emit(kind, data)

    def emit_delta(self, text: str) -> None:
        """Add an ephemeral delta (a model token, a fragment of text) to this turn's stream.

        Delivered live only, never persisted: a client that reconnects gets the persisted
        events it missed but not the deltas. After a failover the stream carries one
        ``reset`` event, so a client drops the partial text it showed rather than
        interleave two hosts' deltas.

        Raises:
            UsageError: outside a handler's turn, or ``text`` is not a string.
        """
        current_turn("emit_delta").emit_delta(text)

    async def remind(self, name: str, /, *, method: str | Callable[..., Any], at: float | None = None,
                     after: float | None = None, every: float | None = None,
                     payload: Mapping[str, Any] | None = None, **arguments: Any) -> None:
        """Call handler ``method`` of this agent (with ``arguments``) later: once ``at`` a time or ``after``
        seconds, or ``every`` seconds. Replaces a reminder or schedule of the same ``name``.

        The handler's keyword arguments are the other keywords, or ``payload=`` (a mapping)
        for arguments named like this method's own (``method``, ``at``, ``after``, ...).

        Durable: kept in the ledger, fired by whichever host is up, activating the identity
        if it is dormant. Each firing is a message with the idempotency key
        ``timer:<name>:<scheduled time>``, so it takes effect once per scheduled time even
        across failovers. Written at once (fenced), not with the turn's commit: a turn that
        fails after this call leaves the reminder set; set it again by the same name to
        change it, or :meth:`forget` it.

        Raises:
            UsageError: no time, both ``at`` and ``after``, a time in the past, a period
                not above 0, or a method this agent has no handler for.
            LeaseLostError: this host no longer owns the identity.
        """
        context = self._context("remind")
        timer = reminder(name, method=self._timer_method("remind", method), payload={**(payload or {}), **arguments},
                         at=at, after=after, every=every, now=time.time())
        await context.set_timer(timer)

    async def schedule(self, name: str, /, *, cron: str, method: str | Callable[..., Any], tz: str = "UTC",
                       overlap: str = "skip", catch_up: str = "latest", payload: Mapping[str, Any] | None = None,
                       **arguments: Any) -> None:
        """Call handler ``method`` (with ``arguments``) at each time of cron expression ``cron`` in time zone ``tz``.

        Replaces a reminder or schedule of the same ``name``; fired as :meth:`remind`'s are,
        and takes the handler's arguments the same way.
        ``overlap="skip"`` (the default) lets a firing wait for the one before it to end;
        ``"allow"`` queues each as its time comes. ``catch_up`` says what times that
        passed unfired (the fleet was down, a firing ran long) do: ``"latest"`` (the
        default) fires once for the latest, ``"all"`` fires each, ``"none"`` fires none.
        ``fleet.timers()`` counts the missed and late ones.

        Raises:
            UsageError: a bad cron expression or time zone, an unknown policy, or a method
                this agent has no handler for.
            LeaseLostError: this host no longer owns the identity.
        """
        context = self._context("schedule")
        timer = schedule(name, cron=cron, tz=tz, method=self._timer_method("schedule", method),
                         payload={**(payload or {}), **arguments}, overlap=overlap, catch_up=catch_up, now=time.time())
        await context.set_timer(timer)

    async def forget(self, name: str) -> bool:
        """Cancel the reminder or schedule ``name``; whether there was one.

        Raises:
            LeaseLostError: this host no longer owns the identity.
        """
        return await self._context("forget").forget_timer(name)

    def _timer_method(self, api: str, method: str | Callable[..., Any]) -> str:
        name = handler_name(method)
        if name not in type(self).handler_names():
            raise UsageError(f"self.{api}(method={name!r}): {type(self).__name__} has no such handler; it has "
                             f"{', '.join(type(self).handler_names()) or 'none'}", api=f"self.{api}")
        return name

    @property
    def step_key(self) -> str:
        """The running step's stable key (``identity:turn:position``); only inside a step's function."""
        return current_step_key()

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


def resolve_object_path(path: str) -> Any:
    """The object a ``"package.module:attribute"`` path names (``attribute`` may be dotted), imported now.

    One rule for every such path rayfleet reads (agent classes, workflows of jobs and of
    the gateway): :func:`pkgutil.resolve_name`, with the colon required, so a bare module
    path is refused rather than taken for the module. Callers turn each failure into
    their own error, which says what to fix.

    Raises:
        ValueError: ``path`` is not of that form.
        ImportError: the module cannot be imported.
        AttributeError: the module has no such attribute.
    """
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"{path!r} is not a 'package.module:attribute' path")
    return pkgutil.resolve_name(path)


def resolve_agent_class(agent: object) -> type[Agent]:
    """Turn an agent class or a ``"pkg.module:Class"`` path into a checked agent class.

    Raises:
        InvalidSpecError: if the path cannot be imported, names nothing, or the
            class is not an ``rf.Agent`` whose State builds from defaults.
    """
    if isinstance(agent, str):
        module_name, _, attribute = agent.partition(":")
        try:
            agent = resolve_object_path(agent)
        except ValueError:
            raise InvalidSpecError(
                f"agent class path {agent!r} must look like 'package.module:ClassName'", field="agent"
            ) from None
        except ImportError as error:
            raise InvalidSpecError(
                f"cannot import module {module_name!r} for agent class {agent!r}: {error}. "
                f"Install the package or fix the path",
                field="agent",
            ) from error
        except AttributeError:
            raise InvalidSpecError(
                f"module {module_name!r} has no {attribute!r} (agent class {agent!r})", field="agent"
            ) from None
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
    on_busy: str = "queue"
    """What a message does when the agent has a turn in progress (running or suspended), unless the
    message says (``mode=``): ``"queue"``, ``"steer"``, ``"interrupt"`` or ``"reject"`` (``rf.HandlingMode``)."""

    def __post_init__(self) -> None:
        set_field = object.__setattr__
        set_field(self, "identity", validate_identity(self.identity))
        set_field(self, "on_busy", HandlingMode.parse(self.on_busy).value)
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
        if self.on_busy != HandlingMode.QUEUE.value:
            # Only when set: specs stored before handling modes keep their fingerprints.
            body["on_busy"] = self.on_busy
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:32]

    def differences(self, other: AgentSpec) -> list[str]:
        """Names of the fields in which ``other`` declares something different."""
        names = []
        for name in ("addressability", "labels", "peers", "topology", "durability", "checkpoint_interval",
                     "display_name", "context", "retry", "dedup_capacity", "on_busy"):
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
