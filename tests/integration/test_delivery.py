"""Delivery guarantees on a live fleet: idempotency, conversation sequences, deadlines,
retries, dead letters, durable pause / park / resume / cancel, and bad input.

Mirrors tests/unit/identity/test_pipeline.py through the public API and real host
actors. A failed attempt rolls State back, so failure counters and "has it run" markers
live in files under the test's tmp dir (hosts are separate processes).
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest
import ray
from polling import eventually
from ray_helpers import host_reply, kill_actor

import rayfleet as rf

T = TypeVar("T")

FAST_RETRY = rf.RetryPolicy(max_attempts=3, base_delay=0.01, max_delay=0.05)


class Account(rf.Agent):
    class State(rf.State):
        total: int = 0
        notes: list[str] = []
        seqs: list[int] = []

    @rf.handler
    def add(self, n: int, note: str = "") -> int:
        self.state.total += n
        self.state.notes = [*self.state.notes, note]
        return self.state.total

    @rf.handler
    async def add_then_linger(self, n: int, seconds: float) -> int:
        """Changes State, then takes a while to answer (the caller may have given up)."""
        self.state.total += n
        self.state.notes = [*self.state.notes, "lingered"]
        await asyncio.sleep(seconds)
        return self.state.total

    @rf.handler
    def record(self, seq: int) -> int:
        self.state.seqs = [*self.state.seqs, seq]
        return len(self.state.seqs)

    @rf.handler
    def get(self) -> dict:
        return {"total": self.state.total, "notes": list(self.state.notes), "seqs": list(self.state.seqs)}

    @rf.handler
    def flaky_add(self, n: int, counter: str, failures: int) -> int:
        """Fails with RetryableError the first ``failures`` attempts; the count lives in a file."""
        path = Path(counter)
        attempts = int(path.read_text()) if path.exists() else 0
        path.write_text(str(attempts + 1))
        if attempts < failures:
            raise rf.RetryableError(f"upstream busy (attempt {attempts + 1})")
        self.state.total += n
        return self.state.total

    @rf.handler
    def add_unless_flag(self, n: int, flag: str) -> int:
        if Path(flag).exists():
            raise RuntimeError(f"flag {Path(flag).name} is set")
        self.state.total += n
        return self.state.total

    @rf.handler
    def poison(self, payload: str) -> None:
        raise KeyError(f"cannot handle {payload}")

    @rf.handler
    async def hold(self, started: str, release: str) -> str:
        """Holds the turn until the file ``release`` exists; writes ``started`` first."""
        Path(started).write_text("holding")
        while not Path(release).exists():
            await asyncio.sleep(0.05)
        return "released"

    @rf.handler
    def touch(self, path: str) -> str:
        Path(path).write_text("ran")
        self.state.total += 1
        return "touched"

    @rf.handler
    def echo(self, value: Any = None) -> str:
        return repr(value)


# -- helpers ---------------------------------------------------------------------------


def kill_owner(fleet: rf.Fleet, identity: str) -> str:
    owner = fleet.status(identity).host
    assert owner is not None, f"{identity} has no owner to kill"
    kill_actor(owner, fleet.config.namespace)
    return owner


def spawn(fleet: rf.Fleet, identity: str) -> rf.AgentRef:
    return fleet.spawn(identity, Account, retry=FAST_RETRY)


def letters_of(fleet: rf.Fleet, identity: str) -> list[rf.DeadLetter]:
    return fleet.dead_letters(identity)


# -- 1. idempotency --------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_duplicate_idempotency_keys_are_applied_once(fleet: rf.Fleet) -> None:
    ref = spawn(fleet, "idem/acct")
    first = ref.call("add", n=5, note="pay-1", idempotency_key="pay-1")
    again = ref.call("add", n=5, note="pay-1", idempotency_key="pay-1")
    assert first == again == 5
    # A repeat gets the original reply without running the handler, whatever it carries.
    assert ref.call("add", n=100, note="other args", idempotency_key="pay-1") == 5
    assert ref.call("get") == {"total": 5, "notes": ["pay-1"], "seqs": []}

    # Different keys are different messages: both applied.
    assert ref.call("add", n=1, note="a", idempotency_key="key-a") == 6
    assert ref.call("add", n=1, note="b", idempotency_key="key-b") == 7
    assert ref.call("add", n=1, note="b", idempotency_key="key-b") == 7
    assert ref.call("get") == {"total": 7, "notes": ["pay-1", "a", "b"], "seqs": []}
    # Messages without a key are never deduplicated.
    assert ref.call("add", n=1, note="plain") == 8
    assert ref.call("add", n=1, note="plain") == 9
    assert sum(stats.duplicates for stats in fleet.host_statistics()) == 3
    assert letters_of(fleet, "idem/acct") == []


# -- 2. lost reply, then the owner dies ------------------------------------------------


@pytest.mark.timeout(120)
def test_lost_reply_then_host_kill_retry_gets_original_reply(fleet: rf.Fleet) -> None:
    identity = "idem/lost-reply"
    ref = spawn(fleet, identity)
    assert ref.call("get")["total"] == 0  # activate; a read commits nothing
    assert fleet.status(identity).checkpoint_version is None

    # The caller gives up; the turn goes on and commits (with its idempotency key).
    with pytest.raises(rf.DeadlineExceededError):
        ref.call("add_then_linger", n=3, seconds=1.0, idempotency_key="k", timeout=0.2)
    eventually(lambda: fleet.status(identity).checkpoint_version == 1, "the lingering turn to commit")

    killed = kill_owner(fleet, identity)
    # The retry lands on the surviving host, which only knows the key from the ledger.
    assert ref.call("add_then_linger", n=3, seconds=1.0, idempotency_key="k", timeout=60) == 3
    assert fleet.status(identity).host not in (None, killed)
    assert ref.call("get", timeout=60) == {"total": 3, "notes": ["lingered"], "seqs": []}
    # The duplicate was answered without running (nothing new to commit).
    assert fleet.status(identity).checkpoint_version == 1
    assert letters_of(fleet, identity) == []


# -- 3. conversation sequences ------------------------------------------------------------


@pytest.mark.timeout(120)
def test_stale_conversation_sequences_are_refused_and_dead_lettered(fleet: rf.Fleet) -> None:
    identity = "sequence/acct"
    ref = spawn(fleet, identity)
    assert ref.call("add", n=1, conversation="c", sequence=3) == 1
    assert ref.call("add", n=1, conversation="c", sequence=3) == 2  # equal: accepted (and run)
    with pytest.raises(rf.StaleSequenceError) as refused:
        ref.call("add", n=100, note="stale", conversation="c", sequence=2)
    assert "stale" in str(refused.value)
    assert ref.call("get")["total"] == 2  # the stale message did not run
    # Conversations are independent; a higher sequence moves the mark up.
    assert ref.call("add", n=1, conversation="other", sequence=1) == 3
    assert ref.call("add", n=1, conversation="c", sequence=4) == 4
    with pytest.raises(rf.StaleSequenceError):
        ref.call("add", n=1, conversation="c", sequence=3)

    letters = letters_of(fleet, identity)
    assert [letter.reason for letter in letters] == [rf.DeadLetterReason.STALE_SEQUENCE] * 2
    first = letters[0]
    assert first.identity == identity and first.attempts == 0
    assert first.envelope.method == "add" and first.envelope.kwargs == {"n": 100, "note": "stale"}
    assert (first.envelope.conversation, first.envelope.sequence) == ("c", 2)

    # The high-water mark is committed with the checkpoint: it holds on the next owner.
    kill_owner(fleet, identity)
    with pytest.raises(rf.StaleSequenceError):
        ref.call("add", n=1000, conversation="c", sequence=3, timeout=60)
    assert ref.call("add", n=1, conversation="c", sequence=4, timeout=60) == 5


@pytest.mark.timeout(120)
def test_sequence_seen_on_a_read_only_turn_survives_failover(fleet: rf.Fleet) -> None:
    identity = "sequence/read"
    ref = spawn(fleet, identity)
    assert ref.call("add", n=1, conversation="r", sequence=1) == 1  # committed with {r: 1}
    assert ref.call("get", conversation="r", sequence=5)["total"] == 1  # a read raises the mark to 5
    with pytest.raises(rf.StaleSequenceError):
        ref.call("add", n=10, conversation="r", sequence=4)  # refused by the live owner
    kill_owner(fleet, identity)
    with pytest.raises(rf.StaleSequenceError):  # ...but the next owner only knows sequence 1
        ref.call("add", n=100, conversation="r", sequence=3, timeout=60)


# -- 4. deadlines ----------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_expired_deadline_dead_letters_without_running(fleet: rf.Fleet, tmp_path: Path) -> None:
    identity = "deadline/acct"
    ref = spawn(fleet, identity)
    marker = tmp_path / "ran.txt"
    deadline = time.time() - 5
    with pytest.raises(rf.DeadlineExceededError):
        ref.call("touch", path=str(marker), deadline=deadline)
    assert not marker.exists()
    assert ref.call("get")["total"] == 0

    [letter] = letters_of(fleet, identity)
    assert letter.reason is rf.DeadLetterReason.DEADLINE_EXCEEDED and letter.attempts == 0
    assert letter.envelope.method == "touch" and letter.envelope.kwargs == {"path": str(marker)}
    assert letter.envelope.deadline == deadline

    # A deadline in the future does not stop the turn.
    assert ref.call("touch", path=str(marker), deadline=time.time() + 60) == "touched"
    assert marker.read_text() == "ran"
    assert len(letters_of(fleet, identity)) == 1


# -- 5. retries ------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_retryable_failures_are_retried_then_succeed(fleet: rf.Fleet, tmp_path: Path) -> None:
    identity = "retry/acct"
    ref = spawn(fleet, identity)
    counter = tmp_path / "attempts.txt"
    assert ref.call("flaky_add", n=7, counter=str(counter), failures=2) == 7
    assert counter.read_text() == "3"  # two failures, then the success
    assert ref.call("get")["total"] == 7  # failed attempts left no trace in State
    assert letters_of(fleet, identity) == []
    assert fleet.dead_letters() == []


# -- 6. poison messages and exhausted retries ---------------------------------------------


@pytest.mark.timeout(120)
def test_poison_message_is_dead_lettered_and_the_agent_keeps_serving(fleet: rf.Fleet, tmp_path: Path) -> None:
    identity = "poison/acct"
    ref = spawn(fleet, identity)
    assert ref.call("add", n=1) == 1
    with pytest.raises(rf.HandlerError) as failure:
        ref.call("poison", payload="bad-order-17")
    assert failure.value.remote_type.endswith("KeyError")
    assert "bad-order-17" in failure.value.remote_message
    assert ref.call("add", n=1) == 2  # the next message is served normally

    [poisoned] = letters_of(fleet, identity)
    assert poisoned.reason is rf.DeadLetterReason.REJECTED and poisoned.attempts == 1
    assert poisoned.envelope.target == identity and poisoned.envelope.method == "poison"
    assert poisoned.envelope.kwargs == {"payload": "bad-order-17"}
    assert "bad-order-17" in poisoned.error

    # A told poison message is dead-lettered too (nobody waits for it).
    ref.tell("poison", payload="told")
    eventually(lambda: len(letters_of(fleet, identity)) == 2, "the told poison message to be dead-lettered")
    assert letters_of(fleet, identity)[1].envelope.kwargs == {"payload": "told"}
    assert ref.call("add", n=1) == 3

    # Exhausted retries: RETRIES_EXHAUSTED after exactly max_attempts attempts.
    counter = tmp_path / "attempts.txt"
    with pytest.raises(rf.HandlerError, match="upstream busy") as exhausted:
        ref.call("flaky_add", n=50, counter=str(counter), failures=10)
    assert exhausted.value.remote_type.endswith("RetryableError")
    assert counter.read_text() == str(FAST_RETRY.max_attempts)
    last = letters_of(fleet, identity)[-1]
    assert last.reason is rf.DeadLetterReason.RETRIES_EXHAUSTED
    assert last.attempts == FAST_RETRY.max_attempts
    assert last.envelope.kwargs == {"n": 50, "counter": str(counter), "failures": 10}
    assert ref.call("get")["total"] == 3


# -- 7. replaying and purging dead letters -------------------------------------------------


@pytest.mark.timeout(120)
def test_replay_dead_letter_and_purge_with_filters(fleet: rf.Fleet, tmp_path: Path) -> None:
    identity = "replay/acct"
    ref = spawn(fleet, identity)
    flag = tmp_path / "outage.flag"
    flag.write_text("down")
    with pytest.raises(rf.HandlerError, match="outage.flag"):
        ref.call("add_unless_flag", n=5, flag=str(flag))
    [letter] = letters_of(fleet, identity)
    assert letter.reason is rf.DeadLetterReason.REJECTED
    assert letter.envelope.kwargs == {"n": 5, "flag": str(flag)}

    flag.unlink()
    assert fleet.replay_dead_letter(letter.id, timeout=60) == 5
    assert letters_of(fleet, identity) == []
    assert ref.call("get")["total"] == 5
    with pytest.raises(rf.UnknownDeadLetterError) as gone:
        fleet.replay_dead_letter(letter.id)  # gone
    assert gone.value.letter_id == letter.id and "fleet.dead_letters()" in str(gone.value)

    # Purge: every given filter must match.
    other = spawn(fleet, "replay/other")
    with pytest.raises(rf.HandlerError):
        ref.call("poison", payload="a1")
    with pytest.raises(rf.HandlerError):
        ref.call("poison", payload="a2")
    cut = time.time()
    with pytest.raises(rf.HandlerError):
        other.call("poison", payload="b1")
    with pytest.raises(rf.HandlerError):
        ref.call("poison", payload="a3")
    by_payload = {letter.envelope.kwargs["payload"]: letter for letter in fleet.dead_letters()}
    assert set(by_payload) == {"a1", "a2", "b1", "a3"}
    assert by_payload["a2"].at < cut < by_payload["b1"].at

    assert fleet.purge_dead_letters(ids=[]) == 0
    assert fleet.purge_dead_letters(identity, ids=[by_payload["a1"].id, by_payload["b1"].id]) == 1
    assert fleet.purge_dead_letters(identity, before=cut) == 1  # a2 (a1 is gone already)
    remaining = {letter.envelope.kwargs["payload"] for letter in fleet.dead_letters()}
    assert remaining == {"b1", "a3"}
    assert fleet.purge_dead_letters("replay/other") == 1
    assert [letter.envelope.kwargs["payload"] for letter in fleet.dead_letters()] == ["a3"]
    assert fleet.purge_dead_letters() == 1
    assert fleet.dead_letters() == []


def test_replay_that_is_not_handled_keeps_the_letter(fleet: rf.Fleet, tmp_path: Path) -> None:
    identity = "replay/kept"
    ref = spawn(fleet, identity)
    flag = tmp_path / "outage.flag"
    flag.write_text("down")
    with pytest.raises(rf.HandlerError):
        ref.call("add_unless_flag", n=5, flag=str(flag))
    [letter] = letters_of(fleet, identity)
    flag.unlink()
    # A retired identity refuses the replay without dead-lettering it again: the letter
    # is the only copy of the message left, so it must stay.
    fleet.retire(identity)
    with pytest.raises(rf.InvalidStateError):
        fleet.replay_dead_letter(letter.id, timeout=60)
    assert [kept.id for kept in letters_of(fleet, identity)] == [letter.id]
    fleet.respawn(identity)
    assert fleet.replay_dead_letter(letter.id, timeout=60) == 5
    assert letters_of(fleet, identity) == []


def test_replay_that_fails_again_leaves_only_the_new_letter(fleet: rf.Fleet) -> None:
    identity = "replay/again"
    ref = spawn(fleet, identity)
    with pytest.raises(rf.HandlerError):
        ref.call("poison", payload="p")
    [first] = letters_of(fleet, identity)
    with pytest.raises(rf.HandlerError):
        fleet.replay_dead_letter(first.id, timeout=60)
    [second] = letters_of(fleet, identity)
    assert second.id != first.id and second.reason is rf.DeadLetterReason.REJECTED
    assert second.envelope.kwargs == {"payload": "p"}


def test_replayed_deadline_letter_runs_instead_of_expiring_again(fleet: rf.Fleet) -> None:
    identity = "replay/late"
    ref = spawn(fleet, identity)
    with pytest.raises(rf.DeadlineExceededError):
        ref.call("add", n=3, deadline=time.time() - 1)
    [letter] = letters_of(fleet, identity)
    assert letter.reason is rf.DeadLetterReason.DEADLINE_EXCEEDED
    # Replaying is the operator's decision to run it now: the old deadline no longer applies.
    assert fleet.replay_dead_letter(letter.id, timeout=60) == 3
    assert letters_of(fleet, identity) == []
    assert ref.call("get")["total"] == 3


# -- 8. pause, park 100, failover, resume ------------------------------------------------


@pytest.mark.timeout(120)
def test_parked_messages_survive_host_kill_and_replay_in_order(fleet: rf.Fleet) -> None:
    identity = "pause/recorder"
    ref = spawn(fleet, identity)
    fleet.pause(identity)
    assert fleet.status(identity).paused is True
    for seq in range(100):
        ref.tell("record", seq=seq)
    eventually(lambda: len(fleet.parked(identity)) == 100, "100 parked messages")

    parked = fleet.parked(identity)
    assert [message.envelope.kwargs["seq"] for message in parked] == list(range(100))
    assert [message.seq for message in parked] == sorted(message.seq for message in parked)
    assert len({message.seq for message in parked}) == 100
    assert all(message.identity == identity and message.envelope.method == "record" for message in parked)

    killed = kill_owner(fleet, identity)
    assert fleet.resume(identity) == 100
    status = fleet.status(identity)
    assert status.paused is False and status.host not in (None, killed)
    assert fleet.parked(identity) == []
    assert ref.call("get", timeout=60)["seqs"] == list(range(100))
    assert ref.call("record", seq=100, timeout=60) == 101  # new work flows again
    assert letters_of(fleet, identity) == []


@pytest.mark.timeout(180)
def test_tell_accepted_by_a_host_killed_before_running_it_is_delivered_once(make_fleet: Any, tmp_path: Path) -> None:
    fleet: rf.Fleet = make_fleet(lease_ttl=4.0)
    identity = "tell/durable"
    ref = spawn(fleet, identity)
    started, release = tmp_path / "started", tmp_path / "release"
    with ThreadPoolExecutor(1) as pool:
        # The agent's turn is held, so the tell its host accepts waits behind it.
        holding = pool.submit(ref.call, "hold", started=str(started), release=str(release), timeout=120)
        eventually(started.exists, "the holding turn to start")
        owner = fleet.status(identity).host
        ref.tell("add", n=7, note="told")
        killed = kill_owner(fleet, identity)
        assert killed == owner
        release.write_text("go")
        assert holding.result() == "released"  # re-routed to the surviving host
    # Another host delivers the held tell once the dead one can no longer be expected to.
    eventually(lambda: ref.call("get", timeout=60)["total"] == 7, "the told add to run", timeout=90)
    state = ref.call("get", timeout=60)
    assert state["total"] == 7 and state["notes"] == ["told"]
    assert letters_of(fleet, identity) == []


REFUSE_LETTERS = {
    "sqlite": ["CREATE TRIGGER refuse_letters BEFORE INSERT ON dead_letters "
               "BEGIN SELECT RAISE(ABORT, 'dead letters refused by the test'); END"],
    "postgresql": ["CREATE FUNCTION refuse_letters() RETURNS trigger LANGUAGE plpgsql AS "
                   "$$ BEGIN RAISE EXCEPTION 'dead letters refused by the test'; END $$",
                   "CREATE TRIGGER refuse_letters BEFORE INSERT ON dead_letters "
                   "FOR EACH ROW EXECUTE FUNCTION refuse_letters()"],
}
ALLOW_LETTERS = {"sqlite": ["DROP TRIGGER refuse_letters"],
                 "postgresql": ["DROP TRIGGER refuse_letters ON dead_letters"]}


def ledger_sql(fleet: rf.Fleet, statements: list[str]) -> None:
    """Run SQL on the fleet's ledger database itself, as an operator (or a failing disk) would act on it."""
    location = fleet.ledger_location
    if location.kind == "sqlite":
        with contextlib.closing(sqlite3.connect(location.path, timeout=30)) as db:
            for statement in statements:
                db.execute(statement)
            db.commit()
    else:
        with psycopg.connect(location.url, autocommit=True) as db:
            for statement in statements:
                db.execute(statement)  # type: ignore[call-overload]


def dead_letter_attempts(fleet: rf.Fleet) -> int:
    """Dead letters the hosts tried to record, written or not."""
    return sum(host.dead_letters for host in fleet.host_statistics())


@pytest.mark.timeout(240)
def test_tell_whose_dead_letter_cannot_be_written_stays_held_until_it_can(make_any_fleet: Any,
                                                                         ledger_kind: str) -> None:
    fleet: rf.Fleet = make_any_fleet(lease_ttl=4.0)
    identity = "tell/poison"
    ref = spawn(fleet, identity)
    assert ref.call("add", n=1, timeout=60) == 1
    ledger_sql(fleet, REFUSE_LETTERS[ledger_kind])
    ref.tell("poison", payload="p1")
    # The handler fails and its dead letter cannot be written. The tell must not be
    # forgotten: a second attempt (a redelivery from the ledger) proves it is still held.
    eventually(lambda: dead_letter_attempts(fleet) >= 2, "the tell to be delivered again", timeout=90)
    assert letters_of(fleet, identity) == []
    ledger_sql(fleet, ALLOW_LETTERS[ledger_kind])
    [letter] = eventually(lambda: letters_of(fleet, identity), "the tell's dead letter", timeout=90)
    assert letter.envelope.kwargs == {"payload": "p1"} and letter.reason is rf.DeadLetterReason.REJECTED
    assert ref.call("add", n=1, timeout=60) == 2  # the agent serves throughout


# -- 9. calls to a paused agent; cancelling parked work ------------------------------------


@pytest.mark.timeout(120)
def test_call_to_paused_agent_times_out_stays_parked_and_runs_once_on_resume(fleet: rf.Fleet) -> None:
    identity = "pause/caller"
    ref = spawn(fleet, identity)
    assert ref.call("add", n=1) == 1
    fleet.pause(identity)
    with pytest.raises(rf.DeadlineExceededError):
        ref.call("add", n=10, note="while paused", timeout=0.5)
    [message] = eventually(lambda: fleet.parked(identity), "the timed-out call to stay parked")
    assert message.envelope.method == "add" and message.envelope.kwargs == {"n": 10, "note": "while paused"}
    assert fleet.status(identity).paused is True

    assert fleet.resume(identity) == 1
    assert fleet.parked(identity) == []
    state = ref.call("get", timeout=60)
    assert state["total"] == 11 and state["notes"].count("while paused") == 1
    assert fleet.resume(identity) == 0  # resuming a running agent replays nothing
    assert ref.call("add", n=1, timeout=60) == 12
    assert letters_of(fleet, identity) == []


@pytest.mark.timeout(120)
def test_cancel_parked_moves_work_to_dead_letters(fleet: rf.Fleet) -> None:
    running = spawn(fleet, "pause/running")
    identity = "pause/cancelled"
    ref = spawn(fleet, identity)
    fleet.pause(identity)
    with ThreadPoolExecutor(max_workers=1) as pool:
        waiting = pool.submit(ref.call, "add", n=9, note="waiting", timeout=60)
        eventually(lambda: len(fleet.parked(identity)) == 1, "the blocked call to park")
        for n in (1, 2):
            ref.tell("add", n=n, note=f"told-{n}")
        eventually(lambda: len(fleet.parked(identity)) == 3, "3 parked messages")
        assert fleet.cancel_parked(identity) == 3
        with pytest.raises(rf.InvalidStateError, match="cancelled"):
            waiting.result(timeout=60)  # the blocked caller is told, not left hanging
    assert fleet.parked(identity) == []
    assert fleet.resume(identity) == 0
    assert ref.call("get", timeout=60)["total"] == 0  # nothing cancelled ever ran
    assert running.call("add", n=1) == 1  # other agents are unaffected

    letters = fleet.dead_letters(identity)  # the bug: ValueError here
    assert [letter.reason for letter in letters] == [rf.DeadLetterReason.CANCELLED] * 3
    assert [letter.envelope.kwargs["note"] for letter in letters] == ["waiting", "told-1", "told-2"]
    assert all(letter.attempts == 0 for letter in letters)


# -- 10. bad input -----------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_bad_input_gets_a_clear_error_and_the_host_keeps_serving(fleet: rf.Fleet) -> None:
    identity = "bad/acct"
    ref = spawn(fleet, identity)
    assert ref.call("add", n=1) == 1

    with pytest.raises(rf.UnknownHandlerError) as unknown:
        ref.call("withdraw", n=1)
    assert unknown.value.method == "withdraw" and "add" in unknown.value.available

    with pytest.raises(rf.InvalidArgumentsError) as invalid:
        ref.call("add", n="lots")
    assert invalid.value.method == "add" and "n" in invalid.value.detail
    [decode] = letters_of(fleet, identity)
    assert decode.reason is rf.DeadLetterReason.DECODE_FAILED and decode.attempts == 0
    assert decode.envelope.kwargs == {"n": "lots"}

    # Arguments that cannot be serialized fail in the caller, at once, for call and tell.
    for value in (threading.Lock(), (i for i in range(3))):
        with pytest.raises(rf.InvalidArgumentsError, match="serialized"):
            ref.call("echo", value=value, timeout=30)
        with pytest.raises(rf.InvalidArgumentsError, match="serialized"):
            ref.tell("echo", value=value)
    # A malformed message is refused where it is built.
    with pytest.raises(rf.InvalidSpecError, match="conversation"):
        ref.call("add", n=1, sequence=3)  # a sequence needs a conversation
    with pytest.raises(rf.InvalidSpecError, match="method"):
        rf.Envelope(target=identity, method="not a handler!")
    assert ref.call("add", n=1) == 2

    # A malformed envelope sent straight to the owning host is answered, not crashed on.
    owner = fleet.status(identity).host
    assert owner is not None
    host = ray.get_actor(owner, namespace=fleet.config.namespace)
    kind, error = host_reply(ray.get(host.deliver.remote(identity, "not an envelope"), timeout=60))
    assert kind == "error" and isinstance(error, rf.RayfleetError), (kind, error)
    assert "Envelope" in str(error) and "str" in str(error), str(error)
    misaddressed = rf.Envelope(target="bad/elsewhere", method="add", kwargs={"n": 1})
    kind, error = host_reply(ray.get(host.deliver.remote(identity, misaddressed), timeout=60))
    assert kind == "error" and isinstance(error, rf.RayfleetError), (kind, error)

    # The host is still up and serving, and nothing bad was applied.
    kind, value = host_reply(ray.get(host.deliver.remote(identity, rf.Envelope(target=identity, method="add", kwargs={"n": 1}))))
    assert (kind, value) == ("ok", 3)
    assert fleet.status(identity).host == owner
    assert ref.call("get")["total"] == 3
    assert [letter.reason for letter in letters_of(fleet, identity)] == [rf.DeadLetterReason.DECODE_FAILED]
