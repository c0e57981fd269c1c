"""Command-line commands that work without a fleet."""

from __future__ import annotations

import json

import pytest

from rayfleet.cli._app import main
from rayfleet.roster import roster_json_schema


def test_roster_schema_prints_the_schema_without_ray(capsys: pytest.CaptureFixture[str]) -> None:
    # tests/unit/conftest.py makes ray.init raise, so this also proves the command stays offline.
    assert main(["roster", "schema"]) == 0
    out = capsys.readouterr()
    schema = json.loads(out.out)
    assert schema == roster_json_schema()
    assert "agents" in schema["properties"] and schema["required"] == ["agents"]
    assert out.err == ""


def test_roster_needs_a_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["roster"])
    assert caught.value.code == 2
    assert "schema" in capsys.readouterr().err
