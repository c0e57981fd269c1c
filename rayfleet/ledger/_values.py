"""The values the ledger takes and returns: frozen, picklable, and the same for every store.

They cross process boundaries (host and driver to the ledger actor), so they hold plain
data only; payloads the ledger does not interpret (specs, envelopes, step outputs)
travel as pickled ``bytes``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NewType, TypeAlias

from ..errors import RayfleetError
from ..identity._values import (
    DEFAULT_DEDUP_CAPACITY,
    ContinuityRecord,
    LeaseGrant,
    SnapshotPointer,
)
from ._turn_rows import TurnEnd

DEFAULT_LEASE_TTL = 10.0
"""Seconds a lease lasts unless the fleet configures otherwise; hosts renew every TTL/3."""

HolderId = NewType("HolderId", str)
"""Who holds a lease: ``<host name>@<incarnation>`` (``rayfleet-host-0@1a2b3c4d``). The
incarnation changes with every start of the host, so a restarted host never passes for
the one before it; the name part says where to route the identity's messages."""


def holder_id(host: str, incarnation: str) -> HolderId:
    """The holder id of incarnation ``incarnation`` of host ``host`` (the one place it is minted)."""
    return HolderId(f"{host}@{incarnation}")


def holder_host(holder: str) -> str:
    """The host name part of a lease holder id (``rayfleet-host-0@1a2b`` -> ``rayfleet-host-0``)."""
    return holder.split("@", 1)[0]


@dataclass(frozen=True, slots=True, kw_only=True)
class SpecRecord:
    """The ledger's columns for one identity's spec; the spec itself travels pickled in ``spec``."""

    identity: str
    spec: bytes
    fingerprint: str
    """Equal fingerprints mean equal specs: spawning again with the same one is a no-op."""
    agent_class: str
    labels: dict[str, str] = field(default_factory=dict)
    addressability: str = "ADDRESSABLE"
    peers: tuple[str, ...] = ()
    """Peers the spec declares (desired edges)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RegisterOutcome:
    """What ``register`` did: created the identity, or found an identical one."""

    created: bool
    lifecycle: str
    awaited: bool = False
    """Some other identity already declares this one as a peer (its edge can be wired now)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseView:
    """The live lease on an identity as the ledger sees it now."""

    holder: str
    fencing_token: int
    ttl: float
    expires_in: float


@dataclass(frozen=True, slots=True, kw_only=True)
class IdentityView:
    """Everything the ledger holds about one identity (read-only)."""

    identity: str
    spec: bytes
    """The cloudpickled ``AgentSpec``."""
    fingerprint: str
    agent_class: str
    labels: dict[str, str]
    addressability: str
    lifecycle: str
    reason: str
    continuity: ContinuityRecord | None
    snapshot: SnapshotPointer | None
    lease: LeaseView | None
    paused: bool = False
    declared_peers: tuple[str, ...] = ()
    """Peers named in the spec (desired edges)."""
    wired_peers: tuple[str, ...] = ()
    """Peers it is wired to now (live edges), which ``self.peers`` shows."""
    suspended_turn: str | None = None
    """The id of its suspended turn, if one holds its mailbox (later messages wait behind it)."""
    running_turn: str | None = None
    """The id of a turn its last owner left running (it stopped mid-turn): the turn's re-send replays it."""
    parked: bool = False
    """Messages wait parked in its durable mailbox (behind a pause, a suspended or a running turn)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Activation:
    """The result of acquiring an identity to host it: grant plus what to load."""

    grant: LeaseGrant
    view: IdentityView
    dedup: tuple[tuple[str, bytes], ...] = ()
    """The identity's remembered idempotency keys and replies, oldest first."""


@dataclass(frozen=True, slots=True)
class RunRequests:
    """What has been asked of a run, as its engine acts on it.

    Attributes:
        cancel: stop: no new step starts; what succeeded is compensated.
        pause: no new step starts until the request is withdrawn; steps in flight finish.
    """

    cancel: bool = False
    pause: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class StepEntry:
    """A workflow step's output, journaled in the transaction of the checkpoint that carries it.

    Journaled only while ``run_token`` is the run's current token and the step is not
    journaled yet; either way the checkpoint itself commits by its own rules.
    """

    run_id: str
    run_token: int
    label: str
    output: bytes
    """As ``rayfleet.checkpoints._step_outputs.encode_output`` encodes it."""
    tokens: int = 0


@dataclass(frozen=True, slots=True)
class StepJournaled:
    """The outcome of a committed checkpoint that carried a :class:`StepEntry` under the run's current token.

    Attributes:
        inserted: this output is the journaled one; ``False``: the step was journaled
            before (by an earlier attempt), and that output stays.
        requests: what is asked of the run, as of the transaction.
    """

    inserted: bool
    requests: RunRequests


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointCommit:
    """One pointer to commit: identity, the writer's token, the new version and row.

    ``dedup`` carries the idempotency keys (and pickled replies) of the turns this
    checkpoint covers, committed in the same transaction as the pointer, so a key is
    remembered exactly when the effect it guards is durable. ``step``, when set, is a
    workflow step's output journaled in that same transaction (see :class:`StepEntry`):
    the step is durable exactly when the turn that produced it is. ``turn_end``, when
    set, ends a durable turn in that same transaction (its row marked, its journal
    dropped): the turn is complete exactly when its final State is committed.
    """

    identity: str
    fencing_token: int
    version: int
    pointer: SnapshotPointer
    dedup: tuple[tuple[str, bytes], ...] = ()
    dedup_capacity: int = DEFAULT_DEDUP_CAPACITY
    step: StepEntry | None = None
    turn_end: TurnEnd | None = None


CommitOutcome: TypeAlias = RayfleetError | StepJournaled | None
"""One checkpoint's outcome in a commit: its refusal, ``None`` (committed), or :class:`StepJournaled`
(committed, and the step it carried was judged under the run's current token)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointRow:
    """An identity's latest committed checkpoint as the ledger points at it (what an export reads)."""

    identity: str
    agent_class: str
    """The spec's agent class path (``module:Class``)."""
    lifecycle: str
    """The persisted lifecycle marker: ``live``, ``retired`` or ``broken``."""
    generation: int
    checkpoint_version: int
    """0 when the identity never committed a checkpoint in this generation."""
    fencing_token: int
    """The token the latest checkpoint (or activation) was written under."""
    committed_at: float | None
    """Wall-clock seconds (the ledger's clock) of the latest commit; ``None`` if none, or if it predates schema 5."""
    snapshot: SnapshotPointer | None
    """Where the committed State is; ``None`` when nothing was committed."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredMessage:
    """A parked message or a dead letter as the ledger keeps it (payload still pickled)."""

    id: int
    identity: str
    message_id: str
    envelope: bytes
    at: float
    reason: str = ""
    error: str = ""
    attempts: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class HostInfo:
    """A registered host: its actor name, the lease holder id of its current incarnation, whether it drains,
    and where its process runs (``None`` for what a host did not say): its node's name, its process id, and
    ``process``, what tells that process from any later one given the same id (on Linux the kernel's boot id
    and the process's start time)."""

    name: str
    holder: str
    started_at: float
    draining: bool
    node: str | None = None
    pid: int | None = None
    process: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class EdgeRow:
    """A live edge as stored: canonical endpoints (``a < b``) and whether the platform manages it."""

    a: str
    b: str
    managed: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class TopologySnapshot:
    """Everything reconciliation needs, read in one consistent view."""

    lifecycles: dict[str, str]
    """Identity to its persisted lifecycle marker."""
    declared: dict[str, tuple[str, ...]]
    """Identity to the peers its spec declares."""
    explicit: tuple[tuple[str, str], ...]
    """Edges wired explicitly with ``fleet.topology.wire`` (canonical pairs)."""
    live: tuple[EdgeRow, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class TopologyChange:
    """Changes to live edges applied in one transaction (each a list of canonical pairs)."""

    wire: tuple[tuple[str, str], ...] = ()
    """Insert as managed (or mark an existing edge managed)."""
    adopt: tuple[tuple[str, str], ...] = ()
    """Mark an edge found live as managed."""
    unwire: tuple[tuple[str, str], ...] = ()
    """Remove managed edges."""
    forget: tuple[tuple[str, str], ...] = ()
    """Remove managed edges whose endpoint is gone."""
    link: tuple[tuple[str, str], ...] = ()
    """Insert as unmanaged (an edge someone else made)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunRecord:
    """A workflow run as the run registry keeps it."""

    run_id: str
    workflow: str
    code_version: str
    status: str
    detail: str
    cancel_requested: bool
    pause_requested: bool
    created_at: float
    updated_at: float
    outcome: bytes | None
    """The pickled ``WorkflowOutcome`` once the run ended."""
    submitted: bool
    """The run was submitted to the runner (its pickled definition is stored)."""
    owner: str | None = None
    """The holder of the run's lease (the engine executing it), or ``None`` once released.

    A holder whose lease lapsed is still named here until another engine takes the run.
    """


@dataclass(frozen=True, slots=True, kw_only=True)
class RunLease:
    """A granted run lease: ``holder`` executes ``run_id`` and writes for it under ``token``.

    ``token`` is strictly larger than every token issued before for the run; the lease
    lasts ``ttl`` seconds from its grant or last renewal.
    """

    run_id: str
    holder: str
    token: int
    ttl: float


@dataclass(frozen=True, slots=True, kw_only=True)
class RunStart:
    """A run's lease granted to its engine, and the run's journal as of the grant (one transaction)."""

    lease: RunLease
    journal: JournalRecord


@dataclass(frozen=True, slots=True, kw_only=True)
class JournalEntry:
    """One journaled step output (pickled or Arrow IPC bytes) and the tokens it spent."""

    label: str
    output: bytes
    tokens: int


@dataclass(frozen=True, slots=True, kw_only=True)
class JournalRecord:
    """A run's journal: step outputs in completion order, and the steps compensated successfully."""

    steps: tuple[JournalEntry, ...]
    compensated: tuple[str, ...]
