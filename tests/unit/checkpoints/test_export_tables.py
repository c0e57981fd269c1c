"""The Parquet export over a real in-process ledger and real snapshot files, queried with DuckDB (no Ray)."""

from __future__ import annotations

import json
from pathlib import Path

import cloudpickle
import duckdb
import pytest
from delivery import deliver

import rayfleet as rf
from rayfleet.checkpoints._export import MARKER, export_fleet, table_name
from rayfleet.checkpoints._store import SnapshotStore
from rayfleet.host._runtime import HostRuntime
from rayfleet.ledger._ledger import Ledger
from rayfleet.ledger._local import LocalLedgerClient
from rayfleet.ledger._values import SpecRecord


class Wallet(rf.Agent):
    class State(rf.State):
        balance: int = 0
        history: list[int] = []
        tags: set[str] = set()  # Arrow has no set: exported as its cloudpickle bytes

    @rf.handler
    async def deposit(self, amount: int) -> int:
        self.state.balance += amount
        self.state.history.append(amount)
        self.state.tags.add(f"d{amount}")
        return self.state.balance


class Diary(rf.Agent):
    class State(rf.State):
        entries: list[str] = []
        generation: int = 0  # collides with an export column: exported as state_generation

    @rf.handler
    async def write(self, text: str) -> int:
        self.state.entries.append(text)
        self.state.generation += 10
        return len(self.state.entries)


WALLET, DIARY = table_name(f"{__name__}:Wallet"), table_name(f"{__name__}:Diary")


def register(ledger: Ledger, identity: str, agent: type[rf.Agent]) -> None:
    spec = rf.AgentSpec(identity=identity, agent=agent)
    ledger.register(SpecRecord(identity=identity, spec=cloudpickle.dumps(spec), fingerprint=spec.fingerprint(),
                               agent_class=spec.agent_class_path))


@pytest.fixture(params=[0, 16 * 1024], ids=["states-in-files", "states-in-the-ledger"])
async def fleet_files(tmp_path: Path, request: pytest.FixtureRequest) -> tuple[LocalLedgerClient, SnapshotStore]:
    """Wallets w/0..w/4 (w/4 never called), diaries d/0..d/1 (d/1 retired), written by a real host runtime.

    Once with every State in snapshot files, once with the (small) States kept in the ledger.
    """
    ledger = Ledger(tmp_path / "ledger.sqlite")
    client = LocalLedgerClient(ledger)
    snapshots = SnapshotStore(str(tmp_path / "store"))
    for index in range(5):
        register(ledger, f"w/{index}", Wallet)
    for index in range(2):
        register(ledger, f"d/{index}", Diary)
    async with HostRuntime(name="h", ledger=client, snapshots=snapshots, incarnation="h",
                           inline_limit=request.param) as host:
        for index in range(4):
            for amount in range(1, index + 2):
                await deliver(host, f"w/{index}", "deposit", kwargs={"amount": amount})
        await deliver(host, "d/0", "write", kwargs={"text": "hello"})
        await deliver(host, "d/1", "write", kwargs={"text": "bye"})
        await host.retire("d/1")
        with pytest.raises(rf.InvalidArgumentsError):
            await deliver(host, "w/0", "deposit", kwargs={"wrong": 1})
    assert bool(snapshots.list_files()) is (request.param == 0)
    return client, snapshots


async def test_export_writes_every_committed_state_per_agent_class(
    fleet_files: tuple[LocalLedgerClient, SnapshotStore], tmp_path: Path,
) -> None:
    client, snapshots = fleet_files
    seen: list[tuple[int, int]] = []
    report = export_fleet(str(tmp_path / "out"), ledger=client, snapshots=snapshots,
                          progress=lambda done, total: seen.append((done, total)))
    assert report.tables == {WALLET: 4, DIARY: 2}
    assert report.uncheckpointed == 1 and report.unreadable == () and report.dead_letters == 1 and report.runs == 0
    assert seen[-1] == (7, 7)
    out = tmp_path / "out"
    wallets = duckdb.sql(
        f"SELECT identity, balance, history, generation, checkpoint_version, fencing_token, lifecycle, "
        f"committed_at IS NOT NULL FROM read_parquet('{out}/{WALLET}/*.parquet') ORDER BY identity"
    ).fetchall()
    assert wallets == [
        (f"w/{i}", sum(range(1, i + 2)), list(range(1, i + 2)), 0, i + 1, 1, "live", True) for i in range(4)
    ]
    [(tags,)] = duckdb.sql(f"SELECT tags FROM read_parquet('{out}/{WALLET}/*.parquet') WHERE identity = 'w/1'").fetchall()
    assert cloudpickle.loads(tags) == {"d1", "d2"}
    diaries = duckdb.sql(
        f"SELECT identity, entries, state_generation, lifecycle FROM read_parquet('{out}/{DIARY}/*.parquet') "
        f"ORDER BY identity"
    ).fetchall()
    assert diaries == [("d/0", ["hello"], 10, "live"), ("d/1", ["bye"], 10, "retired")]
    letters = duckdb.sql(
        f"SELECT identity, method, reason FROM read_parquet('{out}/dead_letters/*.parquet')"
    ).fetchall()
    assert letters == [("w/0", "deposit", "DECODE_FAILED")]
    assert json.loads((out / MARKER).read_text())["tables"] == {WALLET: 4, DIARY: 2}


async def test_an_earlier_export_is_replaced_and_a_foreign_folder_refused(
    fleet_files: tuple[LocalLedgerClient, SnapshotStore], tmp_path: Path,
) -> None:
    client, snapshots = fleet_files
    out = tmp_path / "out"
    export_fleet(str(out), ledger=client, snapshots=snapshots)
    (out / DIARY / "stale.parquet").write_bytes(b"left from before")
    export_fleet(str(out), ledger=client, snapshots=snapshots)
    assert not (out / DIARY / "stale.parquet").exists()
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(rf.InvalidSpecError, match="not a rayfleet export"):
        export_fleet(str(foreign), ledger=client, snapshots=snapshots)
    assert (foreign / "notes.txt").read_text() == "keep me"


def test_latest_checkpoints_pages_through_every_identity(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.sqlite")
    for index in range(7):
        register(ledger, f"x/{index}", Wallet if index % 2 else Diary)
    first = ledger.latest_checkpoints(limit=3)
    assert [row.identity for row in first] == ["x/0", "x/1", "x/2"]
    rest = ledger.latest_checkpoints(after=first[-1].identity, limit=10)
    assert [row.identity for row in rest] == ["x/3", "x/4", "x/5", "x/6"]
    wallets = ledger.latest_checkpoints(agent_class=f"{__name__}:Wallet")
    assert [row.identity for row in wallets] == ["x/1", "x/3", "x/5"]
    assert all(row.snapshot is None and row.checkpoint_version == 0 for row in first)
    with pytest.raises(rf.InvalidSpecError, match="limit"):
        ledger.latest_checkpoints(limit=0)


class Big(rf.State):
    value: int = 0


def test_a_field_pickled_in_one_file_and_typed_in_another_is_exported_as_pickles(tmp_path: Path) -> None:
    from rayfleet.checkpoints._export import _conform, _plan_columns
    from rayfleet.checkpoints._store import SnapshotRow

    store = SnapshotStore(str(tmp_path))
    typed = store.write_batch(group="g", writer="w", rows=[SnapshotRow(identity="a", version=1, state=Big(value=5))])
    huge = store.write_batch(group="g", writer="w", rows=[SnapshotRow(identity="b", version=1,
                                                                      state=Big(value=2**70))])
    columns = _plan_columns([store.read_schema(typed), store.read_schema(huge)])
    assert columns["value"].pickled
    for path, identity, expected in ((typed, "a", 5), (huge, "b", 2**70)):
        [values] = _conform(store.read_rows(path, [0], identities=[identity], versions=[1]), columns)
        assert [cloudpickle.loads(item) for item in values.to_pylist()] == [expected]
    with pytest.raises(rf.SnapshotError, match="expected 'b' version 1"):
        store.read_rows(typed, [0], identities=["b"], versions=[1])
