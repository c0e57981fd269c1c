"""Garbage sent straight to a real host actor: it is refused with a typed error and the host keeps serving.

``ray.get_actor(host).deliver.remote(identity, payload)`` with hypothesis-generated
payloads: arbitrary objects, and Envelopes whose fields were forged past their
validation (as a stale or hostile client could pickle them; unpickling never runs
``__post_init__``). Every answer must be ``("error", RayfleetError)`` with a message
that names the problem (never the host's "internal error" for a bug), or a normal
answer for a forged envelope that happens to be valid; after each, the agent still
answers and its State is unchanged by the garbage.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

import pytest
import ray
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from ray_helpers import host_reply

import rayfleet as rf


class Vault(rf.Agent):
    class State(rf.State):
        total: int = 0

    @rf.handler
    def add(self, n: int) -> int:
        self.state.total += n
        return self.state.total

    @rf.handler
    def get(self) -> int:
        return self.state.total


garbage = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=20),
              st.binary(max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3),
                            st.tuples(inner)),
    max_leaves=6,
)
FIELDS = [field.name for field in dataclasses.fields(rf.Envelope)]


def forge(**fields: Any) -> rf.Envelope:
    """An Envelope whose fields were never validated (what unpickling a forged one gives the host)."""
    envelope = object.__new__(rf.Envelope)
    base = {"target": "vault/a", "method": "get", "args": (), "kwargs": {}, "sender": None, "idempotency_key": None,
            "deadline": None, "conversation": None, "sequence": None, "message_id": "m-1", "sent_at": time.time(),
            "chain": (), "journal": None, "wake": False, "mode": None, "woken_with": None}
    assert set(base) == set(FIELDS), "forge() must set every field of Envelope"
    for name, value in {**base, **fields}.items():
        object.__setattr__(envelope, name, value)
    return envelope


forged = st.dictionaries(st.sampled_from(FIELDS), garbage, min_size=1, max_size=3).map(
    lambda fields: forge(**{**fields, "target": "vault/a"} if "target" not in fields else fields)
)


@pytest.mark.timeout(240)
def test_a_host_actor_refuses_garbage_with_typed_errors_and_keeps_serving(make_fleet) -> None:
    fleet: rf.Fleet = make_fleet(hosts=1)
    vault = fleet.spawn("vault/a", Vault)
    assert vault.call("add", n=7) == 7
    owner = fleet.status("vault/a").host
    assert owner is not None
    actor = ray.get_actor(owner, namespace=fleet.config.namespace)

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(payload=st.one_of(garbage, forged))
    @example(payload=forge(sent_at="yesterday", deadline=1.0))  # a passed deadline reads sent_at
    @example(payload=forge(kwargs=["not", "a", "dict"]))
    @example(payload=forge(args="abc"))
    @example(payload=forge(method="add", kwargs={"n": "many"}))
    @example(payload=forge(method=None))
    @example(payload=forge(method=None, wake=1))  # a wake is answered once taken, and only once it is checked
    @example(payload=forge(method=None, wake=True))
    @example(payload=forge(wake=True, woken_with="not a journal entry"))
    @example(payload=forge(deadline=math.nan))
    @example(payload=forge(sequence=-5, conversation="c"))
    @example(payload=forge(target="someone/else"))
    def check(payload: Any) -> None:
        kind, answer = host_reply(ray.get(actor.deliver.remote("vault/a", payload), timeout=60))
        if kind == "error":
            assert isinstance(answer, rf.RayfleetError), answer
            assert answer.message.strip()
            assert "internal error" not in answer.message, answer.message
        else:
            assert kind == "ok", (kind, answer)
            assert isinstance(payload, rf.Envelope) and payload.method == "get"
        assert vault.call("get") == 7  # still serving, State untouched by the garbage

    check()
    assert vault.call("add", n=1) == 8
