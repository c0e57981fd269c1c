"""Suspended turns on real host runtimes, a real SQLite ledger and real files (no Ray).

A suspended turn holds no coroutine: its host answers its caller when a wake (its own
timer, a signal, the wake sweep of any host) replays it to its end. Later messages wait
behind it, durably, in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import cloudpickle
import pytest

import rayfleet as rf
from rayfleet.checkpoints._store import SnapshotStore
from rayfleet.host._hosted import OwnedElsewhere, TurnResult
from rayfleet.host._messages import wake_envelope
from rayfleet.host._runtime import HostRuntime
from rayfleet.ledger._contract import LedgerCall
from rayfleet.ledger._ledger import Ledger
from rayfleet.ledger._local import LocalLedgerClient
from rayfleet.ledger._turn_rows import TurnRecord, TurnWrite
from rayfleet.ledger._values import SpecRecord
from rayfleet.turns._context import encode_signal

EFFECTS: list[str] = []
DRAFTING = asyncio.Event()
"""Holds ``Shop.draft`` after its first step until a test sets it."""
STARTING = asyncio.Event()
"""Holds ``Shop.draft(hold=True)`` before its first step until a test sets it."""


def effect(label: str) -> str:
    EFFECTS.append(label)
    return label


class Shop(rf.Agent):
    class State(rf.State):
        seen: list[str] = []
        paid: int = 0

    @rf.handler
    async def order(self, nap: float = 0.3) -> str:
        self.state.seen.append("order")  # discarded at the suspension, applied again by the replay
        await self.step("reserve", effect, "reserve")
        await self.sleep(nap)
        await self.step("ship", effect, "ship")
        return "shipped"

    @rf.handler
    async def pay(self, timeout: float | None = None) -> str:
        self.state.seen.append("pay")
        try:
            amount = await self.wait_signal("payment", timeout=timeout)
        except rf.WaitTimeoutError:
            return "timed out"
        self.state.paid += amount
        return f"paid {amount}"

    @rf.handler
    async def refund(self, eur: int, timeout: float | None = None, on_timeout: str = "reject") -> str:
        decision = await self.approval("refund", data={"eur": eur}, approvers=["alice", "bob"], timeout=timeout,
                                       on_timeout=on_timeout)
        verdict = "approved" if decision.approved else "rejected"
        return f"{verdict} by {decision.by}: {decision.comment} {decision.data}"

    @rf.handler
    async def draft(self, hold: bool = False) -> str:
        if hold:
            await STARTING.wait()  # still a plain turn: nothing journaled yet
        await self.step("outline", effect, "outline")  # journaled: a durable turn from here on
        await DRAFTING.wait()
        self.state.seen.append("draft")
        return "drafted"

    @rf.handler
    async def note(self, text: str) -> list[str]:
        self.state.seen.append(text)
        return list(self.state.seen)


@pytest.fixture(autouse=True)
def _clean() -> None:
    global DRAFTING, STARTING
    EFFECTS.clear()
    DRAFTING, STARTING = asyncio.Event(), asyncio.Event()  # an event is bound to the loop it first waits on


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    led = Ledger(tmp_path / "ledger.sqlite")
    spec = rf.AgentSpec(identity="shop/1", agent=Shop)
    led.register(SpecRecord(identity="shop/1", spec=cloudpickle.dumps(spec), fingerprint=spec.fingerprint(),
                            agent_class=spec.agent_class_path, labels={}, addressability=spec.addressability.value))
    return led


class TurnEvents:
    """Host metrics that keep the durable-turn events (and drop the rest)."""

    def __init__(self) -> None:
        self.events: Counter[str] = Counter()

    def turn_event(self, agent_class: str, event: str, count: int = 1) -> None:
        self.events[event] += count

    def __getattr__(self, name: str) -> object:
        return lambda *args, **kwargs: None


def host(ledger: Ledger, tmp_path: Path, name: str, *, wake_interval: float = 0.05,
         metrics: object = None) -> HostRuntime:
    extra = {} if metrics is None else {"metrics": metrics}
    return HostRuntime(name=name, ledger=LocalLedgerClient(ledger), snapshots=SnapshotStore(str(tmp_path)),
                       incarnation=name, wake_interval=wake_interval, **extra)


async def until(condition, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


def signal(ledger: Ledger, name: str, value: object, signal_id: str = "s1") -> int:
    return len(ledger.send_signal(identity="shop/1", name=name, signal_id=signal_id,
                                  value=encode_signal("shop/1", name, value)))


async def test_a_sleeping_turn_suspends_and_its_caller_gets_the_reply_when_it_wakes(
    ledger: Ledger, tmp_path: Path,
) -> None:
    metrics = TurnEvents()
    async with host(ledger, tmp_path, "a", wake_interval=60.0, metrics=metrics) as a:  # its own timer wakes it
        envelope = rf.Envelope(target="shop/1", method="order", kwargs={"nap": 0.3})
        call = asyncio.ensure_future(a.delivery.deliver(envelope))
        await until(lambda: bool(ledger.turns(identity="shop/1", statuses=("SUSPENDED",))))
        (suspended,) = ledger.turns(identity="shop/1", statuses=("SUSPENDED",))
        assert suspended.waiting_for == "sleep" and suspended.wake_at is not None
        assert not call.done()
        result = await asyncio.wait_for(call, 20)
        assert result.value == "shipped" and EFFECTS == ["reserve", "ship"]  # the replay did not reserve again
        assert metrics.events == {"step": 2, "suspended": 1, "resumed": 1, "completed": 1}
        # The State the caller sees is the replay's: the turn's change applied once.
        assert (await a.delivery.deliver(rf.Envelope(target="shop/1", method="note", kwargs={"text": "x"}))
                ).value == ["order", "x"]
    assert ledger.turn(identity="shop/1", turn_id=envelope.message_id).status == "COMPLETED"


async def test_a_suspended_turn_resumes_on_another_host_after_its_host_died(ledger: Ledger, tmp_path: Path) -> None:
    envelope = rf.Envelope(target="shop/1", method="order", kwargs={"nap": 1.0})
    async with host(ledger, tmp_path, "a", wake_interval=60.0) as a:
        call = asyncio.ensure_future(a.delivery.deliver(envelope))
        await until(lambda: bool(ledger.turns(identity="shop/1", statuses=("SUSPENDED",))))
        ledger.revoke_holder(a.holder)  # host a is gone (its lease lapsed); its timer fires as a zombie's
        async with host(ledger, tmp_path, "b") as b:
            # The new owner learns of the suspended turn at activation: a new message waits behind it.
            noting = asyncio.ensure_future(b.delivery.deliver(
                rf.Envelope(target="shop/1", method="note", kwargs={"text": "after"})))
            await until(lambda: len(ledger.parked("shop/1", limit=10)) == 1)
            await until(lambda: ledger.turn(identity="shop/1", turn_id=envelope.message_id).status == "COMPLETED")
            assert (await asyncio.wait_for(noting, 20)).value == ["order", "after"]
            # The caller's re-send (its first host is gone) gets the turn's reply.
            assert (await b.delivery.deliver(envelope)).value == "shipped"
        with pytest.raises((rf.LeaseLostError, asyncio.CancelledError)):
            await asyncio.wait_for(call, 20)
    assert EFFECTS == ["reserve", "ship"]


async def test_a_signal_resumes_the_waiting_turn_and_later_messages_wait_behind_it_in_order(
    ledger: Ledger, tmp_path: Path,
) -> None:
    async with host(ledger, tmp_path, "a") as a:
        paying = asyncio.ensure_future(a.delivery.deliver(rf.Envelope(target="shop/1", method="pay")))
        await until(lambda: bool(ledger.turns(identity="shop/1", statuses=("SUSPENDED",))))
        notes = []
        for count, text in enumerate(("first", "second"), start=1):
            notes.append(asyncio.ensure_future(a.delivery.deliver(
                rf.Envelope(target="shop/1", method="note", kwargs={"text": text}))))
            await until(lambda count=count: len(ledger.parked("shop/1", limit=10)) == count)
        assert not paying.done() and not any(note.done() for note in notes)
        assert signal(ledger, "payment", 42) == 1
        assert (await asyncio.wait_for(paying, 20)).value == "paid 42"
        first, second = [(await asyncio.wait_for(note, 20)).value for note in notes]
        assert first == ["pay", "first"] and second == ["pay", "first", "second"]
        assert ledger.parked("shop/1", limit=10) == []


class JournalReads(LocalLedgerClient):
    """A direct ledger client that counts the turn journals its host reads back."""

    def __init__(self, ledger: Ledger) -> None:
        super().__init__(ledger)
        self.reads = 0

    def turn(self, *, identity: str, turn_id: str) -> LedgerCall[TurnRecord | None]:
        self.reads += 1
        return super().turn(identity=identity, turn_id=turn_id)


@contextlib.asynccontextmanager
async def counted_host(ledger: Ledger, tmp_path: Path, name: str) -> AsyncIterator[tuple[HostRuntime, JournalReads]]:
    """A host whose own wake sweep waits an hour: the test delivers each wake itself."""
    client = JournalReads(ledger)
    async with HostRuntime(name=name, ledger=client, snapshots=SnapshotStore(str(tmp_path)), incarnation=name,
                           wake_interval=3600.0) as runtime:
        yield runtime, client


async def suspended_pay(ledger: Ledger, runtime: HostRuntime) -> asyncio.Future[TurnResult]:
    paying = asyncio.ensure_future(runtime.delivery.deliver(rf.Envelope(target="shop/1", method="pay")))
    await until(lambda: bool(ledger.turns(identity="shop/1", statuses=("SUSPENDED",))))
    return paying


async def test_a_signal_wake_resumes_the_turn_from_the_journal_its_host_kept(ledger: Ledger, tmp_path: Path) -> None:
    async with counted_host(ledger, tmp_path, "a") as (a, reads):
        paying = await suspended_pay(ledger, a)
        (wake,) = ledger.send_signal(identity="shop/1", name="payment", signal_id="s1",
                                     value=encode_signal("shop/1", "payment", 42))
        assert wake.taken is not None and wake.taken.state.value == "completed"
        before = reads.reads
        await a.delivery.deliver(wake_envelope(wake))
        assert (await asyncio.wait_for(paying, 20)).value == "paid 42"
        assert reads.reads == before  # the journal was not read back
        assert ledger.turn(identity="shop/1", turn_id=wake.turn_id).status == "COMPLETED"


async def test_a_wake_that_does_not_carry_the_signal_reads_the_journal(ledger: Ledger, tmp_path: Path) -> None:
    async with counted_host(ledger, tmp_path, "a") as (a, reads):
        paying = await suspended_pay(ledger, a)
        (wake,) = ledger.send_signal(identity="shop/1", name="payment", signal_id="s1",
                                     value=encode_signal("shop/1", "payment", 42))
        before = reads.reads
        # The wake sweep's wake (or one whose signal was taken in an earlier transaction)
        # cannot say what the ledger holds: the signal's value is read from the journal.
        await a.delivery.deliver(dataclasses.replace(wake_envelope(wake), woken_with=None))
        assert (await asyncio.wait_for(paying, 20)).value == "paid 42"
        assert reads.reads == before + 1


async def test_a_kept_journal_is_not_used_under_another_token(ledger: Ledger, tmp_path: Path) -> None:
    async with counted_host(ledger, tmp_path, "a") as (a, reads):
        paying = await suspended_pay(ledger, a)
        entry = a._entries["shop/1"]
        assert entry.held_journal is not None
        entry.held_journal = dataclasses.replace(entry.held_journal, fencing_token=entry.grant.fencing_token - 1)
        (wake,) = ledger.send_signal(identity="shop/1", name="payment", signal_id="s1",
                                     value=encode_signal("shop/1", "payment", 5))
        before = reads.reads
        await a.delivery.deliver(wake_envelope(wake))
        assert (await asyncio.wait_for(paying, 20)).value == "paid 5"
        assert reads.reads == before + 1


async def test_a_sleep_resumes_on_its_host_without_reading_the_journal(ledger: Ledger, tmp_path: Path) -> None:
    async with counted_host(ledger, tmp_path, "a") as (a, reads):
        ordering = asyncio.ensure_future(a.delivery.deliver(
            rf.Envelope(target="shop/1", method="order", kwargs={"nap": 0.3})))
        await until(lambda: bool(ledger.turns(identity="shop/1", statuses=("SUSPENDED",))))
        before = reads.reads
        assert (await asyncio.wait_for(ordering, 20)).value == "shipped"  # woken by the host's own timer
        assert reads.reads == before and EFFECTS == ["reserve", "ship"]


def test_an_envelope_stored_before_a_field_was_added_loads_with_its_default() -> None:
    sent = rf.Envelope(target="shop/1", method="pay", mode="queue")
    state = sent.__getstate__()
    stored = rf.Envelope.__new__(rf.Envelope)
    stored.__setstate__(state[:-1])  # as an earlier version pickled it, without woken_with
    stored.check()
    assert stored == sent and stored.woken_with is None


async def test_a_signal_sent_before_the_wait_is_kept_and_taken_at_once(ledger: Ledger, tmp_path: Path) -> None:
    assert signal(ledger, "payment", 7) == 0  # nobody waits: kept
    async with host(ledger, tmp_path, "a") as a:
        result = await asyncio.wait_for(a.delivery.deliver(rf.Envelope(target="shop/1", method="pay")), 20)
        assert result.value == "paid 7"
        assert ledger.pending_signals(identity="shop/1") == []
        assert signal(ledger, "payment", 7) == 0  # the same signal id again: recorded once, nothing new
        assert ledger.pending_signals(identity="shop/1") == []


async def test_a_durable_timeout_raises_wait_timeout_in_the_handler(ledger: Ledger, tmp_path: Path) -> None:
    async with host(ledger, tmp_path, "a") as a:
        envelope = rf.Envelope(target="shop/1", method="pay", kwargs={"timeout": 0.2})
        assert (await asyncio.wait_for(a.delivery.deliver(envelope), 20)).value == "timed out"
        # A signal after the timeout is kept for the next wait, not lost.
        assert signal(ledger, "payment", 5) == 0
        assert (await asyncio.wait_for(a.delivery.deliver(
            rf.Envelope(target="shop/1", method="pay")), 20)).value == "paid 5"


class SignalAfterTheWait(LocalLedgerClient):
    """Sends signal ``payment`` right after the turn's second wait was written: the signal that
    races a timeout, as a sender's would that came in between."""

    def __init__(self, ledger: Ledger) -> None:
        super().__init__(ledger)
        self.waits = 0

    def wait_signal(self, *, identity: str, fencing_token: int, name: str, turn: TurnWrite) -> LedgerCall[bytes | None]:
        answer = super().wait_signal(identity=identity, fencing_token=fencing_token, name=name, turn=turn)
        self.waits += 1
        if self.waits == 2:
            self.ledger.send_signal(identity=identity, name=name, signal_id="late", value=encode_signal(
                identity, name, 11))
        return answer


async def test_a_signal_that_races_a_timeout_is_kept_for_the_next_wait(ledger: Ledger, tmp_path: Path) -> None:
    client = SignalAfterTheWait(ledger)
    async with HostRuntime(name="a", ledger=client, snapshots=SnapshotStore(str(tmp_path)), incarnation="a",
                           wake_interval=0.05) as a:
        envelope = rf.Envelope(target="shop/1", method="pay", kwargs={"timeout": 0.3})
        assert (await asyncio.wait_for(a.delivery.deliver(envelope), 20)).value == "timed out"
        # The handler was told the wait timed out: the signal is not this wait's, it waits for the next.
        assert [sid for _, sid, _ in ledger.pending_signals(identity="shop/1")] == ["late"]
        again = rf.Envelope(target="shop/1", method="pay", kwargs={"timeout": 5.0})
        assert (await asyncio.wait_for(a.delivery.deliver(again), 20)).value == "paid 11"


async def test_a_suspended_identity_can_be_deactivated_and_its_wake_activates_it(ledger: Ledger, tmp_path: Path) -> None:
    async with host(ledger, tmp_path, "a") as a:
        envelope = rf.Envelope(target="shop/1", method="pay")
        call = asyncio.ensure_future(a.delivery.deliver(envelope))
        await until(lambda: bool(ledger.turns(identity="shop/1", statuses=("SUSPENDED",))))
        assert await a.deactivate("shop/1")
        assert not a.is_active("shop/1")
        with pytest.raises(rf.LeaseLostError):  # its caller learns, and sends it again
            await asyncio.wait_for(call, 20)
        again = asyncio.ensure_future(a.delivery.deliver(envelope))  # activates; the turn suspends again
        await until(lambda: a.is_active("shop/1"))
        await asyncio.sleep(0.1)
        assert not again.done()
        assert signal(ledger, "payment", 3) == 1
        assert (await asyncio.wait_for(again, 20)).value == "paid 3"


async def test_a_wake_that_reaches_a_host_not_owning_the_turn_is_redirected_not_answered_and_lost(
    ledger: Ledger, tmp_path: Path,
) -> None:
    # A wake goes where the sender's route points (a host's sweep, a driver's signal). Answered
    # at once by a host that does not own the identity, it was lost there in the background
    # (its owner refused it there) and the sender kept the stale route: the turn stayed suspended.
    async with host(ledger, tmp_path, "a", wake_interval=60.0) as a, \
            host(ledger, tmp_path, "b", wake_interval=60.0) as b:
        envelope = rf.Envelope(target="shop/1", method="pay")
        call = asyncio.ensure_future(a.delivery.deliver(envelope))
        await until(lambda: bool(ledger.turns(identity="shop/1", statuses=("SUSPENDED",))))
        (wake,) = ledger.send_signal(identity="shop/1", name="payment", signal_id="s1",
                                     value=encode_signal("shop/1", "payment", 3))
        with pytest.raises(OwnedElsewhere):
            await b.delivery.deliver(wake_envelope(wake))
        assert not b.is_active("shop/1")
        assert (await a.delivery.deliver(wake_envelope(wake))).suspended  # taken: it resumes in the background
        assert (await asyncio.wait_for(call, 20)).value == "paid 3"


async def test_bad_waits_are_refused_with_a_usage_error(ledger: Ledger, tmp_path: Path) -> None:
    async with host(ledger, tmp_path, "a") as a:
        with pytest.raises(rf.HandlerError) as failed:
            await a.delivery.deliver(rf.Envelope(target="shop/1", method="order", kwargs={"nap": float("nan")}))
        assert failed.value.remote_type.endswith("UsageError") and "finite" in failed.value.remote_message
        with pytest.raises(rf.HandlerError) as failed:
            await a.delivery.deliver(rf.Envelope(target="shop/1", method="pay", kwargs={"timeout": -1}))
        assert "timeout" in failed.value.remote_message
    with pytest.raises(rf.InvalidSpecError, match="over"):
        encode_signal("shop/1", "payment", b"x" * (300 * 1024))
    with pytest.raises(rf.InvalidSpecError, match="name"):
        encode_signal("shop/1", "", 1)
    with pytest.raises(rf.UnknownIdentityError):
        ledger.send_signal(identity="nobody", name="payment", signal_id="s", value=b"")


async def test_an_approval_suspends_the_turn_until_a_person_decides_once(ledger: Ledger, tmp_path: Path) -> None:
    from rayfleet.turns._approvals import approval_info
    async with host(ledger, tmp_path, "a") as a:
        refund = asyncio.ensure_future(a.delivery.deliver(
            rf.Envelope(target="shop/1", method="refund", kwargs={"eur": 500})))
        await until(lambda: bool(ledger.approvals()))
        (pending,) = [approval_info(row) for row in ledger.approvals()]
        assert (pending.subject, pending.data, pending.approvers, pending.status) == (
            "refund", {"eur": 500}, ("alice", "bob"), "PENDING")
        assert pending.identity == "shop/1" and pending.turn_id == refund_turn(ledger)
        resolved = ledger.resolve_approval(approval_id=pending.id, approved=True, by="alice", comment="fine",
                                           expect_version=pending.version)
        assert resolved.woken is not None  # the sweep (or a driver) delivers it
        assert (await asyncio.wait_for(refund, 20)).value == "approved by alice: fine None"
        with pytest.raises(rf.ApprovalConflictError, match="already approved by alice"):
            ledger.resolve_approval(approval_id=pending.id, approved=False, by="bob")


def refund_turn(ledger: Ledger) -> str:
    (turn,) = ledger.turns(identity="shop/1", statuses=("SUSPENDED",))
    return turn.turn_id


async def test_an_approval_timeout_decides_it_and_a_person_who_decided_first_wins(
    ledger: Ledger, tmp_path: Path,
) -> None:
    async with host(ledger, tmp_path, "a") as a:
        approved = await asyncio.wait_for(a.delivery.deliver(rf.Envelope(
            target="shop/1", method="refund", kwargs={"eur": 5, "timeout": 0.2, "on_timeout": "approve"})), 20)
        assert approved.value == "approved by timeout: decided by its timeout None"
        rejected = await asyncio.wait_for(a.delivery.deliver(rf.Envelope(
            target="shop/1", method="refund", kwargs={"eur": 6, "timeout": 0.2})), 20)
        assert rejected.value == "rejected by timeout: decided by its timeout None"
        statuses = sorted(row.status for row in ledger.approvals(status=None))
        assert statuses == ["APPROVED", "REJECTED"]


async def test_bad_approval_requests_are_refused_with_a_usage_error(ledger: Ledger, tmp_path: Path) -> None:
    async with host(ledger, tmp_path, "a") as a:
        for kwargs, complaint in (({"timeout": -1}, "timeout"), ({"on_timeout": "maybe"}, "on_timeout")):
            with pytest.raises(rf.HandlerError) as failed:
                await a.delivery.deliver(rf.Envelope(target="shop/1", method="refund", kwargs={"eur": 1, **kwargs}))
            assert failed.value.remote_type.endswith("UsageError") and complaint in failed.value.remote_message
    assert ledger.approvals(status=None) == []


async def test_a_keyed_retry_of_a_suspended_turn_waits_for_it_instead_of_running_again(
    ledger: Ledger, tmp_path: Path,
) -> None:
    async with host(ledger, tmp_path, "a") as a:
        first = asyncio.ensure_future(a.delivery.deliver(
            rf.Envelope(target="shop/1", method="pay", idempotency_key="order-7")))
        await until(lambda: bool(ledger.turns(identity="shop/1", statuses=("SUSPENDED",))))
        # The caller gave up and retried with its key: a new message, the same effect.
        retry = asyncio.ensure_future(a.delivery.deliver(
            rf.Envelope(target="shop/1", method="pay", idempotency_key="order-7")))
        await asyncio.sleep(0.3)
        assert ledger.parked("shop/1", limit=10) == []  # not queued behind its own turn
        assert signal(ledger, "payment", 9) == 1
        assert [(await asyncio.wait_for(call, 20)).value for call in (first, retry)] == ["paid 9", "paid 9"]
        assert (await a.delivery.deliver(rf.Envelope(target="shop/1", method="note", kwargs={"text": "x"}))
                ).value == ["pay", "x"]  # the turn ran once
    async with host(ledger, tmp_path, "b") as b:  # and a later retry gets the remembered reply
        again = await b.delivery.deliver(rf.Envelope(target="shop/1", method="pay", idempotency_key="order-7"))
        assert again.value == "paid 9" and again.duplicate


async def test_a_burst_of_wakes_is_claimed_as_fast_as_the_host_delivers_them(
    ledger: Ledger, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Like timer firings, wakes a host claimed but could not start on before their claims
    # lapse would be delivered again by another host; the firing limit bounds both.
    from rayfleet.host import _runtime
    monkeypatch.setattr(_runtime, "FIRING_LIMIT", 2)
    shops = [f"shop/{index}" for index in range(1, 6)]
    for identity in shops[1:]:
        spec = rf.AgentSpec(identity=identity, agent=Shop)
        ledger.register(SpecRecord(identity=identity, spec=cloudpickle.dumps(spec), fingerprint=spec.fingerprint(),
                                   agent_class=spec.agent_class_path, labels={},
                                   addressability=spec.addressability.value))
    async with host(ledger, tmp_path, "a", wake_interval=3600.0) as a:
        calls = [asyncio.ensure_future(a.delivery.deliver(rf.Envelope(target=identity, method="pay")))
                 for identity in shops]
        await until(lambda: len(ledger.turns(statuses=("SUSPENDED",))) == len(shops))
        await a.deactivate_all()  # dormant: each wake must activate its identity
        for pending in calls:
            with pytest.raises(rf.LeaseLostError):
                await asyncio.wait_for(pending, 20)
        for identity in shops:
            assert len(ledger.send_signal(identity=identity, name="payment", signal_id="s1",
                                          value=encode_signal(identity, "payment", 1))) == 1
        assert await a.wake_due() == 2  # the room it has, not the 5 due
        # The rest is claimed as the deliveries end, without waiting for the next interval (an hour).
        await until(lambda: not ledger.turns(statuses=("SUSPENDED",)))
        assert all(a.is_active(identity) for identity in shops)


async def test_messages_behind_a_running_durable_turn_wait_in_the_ledger_and_run_after_it_in_order(
    ledger: Ledger, tmp_path: Path,
) -> None:
    async with host(ledger, tmp_path, "a") as a:
        drafting = asyncio.ensure_future(a.delivery.deliver(rf.Envelope(target="shop/1", method="draft")))
        notes = []
        try:
            await until(lambda: EFFECTS == ["outline"])
            for count, text in enumerate(("first", "second"), start=1):
                notes.append(asyncio.ensure_future(a.delivery.deliver(
                    rf.Envelope(target="shop/1", method="note", kwargs={"text": text}))))
                await until(lambda count=count: len(ledger.parked("shop/1", limit=10)) == count)
            assert not drafting.done() and not any(note.done() for note in notes)
        finally:
            DRAFTING.set()
        assert (await asyncio.wait_for(drafting, 20)).value == "drafted"
        first, second = [(await asyncio.wait_for(note, 20)).value for note in notes]
        assert first == ["draft", "first"] and second == ["draft", "first", "second"]
        assert ledger.parked("shop/1", limit=10) == []
        # The mailbox is open again: a message now runs at once, without parking.
        assert (await a.delivery.deliver(rf.Envelope(target="shop/1", method="note", kwargs={"text": "third"}))
                ).value == ["draft", "first", "second", "third"]


@contextlib.asynccontextmanager
async def cut_off_with_one_parked(ledger: Ledger, a: HostRuntime) -> AsyncIterator[rf.Envelope]:
    """Host ``a`` runs a durable turn (``draft``, past its journaled step) with a note parked
    behind it; yields the turn's message. On the way out the turn is let go and both of
    a's callers are found cut off (the test revokes a's leases)."""
    draft = rf.Envelope(target="shop/1", method="draft")
    drafting = asyncio.ensure_future(a.delivery.deliver(draft))
    noting = None
    try:
        await until(lambda: EFFECTS == ["outline"])
        noting = asyncio.ensure_future(a.delivery.deliver(
            rf.Envelope(target="shop/1", method="note", kwargs={"text": "parked"})))
        await until(lambda: len(ledger.parked("shop/1", limit=10)) == 1)
        yield draft
    finally:
        DRAFTING.set()
    for call in (drafting, noting):
        with pytest.raises((rf.LeaseLostError, asyncio.CancelledError)):
            await asyncio.wait_for(call, 20)


async def test_messages_parked_behind_a_turn_cut_off_by_its_hosts_death_run_after_it_at_the_next_owner(
    ledger: Ledger, tmp_path: Path,
) -> None:
    async with host(ledger, tmp_path, "a") as a, cut_off_with_one_parked(ledger, a) as draft:
        ledger.revoke_holder(a.holder)  # host a is gone, with both callers (the turn is never sent again)
        async with host(ledger, tmp_path, "b") as b:
            # The next message activates the identity at b, which resumes the cut-off turn
            # first (from its journal), then runs what parked behind it, then this message.
            later = asyncio.ensure_future(b.delivery.deliver(
                rf.Envelope(target="shop/1", method="note", kwargs={"text": "later"})))
            await asyncio.sleep(0.3)
            assert not later.done()  # behind the resumed turn, which waits to be let go
            DRAFTING.set()
            assert (await asyncio.wait_for(later, 20)).value == ["draft", "parked", "later"]
            assert EFFECTS == ["outline"]  # the turn's step ran once: the resume replayed it
            assert ledger.turn(identity="shop/1", turn_id=draft.message_id).status == "COMPLETED"
            assert ledger.parked("shop/1", limit=10) == []


class TurnsUnreadable(LocalLedgerClient):
    """A ledger client that cannot read a turn's journal (the ledger failing that one read)."""

    def turn(self, *, identity, turn_id):  # type: ignore[no-untyped-def]
        raise ConnectionError("the ledger is down")


async def test_a_cut_off_turn_that_cannot_resume_does_not_hold_the_messages_parked_behind_it(
    ledger: Ledger, tmp_path: Path,
) -> None:
    async with host(ledger, tmp_path, "a") as a, cut_off_with_one_parked(ledger, a) as draft:
        ledger.revoke_holder(a.holder)
        b = HostRuntime(name="b", ledger=TurnsUnreadable(ledger), snapshots=SnapshotStore(str(tmp_path)),
                        incarnation="b", wake_interval=0.05)
        async with b:
            later = await asyncio.wait_for(b.delivery.deliver(
                rf.Envelope(target="shop/1", method="note", kwargs={"text": "later"})), 20)
            assert later.value == ["parked", "later"]  # not held for a turn nobody could resume
    assert ledger.turn(identity="shop/1", turn_id=draft.message_id).status == "RUNNING"  # runs when sent again


async def test_a_paused_agents_cut_off_turn_is_not_resumed_until_it_is_sent_again(
    ledger: Ledger, tmp_path: Path,
) -> None:
    async with host(ledger, tmp_path, "a") as a, cut_off_with_one_parked(ledger, a):
        # A pause that landed (as one sent while the turn ran would once it ended).
        ledger.set_paused(identity="shop/1", fencing_token=a._entries["shop/1"].grant.fencing_token,
                          paused=True)
        ledger.revoke_holder(a.holder)
        async with host(ledger, tmp_path, "b") as b:
            later = asyncio.ensure_future(b.delivery.deliver(
                rf.Envelope(target="shop/1", method="note", kwargs={"text": "later"})))
            await until(lambda: len(ledger.parked("shop/1", limit=10)) == 2)  # paused: nothing runs
            await b.delivery.resume("shop/1")
            # What parked runs in order; the cut-off turn (still held) runs when sent again.
            assert (await asyncio.wait_for(later, 20)).value == ["parked", "later"]


async def test_a_message_never_parks_ahead_of_one_that_waits_in_memory_behind_a_plain_turn(
    ledger: Ledger, tmp_path: Path,
) -> None:
    async with host(ledger, tmp_path, "a") as a:
        drafting = asyncio.ensure_future(a.delivery.deliver(
            rf.Envelope(target="shop/1", method="draft", kwargs={"hold": True})))
        notes = []
        try:
            await asyncio.sleep(0.2)
            # Behind a plain turn (nothing journaled yet) a message waits in the host's memory.
            notes.append(asyncio.ensure_future(a.delivery.deliver(
                rf.Envelope(target="shop/1", method="note", kwargs={"text": "first"}))))
            await asyncio.sleep(0.2)
            STARTING.set()
            await until(lambda: EFFECTS == ["outline"])  # now a durable turn
            # The next one waits with the first, in memory, instead of parking ahead of it.
            notes.append(asyncio.ensure_future(a.delivery.deliver(
                rf.Envelope(target="shop/1", method="note", kwargs={"text": "second"}))))
            await asyncio.sleep(0.3)
            assert ledger.parked("shop/1", limit=10) == []
        finally:
            STARTING.set()
            DRAFTING.set()
        assert (await asyncio.wait_for(drafting, 20)).value == "drafted"
        first, second = [(await asyncio.wait_for(note, 20)).value for note in notes]
        assert first == ["draft", "first"] and second == ["draft", "first", "second"]
