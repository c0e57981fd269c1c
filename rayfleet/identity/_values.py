"""Value types of the identity core: lifecycle states, records, leases, status, events.

Objects the runtime issues (``LeaseGrant``, ``ContinuityRecord``, ``IdentityStatus``)
are never built by user code; tests build them with ``dataclasses.replace``.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

DEFAULT_DEDUP_CAPACITY = 10_000
"""Idempotency keys each agent remembers (FIFO) unless its spec says otherwise."""


class LifecycleState(str, enum.Enum):
    """Where an identity is in its life, as ``fleet.status`` reports it."""

    UNINITIALIZED = "UNINITIALIZED"
    """Spawned, never activated: no continuity record yet."""
    DORMANT = "DORMANT"
    """Has a continuity record, no live owner."""
    ACTIVE = "ACTIVE"
    """Live on a host that holds its lease."""
    SUSPENDED = "SUSPENDED"
    """Transient, during respawn or reset."""
    RETIRING = "RETIRING"
    """Retired: refuses messages until respawned."""
    BROKEN = "BROKEN"
    """Its continuity cannot be used safely (e.g. a corrupt snapshot)."""


class Addressability(str, enum.Enum):
    """Who may send to an agent."""

    ADDRESSABLE = "ADDRESSABLE"
    INTERNAL_ONLY = "INTERNAL_ONLY"


class Durability(str, enum.Enum):
    """When an agent's State is committed."""

    EVERY_TURN = "EVERY_TURN"
    """Commit after every turn; the reply is sent only after the commit."""
    PERIODIC = "PERIODIC"
    """Reply first; commit at most every ``checkpoint_interval`` seconds."""
    ON_DEACTIVATE = "ON_DEACTIVATE"
    """Commit only when the agent is deactivated, drained, or checkpoints explicitly."""


class TopologyPolicy(str, enum.Enum):
    """Whether an agent may message identities it is not wired to."""

    OPEN = "open"
    ENFORCED = "enforced"


# Lifecycle markers the ledger persists; the live states are derived from leases.
PERSISTED_LIVE = "live"
PERSISTED_RETIRED = "retired"
PERSISTED_BROKEN = "broken"


@dataclass(frozen=True, slots=True, kw_only=True)
class ContinuityRecord:
    """The durable binding of an identity (issued by the runtime, never built by users)."""

    identity: str
    runtime_id: str
    """``rt:{identity}:{generation}``."""
    session_id: str
    """Random id of the current session; rotates on reset."""
    generation: int
    """0 at creation; only reset advances it, by one."""
    checkpoint_version: int
    """0 means never checkpointed; the first checkpoint is 1."""
    fencing_token: int
    """The fencing token the record was last written with."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SnapshotPointer:
    """Where an identity's committed State lives: one row of one immutable Arrow file, or the ledger itself.

    A small State travels inline in the ledger's commit (one durable write for the
    whole turn): ``file`` is empty then, and ``inline`` holds the State as an Arrow IPC
    stream of one row wherever the ledger hands out a State to read (an activation's
    view, an export page); other views carry ``inline=None``.
    """

    file: str
    """Path of the Arrow IPC file, relative to the storage root; ``""`` for a State kept in the ledger."""
    row: int
    version: int
    """The checkpoint version stored in that row."""
    inline: bytes | None = None

    @property
    def in_ledger(self) -> bool:
        """Whether the State is kept in the ledger row rather than in a file."""
        return not self.file


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseGrant:
    """Ownership of one identity by one holder, issued by the ledger.

    Every grant for an identity carries a strictly larger fencing token than any
    grant before it, across ledger restarts.
    """

    identity: str
    holder: str
    fencing_token: int
    ttl: float
    """Seconds the lease lasts from when the holder installs it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseDenied:
    """An acquire that failed because another live holder owns the identity."""

    identity: str
    holder: str
    """Who holds it now."""
    expires_in: float


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseInfo:
    """A read-only view of a lease, as reported by ``status``."""

    fencing_token: int
    ttl_remaining: float
    healthy: bool
    """True while more than 20 % of the TTL remains."""


def lease_is_healthy(ttl: float, remaining: float) -> bool:
    """A lease is healthy while strictly more than a fifth of its TTL remains."""
    return remaining > ttl / 5


@dataclass(frozen=True, slots=True, kw_only=True)
class IdentityStatus:
    """What the fleet knows about one identity right now."""

    identity: str
    state: LifecycleState
    generation: int | None = None
    checkpoint_version: int | None = None
    """None before the first checkpoint."""
    runtime_id: str | None = None
    session_id: str | None = None
    lease: LeaseInfo | None = None
    host: str | None = None
    """Name of the host actor that owns it, when ACTIVE."""
    paused: bool = False
    agent_class: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    addressability: Addressability = Addressability.ADDRESSABLE
    broken_reason: str = ""
    """Why the identity is BROKEN, empty otherwise."""


class EventKind(str, enum.Enum):
    """What an :class:`IdentityEvent` reports."""

    STATE_CHANGED = "STATE_CHANGED"
    LEASE_UPDATED = "LEASE_UPDATED"
    LEASE_LOST = "LEASE_LOST"
    CHECKPOINT_COMPLETED = "CHECKPOINT_COMPLETED"
    PAUSED = "PAUSED"
    RESUMED = "RESUMED"
    DELETED = "DELETED"
    """The identity was deleted; its subscription ends after this event."""


@dataclass(frozen=True, slots=True, kw_only=True)
class IdentityEvent:
    """One thing that happened to an identity, delivered by ``fleet.subscribe``."""

    identity: str
    kind: EventKind
    state: LifecycleState | None = None
    fencing_token: int | None = None
    checkpoint_version: int | None = None
    host: str | None = None
    at: float = field(default_factory=time.time)
    """Wall-clock seconds when the host emitted it."""
