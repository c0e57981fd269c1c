"""``fleet.export``: the latest committed State of every identity as Parquet, locally and on S3, queried with DuckDB."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import duckdb
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

import rayfleet as rf
from rayfleet.demo import Counter


class Ledgerbook(rf.Agent):
    class State(rf.State):
        owner: str = ""
        entries: list[int] = []

    @rf.handler
    async def record(self, owner: str, amount: int) -> int:
        self.state.owner = owner
        self.state.entries.append(amount)
        return sum(self.state.entries)

    @rf.handler
    async def boom(self) -> None:
        raise ValueError("no")


COUNTERS = "rayfleet.demo.agents.Counter"
BOOKS = f"{__name__}.Ledgerbook"


@pytest.fixture(scope="module")
def exported_fleet(tmp_path_factory: pytest.TempPathFactory, ray_session: int) -> rf.Fleet:
    """Counters c/0..c/2 (c/2 never called), ledgerbooks b/0..b/1 (b/1 retired), one dead letter, one run."""
    import uuid

    fleet = rf.connect(storage=tmp_path_factory.mktemp("export") / "store", hosts=2,
                       namespace=f"t-{uuid.uuid4().hex[:10]}")
    for index in range(3):
        fleet.spawn(f"c/{index}", Counter)
    for index in range(2):
        fleet.spawn(f"b/{index}", Ledgerbook)
    fleet.agent("c/0").call("add", n=5)
    for n in (1, 2, 3):
        fleet.agent("c/1").call("add", n=n)
    fleet.agent("b/0").call("record", owner="ann", amount=7)
    fleet.agent("b/1").call("record", owner="bob", amount=9)
    fleet.retire("b/1")
    with pytest.raises(rf.HandlerError):
        fleet.agent("b/0").call("boom")
    workflow = rf.Workflow("export-flow")
    workflow.step("bump", to="c/0", call="add", payload={"n": 1})
    assert fleet.run(workflow).status is rf.RunStatus.COMPLETED
    yield fleet
    fleet.shutdown(stop_actors=True)


def _check(report: rf.ExportReport, read: Callable[[str], object]) -> None:
    assert report.tables == {COUNTERS: 2, BOOKS: 2}
    assert report.uncheckpointed == 1 and report.dead_letters == 1 and report.runs == 1 and report.unreadable == ()
    counters, books, letters, runs = read(COUNTERS), read(BOOKS), read("dead_letters"), read("runs")  # noqa: F841
    assert duckdb.sql(
        "SELECT identity, total, generation, checkpoint_version, lifecycle FROM counters ORDER BY identity"
    ).fetchall() == [("c/0", 6, 0, 2, "live"), ("c/1", 6, 0, 3, "live")]
    assert duckdb.sql(
        "SELECT identity, owner, entries, lifecycle, fencing_token > 0, committed_at IS NOT NULL "
        "FROM books ORDER BY identity"
    ).fetchall() == [("b/0", "ann", [7], "live", True, True), ("b/1", "bob", [9], "retired", True, True)]
    assert duckdb.sql("SELECT identity, method, reason FROM letters").fetchall() == [("b/0", "boom", "REJECTED")]
    assert duckdb.sql("SELECT workflow, status FROM runs").fetchall() == [("export-flow", "COMPLETED")]


def test_export_to_a_local_folder(exported_fleet: rf.Fleet, tmp_path: Path) -> None:
    seen: list[tuple[int, int]] = []
    report = exported_fleet.export(tmp_path / "out", progress=lambda done, total: seen.append((done, total)))
    assert seen[-1] == (5, 5)
    _check(report, lambda table: duckdb.read_parquet(f"{tmp_path / 'out'}/{table}/*.parquet"))
    # The CLI's and the README's query: the State equals what the agents answer.
    by_identity = dict(duckdb.sql(
        f"SELECT identity, total FROM read_parquet('{tmp_path / 'out'}/{COUNTERS}/*.parquet')").fetchall())
    assert by_identity == {"c/0": exported_fleet.agent("c/0").call("get"),
                           "c/1": exported_fleet.agent("c/1").call("get")}


def test_export_to_s3(exported_fleet: rf.Fleet, s3_server: object) -> None:
    uri = s3_server.uri("exports/today")  # type: ignore[attr-defined]
    report = exported_fleet.export(uri)
    assert "test-secret" not in report.path
    filesystem, root = pafs.FileSystem.from_uri(uri)
    # DuckDB's own S3 reader needs an extension download; pyarrow reads the objects and DuckDB queries them.
    _check(report, lambda table: pq.read_table(f"{root}/{table}", filesystem=filesystem))
