"""Rendering: JSON that parses, tables that never read data as markup, progress only on a terminal."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

import rayfleet as rf
from rayfleet.cli._output import Column, counting, emit_json, emit_table, jsonable


class Note(rf.State):
    text: str = ""


def test_jsonable_turns_values_into_plain_json() -> None:
    status = rf.IdentityStatus(identity="a/b", state=rf.LifecycleState.ACTIVE, generation=2,
                               lease=rf.LeaseInfo(fencing_token=7, ttl_remaining=9.5, healthy=True),
                               labels={"team": "a"})
    value = jsonable({"status": status, "edges": (("a", "b"),), "odd": object, "model": Note(text="hi")})
    assert json.loads(json.dumps(value)) == value
    assert value["status"]["state"] == "ACTIVE" and value["status"]["lease"]["fencing_token"] == 7
    assert value["edges"] == [["a", "b"]]
    assert value["odd"] == repr(object)
    assert value["model"] == {"text": "hi"}


def test_emit_json_prints_one_parsable_document(capsys: pytest.CaptureFixture[str]) -> None:
    emit_json([rf.LifecycleState.BROKEN, {"n": 1.5}])
    assert json.loads(capsys.readouterr().out) == ["BROKEN", {"n": 1.5}]


def test_table_cells_are_text_not_markup(capsys: pytest.CaptureFixture[str]) -> None:
    emit_table([{"identity": "[bold]x[/bold]", "labels": {"k": "v"}, "paused": False, "host": None}],
               [Column("identity", "identity"), Column("labels", "labels"), Column("paused", "paused"),
                Column("host", "host")], title="t", empty="none")
    out = capsys.readouterr().out
    assert "[bold]x[/bold]" in out and "k=v" in out and "no" in out and "-" in out
    emit_table([], [Column("identity", "identity")], title="t", empty="no identities")
    assert capsys.readouterr().out.strip() == "no identities"


def test_progress_moves_on_a_terminal_and_stays_silent_elsewhere() -> None:
    terminal = io.StringIO()
    with counting("exporting", console=Console(file=terminal, force_terminal=True, width=100)) as progress:
        progress(1, 3)
        progress(3, 3)
    assert "exporting" in terminal.getvalue() and "3/3" in terminal.getvalue()
    piped = io.StringIO()
    with counting("exporting", console=Console(file=piped, force_terminal=False)) as progress:
        progress(3, 3)
    assert piped.getvalue() == ""
