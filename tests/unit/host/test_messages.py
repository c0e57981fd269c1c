"""Delivery arithmetic without a host: dedup window, conversation sequences, retry policy, envelopes."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

import rayfleet as rf
from rayfleet.host._messages import ConversationSequences, DedupWindow


def test_dedup_window_is_fifo_and_bounded() -> None:
    window = DedupWindow(capacity=3)
    for key in "abc":
        assert window.insert(key, key.encode())
    assert not window.insert("a", b"other")  # a repeat neither inserts nor refreshes
    assert window.get("a") == b"a"
    assert window.insert("d", b"d")  # evicts the oldest, "a", even though it was just seen
    assert "a" not in window and len(window) == 3
    assert DedupWindow(capacity=0).capacity == 1


@given(st.lists(st.text(min_size=1, max_size=3), max_size=60), st.integers(min_value=1, max_value=8))
def test_dedup_window_never_exceeds_capacity(keys: list[str], capacity: int) -> None:
    window = DedupWindow(capacity=capacity)
    for key in keys:
        window.insert(key, b"")
        assert len(window) <= capacity


def test_conversation_sequences_refuse_lower_accepts_equal_and_higher() -> None:
    sequences = ConversationSequences()
    assert sequences.accept("conv", 0, now=1.0)  # sequence 0 on a fresh conversation is accepted
    assert sequences.accept("conv", 5, now=2.0)
    assert sequences.accept("conv", 5, now=3.0)  # the same holder's retry
    assert not sequences.accept("conv", 4, now=4.0)
    assert sequences.high_water("conv") == 5
    assert sequences.accept("other", 1, now=4.0)


def test_conversation_sequences_sweeps_idle_entries_only_past_the_soft_cap_and_at_most_once_per_interval() -> None:
    sequences = ConversationSequences(soft_cap=3, ttl=10.0, sweep_interval=1.0)
    for index in range(4):
        sequences.accept(f"old-{index}", 7, now=0.0)
    assert len(sequences) == 4  # the cap is soft: nothing is swept while everything is young
    sequences.accept("fresh", 1, now=20.0)  # past the cap, interval elapsed: idle entries go
    assert len(sequences) == 1 and sequences.high_water("fresh") == 1
    # After a sweep, an old sequence is accepted again (dedup is the backstop).
    assert sequences.accept("old-0", 1, now=20.5)


def test_conversation_sequences_rejection_does_not_refresh_age() -> None:
    sequences = ConversationSequences(soft_cap=0, ttl=10.0, sweep_interval=0.0)
    sequences.accept("conv", 5, now=0.0)
    assert not sequences.accept("conv", 1, now=9.0)
    sequences.accept("other", 1, now=10.5)  # sweeps: "conv" was last accepted at 0.0
    assert sequences.high_water("conv") is None


def test_retry_policy_backs_off_exponentially_with_capped_jitter() -> None:
    policy = rf.RetryPolicy(max_attempts=5, base_delay=0.2, max_delay=1.0, jitter=0.2)
    rng = random.Random(7)
    delays = [policy.delay_for(attempt, rng=rng) for attempt in range(6)]
    for attempt, delay in enumerate(delays):
        raw = min(0.2 * 2**attempt, 1.0)
        assert raw * 0.8 <= delay <= min(raw * 1.2, 1.0)
    assert rf.RetryPolicy(jitter=0).delay_for(10) == 5.0


@pytest.mark.parametrize(
    "options", [{"max_attempts": 0}, {"base_delay": -1}, {"base_delay": 2.0, "max_delay": 1.0}, {"jitter": 1.5}]
)
def test_retry_policy_refuses_bad_values(options: dict[str, float]) -> None:
    with pytest.raises(rf.InvalidSpecError, match="retry"):
        rf.RetryPolicy(**options)  # type: ignore[arg-type]


def test_dedup_key_is_scoped_by_sender() -> None:
    outside = rf.Envelope(target="a", method="m", idempotency_key="k")
    peer = rf.Envelope(target="a", method="m", idempotency_key="k", sender="b")
    assert outside.dedup_key() != peer.dedup_key()
    assert rf.Envelope(target="a", method="m").dedup_key() is None
    assert outside.message_id != rf.Envelope(target="a", method="m").message_id


def test_an_envelope_names_the_workflow_run_it_is_a_step_of() -> None:
    from rayfleet.host._messages import workflow_sender
    assert rf.Envelope(target="a", method="m").workflow_run() == ""
    assert rf.Envelope(target="a", method="m", sender="orders/1").workflow_run() == ""
    assert rf.Envelope(target="a", method="m", sender=workflow_sender("run-7")).workflow_run() == "run-7"
    journaled = rf.Envelope(target="a", method="m", sender=workflow_sender("run-7"), journal=("run-7", "s", 3))
    assert journaled.workflow_run() == "run-7"


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"method": "not a name"}, "method must be a handler name"),
        ({"args": [1]}, "args must be a tuple"),
        ({"kwargs": {1: 2}}, "names must be strings"),
        ({"idempotency_key": ""}, "idempotency_key must be a non-empty string"),
        ({"deadline": "soon"}, "deadline must be"),
        ({"sequence": -1, "conversation": "c"}, "sequence must be a non-negative integer"),
        ({"sequence": 3}, "a sequence needs a conversation"),
        ({"chain": ["a"]}, "chain must be a tuple of identities"),
        ({"chain": ("a", "")}, "chain must be a tuple of identities"),
        ({"journal": ("run", "step")}, "journal must be"),
        ({"journal": ("run", "", 1)}, "journal must be"),
        ({"journal": ("run", "step", True)}, "journal must be"),
        ({"journal": ["run", "step", 1]}, "journal must be"),
        ({"wake": "yes"}, "wake must be True or False"),
        ({"mode": "shout"}, "mode must be one of queue, steer, interrupt, reject"),
    ],
)
def test_malformed_envelopes_are_refused_with_the_reason(fields: dict[str, object], problem: str) -> None:
    options: dict[str, object] = {"target": "a", "method": "m", **fields}
    with pytest.raises(rf.InvalidSpecError, match=problem):
        rf.Envelope(**options)  # type: ignore[arg-type]


def test_an_envelope_missing_a_field_is_refused_by_check() -> None:
    # What unpickling an Envelope pickled by an older client (without ``chain``) gives a host.
    envelope = object.__new__(rf.Envelope)
    for name in ("target", "method", "args", "kwargs", "sender", "idempotency_key", "deadline", "conversation",
                 "sequence", "message_id", "sent_at"):
        object.__setattr__(envelope, name, getattr(rf.Envelope(target="a/1", method="get"), name))
    with pytest.raises(rf.InvalidSpecError, match="missing field.*chain"):
        envelope.check()


def test_an_envelope_crosses_a_ray_call_as_its_wire_form_and_comes_back_equal() -> None:
    sent = rf.Envelope(target="a", method="add", args=((1, 2),), kwargs={"pair": (3, [4])}, sender="b",
                    idempotency_key="k", deadline=5.0, conversation="c", sequence=2, chain=("b",), wake=True,
                    mode="steer")
    wire = sent.wire()
    assert type(wire) is tuple and all(type(part) is not rf.Envelope for part in wire)
    assert rf.Envelope.from_wire(wire) == sent


@pytest.mark.parametrize("wire", [["a", "add"], ("a", "add"), "not a message", None])
def test_something_that_is_not_an_envelopes_wire_form_is_refused_naming_it(wire: object) -> None:
    with pytest.raises(rf.InvalidSpecError, match="wire form") as refused:
        rf.Envelope.from_wire(wire)
    assert refused.value.field == "envelope"


def test_a_wire_form_with_a_malformed_field_is_refused_like_a_constructed_envelope() -> None:
    wire = list(rf.Envelope(target="a", method="add").wire())
    wire[1] = "not a name!"
    with pytest.raises(rf.InvalidSpecError, match="method must be a handler name"):
        rf.Envelope.from_wire(tuple(wire))
