"""The ledger's durable-turn rows and journals, on every store (see ``test_ledger`` for the stores)."""
# ruff: noqa: F811 - the fixtures imported from test_ledger are named as the tests take them

from __future__ import annotations

import dataclasses

import pytest
from test_ledger import PostgresBackend, backend, clock, commit, grant, ledger, register  # noqa: F401 - fixtures and helpers

from rayfleet.errors import StaleFencingTokenError
from rayfleet.ledger._turn_rows import ApprovalRequest, TurnEnd, TurnEntry, TurnEntryKind, TurnEntryState, TurnWrite


def _step(position: int, name: str, state: TurnEntryState = TurnEntryState.COMPLETED, value: bytes | None = b"v") -> TurnEntry:
    return TurnEntry(position=position, kind=TurnEntryKind.STEP, name=name, state=state, value=value)


def _write(led, token: int, *entries: TurnEntry, turn_id: str = "t1", **fields) -> None:
    led.write_turn(identity="a", fencing_token=token, turn=TurnWrite(
        turn_id=turn_id, method="go", envelope=b"envelope", entries=entries, **fields))


def test_a_turn_has_no_row_until_it_journals_and_then_keeps_its_entries_in_order(ledger):
    register(ledger)
    token = grant(ledger, "h1").fencing_token
    assert ledger.turn(identity="a", turn_id="t1") is None
    _write(ledger, token, _step(1, "second"), _step(0, "first", TurnEntryState.REQUESTED, None))
    record = ledger.turn(identity="a", turn_id="t1")
    assert record is not None and record.status == "RUNNING" and record.method == "go"
    assert record.envelope == b"envelope" and record.steps == 2
    assert [(e.position, e.name, e.state) for e in record.entries] == [
        (0, "first", TurnEntryState.REQUESTED), (1, "second", TurnEntryState.COMPLETED)]


def test_a_completed_entry_is_never_changed_but_a_requested_one_completes(ledger):
    register(ledger)
    token = grant(ledger, "h1").fencing_token
    _write(ledger, token, _step(0, "s", TurnEntryState.REQUESTED, None), _step(1, "done", value=b"first"))
    _write(ledger, token, _step(0, "s", value=b"ran"), _step(1, "done", value=b"second"))
    record = ledger.turn(identity="a", turn_id="t1")
    assert record is not None
    assert [(e.state, e.value) for e in record.entries] == [
        (TurnEntryState.COMPLETED, b"ran"), (TurnEntryState.COMPLETED, b"first")]


def test_a_stale_owner_cannot_journal(ledger, clock):
    register(ledger)
    old = grant(ledger, "h1", ttl=1.0).fencing_token
    clock.advance(2.0)
    new = grant(ledger, "h2").fencing_token
    _write(ledger, new, _step(0, "s", value=b"new"))
    with pytest.raises(StaleFencingTokenError):
        _write(ledger, old, _step(0, "s", value=b"zombie"), _step(1, "more"))
    with pytest.raises(StaleFencingTokenError):
        ledger.end_turn(identity="a", fencing_token=old, ended=TurnEnd(turn_id="t1", status="FAILED"))
    record = ledger.turn(identity="a", turn_id="t1")
    assert record is not None and record.status == "RUNNING"
    assert [(e.position, e.value) for e in record.entries] == [(0, b"new")]


def test_a_write_that_need_not_wait_for_the_disk_is_written_and_fenced_like_any(ledger, clock):
    register(ledger)
    old = grant(ledger, "h1", ttl=1.0).fencing_token
    _write(ledger, old, _step(0, "first"))
    _write(ledger, old, _step(1, "second"), entries_only=True, flush=False)
    clock.advance(2.0)
    new = grant(ledger, "h2").fencing_token
    with pytest.raises(StaleFencingTokenError):
        _write(ledger, old, _step(2, "zombie"), entries_only=True, flush=False)
    _write(ledger, new, _step(2, "third"), entries_only=True, flush=False)
    assert [e.name for e in ledger.turn(identity="a", turn_id="t1").entries] == ["first", "second", "third"]


@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)  # synchronous_commit is PostgreSQL's
def test_on_postgresql_an_unflushed_write_turns_synchronous_commit_off_for_its_own_transaction_only(backend, clock):
    assert isinstance(backend, PostgresBackend)
    led = backend.open(clock)
    register(led)
    token = grant(led, "h1").fencing_token
    _write(led, token, _step(0, "first"))
    turn = TurnWrite(turn_id="t1", method="go", envelope=b"", entries=(_step(1, "second"),), entries_only=True)

    def settings(tx, write: TurnWrite) -> tuple[str, str]:
        statement = led.write_turn_alone(identity="a", fencing_token=token, turn=write)
        assert statement is not None
        before = tx.execute("SHOW synchronous_commit").fetchone()[0]
        assert statement.answer(tx.execute(statement.sql, statement.parameters).fetchall())
        return before, tx.execute("SHOW synchronous_commit").fetchone()[0]

    assert led._db.write(lambda tx: settings(tx, dataclasses.replace(turn, flush=False))) == ("on", "off")
    for _ in range(4):  # on every connection of the pool: the first one's setting did not outlive it
        assert led._db.write(lambda tx: settings(tx, turn)) == ("on", "on")
    assert [e.name for e in led.turn(identity="a", turn_id="t1").entries] == ["first", "second"]


def test_a_commit_ends_its_turn_in_the_same_transaction_and_a_refused_one_does_not(ledger, clock):
    register(ledger)
    token = grant(ledger, "h1").fencing_token
    _write(ledger, token, _step(0, "s"))
    _write(ledger, token, _step(0, "s"), turn_id="t2")
    ended = commit("a", token, 1)
    refused = commit("a", token, 1)  # the same version again: not newer, refused
    assert ledger.commit_checkpoints([dataclasses.replace(ended, turn_end=TurnEnd(turn_id="t1"))]) == [None]
    outcomes = ledger.commit_checkpoints([dataclasses.replace(refused, turn_end=TurnEnd(turn_id="t2"))])
    assert outcomes[0] is not None
    first, second = ledger.turn(identity="a", turn_id="t1"), ledger.turn(identity="a", turn_id="t2")
    assert first is not None and first.status == "COMPLETED" and first.entries == ()
    assert second is not None and second.status == "RUNNING" and second.steps == 1
    assert [t.turn_id for t in ledger.turns(identity="a")] == ["t2"]
    assert {t.turn_id for t in ledger.turns(statuses=("COMPLETED",))} == {"t1"}


def test_suspended_turns_are_claimed_when_due_once_per_claim_and_woken_by_what_they_wait_for(ledger, clock):
    register(ledger)
    token = grant(ledger, "h1").fencing_token
    now = clock()
    _write(ledger, token, turn_id="sleeper", status="SUSPENDED", waiting_for="sleep", wake_at=now + 10)
    _write(ledger, token, turn_id="payer", status="SUSPENDED", waiting_for="signal:payment")
    assert ledger.claim_wakes() == []
    clock.advance(11)
    claimed = ledger.claim_wakes(claim_for=5)
    assert [(w.turn_id, w.waiting_for, w.envelope) for w in claimed] == [("sleeper", "sleep", b"envelope")]
    assert ledger.claim_wakes(claim_for=5) == []  # claimed by the first sweep
    clock.advance(6)
    assert [w.turn_id for w in ledger.claim_wakes(claim_for=5)] == ["sleeper"]  # the claim lapsed

    assert ledger.wake_turns(identity="a", waiting_for="signal:other") == []
    assert ledger.wake_turns(identity="a", waiting_for="signal:payment") == ["payer"]
    assert [w.turn_id for w in ledger.claim_wakes(claim_for=5)] == ["payer"]
    # Resuming writes the row again, which clears the claim and the wake.
    _write(ledger, token, turn_id="payer", status="RUNNING")
    clock.advance(100)
    assert [w.turn_id for w in ledger.claim_wakes(claim_for=5)] == ["sleeper"]


def test_claims_are_bounded_batches_oldest_due_first(ledger, clock):
    register(ledger)
    token = grant(ledger, "h1").fencing_token
    now = clock()
    for i in range(7):
        _write(ledger, token, turn_id=f"t{i}", status="SUSPENDED", waiting_for="sleep", wake_at=now + 7 - i)
    clock.advance(10)
    assert [w.turn_id for w in ledger.claim_wakes(limit=3)] == ["t6", "t5", "t4"]
    assert [w.turn_id for w in ledger.claim_wakes(limit=3)] == ["t3", "t2", "t1"]
    assert [w.turn_id for w in ledger.claim_wakes(limit=3)] == ["t0"]


def test_ended_turns_are_purged_after_retention_and_deleted_identities_forget_their_turns(ledger, clock):
    register(ledger)
    register(ledger, "b")
    token = grant(ledger, "h1").fencing_token
    _write(ledger, token, _step(0, "s"), turn_id="done")
    _write(ledger, token, _step(0, "s"), turn_id="running")
    ledger.end_turn(identity="a", fencing_token=token, ended=TurnEnd(turn_id="done", status="FAILED", error="boom"))
    failed = ledger.turn(identity="a", turn_id="done")
    assert failed is not None and failed.status == "FAILED" and failed.error == "boom" and failed.entries == ()
    assert ledger.purge_turns(ended_before=clock() - 1) == 0
    clock.advance(10)
    assert ledger.purge_turns(ended_before=clock() - 1) == 1
    assert ledger.turn(identity="a", turn_id="done") is None
    assert ledger.turn(identity="a", turn_id="running") is not None
    ledger.delete(identity="a", fencing_token=token)
    assert ledger.turn(identity="a", turn_id="running") is None


def _suspension(name: str, position: int = 0, turn_id: str = "t1") -> TurnWrite:
    return TurnWrite(turn_id=turn_id, method="go", envelope=b"envelope", status="SUSPENDED",
                     waiting_for=f"signal:{name}", entries=(TurnEntry(
                         position=position, kind=TurnEntryKind.SIGNAL, name=name, state=TurnEntryState.WAITING),))


def test_a_signal_sent_before_anyone_waits_is_kept_and_taken_once(ledger):
    register(ledger)
    token = grant(ledger, "h1").fencing_token
    assert ledger.send_signal(identity="a", name="paid", signal_id="s1", value=b"42") == []
    assert ledger.send_signal(identity="a", name="paid", signal_id="s1", value=b"again") == []  # same id: once
    assert [(name, sid) for name, sid, _ in ledger.pending_signals(identity="a")] == [("paid", "s1")]
    assert ledger.wait_signal(identity="a", fencing_token=token, name="paid", turn=_suspension("paid")) == b"42"
    record = ledger.turn(identity="a", turn_id="t1")
    assert record is not None and record.status == "RUNNING" and record.wake_at is None
    assert [(e.kind, e.state, e.value) for e in record.entries] == [
        (TurnEntryKind.SIGNAL, TurnEntryState.COMPLETED, b"42")]
    assert ledger.pending_signals(identity="a") == []
    # A second turn waiting for the same name finds nothing and suspends.
    assert ledger.wait_signal(identity="a", fencing_token=token, name="paid",
                              turn=_suspension("paid", turn_id="t2")) is None
    assert ledger.turn(identity="a", turn_id="t2").status == "SUSPENDED"


def test_a_signal_wakes_the_turn_suspended_on_it_and_only_that_one(ledger):
    register(ledger)
    token = grant(ledger, "h1").fencing_token
    assert ledger.wait_signal(identity="a", fencing_token=token, name="paid", turn=_suspension("paid")) is None
    assert ledger.wait_signal(identity="a", fencing_token=token, name="shipped",
                              turn=_suspension("shipped", turn_id="t2")) is None
    assert ledger.claim_wakes() == []  # no wake time: nothing due
    woken = ledger.send_signal(identity="a", name="paid", signal_id="s1", value=b"42")
    assert [(w.turn_id, w.envelope, w.waiting_for) for w in woken] == [("t1", b"envelope", "signal:paid")]
    # The wake carries the entry the signal completed, as the ledger now holds it.
    assert woken[0].taken == TurnEntry(position=0, kind=TurnEntryKind.SIGNAL, name="paid",
                                       state=TurnEntryState.COMPLETED, value=b"42")
    assert [(w.turn_id, w.taken) for w in ledger.claim_wakes()] == [("t1", None)]  # a sweep's completed nothing
    # The signal was handed to the waiting entry in the sending transaction: its replay reads it there.
    (entry,) = ledger.turn(identity="a", turn_id="t1").entries
    assert (entry.state, entry.value) == (TurnEntryState.COMPLETED, b"42")
    assert ledger.pending_signals(identity="a") == []
    (again,) = ledger.send_signal(identity="a", name="paid", signal_id="s1", value=b"again")
    assert again.taken is None  # woken again, but nothing completed by this one
    (entry,) = ledger.turn(identity="a", turn_id="t1").entries
    assert entry.value == b"42"  # the same signal id again changes nothing
    # The other turn still waits for its own signal.
    assert ledger.turn(identity="a", turn_id="t2").entries[0].state == TurnEntryState.WAITING


def test_a_signal_goes_to_the_oldest_turn_still_waiting_for_it(ledger, clock):
    register(ledger)
    token = grant(ledger, "h1").fencing_token
    ledger.wait_signal(identity="a", fencing_token=token, name="paid", turn=_suspension("paid", turn_id="t1"))
    clock.advance(1)
    ledger.wait_signal(identity="a", fencing_token=token, name="paid", turn=_suspension("paid", turn_id="t2"))
    woken = ledger.send_signal(identity="a", name="paid", signal_id="s1", value=b"1")
    assert [(w.turn_id, w.taken is not None) for w in woken] == [("t1", True), ("t2", False)]
    # t1 has its signal but has not resumed yet (still listed as suspended): the next one is t2's.
    woken = ledger.send_signal(identity="a", name="paid", signal_id="s2", value=b"2")
    assert [(w.turn_id, w.taken is not None) for w in woken] == [("t1", False), ("t2", True)]
    assert ledger.turn(identity="a", turn_id="t2").entries[0].value == b"2"
    assert ledger.pending_signals(identity="a") == []


def test_a_wait_run_again_after_a_signal_took_its_entry_gets_that_signal(ledger):
    # The turn suspended, then ran again for another reason (its timeout's wake, its caller's
    # keyed retry) and read its journal before a signal completed the waiting entry. Its wait,
    # run again, must get that signal: suspending again would leave the row waiting with no
    # wake time (the signal's wake may be lost) and a timeout would see a signal it never gets.
    register(ledger)
    token = grant(ledger, "h1").fencing_token
    assert ledger.wait_signal(identity="a", fencing_token=token, name="paid", turn=_suspension("paid")) is None
    (wake,) = ledger.send_signal(identity="a", name="paid", signal_id="s1", value=b"42")
    assert wake.taken is not None
    assert ledger.wait_signal(identity="a", fencing_token=token, name="paid", turn=_suspension("paid")) == b"42"
    record = ledger.turn(identity="a", turn_id="t1")
    assert record is not None and record.status == "RUNNING" and record.waiting_for == ""
    assert [(e.state, e.value) for e in record.entries] == [(TurnEntryState.COMPLETED, b"42")]
    # A later signal is kept for the next wait, not taken by this entry again.
    ledger.send_signal(identity="a", name="paid", signal_id="s2", value=b"7")
    assert [sid for _, sid, _ in ledger.pending_signals(identity="a")] == ["s2"]


def test_a_stale_owner_cannot_take_a_signal_and_an_unknown_identity_gets_none(ledger, clock):
    from rayfleet.errors import UnknownIdentityError
    register(ledger)
    old = grant(ledger, "h1", ttl=1.0).fencing_token
    clock.advance(2.0)
    grant(ledger, "h2")
    ledger.send_signal(identity="a", name="paid", signal_id="s1", value=b"42")
    with pytest.raises(StaleFencingTokenError):
        ledger.wait_signal(identity="a", fencing_token=old, name="paid", turn=_suspension("paid"))
    assert len(ledger.pending_signals(identity="a")) == 1  # not taken
    with pytest.raises(UnknownIdentityError):
        ledger.send_signal(identity="nobody", name="paid", signal_id="s1", value=b"42")


def test_the_activation_view_names_the_suspended_turn(ledger):
    register(ledger)
    token = grant(ledger, "h1").fencing_token
    assert ledger.resolve(["a"])["a"].suspended_turn is None
    ledger.wait_signal(identity="a", fencing_token=token, name="paid", turn=_suspension("paid"))
    assert ledger.resolve(["a"])["a"].suspended_turn == "t1"


def test_the_activation_view_says_whether_messages_are_parked(ledger):
    register(ledger)
    token = grant(ledger, "h1").fencing_token
    assert ledger.resolve(["a"])["a"].parked is False
    ledger.park(identity="a", fencing_token=token, message_id="m1", envelope=b"e")
    ledger.park(identity="a", fencing_token=token, message_id="m2", envelope=b"e")
    assert ledger.resolve(["a"])["a"].parked is True
    for stored in ledger.parked("a", limit=10):
        ledger.unpark(identity="a", fencing_token=token, seq=stored.id)
    assert ledger.resolve(["a"])["a"].parked is False


def test_an_entries_only_write_adds_the_entry_and_leaves_the_row_and_is_fenced(ledger, clock):
    register(ledger)
    token = grant(ledger, "h1", ttl=1.0).fencing_token
    _write(ledger, token, _step(0, "first"))
    before = ledger.turn(identity="a", turn_id="t1")
    clock.advance(0.5)
    ledger.write_turn(identity="a", fencing_token=token, turn=TurnWrite(
        turn_id="t1", method="go", envelope=b"", entries=(_step(1, "second"),), entries_only=True))
    after = ledger.turn(identity="a", turn_id="t1")
    assert after is not None and before is not None
    assert (after.envelope, after.status, after.updated) == (before.envelope, before.status, before.updated)
    assert [e.name for e in after.entries] == ["first", "second"]
    clock.advance(2.0)
    grant(ledger, "h2")
    with pytest.raises(StaleFencingTokenError):
        ledger.write_turn(identity="a", fencing_token=token, turn=TurnWrite(
            turn_id="t1", method="go", envelope=b"", entries=(_step(2, "zombie"),), entries_only=True))
    assert [e.name for e in ledger.turn(identity="a", turn_id="t1").entries] == ["first", "second"]


def _asked(approval_id: str = "ap1", turn_id: str = "t1", **fields) -> tuple[ApprovalRequest, TurnWrite]:
    request = ApprovalRequest(approval_id=approval_id, turn_id=turn_id, position=0, subject="refund", data=b"d",
                              **fields)
    turn = TurnWrite(turn_id=turn_id, method="go", envelope=b"envelope", status="SUSPENDED",
                     waiting_for=f"approval:{approval_id}", entries=(TurnEntry(
                         position=0, kind=TurnEntryKind.APPROVAL, name="refund", state=TurnEntryState.WAITING),))
    return request, turn


def test_an_approval_is_requested_once_suspends_its_turn_and_is_decided_once(ledger):
    from rayfleet.errors import ApprovalConflictError
    register(ledger)
    token = grant(ledger, "h1").fencing_token
    request, turn = _asked(approvers=("alice", "bob"))
    row = ledger.request_approval(identity="a", fencing_token=token, request=request, turn=turn)
    assert (row.status, row.version, row.approvers) == ("PENDING", 1, ("alice", "bob"))
    assert ledger.request_approval(identity="a", fencing_token=token, request=request, turn=turn).version == 1
    assert ledger.turn(identity="a", turn_id="t1").status == "SUSPENDED"
    assert [r.approval_id for r in ledger.approvals(identity="a*")] == ["ap1"]
    assert ledger.approvals(identity="b*") == []
    resolved = ledger.resolve_approval(approval_id="ap1", approved=True, by="alice", comment="ok", expect_version=1)
    assert (resolved.approval.status, resolved.approval.version, resolved.approval.decided_by) == (
        "APPROVED", 2, "alice")
    assert resolved.woken is not None and resolved.woken.turn_id == "t1"
    assert [w.turn_id for w in ledger.claim_wakes()] == ["t1"]
    with pytest.raises(ApprovalConflictError) as second:
        ledger.resolve_approval(approval_id="ap1", approved=False, by="bob")
    assert (second.value.decided_by, second.value.status) == ("alice", "APPROVED")
    assert [step["action"] for step in __import__("json").loads(ledger.approval(approval_id="ap1").audit)] == [
        "requested", "approved"]
    # Asked again by the replay: decided, so nothing is suspended.
    decided = ledger.request_approval(identity="a", fencing_token=token, request=request, turn=turn)
    assert decided.status == "APPROVED"
    assert ledger.approvals() == []  # none pending


def test_approvals_are_listed_by_the_workflow_run_that_asked_them(ledger):
    register(ledger)
    token = grant(ledger, "h1").fencing_token
    for approval_id, turn_id, run_id in (("ap1", "t1", "run-1"), ("ap2", "t2", "run-2"), ("ap3", "t3", "")):
        request, turn = _asked(approval_id, turn_id, run_id=run_id)
        ledger.request_approval(identity="a", fencing_token=token, request=request, turn=turn)
    assert [(r.approval_id, r.run_id) for r in ledger.approvals(run_id="run-1")] == [("ap1", "run-1")]
    assert [r.approval_id for r in ledger.approvals(run_id="run-2", identity="a")] == ["ap2"]
    assert ledger.approvals(run_id="run-3") == []
    assert [r.approval_id for r in ledger.approvals()] == ["ap1", "ap2", "ap3"]


def test_a_deleted_identity_keeps_its_decided_approvals_as_the_audit_trail_and_drops_pending_ones(ledger):
    register(ledger)
    token = grant(ledger, "h1").fencing_token
    for approval_id, turn_id in (("ap1", "t1"), ("ap2", "t2")):
        request, turn = _asked(approval_id, turn_id)
        ledger.request_approval(identity="a", fencing_token=token, request=request, turn=turn)
    ledger.resolve_approval(approval_id="ap1", approved=True, by="alice", comment="ok")
    ledger.delete(identity="a", fencing_token=token)
    kept = ledger.approval(approval_id="ap1")
    assert (kept.status, kept.decided_by, kept.comment) == ("APPROVED", "alice", "ok")
    assert [r.approval_id for r in ledger.approvals(status=None, identity="a")] == ["ap1"]
    assert ledger.approvals(status="PENDING") == []  # nobody can decide ap2 now


def test_a_stale_version_an_unknown_id_and_a_stranger_are_refused(ledger):
    from rayfleet.errors import ApprovalConflictError, InvalidSpecError, UnknownApprovalError
    register(ledger)
    token = grant(ledger, "h1").fencing_token
    request, turn = _asked(approvers=("alice",))
    ledger.request_approval(identity="a", fencing_token=token, request=request, turn=turn)
    with pytest.raises(ApprovalConflictError, match="changed since you read it"):
        ledger.resolve_approval(approval_id="ap1", approved=True, by="alice", expect_version=7)
    with pytest.raises(UnknownApprovalError):
        ledger.resolve_approval(approval_id="nope", approved=True, by="alice")
    with pytest.raises(InvalidSpecError, match="approvers"):
        ledger.resolve_approval(approval_id="ap1", approved=True, by="mallory")
    assert ledger.approval(approval_id="ap1").status == "PENDING"


def test_of_two_concurrent_decisions_exactly_one_is_applied_and_the_other_names_the_winner(ledger):
    from concurrent.futures import ThreadPoolExecutor

    from rayfleet.errors import ApprovalConflictError
    register(ledger)
    token = grant(ledger, "h1").fencing_token
    for round_ in range(10):
        request, turn = _asked(approval_id=f"ap{round_}", turn_id=f"t{round_}")
        ledger.request_approval(identity="a", fencing_token=token, request=request, turn=turn)

        def decide(by: str, approval_id: str = request.approval_id) -> str:
            try:
                ledger.resolve_approval(approval_id=approval_id, approved=by == "alice", by=by)
            except ApprovalConflictError as refused:
                return f"refused: {refused.decided_by}"
            return f"won: {by}"

        with ThreadPoolExecutor(2) as pool:
            outcomes = sorted(pool.map(decide, ["alice", "bob"]))
        winner = ledger.approval(approval_id=request.approval_id).decided_by
        loser = "bob" if winner == "alice" else "alice"
        assert sorted(outcomes) == sorted([f"won: {winner}", f"refused: {winner}"]), (outcomes, loser)


def test_a_burst_of_due_timers_is_claimed_in_due_order_and_its_one_offs_settled_in_batches(ledger, clock):
    """Claims come in due order across batches; one settlement batch holds many one-offs,
    a duplicate, a stale settlement and a recurring timer."""
    from rayfleet.ledger import TimerFired, TimerSpec
    from rayfleet.ledger._store import IN_LIST
    register(ledger)
    token = grant(ledger, "h1", ttl=100.0).fencing_token
    now = clock()
    count = IN_LIST + 7
    for index in range(count):
        ledger.set_timer(identity="a", fencing_token=token, timer=TimerSpec(
            name=f"r{index}", method="go", payload=b"p", next_due=now + 1 + (count - index) / 1000))
    ledger.set_timer(identity="a", fencing_token=token, timer=TimerSpec(
        name="every", method="go", payload=b"p", next_due=now + 1, every=10.0))
    clock.advance(5)
    first = ledger.claim_timers(limit=300)
    rest = ledger.claim_timers(limit=1000)
    assert ledger.claim_timers() == []  # every due timer is held
    claimed = first + rest
    assert len(claimed) == count + 1 and len({t.name for t in claimed}) == count + 1
    assert [t.next_due for t in first] == sorted(t.next_due for t in first)
    assert max(t.next_due for t in first) <= min(t.next_due for t in rest)  # the soonest due first
    one_offs = [TimerFired(identity="a", name=t.name, scheduled=t.next_due, next_due=None, lateness=0.5)
                for t in claimed if t.name != "every"]
    stale = dataclasses.replace(one_offs[3], scheduled=one_offs[3].scheduled + 1)
    moved = TimerFired(identity="a", name="every", scheduled=now + 1, next_due=now + 11, lateness=0.5)
    assert ledger.settle_timers(fired=[*one_offs, one_offs[0], stale, moved]) == [True] * count + [False, False, True]
    (left,) = ledger.timers(identity="a")
    assert (left.name, left.next_due, left.fired) == ("every", now + 11, 1)


def test_a_host_claims_the_due_timers_of_its_own_identities_and_others_only_when_unheld_lapsed_or_overdue(
        ledger, clock):
    from rayfleet.ledger import TimerSpec
    for identity in ("mine", "theirs", "dormant"):
        register(ledger, identity)
    tokens = {"mine": grant(ledger, "h1", "mine", ttl=60.0).fencing_token,
              "theirs": grant(ledger, "h2", "theirs", ttl=20.0).fencing_token}
    dormant = grant(ledger, "h2", "dormant").fencing_token
    now = clock()
    for identity, token in [*tokens.items(), ("dormant", dormant)]:
        ledger.set_timer(identity=identity, fencing_token=token, timer=TimerSpec(
            name="r", method="go", payload=b"p", next_due=now + 1))
    ledger.release(holder="h2", tokens={"dormant": dormant})  # deactivated: nobody holds it
    clock.advance(2)
    claimed = ledger.claim_timers(claim_for=0.0, holder="h1", holder_first=5.0)
    assert sorted(t.identity for t in claimed) == ["dormant", "mine"]  # "theirs" is left to h2 ...
    assert sorted(t.identity for t in ledger.claim_timers(claim_for=0.0, holder="h2", holder_first=5.0)) == [
        "dormant", "theirs"]
    clock.advance(5)  # ... until it is overdue past the allowance
    assert len(ledger.claim_timers(claim_for=0.0, holder="h1", holder_first=5.0)) == 3
    assert len(ledger.claim_timers(claim_for=0.0)) == 3  # no holder named: every due timer
    ledger.set_timer(identity="theirs", fencing_token=tokens["theirs"], timer=TimerSpec(
        name="r", method="go", payload=b"p", next_due=clock() + 1))
    clock.advance(15)  # h2's lease lapsed (20 s, never renewed): its timer is anyone's at once
    assert "theirs" in {t.identity for t in ledger.claim_timers(claim_for=0.0, holder="h1", holder_first=60.0)}


def test_timers_are_set_fenced_claimed_when_due_settled_once_and_forgotten(ledger, clock):
    from rayfleet.ledger import TimerFired, TimerSpec
    register(ledger)
    token = grant(ledger, "h1", ttl=100.0).fencing_token
    now = clock()
    ledger.set_timer(identity="a", fencing_token=token, timer=TimerSpec(
        name="tick", method="go", payload=b"p", next_due=now + 10, every=10.0))
    ledger.set_timer(identity="a", fencing_token=token, timer=TimerSpec(
        name="later", method="go", payload=b"p", next_due=now + 1000))
    assert ledger.claim_timers() == []  # nothing due
    clock.advance(11)
    (due,) = ledger.claim_timers(claim_for=5.0)
    assert (due.name, due.next_due) == ("tick", now + 10)
    assert ledger.claim_timers() == []  # held by the first claim
    fired = TimerFired(identity="a", name="tick", scheduled=due.next_due, next_due=now + 20, lateness=1.0)
    # Settlements go in batches; in one batch the same time settled twice moves the timer once.
    assert ledger.settle_timers(fired=[fired, fired]) == [True, False]
    assert ledger.settle_timers(fired=[fired]) == [False]
    assert ledger.settle_timers(fired=[]) == []
    (tick,) = ledger.timers(identity="a", due_before=now + 100)
    assert (tick.next_due, tick.fired, tick.last_lateness) == (now + 20, 1, 1.0)
    assert ledger.fire_timer_now(identity="a", name="later") is True
    assert [t.name for t in ledger.claim_timers()] == ["later"]
    clock.advance(200)
    grant(ledger, "h2")
    with pytest.raises(StaleFencingTokenError):
        ledger.forget_timer(identity="a", name="tick", fencing_token=token)
    assert ledger.forget_timer(identity="a", name="tick") is True  # an operator's cancel is not fenced
    assert [t.name for t in ledger.timers()] == ["later"]
