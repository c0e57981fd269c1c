"""What a host answers a request with: ``(kind, payload)``.

A tuple of a kind string and a payload keeps the hot path free of class lookups; the
payload is the value for ``ok``, the owner's host name for ``redirect``, nothing for
``retry`` (this host cannot serve it now: route it again), and a pickle-safe
``RayfleetError`` for ``error`` (returned, not raised, so the caller gets the error
itself rather than Ray's wrapper).
"""

from __future__ import annotations

from typing import Any

from ..identity._handlers import Usage
from ..ledger._values import RunRequests, StepJournaled

OK = "ok"
REDIRECT = "redirect"
RETRY = "retry"
ERROR = "error"

Reply = tuple[str, Any]


TurnReplyWire = tuple[Any, int, int, "tuple[bool, bool, bool] | None"]
"""A delivered turn's reply payload: the value, the usage's prompt and completion tokens, and
the journaled workflow step as ``(inserted, cancel requested, pause requested)`` or ``None``.

Plain tuples of ints and bools travel by Ray's msgpack path; the dataclasses they stand
for would be pickled, which costs every reply a visible share of a whole call (benchmark
B1, call latency, in ``benchmarks/calls.py``)."""


def turn_reply_wire(value: Any, usage: Usage, step: StepJournaled | None) -> TurnReplyWire:
    """The wire form of a turn's reply (see :data:`TurnReplyWire`)."""
    journaled = None if step is None else (step.inserted, step.requests.cancel, step.requests.pause)
    return value, usage.prompt_tokens, usage.completion_tokens, journaled


def turn_value(wire: TurnReplyWire) -> Any:
    """The handler's value in a turn's reply."""
    return wire[0]


def turn_reply_from_wire(wire: TurnReplyWire) -> tuple[Any, Usage, StepJournaled | None]:
    """The value, usage and journaled step that :func:`turn_reply_wire` sent."""
    value, prompt_tokens, completion_tokens, journaled = wire
    step = None if journaled is None else StepJournaled(
        inserted=journaled[0], requests=RunRequests(cancel=journaled[1], pause=journaled[2]))
    return value, Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens), step
