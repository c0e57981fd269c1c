"""The delivery pipeline of a host, against a real in-process ledger and real files (no Ray)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import ClassVar

import cloudpickle
import pytest
from delivery import deliver

import rayfleet as rf
from rayfleet.checkpoints._store import SnapshotStore
from rayfleet.host._runtime import HostRuntime
from rayfleet.ledger._ledger import Ledger
from rayfleet.ledger._local import LocalLedgerClient
from rayfleet.ledger._values import SpecRecord

FAST_RETRY = rf.RetryPolicy(max_attempts=3, base_delay=0.001, max_delay=0.01)


class Account(rf.Agent):
    class State(rf.State):
        balance: int = 0
        log: list[str] = []

    @rf.handler
    async def deposit(self, amount: int, note: str = "") -> int:
        self.state.balance += amount
        self.state.log = [*self.state.log, note]
        return self.state.balance

    # Outside State on purpose: a failed attempt rolls State back, an outage does not.
    outage: ClassVar[dict[str, int]] = {}

    @rf.handler
    async def set_flaky(self, failures: int) -> None:
        Account.outage[self.identity] = failures

    @rf.handler
    async def flaky_deposit(self, amount: int) -> int:
        if Account.outage.get(self.identity, 0) > 0:
            Account.outage[self.identity] -= 1
            raise rf.RetryableError("upstream busy")
        self.state.balance += amount
        return self.state.balance

    @rf.handler
    async def write_note(self, text: str) -> str:
        self.state.log = [*self.state.log, text]
        return text

    @rf.handler
    async def read_balance(self) -> int:
        return self.state.balance

    @rf.handler
    async def poison(self) -> None:
        raise KeyError("cannot handle this")


def register(ledger: Ledger, identity: str, **options: object) -> None:
    options.setdefault("retry", FAST_RETRY)
    spec = rf.AgentSpec(identity=identity, agent=Account, **options)  # type: ignore[arg-type]
    ledger.register(SpecRecord(identity=identity, spec=cloudpickle.dumps(spec), fingerprint=spec.fingerprint(),
                               agent_class=spec.agent_class_path, labels={}, addressability=spec.addressability.value))


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    ledger = Ledger(tmp_path / "ledger.sqlite")
    register(ledger, "acct/1")
    return ledger


def host(ledger: Ledger, tmp_path: Path, name: str = "h1") -> HostRuntime:
    return HostRuntime(name=name, ledger=LocalLedgerClient(ledger), snapshots=SnapshotStore(str(tmp_path)),
                       incarnation=name)


def reasons(ledger: Ledger) -> list[str]:
    return [letter.reason for letter in ledger.dead_letters()]


async def test_duplicate_idempotency_key_has_its_effect_once(ledger: Ledger, tmp_path: Path) -> None:
    async with host(ledger, tmp_path) as runtime:
        first = await deliver(runtime, "acct/1", "deposit", (), {"amount": 10}, idempotency_key="k1")
        again = await deliver(runtime, "acct/1", "deposit", (), {"amount": 10}, idempotency_key="k1")
        assert (first.value, again.value, again.duplicate) == (10, 10, True)
        other_sender = await deliver(runtime, "acct/1", "deposit", (), {"amount": 10}, idempotency_key="k1",
                                             sender="acct/peer")
        assert other_sender.value == 20 and not other_sender.duplicate
        assert runtime.statistics().duplicates == 1


async def test_dedup_survives_a_new_owner(ledger: Ledger, tmp_path: Path) -> None:
    async with host(ledger, tmp_path) as runtime:
        await deliver(runtime, "acct/1", "deposit", (), {"amount": 5}, idempotency_key="pay-1")
    async with host(ledger, tmp_path, "h2") as heir:
        again = await deliver(heir, "acct/1", "deposit", (), {"amount": 5}, idempotency_key="pay-1")
        assert again.duplicate and again.value == 5
        assert (await deliver(heir, "acct/1", "deposit", (), {"amount": 1})).value == 6


async def test_a_resent_envelope_without_a_key_is_answered_from_the_checkpoint_by_its_next_owner(
    ledger: Ledger, tmp_path: Path,
) -> None:
    sent = rf.Envelope(target="acct/1", method="deposit", kwargs={"amount": 10})
    async with host(ledger, tmp_path) as runtime:
        assert (await runtime.delivery.deliver(sent)).value == 10
    # The first owner is gone (its reply never reached the caller); the router sends the same envelope on.
    async with host(ledger, tmp_path, "h2") as heir:
        again = await heir.delivery.deliver(sent)
        assert again.duplicate and again.value == 10
        # A new call of the same handler and arguments is a new message, and runs.
        fresh = await heir.delivery.deliver(rf.Envelope(target="acct/1", method="deposit", kwargs={"amount": 10}))
        assert (fresh.value, fresh.duplicate) == (20, False)
        assert heir.statistics().duplicates == 1


async def test_the_message_window_is_bounded_and_keeps_large_replies_in_the_dedup_window(
    ledger: Ledger, tmp_path: Path,
) -> None:
    from rayfleet.host._messages import RECENT_MESSAGES

    first = rf.Envelope(target="acct/1", method="deposit", kwargs={"amount": 1})
    large = rf.Envelope(target="acct/1", method="write_note", kwargs={"text": "x" * 4096})
    async with host(ledger, tmp_path) as runtime:
        await runtime.delivery.deliver(first)
        await runtime.delivery.deliver(large)  # its 4 KiB reply is too large for the window
        for _ in range(RECENT_MESSAGES):
            await runtime.delivery.deliver(rf.Envelope(target="acct/1", method="deposit", kwargs={"amount": 1}))
    assert len(ledger.dedup_window("acct/1")) == 1  # only the large reply went to the ledger's window
    async with host(ledger, tmp_path, "h2") as heir:
        assert (await heir.delivery.deliver(large)).duplicate
        # The first message left the window RECENT_MESSAGES turns later; its re-send runs again.
        assert not (await heir.delivery.deliver(first)).duplicate


async def test_a_read_only_turn_without_a_key_is_not_remembered(ledger: Ledger, tmp_path: Path) -> None:
    read = rf.Envelope(target="acct/1", method="read_balance")
    async with host(ledger, tmp_path) as runtime:
        assert (await runtime.delivery.deliver(read)).value == 0
        # Nothing changed, so nothing was committed: running it again is harmless and costs no write.
        assert not (await runtime.delivery.deliver(read)).duplicate
    assert ledger.dedup_window("acct/1") == []


async def test_dedup_window_is_bounded_oldest_first(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.sqlite")
    register(ledger, "acct/1", dedup_capacity=3)
    async with host(ledger, tmp_path) as runtime:
        for key in ("a", "b", "c", "d"):
            await deliver(runtime, "acct/1", "deposit", (), {"amount": 1}, idempotency_key=key)
        assert [key.split("\x1f")[1] for key, _ in ledger.dedup_window("acct/1")] == ["b", "c", "d"]
        # "a" was evicted: it runs again; "d" is still remembered.
        assert not (await deliver(runtime, "acct/1", "deposit", (), {"amount": 1}, idempotency_key="a")).duplicate
        assert (await deliver(runtime, "acct/1", "deposit", (), {"amount": 1}, idempotency_key="d")).duplicate


async def test_stale_conversation_sequence_is_refused_and_dead_lettered(ledger: Ledger, tmp_path: Path) -> None:
    async with host(ledger, tmp_path) as runtime:
        await deliver(runtime, "acct/1", "deposit", (), {"amount": 1}, conversation="c", sequence=3)
        await deliver(runtime, "acct/1", "deposit", (), {"amount": 1}, conversation="c", sequence=3)
        with pytest.raises(rf.StaleSequenceError, match="stale"):
            await deliver(runtime, "acct/1", "deposit", (), {"amount": 100}, conversation="c", sequence=2)
    assert reasons(ledger) == ["STALE_SEQUENCE"]
    # The high-water mark travels with the checkpoint to the next owner.
    async with host(ledger, tmp_path, "h2") as heir:
        with pytest.raises(rf.StaleSequenceError):
            await deliver(heir, "acct/1", "deposit", (), {"amount": 100}, conversation="c", sequence=1)
        assert (await deliver(heir, "acct/1", "deposit", (), {"amount": 0}, conversation="c", sequence=4)).value == 2


async def test_a_sequence_that_went_backwards_raises_stale_sequence_with_advice_for_the_caller(
    ledger: Ledger, tmp_path: Path,
) -> None:
    async with host(ledger, tmp_path) as runtime:
        await deliver(runtime, "acct/1", "deposit", (), {"amount": 1}, conversation="c", sequence=3)
        with pytest.raises(rf.StaleSequenceError) as caught:
            await deliver(runtime, "acct/1", "deposit", (), {"amount": 100}, conversation="c", sequence=2)
    error = caught.value
    assert (error.conversation, error.presented, error.current) == ("c", 2, 3)
    assert isinstance(error, rf.DeliveryError) and not isinstance(error, rf.StaleFencingTokenError)
    # The caller's own numbering went backwards: nothing about owners or dropping the agent.
    assert "another owner" not in error.message and "Drop the agent" not in error.message
    assert "sequence" in error.message and "3" in error.message


async def test_expired_deadline_dead_letters_without_running(ledger: Ledger, tmp_path: Path) -> None:
    async with host(ledger, tmp_path) as runtime:
        with pytest.raises(rf.DeadlineExceededError):
            await deliver(runtime, "acct/1", "deposit", (), {"amount": 1}, deadline=time.time() - 1)
        assert (await deliver(runtime, "acct/1", "deposit", (), {"amount": 0})).value == 0
    [letter] = ledger.dead_letters()
    assert letter.reason == "DEADLINE_EXCEEDED" and letter.attempts == 0
    assert cloudpickle.loads(letter.envelope).kwargs == {"amount": 1}


async def test_retryable_errors_are_retried_then_succeed(ledger: Ledger, tmp_path: Path) -> None:
    async with host(ledger, tmp_path) as runtime:
        await deliver(runtime, "acct/1", "set_flaky", (), {"failures": 2})
        assert (await deliver(runtime, "acct/1", "flaky_deposit", (), {"amount": 7})).value == 7
        assert ledger.dead_letters() == []


async def test_exhausted_retries_and_poison_messages_are_dead_lettered(ledger: Ledger, tmp_path: Path) -> None:
    async with host(ledger, tmp_path) as runtime:
        await deliver(runtime, "acct/1", "set_flaky", (), {"failures": 10})
        with pytest.raises(rf.HandlerError, match="upstream busy"):
            await deliver(runtime, "acct/1", "flaky_deposit", (), {"amount": 7})
        with pytest.raises(rf.HandlerError, match="KeyError"):
            await deliver(runtime, "acct/1", "poison", (), {})
        # The agent keeps serving after a poison message.
        assert (await deliver(runtime, "acct/1", "deposit", (), {"amount": 1})).value == 1
        with pytest.raises(rf.InvalidArgumentsError):
            await deliver(runtime, "acct/1", "deposit", (), {"amount": "lots"})
    letters = ledger.dead_letters()
    assert [(letter.reason, letter.attempts) for letter in letters] == [
        ("RETRIES_EXHAUSTED", 3), ("REJECTED", 1), ("DECODE_FAILED", 0)
    ]


async def test_pause_parks_in_order_and_resume_replays_oldest_first(ledger: Ledger, tmp_path: Path) -> None:
    async with host(ledger, tmp_path) as runtime:
        await runtime.delivery.pause("acct/1")
        calls = [
            asyncio.create_task(deliver(runtime, "acct/1", "deposit", (), {"amount": 1, "note": str(i)}))
            for i in range(5)
        ]
        for _ in range(100):
            if len(ledger.parked("acct/1")) == 5:
                break
            await asyncio.sleep(0.01)
        assert [cloudpickle.loads(m.envelope).kwargs["note"] for m in ledger.parked("acct/1")] == list("01234")
        assert not any(call.done() for call in calls)
        assert await runtime.delivery.resume("acct/1") == 5
        results = await asyncio.gather(*calls)
        assert [result.value for result in results] == [1, 2, 3, 4, 5]  # replayed oldest first
        assert ledger.parked("acct/1") == [] and not ledger.is_paused("acct/1")
        log = (await deliver(runtime, "acct/1", "deposit", (), {"amount": 0, "note": "after"})).value
        assert log == 5


async def test_parked_work_and_pause_survive_a_new_owner(ledger: Ledger, tmp_path: Path) -> None:
    runtime = host(ledger, tmp_path)
    await runtime.start()
    await runtime.delivery.pause("acct/1")
    for i in range(3):
        asyncio.create_task(deliver(runtime, "acct/1", "deposit", (), {"amount": 1, "note": str(i)},
                                            idempotency_key=f"k{i}"))
    for _ in range(100):
        if len(ledger.parked("acct/1")) == 3:
            break
        await asyncio.sleep(0.01)
    ledger.revoke_holder(runtime.holder)  # the first owner is gone as far as the ledger knows
    async with host(ledger, tmp_path, "h2") as heir:
        view = ledger.resolve(["acct/1"])["acct/1"]
        assert view.paused
        assert await heir.delivery.resume("acct/1") == 3
        # A client retrying one of the parked calls gets the original reply: once, not twice.
        again = await deliver(heir, "acct/1", "deposit", (), {"amount": 1, "note": "1"}, idempotency_key="k1")
        assert again.duplicate and again.value == 2
        assert (await deliver(heir, "acct/1", "deposit", (), {"amount": 0})).value == 3
    await runtime.shutdown(checkpoint=False)


async def test_cancel_parked_moves_work_to_dead_letters(ledger: Ledger, tmp_path: Path) -> None:
    async with host(ledger, tmp_path) as runtime:
        await runtime.delivery.pause("acct/1")
        waiting = asyncio.create_task(deliver(runtime, "acct/1", "deposit", (), {"amount": 9}))
        for _ in range(100):
            if ledger.parked("acct/1"):
                break
            await asyncio.sleep(0.01)
        assert await runtime.delivery.cancel_parked("acct/1") == 1
        with pytest.raises(rf.InvalidStateError, match="cancelled"):
            await waiting
        await runtime.delivery.resume("acct/1")
        assert (await deliver(runtime, "acct/1", "deposit", (), {"amount": 0})).value == 0
    assert reasons(ledger) == ["CANCELLED"]


async def test_addressability_is_checked_before_lifecycle(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.sqlite")
    register(ledger, "acct/inner", addressability=rf.Addressability.INTERNAL_ONLY)
    async with host(ledger, tmp_path) as runtime:
        await runtime.retire("acct/inner")
        with pytest.raises(rf.NotAddressableError):
            await deliver(runtime, "acct/inner", "deposit", (), {"amount": 1})
        with pytest.raises(rf.InvalidStateError, match="RETIRING"):
            await deliver(runtime, "acct/inner", "deposit", (), {"amount": 1}, sender="acct/peer")
