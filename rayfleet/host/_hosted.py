"""What a host keeps per activated agent, the values a turn produces, and the host's internal signals.

A ``HostedAgent``'s State and delivery bookkeeping change only under its own
``turn_lock``; only the renewal loop (which replaces the grant or drops the entry)
and a peer refresh touch it without the lock. Once ``dropped`` is set the
entry is never served again: a message that finds it dropped activates the
identity anew. ``OwnedElsewhere`` and ``HostDraining`` are signals to the platform
(go to the owning host, or to another one), never errors a user sees.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..identity._agent import Agent, AgentSpec
from ..identity._handlers import Usage
from ..identity._values import ContinuityRecord, LeaseGrant
from ..ledger._turn_rows import TurnEnd
from ..ledger._values import StepEntry, StepJournaled
from ._messages import RECENT_MESSAGES, ConversationSequences, DedupWindow

if TYPE_CHECKING:
    from ..turns._context import TurnContext


class OwnedElsewhere(Exception):
    """Internal signal: another live holder owns the identity; the caller should go there."""

    def __init__(self, identity: str, holder: str) -> None:
        super().__init__(identity, holder)
        self.identity = identity
        self.holder = holder


class HostDraining(Exception):
    """Internal signal: this host takes no new activations; route elsewhere."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnResult:
    """What one delivered turn produced."""

    value: Any
    usage: Usage
    checkpoint_version: int
    duplicate: bool = False
    """True when this is the remembered reply of an earlier turn with the same idempotency key."""
    step: StepJournaled | None = None
    """What became of the workflow step the message asked to journal with the turn's commit
    (``Envelope.journal``); ``None`` when nothing was journaled (see ``Delivery``)."""
    suspended: bool = False
    """The turn suspended (``value`` is ``None``): its journal holds the wait, and it resumes when woken."""


@dataclass(slots=True)
class HostedAgent:
    """One agent activated on a host: its spec, instance, lease and delivery bookkeeping."""

    spec: AgentSpec
    agent: Agent
    record: ContinuityRecord
    grant: LeaseGrant
    installed_at: float
    checkpoint_version: int
    turn_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_used: float = 0.0
    dirty: bool = False
    last_commit: float = 0.0
    dropped: bool = False
    paused: bool = False
    pause_generation: int = 0
    """How many pauses took effect here; a resume stops when one took effect after it began."""
    dedup: DedupWindow = field(default_factory=DedupWindow)
    pending_dedup: list[tuple[str, bytes]] = field(default_factory=list)
    """Keys of the turns since the last commit, with their replies; committed with the next checkpoint.

    Under ``EVERY_TURN`` a key joins ``dedup`` only once that commit succeeded; under
    the other durabilities it is in ``dedup`` at once, as unsaved as the State it guards."""
    recent_messages: DedupWindow = field(default_factory=lambda: DedupWindow(RECENT_MESSAGES))
    """Replies of the last state-changing turns without an idempotency key, by message key.

    Saved beside the State in each checkpoint, so the next owner answers a router's
    re-send of one of them with its reply instead of running it again. Under
    ``EVERY_TURN`` a turn's message joins it before its commit: a commit that does not
    land takes the entry out of service, window and all."""
    pending_step: StepEntry | None = None
    """A workflow step's output to journal with the next commit (an ``EVERY_TURN`` turn's, so one at most)."""
    pending_turn_end: TurnEnd | None = None
    """A durable turn that ends with the next checkpoint (its completion commits with its final State)."""
    suspended_turn: str | None = None
    """The turn suspended now (sleep, signal, approval), which holds the mailbox: later messages
    park behind it until it ends. Read from the ledger at activation."""
    suspended_key: str | None = None
    """The suspended turn's dedup key (``sender␟idempotency key``), or ``None`` (none, or not read yet)."""
    draining_parked: bool = False
    """The messages parked behind a turn that ended are being replayed: new ones park too."""
    parked_left: bool = False
    """Messages were parked when this host activated the identity (left by its last owner): the
    first message here replays them before it runs."""
    parks_behind_running: bool = False
    """Messages parked behind the running turn here: later ones park too, and its end replays them."""
    parking: set[asyncio.Future[Any]] = field(default_factory=set)
    """Parks behind the running turn still being written (taken without the turn lock); a replay of
    the parked messages waits for them, so none is left behind."""
    lock_waiters: int = 0
    """Messages waiting in memory for the turn lock; while any do, a later one waits with them
    (in order) instead of parking ahead of them."""
    running_context: TurnContext | None = None
    """The context of the exclusive turn whose handler runs now: whether it journaled (a durable
    turn) decides where later messages wait."""
    recovered_turn: str | None = None
    """A turn the previous owner left running (read at activation): its journal is read before it runs."""
    interrupts: dict[str, str] = field(default_factory=dict)
    """Turns asked to stop at their next await (an ``interrupt`` message), by turn id: who asked."""
    steering: list[Any] = field(default_factory=list)
    """``steer`` messages (envelopes) for the running turn, not read yet."""
    steered: list[Any] = field(default_factory=list)
    """``steer`` messages the running turn read (``self.steering()``): their callers get its reply."""
    sequences: ConversationSequences = field(default_factory=ConversationSequences)
    peers: tuple[str, ...] = ()
    """Identities this agent is wired to now (live edges in the ledger)."""
    handler_task: asyncio.Future[Any] | None = None
    """The handler attempt running now, when it can be stopped; cancelled when the entry is dropped."""
    agent_class: str = field(init=False, default="")
    """``spec.agent_class_path``, computed once: metrics tag every message with it."""

    def __post_init__(self) -> None:
        self.agent_class = self.spec.agent_class_path

    @property
    def running_turn(self) -> str | None:
        """The id of the exclusive turn whose handler runs now."""
        return None if self.running_context is None else self.running_context.turn_id
