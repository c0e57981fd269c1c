"""Delivery values and bounded maps: envelopes, dead letters, parked messages, dedup window, conversation sequences.

These are plain data structures, so their arithmetic is tested without a host; the
delivery path in ``_delivery.py`` uses them. An ``Envelope`` is validated when it is
built, so a malformed message is refused where it enters instead of failing inside
a host, and it pickles whole, so a parked or dead-lettered message is stored exactly
as it was sent. Both per-agent maps are bounded: the dedup window holds a fixed
number of keys, and the conversation sequences sweep idle conversations once it passes a soft
cap, so neither grows with the traffic an agent has ever seen.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import cloudpickle

from ..errors import InvalidSpecError
from ..identity._values import DEFAULT_DEDUP_CAPACITY
from ..ledger._turn_rows import TurnEntry, TurnWake
from ..ledger._values import StoredMessage

DEDUP_SCOPE_SEPARATOR = "\x1f"
SEQUENCE_MAP_SOFT_CAP = 16_384
SEQUENCE_ENTRY_TTL = 600.0
SEQUENCE_SWEEP_INTERVAL = 1.0
EXTERNAL_SENDER = "external"
WORKFLOW_SENDER_PREFIX = "workflow:"
"""The sender of a workflow run's steps is ``workflow:<run id>`` (see :func:`workflow_sender`)."""
RECENT_MESSAGES = 16
"""Message ids of an agent's last state-changing turns without an idempotency key, remembered with its checkpoint.

A router sends one envelope again only when the host it sent it to died: the turns that
host committed without getting their replies out are the last few of each identity (its
turns run one at a time), so a short window covers them."""
RECENT_REPLY_LIMIT = 1024
"""Largest pickled reply kept in the message-id window; a larger one is remembered in the ledger's dedup window."""


class DeadLetterReason(str, enum.Enum):
    """Why a message ended in the dead-letter log."""

    DECODE_FAILED = "DECODE_FAILED"
    """The arguments could not be bound or validated against the handler."""
    REJECTED = "REJECTED"
    """The handler raised a non-retryable error."""
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    RETRIES_EXHAUSTED = "RETRIES_EXHAUSTED"
    STALE_SEQUENCE = "STALE_SEQUENCE"
    """A conversation sequence lower than one the agent already saw (``StaleSequenceError``)."""
    CANCELLED = "CANCELLED"
    """Parked work dropped by ``fleet.cancel_parked``."""
    DELETED = "DELETED"
    """Parked work of an identity that was deleted."""

    @classmethod
    def _missing_(cls, value: object) -> DeadLetterReason | None:
        # Ledgers written before the conversation sequence had its own word hold "STALE_FENCE".
        return cls.STALE_SEQUENCE if value == "STALE_FENCE" else None


@dataclass(frozen=True, slots=True, kw_only=True)
class Envelope:
    """One message to an agent, as it travels and as it is parked or dead-lettered."""

    target: str
    method: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    sender: str | None = None
    """The sending agent's identity; ``None`` for a caller outside the fleet."""
    idempotency_key: str | None = None
    deadline: float | None = None
    """Wall-clock seconds (``time.time()``) after which the message is dead-lettered unhandled."""
    conversation: str | None = None
    sequence: int | None = None
    """The message's place in its conversation; a sequence lower than one already seen is refused."""
    message_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    sent_at: float = field(default_factory=time.time)
    chain: tuple[str, ...] = ()
    """Agents whose turns wait on this message, the first caller first (empty from outside the fleet).

    A peer send appends its sender; a send to an identity already in the chain is refused
    (:class:`~rayfleet.errors.PeerCycleError`), since that agent's turn cannot end before it.
    """
    journal: tuple[str, str, int] | None = None
    """``(run_id, step label, run token)`` of a workflow step: journal the reply as that step's
    output in the transaction of the turn's checkpoint (``EVERY_TURN`` agents only; see ``Delivery``)."""
    wake: bool = False
    """The platform's redelivery of a suspended turn whose wake came (a timer, a signal): the host
    answers at once and replays the turn in the background; its caller gets the reply."""
    mode: str | None = None
    """What this message does when its agent has a turn in progress: ``queue``, ``steer``,
    ``interrupt`` or ``reject`` (``rf.HandlingMode`` values); ``None``: the spec's ``on_busy``."""
    woken_with: TurnEntry | None = None
    """A wake's only: the journal entry the wake completed in the ledger (a signal taken), which
    the host that suspended the turn applies to the journal it holds instead of reading it back."""

    def __post_init__(self) -> None:
        self.check()

    def __setstate__(self, state: list[Any]) -> None:
        # An envelope pickled by an earlier version (parked, dead-lettered, or the message of a
        # suspended turn) lacks the fields added since, which come last and have defaults: they
        # take their defaults, so what was stored before an upgrade is delivered after it.
        for index, spec in enumerate(dataclasses.fields(self)):
            if index < len(state):
                value = state[index]
            elif spec.default is not dataclasses.MISSING:
                value = spec.default
            elif spec.default_factory is not dataclasses.MISSING:
                value = spec.default_factory()
            else:
                continue  # a required field missing: check() names it
            object.__setattr__(self, spec.name, value)

    def check(self) -> None:
        """Raise if a field is malformed; unpickling never runs ``__post_init__``, so a host checks again.

        Raises:
            InvalidSpecError: naming the field and what it must be.
        """
        missing = [field.name for field in dataclasses.fields(self) if not hasattr(self, field.name)]
        if missing:
            # Pickled by an older or foreign client whose Envelope lacked these fields.
            raise InvalidSpecError(
                f"malformed message: missing field(s) {', '.join(missing)}; send it with this rayfleet version",
                field="envelope",
            )
        problem = _envelope_problem(self)
        if problem:
            raise InvalidSpecError(f"malformed message to {self.target!r}: {problem}", field="envelope")

    def dedup_key(self) -> str | None:
        """``sender␟key``: one sender can neither suppress nor replay another's key."""
        if self.idempotency_key is None:
            return None
        return f"{self.sender or EXTERNAL_SENDER}{DEDUP_SCOPE_SEPARATOR}{self.idempotency_key}"

    def message_key(self) -> str:
        """The implicit key of a message without an idempotency key: its message id, unique to this envelope.

        Only the platform sends one envelope twice (a router's re-send after the host it
        went to died); a caller's own retry is a new envelope with a new id.
        """
        return f"{self.sender or EXTERNAL_SENDER}{DEDUP_SCOPE_SEPARATOR}message{DEDUP_SCOPE_SEPARATOR}{self.message_id}"

    def workflow_run(self) -> str:
        """The run whose step this message is (``""``: none), as its sender names it (:func:`workflow_sender`).

        Only attribution rests on the sender (an approval's ``run_id``): an agent named
        ``workflow:<x>`` could claim a run that way, but never journal into one, which
        takes the run's token.
        """
        if self.sender is not None and self.sender.startswith(WORKFLOW_SENDER_PREFIX):
            return self.sender[len(WORKFLOW_SENDER_PREFIX):]
        return ""

    def wire(self) -> EnvelopeWire:
        """This envelope as it crosses a Ray call (see :data:`EnvelopeWire`)."""
        return (self.target, self.method, self.args, self.kwargs, self.sender, self.idempotency_key, self.deadline,
                self.conversation, self.sequence, self.message_id, self.sent_at, self.chain, self.journal, self.wake,
                self.mode, self.woken_with)

    @classmethod
    def from_wire(cls, wire: object) -> Envelope:
        """The envelope :meth:`wire` sent, checked like any constructed one.

        Raises:
            InvalidSpecError: ``wire`` is not an envelope's wire form, or one of its fields is malformed.
        """
        if not isinstance(wire, tuple) or len(wire) != len(_WIRE_FIELDS):
            raise InvalidSpecError(
                f"malformed message: expected an rf.Envelope or its wire form (a tuple of {len(_WIRE_FIELDS)} "
                f"fields), got {type(wire).__name__}; send messages through fleet.agent(...).call()",
                field="envelope",
            )
        return cls(**dict(zip(_WIRE_FIELDS, wire, strict=True)))


def wake_envelope(wake: TurnWake) -> Envelope:
    """The message that takes a woken suspended turn to its owner: the turn's own, marked a wake,
    with the entry the wake completed (see :attr:`Envelope.woken_with`)."""
    envelope: Envelope = cloudpickle.loads(wake.envelope)
    return dataclasses.replace(envelope, wake=True, woken_with=wake.taken)


def workflow_sender(run_id: str) -> str:
    """The sender that workflow run ``run_id``'s step messages carry (:meth:`Envelope.workflow_run` reads it back)."""
    return WORKFLOW_SENDER_PREFIX + run_id


EnvelopeWire = tuple[Any, ...]
"""An :class:`Envelope` as it crosses a Ray call: its field values, in the order of its fields.

Ray sends a tuple of plain values (strings, numbers, tuples, dicts) through its msgpack
path and pickles only what msgpack cannot hold (a handler's argument of a class of its
own), where the dataclass went whole through cloudpickle, a cost benchmark B1 (call
latency) shows on every call. Tuples stay tuples on the way. Hosts accept either form."""

_WIRE_FIELDS = tuple(field.name for field in dataclasses.fields(Envelope))

HANDLING_MODES = ("queue", "steer", "interrupt", "reject")
"""``rf.HandlingMode`` values (kept here as strings: the host package does not import ``turns``)."""


def _envelope_problem(envelope: Envelope) -> str:
    if not isinstance(envelope.target, str) or not envelope.target:
        return "target must be an identity"
    if not isinstance(envelope.method, str) or not envelope.method.isidentifier():
        return f"method must be a handler name, got {envelope.method!r}"
    if not isinstance(envelope.args, tuple) or not isinstance(envelope.kwargs, dict):
        return "args must be a tuple and kwargs a dict"
    if not all(isinstance(key, str) for key in envelope.kwargs):
        return "keyword argument names must be strings"
    for name in ("sender", "idempotency_key", "conversation"):
        value = getattr(envelope, name)
        if value is not None and (not isinstance(value, str) or not value):
            return f"{name} must be a non-empty string or None, got {value!r}"
    if not isinstance(envelope.chain, tuple) or not all(isinstance(i, str) and i for i in envelope.chain):
        return f"chain must be a tuple of identities, got {envelope.chain!r}"
    if envelope.deadline is not None and (isinstance(envelope.deadline, bool)
                                          or not isinstance(envelope.deadline, (int, float))
                                          or math.isnan(envelope.deadline)):
        return f"deadline must be a time.time() value or None, got {envelope.deadline!r}"
    if not isinstance(envelope.message_id, str) or not envelope.message_id:
        return f"message_id must be a non-empty string, got {envelope.message_id!r}"
    if (isinstance(envelope.sent_at, bool) or not isinstance(envelope.sent_at, (int, float))
            or not math.isfinite(envelope.sent_at)):
        return f"sent_at must be a time.time() value, got {envelope.sent_at!r}"
    if envelope.sequence is not None and (isinstance(envelope.sequence, bool) or not isinstance(envelope.sequence, int)
                                       or envelope.sequence < 0):
        return f"sequence must be a non-negative integer or None, got {envelope.sequence!r}"
    journal = envelope.journal
    if journal is not None and not (
        isinstance(journal, tuple) and len(journal) == 3 and all(isinstance(part, str) and part for part in journal[:2])
        and isinstance(journal[2], int) and not isinstance(journal[2], bool)
    ):
        return f"journal must be (run_id, step label, run token) or None, got {journal!r}"
    if (envelope.sequence is None) != (envelope.conversation is None) and envelope.sequence is not None:
        return "a sequence needs a conversation: pass conversation= with sequence="
    if not isinstance(envelope.wake, bool):
        return f"wake must be True or False, got {envelope.wake!r}"
    if envelope.woken_with is not None and (not envelope.wake or not isinstance(envelope.woken_with, TurnEntry)):
        return f"woken_with must be None or, on a wake, a journal entry; got {envelope.woken_with!r}"
    if envelope.mode is not None and envelope.mode not in HANDLING_MODES:
        return f"mode must be one of {', '.join(HANDLING_MODES)} or None, got {envelope.mode!r}"
    return ""


@dataclass(frozen=True, slots=True, kw_only=True)
class DeadLetter:
    """A message that could not be handled, with the reason and the original envelope."""

    id: int
    identity: str
    envelope: Envelope
    reason: DeadLetterReason
    error: str
    attempts: int
    at: float

    @classmethod
    def from_stored(cls, stored: StoredMessage) -> DeadLetter:
        """The dead letter the ledger's row ``stored`` holds (its envelope unpickled)."""
        return cls(id=stored.id, identity=stored.identity, envelope=cloudpickle.loads(stored.envelope),
                   reason=DeadLetterReason(stored.reason), error=stored.error, attempts=stored.attempts, at=stored.at)


@dataclass(frozen=True, slots=True, kw_only=True)
class ParkedMessage:
    """A message held while its agent is paused (oldest first in listings)."""

    seq: int
    identity: str
    envelope: Envelope
    parked_at: float


class DedupWindow:
    """The last ``capacity`` idempotency keys of an agent with their replies.

    FIFO, not LRU: seeing a key again does not refresh it, so the oldest keys leave
    first whatever their traffic, and a hot key cannot keep a newer one out. The
    window's map is made with its first key: most agents of a large fleet never see one.
    """

    __slots__ = ("_replies", "capacity")

    def __init__(self, capacity: int = DEFAULT_DEDUP_CAPACITY) -> None:
        self.capacity = max(int(capacity), 1)
        self._replies: OrderedDict[str, bytes] | None = None

    def __len__(self) -> int:
        return 0 if self._replies is None else len(self._replies)

    def __contains__(self, key: str) -> bool:
        return self._replies is not None and key in self._replies

    def get(self, key: str) -> bytes | None:
        return None if self._replies is None else self._replies.get(key)

    def insert(self, key: str, reply: bytes) -> bool:
        """Remember ``key``; ``False`` (and nothing changes) if it is already known."""
        if self._replies is None:
            self._replies = OrderedDict()
        elif key in self._replies:
            return False
        while len(self._replies) >= self.capacity:
            self._replies.popitem(last=False)
        self._replies[key] = reply
        return True

    def items(self) -> list[tuple[str, bytes]]:
        """The remembered keys with their replies, oldest first."""
        return [] if self._replies is None else list(self._replies.items())


class ConversationSequences:
    """Highest sequence seen per conversation, bounded by a soft cap and an idle sweep.

    ``accept`` refuses a sequence lower than the conversation's high-water mark and
    accepts an equal one (the same holder's retry; dedup handles the duplicate). When
    the map grows past the soft cap, entries idle for ``ttl`` seconds are swept, at
    most once per ``sweep_interval``.
    """

    __slots__ = ("_entries", "_last_sweep", "soft_cap", "sweep_interval", "ttl")

    def __init__(
        self, *, soft_cap: int = SEQUENCE_MAP_SOFT_CAP, ttl: float = SEQUENCE_ENTRY_TTL,
        sweep_interval: float = SEQUENCE_SWEEP_INTERVAL,
    ) -> None:
        self.soft_cap = soft_cap
        self.ttl = ttl
        self.sweep_interval = sweep_interval
        self._entries: dict[str, tuple[int, float]] = {}
        self._last_sweep = 0.0

    def __len__(self) -> int:
        return len(self._entries)

    def high_water(self, conversation: str) -> int | None:
        entry = self._entries.get(conversation)
        return None if entry is None else entry[0]

    def accept(self, conversation: str, sequence: int, now: float) -> bool:
        if len(self._entries) > self.soft_cap and now - self._last_sweep > self.sweep_interval:
            self._last_sweep = now
            self._entries = {c: e for c, e in self._entries.items() if now - e[1] < self.ttl}
        current = self._entries.get(conversation)
        if current is not None and sequence < current[0]:
            return False  # a refusal does not refresh the entry's age
        self._entries[conversation] = (sequence, now)
        return True

    def export(self) -> dict[str, tuple[int, float]]:
        return dict(self._entries)

    def restore(self, entries: dict[str, tuple[int, float]]) -> None:
        self._entries = dict(entries)
