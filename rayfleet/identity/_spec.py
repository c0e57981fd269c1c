"""``AgentSpec``: everything the fleet needs to host one identity."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import InvalidSpecError
from ..retry import RetryPolicy
from ._agent import Agent, agent_class_path, resolve_agent_class
from ._names import validate_identity
from ._values import DEFAULT_DEDUP_CAPACITY, Addressability, Durability, TopologyPolicy

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
        if not isinstance(self.checkpoint_interval, (int, float)) or self.checkpoint_interval <= 0:
            raise InvalidSpecError(
                f"spec for {self.identity!r}: checkpoint_interval must be a positive number of seconds, "
                f"got {self.checkpoint_interval!r}",
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
        if not isinstance(self.dedup_capacity, int) or self.dedup_capacity < 1:
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
            "context": repr(sorted(self.context.items(), key=lambda item: item[0])),
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
