"""The wire form of a workflow dispatch's reply: plain values that Ray sends without pickling classes."""

from __future__ import annotations

import msgpack
import pytest

from rayfleet.identity._handlers import Usage
from rayfleet.ledger._values import RunRequests, StepJournaled
from rayfleet.platform._replies import turn_reply_from_wire, turn_reply_wire


@pytest.mark.parametrize("step", [
    None,
    StepJournaled(inserted=True, requests=RunRequests()),
    StepJournaled(inserted=False, requests=RunRequests(cancel=True, pause=False)),
    StepJournaled(inserted=True, requests=RunRequests(cancel=False, pause=True)),
])
def test_a_dispatch_reply_comes_back_as_it_was_sent(step: StepJournaled | None) -> None:
    usage = Usage(prompt_tokens=12, completion_tokens=30)
    wire = turn_reply_wire({"answer": 42}, usage, step)
    assert turn_reply_from_wire(wire) == ({"answer": 42}, usage, step)


def test_a_dispatch_reply_holds_no_class_of_ours() -> None:
    # What Ray's msgpack path takes (the value aside): packing fails on any dataclass.
    wire = turn_reply_wire(7, Usage(prompt_tokens=1), StepJournaled(inserted=True, requests=RunRequests(pause=True)))
    assert msgpack.unpackb(msgpack.packb(wire), use_list=False) == (7, 1, 0, (True, False, True))
