"""The stream reader's logic (``_reading``) across a failover, without Ray or a ledger.

A reader can get persisted events live from an owner that dies (or is fenced) before its
group commit writes them. When the next owner's part of the stream starts without a
``reset`` (the ledger held nothing of the old owner's part past a suspension, or nothing
at all), the reader itself must mark the seam: the chaos suite found a reader holding
events 3.591-3.593 the ledger never kept, with no reset after them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from rayfleet.ledger._turn_rows import TurnEventRow
from rayfleet.platform._turn_handle import _reading
from rayfleet.turns._values import TurnEvent

TURN = "t-1"


def wire(ident: str, kind: str, *, persisted: bool = True) -> tuple[str, str, str, str, float, bool]:
    return ident, TURN, kind, "null", 1.0, persisted


def row(epoch: int, seq: int, kind: str) -> TurnEventRow:
    return TurnEventRow(identity="a/1", turn_id=TURN, epoch=epoch, seq=seq, kind=kind, data=json.dumps(None), at=1.0)


def run(after: tuple[int, int, int] | None, *, ledger: list[list[TurnEventRow]],
        polls: list[tuple[list[Any], str, bool]], kept: Callable[[tuple[int, int, int]], bool] = lambda key: True
        ) -> tuple[list[TurnEvent], list[tuple[int, int, int]]]:
    """Drive the reader with scripted answers; the events it gave and the keys it asked the ledger about."""
    steps = _reading(TURN, after, finished=lambda: True)
    events: list[TurnEvent] = []
    asked: list[tuple[int, int, int]] = []
    answer: Any = None
    while True:
        try:
            what, argument = steps.send(answer)
        except StopIteration:
            return events, asked
        if what == "event":
            events.append(argument)
            answer = None
        elif what == "ledger":
            answer = ledger.pop(0) if ledger else []
        elif what == "kept":
            asked.append(argument)
            answer = kept(argument)
        else:
            answer = polls.pop(0)


def test_persisted_events_seen_live_and_lost_get_a_reset_before_the_next_owner() -> None:
    events, asked = run(None, ledger=[[]], kept=lambda key: False, polls=[
        ([wire("3.1", "started"), wire("3.2", "part")], "running", False),
        ([wire("4.1", "started"), wire("4.2", "completed")], "running", False)])
    assert [(event.id, event.kind, event.persisted) for event in events] == [
        ("3.1", "started", True), ("3.2", "part", True), ("4.0", "reset", False), ("4.1", "started", True),
        ("4.2", "completed", True)]
    assert asked == [(3, 2, 0)]


def test_no_reset_when_what_the_reader_saw_is_kept() -> None:
    events, asked = run(None, ledger=[[]], kept=lambda key: True, polls=[
        ([wire("3.1", "started"), wire("3.2", "suspended")], "running", False),
        ([wire("4.1", "resumed"), wire("4.2", "completed")], "running", False)])
    assert [event.id for event in events] == ["3.1", "3.2", "4.1", "4.2"]
    assert asked == [(3, 2, 0)]


def test_the_next_owners_own_reset_is_not_doubled() -> None:
    events, asked = run(None, ledger=[[]], kept=lambda key: False, polls=[
        ([wire("3.1", "started"), wire("3.2", "part")], "running", False),
        ([wire("4.1", "reset"), wire("4.2", "started"), wire("4.3", "completed")], "running", False)])
    assert [event.id for event in events] == ["3.1", "3.2", "4.1", "4.2", "4.3"]
    assert asked == []


def test_a_reader_resuming_after_a_lost_event_from_the_ledger_gets_the_reset() -> None:
    # Reconnected with Last-Event-ID 3.593: the next owner already wrote its events, so they come from the ledger.
    events, asked = run((3, 593, 0), ledger=[[row(4, 1, "started"), row(4, 2, "completed")]],
                        kept=lambda key: False, polls=[])
    assert [(event.id, event.kind) for event in events] == [("4.0", "reset"), ("4.1", "started"),
                                                            ("4.2", "completed")]
    assert asked == [(3, 593, 0)]


def test_events_read_from_the_ledger_need_no_check() -> None:
    events, asked = run(None, ledger=[[row(3, 1, "started"), row(3, 2, "part"), row(4, 1, "started"),
                                       row(4, 2, "completed")]], kept=lambda key: False, polls=[])
    assert [event.id for event in events] == ["3.1", "3.2", "4.1", "4.2"]
    assert asked == []


def test_deltas_seen_before_a_failover_always_get_a_reset() -> None:
    events, asked = run(None, ledger=[[]], polls=[
        ([wire("3.1", "started"), wire("3.1.1", "delta", persisted=False)], "running", False),
        ([wire("4.1", "started"), wire("4.2", "completed")], "running", False)])
    assert [event.id for event in events] == ["3.1", "3.1.1", "4.0", "4.1", "4.2"]
    assert asked == []


def test_a_gap_after_a_lost_event_still_marks_the_seam() -> None:
    events, asked = run(None, ledger=[[], [row(4, 1, "started"), row(4, 2, "completed")]], kept=lambda key: False,
                        polls=[([wire("3.1", "started")], "running", False), ([], "running", True)])
    assert [event.id for event in events] == ["3.1", "4.0", "4.1", "4.2"]
    assert asked == [(3, 1, 0)]


def test_persisted_events_the_earlier_owner_wrote_after_the_readers_place_come_from_the_ledger_before_the_next_owner(
        ) -> None:
    # The chaos suite: a reader had 4.627 and 4.628 live; its owner persisted 4.629 and died
    # before the reader polled it; the next owner's live part began at its reset, 5.1, and
    # the reader went on from there without 4.629.
    events, _ = run(None, ledger=[[], [row(4, 629, "part"), row(5, 1, "reset")]], polls=[
        ([wire("4.627", "started"), wire("4.628", "step")], "running", False),
        ([wire("5.1", "reset"), wire("5.2", "started"), wire("5.3", "completed")], "running", False)])
    assert [(event.id, event.kind) for event in events] == [
        ("4.627", "started"), ("4.628", "step"), ("4.629", "part"), ("5.1", "reset"), ("5.2", "started"),
        ("5.3", "completed")]
