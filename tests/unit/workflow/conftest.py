"""An in-process fleet for workflow engine tests: labelled agents, handlers and dedup.

Leases (the run's and its exclusive steps') are the journal's: ``InMemoryJournal``
applies the ledger's rules.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import pytest

from rayfleet.errors import UnknownHandlerError, UnknownIdentityError
from rayfleet.identity._handlers import Reply, Usage
from rayfleet.testing import InMemoryJournal
from rayfleet.workflow import JournalWith, StepReply

Handler = Callable[[str, dict[str, Any]], Awaitable[Any]]


class FakeFleet:
    """Implements the engine's Dispatcher protocol in memory.

    Handlers are ``async fn(identity, payload)`` registered per method (optionally per
    identity); they return an output or a ``Reply`` carrying usage. A repeated
    idempotency key on the same agent returns the first successful reply without
    running the handler again, which is the contract real agents give.
    """

    def __init__(self) -> None:
        self.labels: dict[str, dict[str, str]] = {}
        self.handlers: dict[tuple[str | None, str], Handler] = {}
        self.counts: Counter[tuple[str, str]] = Counter()
        self.calls: list[dict[str, Any]] = []
        self.replies: dict[tuple[str, str], tuple[Any, Usage]] = {}
        self.journal_with_turns: InMemoryJournal | None = None
        """When set, a call asked to journal its step journals it here with the turn, as a host would."""

    def agent(self, identity: str, **labels: str) -> FakeFleet:
        self.labels[identity] = dict(labels)
        return self

    def on(self, method: str, fn: Handler, *, identity: str | None = None) -> FakeFleet:
        self.handlers[(identity, method)] = fn
        return self

    async def ensure_waiter(self, identity: str) -> None:
        self.labels.setdefault(identity, {})

    async def retire_waiter(self, identity: str) -> None:
        self.labels.pop(identity, None)

    def dispatched(self, method: str) -> list[dict[str, Any]]:
        """Calls of ``method`` that actually ran a handler (dedup hits excluded)."""
        return [call for call in self.calls if call["method"] == method and not call["dedup"]]

    async def call(
        self, *, target: str, method: str, payload: dict[str, Any], idempotency_key: str, timeout: float,
        conversation: str | None = None, sequence: int | None = None, journal: JournalWith | None = None,
    ) -> tuple[Any, Usage] | StepReply:
        record = {"target": target, "method": method, "payload": payload, "key": idempotency_key,
                  "timeout": timeout, "conversation": conversation, "sequence": sequence, "dedup": False,
                  "journal": journal}
        self.calls.append(record)
        if (target, idempotency_key) in self.replies:
            record["dedup"] = True
            return self.replies[(target, idempotency_key)]
        if target not in self.labels:
            raise UnknownIdentityError(identity=target)
        fn = self.handlers.get((target, method)) or self.handlers.get((None, method))
        if fn is None:
            raise UnknownHandlerError(identity=target, method=method, available=())
        self.counts[(target, method)] += 1
        result = await asyncio.wait_for(fn(target, payload), timeout)
        reply = (result.value, result.usage) if isinstance(result, Reply) else (result, Usage())
        self.replies[(target, idempotency_key)] = reply
        if journal is not None and self.journal_with_turns is not None:
            # As a host journals a step in its agent's checkpoint transaction.
            journaled = self.journal_with_turns.journal_with_turn(
                journal.run_id, journal.label, reply[0], reply[1].total_tokens, token=journal.token)
            return StepReply(reply[0], reply[1], journaled)
        return reply

    async def select(self, labels: Mapping[str, str]) -> list[str]:
        return sorted(identity for identity, own in self.labels.items()
                      if all(own.get(key) == value for key, value in labels.items()))


async def echo(identity: str, payload: dict[str, Any]) -> Any:
    return {"by": identity, **payload}


@pytest.fixture
def fleet() -> FakeFleet:
    """A fleet with agents a1, a2, a3 labelled skill=work and handlers ``work`` (echo) and ``undo``."""
    fake = FakeFleet()
    for name in ("a1", "a2", "a3"):
        fake.agent(name, skill="work")
    fake.on("work", echo)
    fake.on("undo", echo)
    return fake
