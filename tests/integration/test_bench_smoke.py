"""The benchmark suite at its smallest sizes (``python -m benchmarks --smoke``), so it cannot rot.

It runs inside the session's one Ray (the suite uses a Ray that is already up and
leaves it running). Only the shape of what each benchmark reports is checked: every
one of B1..B14 produced its rows with figures, a verdict and no error, and the JSON
file parses. No wall-clock thresholds, and no assertion on whether a target was met.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pg_support
import pytest
import ray

from benchmarks.__main__ import IDS, main

ALL = ("B1", "B2", "B3", "B4", "B5", "B6", "B7", "B8", "B9", "B10", "B11", "B12", "B13", "B14")
STORE_DEPENDENT = ("B1", "B2", "B6", "B9", "B10", "B11", "B12", "B13", "B14")
"""Benchmarks that run once per ledger store."""
NO_BASELINE = ("B8 ", "B9 bulk", "B4 live")
"""Rows whose figure stands alone (no raw-Ray side)."""
ONE_SHOT = ("B12 reminders", "B12 reminder lateness")
"""Rows measured once (a burst of 100,000 reminders is not repeated in rounds)."""
MAY_BE_ZERO = ("B4 memory", "B14 ")
"""RSS growth over a few hundred agents can be nothing at all (or negative), and B14's difference of medians can
come out at or below zero at smoke sizes: only numeric is required."""


def _numeric(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@pytest.mark.timeout(600)
def test_every_benchmark_reports_its_rows_at_smoke_sizes(tmp_path: Path) -> None:
    assert IDS == ALL
    out = tmp_path / "smoke.json"

    assert main(["--smoke", "--out", str(out)]) == 0

    assert ray.is_initialized(), "the suite shut down a Ray it did not start"
    report = json.loads(out.read_text())
    assert report["mode"] == "smoke"
    assert report["machine"]["python"] and report["machine"]["ray"] == ray.__version__
    rows = report["results"]
    failures = [f"{row['name']}: {row['error']}" for row in rows if "error" in row]
    assert not failures, failures
    for benchmark in ALL:
        assert any(row["name"].split(" ", 1)[0] == benchmark for row in rows), f"no row for {benchmark}"
    for row in rows:
        name = row["name"]
        assert name.split(" ", 1)[0] in ALL, name
        assert isinstance(row["pass"], bool), name
        assert row["unit"] and row["target"], name
        assert _numeric(row["rayfleet"]), name
        if not name.startswith(MAY_BE_ZERO):
            assert row["rayfleet"] > 0, name
        if name.startswith(NO_BASELINE):
            assert row["baseline"] is None and row["ratio"] is None, name
        else:
            assert _numeric(row["baseline"]) and row["baseline"] > 0, name
            assert _numeric(row["ratio"]), name
        assert row["spread"]["rayfleet"]["rounds"] >= (1 if name.startswith(ONE_SHOT) else 2), name
    stores = {"sqlite"} | ({"postgresql"} if pg_support.unavailable() is None else set())
    for benchmark in STORE_DEPENDENT:
        for store in stores:
            assert any(row["name"].startswith(benchmark) and row["name"].endswith(store) for row in rows), \
                f"{benchmark} has no row on {store}"
    if "postgresql" not in stores:
        assert report["skipped"], "PostgreSQL rows were left out without saying why"
