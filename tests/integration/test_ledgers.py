"""Choosing a ledger: URLs, the fleet id that binds a ledger to its storage, bulk creation."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from agents import Counter

import rayfleet as rf


def _namespace() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"


@pytest.mark.timeout(120)
def test_an_empty_ledger_over_an_existing_fleets_storage_is_refused(tmp_path: Path) -> None:
    storage = tmp_path / "store"
    namespace = _namespace()
    fleet = rf.connect(storage=storage, namespace=namespace, hosts=1, inline_state_bytes=0)
    try:
        assert fleet.spawn("counter/kept", Counter).call(Counter.add, n=7) == 7
    finally:
        fleet.shutdown(stop_actors=True)
    snapshots = sorted(path.name for path in (storage / "snapshots").rglob("*.arrow"))
    assert snapshots and (storage / "fleet.json").exists()
    for path in storage.glob("ledger.sqlite*"):
        path.unlink()  # the ledger is lost; the snapshots are not

    with pytest.raises(rf.FleetMismatchError) as caught:
        rf.connect(storage=storage, namespace=_namespace(), hosts=1)
    error = caught.value
    assert error.ledger_fleet is None and error.storage_fleet
    assert str(storage) in str(error) and "ledger.sqlite" in str(error)
    assert "fencing tokens would start again" in str(error)
    # Nothing was lost or overwritten by the refusal.
    assert sorted(path.name for path in (storage / "snapshots").rglob("*.arrow")) == snapshots


@pytest.mark.timeout(120)
def test_another_fleets_ledger_is_refused(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    for storage in (first, second):
        rf.connect(storage=storage, namespace=_namespace(), hosts=1).shutdown(stop_actors=True)
    with pytest.raises(rf.FleetMismatchError) as caught:
        rf.connect(storage=first, ledger=f"sqlite://{second / 'ledger.sqlite'}", namespace=_namespace(), hosts=1)
    assert caught.value.ledger_fleet and caught.value.storage_fleet
    assert caught.value.ledger_fleet != caught.value.storage_fleet


@pytest.mark.parametrize(
    ("ledger", "problem"),
    [
        ("mysql://db/x", "is not a URL rayfleet knows"),
        ("sqlite:///", "absolute file path"),
        ("postgresql:///nohost", "names no host"),
    ],
)
def test_bad_ledger_urls_are_refused_before_anything_starts(tmp_path: Path, ledger: str, problem: str) -> None:
    with pytest.raises(rf.InvalidSpecError, match=problem) as caught:
        rf.connect(storage=tmp_path / "store", ledger=ledger, namespace=_namespace(), hosts=1)
    assert caught.value.field == "ledger"
    assert not (tmp_path / "store").exists()


@pytest.mark.timeout(300)
def test_spawn_many_creates_thousands_in_a_few_transactions(make_any_fleet: Any) -> None:
    fleet: rf.Fleet = make_any_fleet()
    specs = [rf.AgentSpec(identity=f"bulk/{index}", agent=Counter, labels={"shard": str(index % 4)})
             for index in range(3_000)]
    seen: list[tuple[int, int]] = []
    refs = fleet.spawn_many(specs, batch=1_000, progress=lambda done, total: seen.append((done, total)))
    assert [ref.identity for ref in refs] == [spec.identity for spec in specs]
    assert seen == [(1_000, 3_000), (2_000, 3_000), (3_000, 3_000)]  # what `rayfleet` shows as a progress bar
    assert len(fleet.list_agents(labels={"shard": "3"})) == 750
    assert fleet.spawn_many(specs[:10]) and len(fleet.list_agents()) == 3_000  # idempotent
    assert refs[1234].call(Counter.add, n=5) == 5
    with pytest.raises(rf.InvalidSpecError, match="different spec"):
        fleet.spawn_many([rf.AgentSpec(identity="bulk/1", agent=Counter, labels={"shard": "other"})])
    with pytest.raises(rf.InvalidSpecError, match="appears twice"):
        fleet.spawn_many([specs[0], specs[0]])


@pytest.mark.timeout(180)
def test_a_host_on_postgresql_ends_a_stopped_clients_hold_on_an_agents_rows(
    postgres_ledger: str, make_fleet: Any,
) -> None:
    """A process stopped in the middle of a pipelined transaction (a host frozen inside a batch
    commit) holds the rows it updated, and PostgreSQL keeps its session waiting for the rest; the
    next host to activate the agent must not wait for as long as that process stays stopped."""
    import psycopg

    fleet: rf.Fleet = make_fleet(ledger=postgres_ledger, hosts=1)
    ref = fleet.spawn("held/a", Counter)
    assert ref.call(Counter.add, n=1) == 1
    assert fleet.deactivate("held/a")  # checkpointed and released: the next call activates it again
    stopped = psycopg.connect(postgres_ledger, autocommit=True)
    try:
        stopped.pgconn.enter_pipeline_mode()
        stopped.pgconn.send_query_params(b"BEGIN", None)
        stopped.pgconn.send_query_params(b"UPDATE continuity SET generation = generation WHERE identity = 'held/a'",
                                         None)
        stopped.pgconn.flush()  # no Sync: the server holds the row and waits for the rest

        # Without the hosts' stall watch this waits until the timeout (the grant waits on the row).
        assert ref.call(Counter.add, n=1, timeout=60) == 2
    finally:
        stopped.close()
