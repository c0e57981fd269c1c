"""A workflow step journaled by the host in its agent's checkpoint transaction, on real Ray and both ledgers.

Internal integration test: it dispatches through the fleet's own ``RayDispatcher``
(what the engine uses) so the reply's ``journaled`` can be read, and reads the journal
and run leases through the fleet's ledger client.
"""

from __future__ import annotations

import asyncio
from typing import Any

import rayfleet as rf
from rayfleet.demo import Counter
from rayfleet.ledger import RunRequests, StepJournaled
from rayfleet.platform._runner import RayDispatcher
from rayfleet.workflow import JournalWith, StepReply


def _dispatch(fleet: rf.Fleet, target: str, key: str, journal: JournalWith | None) -> StepReply:
    courier: Any = fleet._courier
    dispatcher = RayDispatcher(courier, "run-1")
    return asyncio.run(dispatcher.call(target=target, method="add", payload={"n": 2}, idempotency_key=key,
                                       timeout=60.0, journal=journal))


def test_an_every_turn_step_is_journaled_with_its_checkpoint_and_a_stale_token_is_not(any_fleet: rf.Fleet) -> None:
    fleet = any_fleet
    ledger: Any = fleet._courier.ledger
    fleet.spawn("tally/every", Counter)
    _create_run(ledger)
    token = _lease(ledger, "engine-1")

    reply = _dispatch(fleet, "tally/every", "run-1/s1/1-0", JournalWith("run-1", "s1", token))
    assert reply.value == 2 and reply.journaled == StepJournaled(inserted=True, requests=RunRequests())
    journal = _journal(ledger)
    assert [entry.label for entry in journal.steps] == ["s1"]

    # The same key again: the remembered reply, with no second turn, no commit and so no journal answer.
    again = _dispatch(fleet, "tally/every", "run-1/s1/1-0", JournalWith("run-1", "s1", token))
    assert again.value == 2 and again.journaled is None

    # Another engine took the run: the turn still commits, the step is not journaled.
    ledger.release_run_lease(run_id="run-1", holder="engine-1", token=token).result()
    newer = _lease(ledger, "engine-2")
    stale = _dispatch(fleet, "tally/every", "run-1/s2/1-0", JournalWith("run-1", "s2", token))
    assert stale.value == 4 and stale.journaled is None
    assert [entry.label for entry in _journal(ledger).steps] == ["s1"]
    current = _dispatch(fleet, "tally/every", "run-1/s2/1-1", JournalWith("run-1", "s2", newer))
    assert current.value == 6 and current.journaled == StepJournaled(inserted=True, requests=RunRequests())


def test_a_periodic_agents_step_is_left_to_the_engine(fleet: rf.Fleet) -> None:
    ledger: Any = fleet._courier.ledger
    fleet.spawn("tally/periodic", Counter, durability="PERIODIC")
    _create_run(ledger)
    token = _lease(ledger, "engine-1")
    reply = _dispatch(fleet, "tally/periodic", "run-1/s1/1-0", JournalWith("run-1", "s1", token))
    assert reply.value == 2 and reply.journaled is None
    assert _journal(ledger).steps == ()


def test_a_workflow_on_every_turn_agents_journals_each_output_once(any_fleet: rf.Fleet) -> None:
    fleet = any_fleet
    fleet.spawn("tally/a", Counter)
    wf = rf.Workflow("chain")
    for index in range(5):
        wf.step(f"s{index}", to="tally/a", call="add", payload={"n": 1}, after=[f"s{index - 1}"] if index else ())
    outcome = fleet.run(wf, run_id="chain-1")
    assert outcome.ok and outcome.outputs == {f"s{index}": index + 1 for index in range(5)}
    ledger: Any = fleet._courier.ledger
    journal = ledger.journal("chain-1").result()
    assert [entry.label for entry in journal.steps] == [f"s{index}" for index in range(5)]
    assert fleet.agent("tally/a").call("add", n=0) == 5  # each step ran once


def _create_run(ledger: Any) -> None:
    ledger.create_run(run_id="run-1", workflow="wf", code_version="v1", definition=None).result()


def _lease(ledger: Any, holder: str) -> int:
    return int(ledger.acquire_run_lease(run_id="run-1", holder=holder, ttl=60.0).result().token)


def _journal(ledger: Any) -> Any:
    return ledger.journal("run-1").result()
