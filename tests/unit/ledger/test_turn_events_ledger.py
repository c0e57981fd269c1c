"""The ledger's turn streams (table ``turn_events``), on every store (see ``test_ledger`` for the stores)."""
# ruff: noqa: F811 - the fixtures imported from test_ledger are named as the tests take them

from __future__ import annotations

import pytest
from test_ledger import backend, clock, grant, ledger, register  # noqa: F401 - fixtures and helpers

from rayfleet.errors import InvalidSpecError
from rayfleet.ledger._turn_rows import TurnEventRow, TurnWrite


def _event(epoch: int, seq: int, *, turn_id: str = "t1", kind: str = "status", identity: str = "a",
           at: float = 1.0) -> TurnEventRow:
    return TurnEventRow(identity=identity, turn_id=turn_id, epoch=epoch, seq=seq, kind=kind, data=f'{{"n": {seq}}}',
                        at=at)


def _ids(rows: list[TurnEventRow]) -> list[tuple[int, int]]:
    return [(row.epoch, row.seq) for row in rows]


def test_events_are_read_back_by_turn_in_order_after_a_given_id(ledger):
    register(ledger)
    token = grant(ledger, "h1").fencing_token
    assert ledger.append_turn_events(events=[_event(token, 2), _event(token, 1), _event(token, 3, turn_id="t2"),
                                             _event(token, 4)]) == []
    assert _ids(ledger.turn_events(identity="a", turn_id="t1")) == [(token, 1), (token, 2), (token, 4)]
    assert _ids(ledger.turn_events(identity="a", turn_id="t1", after_epoch=token, after_seq=1)) == [
        (token, 2), (token, 4)]
    assert _ids(ledger.turn_events(identity="a", turn_id="t1", limit=1)) == [(token, 1)]
    assert ledger.turn_events(identity="a", turn_id="t1")[0].data == '{"n": 1}'
    last = ledger.last_turn_event(identity="a", turn_id="t1")
    assert last is not None and (last.epoch, last.seq) == (token, 4)
    assert ledger.last_turn_event(identity="a", turn_id="nope") is None
    assert ledger.turn_event_owner(identity="a", epoch=token, seq=3) == "t2"
    assert ledger.turn_event_owner(identity="a", epoch=token, seq=99) is None
    with pytest.raises(InvalidSpecError):
        ledger.turn_events(identity="a", turn_id="t1", limit=0)


def test_an_event_is_written_once(ledger):
    register(ledger)
    token = grant(ledger, "h1").fencing_token
    ledger.append_turn_events(events=[_event(token, 1, kind="first")])
    ledger.append_turn_events(events=[_event(token, 1, kind="again")])
    assert [row.kind for row in ledger.turn_events(identity="a", turn_id="t1")] == ["first"]


def test_a_zombie_cannot_append_and_the_next_owner_epoch_sorts_after(ledger, clock):
    register(ledger)
    register(ledger, "b")
    old = grant(ledger, "h1", ttl=1.0).fencing_token
    other = grant(ledger, "h1", identity="b").fencing_token
    ledger.append_turn_events(events=[_event(old, 1)])
    clock.advance(2.0)
    new = grant(ledger, "h2").fencing_token
    assert new > old
    refused = ledger.append_turn_events(events=[_event(old, 2), _event(other, 1, identity="b")])
    assert refused == ["a"]
    assert _ids(ledger.turn_events(identity="b", turn_id="t1")) == [(other, 1)]
    ledger.append_turn_events(events=[_event(new, 1, kind="reset")])
    assert _ids(ledger.turn_events(identity="a", turn_id="t1")) == [(old, 1), (new, 1)]
    assert _ids(ledger.turn_events(identity="a", turn_id="t1", after_epoch=old, after_seq=1)) == [(new, 1)]
    assert ledger.append_turn_events(events=[_event(1, 1, identity="ghost")]) == ["ghost"]


def test_retention_forgets_ended_streams_a_bounded_batch_at_a_time(ledger):
    register(ledger)
    token = grant(ledger, "h1").fencing_token
    ledger.append_turn_events(events=[
        _event(token, 1, turn_id="old1", at=10.0), _event(token, 2, turn_id="old1", kind="completed", at=11.0),
        _event(token, 3, turn_id="old2", at=12.0), _event(token, 4, turn_id="old2", kind="failed", at=13.0),
        _event(token, 5, turn_id="running", at=14.0),
        _event(token, 6, turn_id="new", at=50.0), _event(token, 7, turn_id="new", kind="interrupted", at=51.0),
    ])
    assert ledger.purge_turn_events(ended_before=40.0, limit=1) == 1
    assert ledger.turn_events(identity="a", turn_id="old1") == []
    assert ledger.purge_turn_events(ended_before=40.0) == 1
    assert ledger.purge_turn_events(ended_before=40.0) == 0
    assert ledger.turn_events(identity="a", turn_id="old2") == []
    assert _ids(ledger.turn_events(identity="a", turn_id="running")) == [(token, 5)]
    assert len(ledger.turn_events(identity="a", turn_id="new")) == 2


def test_deleting_an_identity_forgets_its_streams(ledger):
    register(ledger)
    token = grant(ledger, "h1").fencing_token
    ledger.append_turn_events(events=[_event(token, 1)])
    ledger.delete(identity="a", fencing_token=token)
    assert ledger.turn_events(identity="a", turn_id="t1") == []


def test_streams_abandoned_without_an_end_are_forgotten_unless_their_turn_is_in_progress(ledger):
    register(ledger)
    token = grant(ledger, "h1").fencing_token
    for turn_id, status in (("suspended", "SUSPENDED"), ("running", "RUNNING"), ("failed", "FAILED")):
        ledger.write_turn(identity="a", fencing_token=token, turn=TurnWrite(
            turn_id=turn_id, method="m", envelope=b"e", status=status))
    seq = iter(range(1, 100))

    def stream(turn_id: str, *kinds_at: tuple[str, float]) -> list[TurnEventRow]:
        return [_event(token, next(seq), turn_id=turn_id, kind=kind, at=at) for kind, at in kinds_at]

    ledger.append_turn_events(events=[
        *stream("cut", ("started", 10.0), ("status", 11.0)),            # cut off, never sent again: forgotten
        *stream("plain", ("started", 12.0)),                             # no journal row at all: forgotten
        *stream("failed", ("started", 13.0), ("status", 14.0)),          # journal says it is over: forgotten
        *stream("suspended", ("started", 15.0), ("suspended", 16.0)),    # waits (for days, maybe): kept
        *stream("running", ("started", 17.0)),                           # in the journal as running: kept
        *stream("ended", ("started", 18.0), ("completed", 19.0)),        # retention's, not this sweep's
        *stream("recent", ("started", 20.0), ("status", 50.0)),          # wrote since idle_before: kept
        *stream("new", ("started", 60.0)),                               # started after idle_before: kept
    ])
    # Two candidates a batch, each batch after the last one's cursor.
    first = ledger.purge_abandoned_turn_events(idle_before=40.0, limit=2)
    assert first.forgotten == 2 and first.next_after == 12.0
    second = ledger.purge_abandoned_turn_events(idle_before=40.0, after=first.next_after, limit=2)
    assert second.forgotten == 1 and second.next_after == 15.0
    rest = [ledger.purge_abandoned_turn_events(idle_before=40.0, after=15.0, limit=2),
            ledger.purge_abandoned_turn_events(idle_before=40.0, after=18.0, limit=2)]
    assert [sweep.forgotten for sweep in rest] == [0, 0] and rest[-1].next_after is None
    for turn_id in ("cut", "plain", "failed"):
        assert ledger.turn_events(identity="a", turn_id=turn_id) == []
    for turn_id in ("suspended", "running", "ended", "recent", "new"):
        assert ledger.turn_events(identity="a", turn_id=turn_id), turn_id
    with pytest.raises(InvalidSpecError):
        ledger.purge_abandoned_turn_events(idle_before=40.0, limit=0)
