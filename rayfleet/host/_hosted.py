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
from ..ledger._turn_rows import TurnEnd, TurnEntry, TurnEntryKind, TurnEntryState
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


HELD_JOURNAL_BYTES = 1 << 20
"""A suspended turn's journal is kept in memory (to resume it without reading it back) only up to this
many bytes of entry values: a larger one is read again at the wake."""


@dataclass(frozen=True, slots=True)
class HeldJournal:
    """The journal of the turn suspended on this host, as the host wrote it.

    Valid only under the fencing token it was written with: no other owner wrote since.
    While the turn is suspended, the one write to its journal that is not the owner's is a
    signal completing the entry the turn waits on, and the wake of that signal carries the
    entry (``Envelope.woken_with``). So the journal is this, with that entry applied;
    a wake of a signal wait that does not carry it (a timeout, a wake sweep's) reads the
    journal back, as does every other host.
    """

    turn_id: str
    fencing_token: int
    entries: tuple[TurnEntry, ...]
    streamed: bool
    """Whether the turn had a stream when it suspended (its resume then reads the stream's last event)."""

    def resumed(self, turn_id: str, fencing_token: int, woken_with: TurnEntry | None) -> tuple[TurnEntry, ...] | None:
        """The journal to resume ``turn_id`` from, or ``None`` when it must be read from the ledger."""
        if turn_id != self.turn_id or fencing_token != self.fencing_token:
            return None
        waiting = [entry for entry in self.entries if entry.state is TurnEntryState.WAITING]
        if woken_with is None:
            # Nothing was applied by the wake: right unless the ledger may hold a signal taken since.
            return None if any(entry.kind is TurnEntryKind.SIGNAL for entry in waiting) else self.entries
        if not any(entry.position == woken_with.position and entry.kind is woken_with.kind
                   and entry.name == woken_with.name for entry in waiting):
            return None
        return tuple(woken_with if entry.position == woken_with.position else entry for entry in self.entries)


def held_journal(turn_id: str, fencing_token: int, entries: tuple[TurnEntry, ...] | None, *,
                 streamed: bool) -> HeldJournal | None:
    """What to keep of a turn that just suspended: its journal, unless unknown or over ``HELD_JOURNAL_BYTES``."""
    if entries is None or sum(len(entry.value or b"") for entry in entries) > HELD_JOURNAL_BYTES:
        return None
    return HeldJournal(turn_id=turn_id, fencing_token=fencing_token, entries=entries, streamed=streamed)


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
    held_journal: HeldJournal | None = None
    """The journal of ``suspended_turn`` as this host wrote it, to resume it without a read (see
    :class:`HeldJournal`); taken by the turn's next run here."""
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
