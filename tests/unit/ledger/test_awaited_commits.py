"""A commit of one checkpoint awaited on the caller's event loop (PostgreSQL): same rules, no worker thread.

Hosts await their turn's commit; on PostgreSQL the one-statement commit runs on the
host's event loop over a connection of that loop's rather than on a worker thread.
These tests hold it to everything the blocking commit promises: the pointer moves
under the same fencing, the key is remembered once, the step is journaled, a refusal
writes nothing and is named by the transaction path, and a lost connection is retried
or reported unknown exactly as the blocking path does.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import psycopg
import pytest

from rayfleet.errors import (
    InternalError,
    LedgerUnavailableError,
    StaleCheckpointVersionError,
    StaleFencingTokenError,
)
from rayfleet.identity._values import SnapshotPointer
from rayfleet.ledger import RunRequests, StepEntry, StepJournaled, _postgres
from rayfleet.ledger._ledger import Ledger
from rayfleet.ledger._local import LocalLedgerClient
from rayfleet.ledger._postgres import PostgresDatabase
from rayfleet.ledger._turn_rows import TurnEnd, TurnEntry, TurnEntryKind, TurnEntryState, TurnEventRow, TurnWrite
from rayfleet.ledger._values import Activation, CheckpointCommit, CommitOutcome, SpecRecord


def granted(ledger: Ledger, identity: str = "t/a", holder: str = "h") -> int:
    ledger.register(SpecRecord(identity=identity, spec=b"s", fingerprint="f", agent_class="m:C", labels={}))
    activation = ledger.acquire(holder=holder, identities=[identity], ttl=60)[identity]
    assert isinstance(activation, Activation), activation
    return activation.grant.fencing_token


def checkpoint(token: int, version: int, *, keys: int = 1, step: StepEntry | None = None) -> CheckpointCommit:
    return CheckpointCommit(
        identity="t/a", fencing_token=token, version=version,
        pointer=SnapshotPointer(file="", row=0, version=version, inline=b"state-%d" % version),
        dedup=tuple((f"k{version}-{n}", b"reply") for n in range(keys)), step=step,
    )


async def awaited(ledger: Ledger, commits: list[CheckpointCommit]) -> list[CommitOutcome] | None:
    """``commits`` as the client commits them awaited: their one statement, on this event loop."""
    statement = ledger.commit_alone(commits)
    assert statement is not None
    return await ledger.write_awaited(statement)


def test_only_one_checkpoint_of_one_statement_on_postgresql_is_committed_awaited(
    postgres_url: str, tmp_path: Path,
) -> None:
    ledger = Ledger(PostgresDatabase(postgres_url, pool_size=1))
    sqlite = Ledger(tmp_path / "ledger.db")
    try:
        token = granted(ledger)
        assert ledger.writes_awaited and not sqlite.writes_awaited
        assert ledger.commit_alone([checkpoint(token, 1)]) is not None
        assert ledger.commit_alone([checkpoint(token, 1, keys=0)]) is not None
        assert ledger.commit_alone([checkpoint(token, 1, keys=2)]) is None  # two keys: the transaction's
        assert ledger.commit_alone([checkpoint(token, 1), checkpoint(token, 2)]) is None
        assert sqlite.commit_alone([checkpoint(1, 1)]) is None
        statement = ledger.commit_alone([checkpoint(token, 1)])
        assert statement is not None
        with pytest.raises(InternalError, match="no awaited writes"):
            asyncio.run(sqlite.write_awaited(statement))
        assert ledger.resolve(["t/a"])["t/a"].continuity.checkpoint_version == 0  # type: ignore[union-attr]
    finally:
        ledger.close()
        sqlite.close()


def test_an_awaited_commit_moves_the_pointer_remembers_its_key_and_journals_its_step(postgres_url: str) -> None:
    ledger = Ledger(PostgresDatabase(postgres_url, pool_size=1))
    try:
        token = granted(ledger)
        ledger.create_run(run_id="r", workflow="wf", code_version="v", definition=None)
        run_token = ledger.acquire_run_lease(run_id="r", holder="engine", ttl=60).token
        step = StepEntry(run_id="r", run_token=run_token, label="s1", output=b"out", tokens=3)

        async def commits() -> list[object]:
            first = await awaited(ledger, [checkpoint(token, 1, step=step)])
            again = await awaited(ledger, [checkpoint(token, 2, keys=0, step=step)])
            return [first, again]

        first, again = asyncio.run(commits())
        assert first == [StepJournaled(inserted=True, requests=RunRequests())]
        assert again == [StepJournaled(inserted=False, requests=RunRequests())]  # journaled once
        view = ledger.resolve(["t/a"])["t/a"]
        assert view.continuity is not None and view.continuity.checkpoint_version == 2
        assert view.snapshot is not None and (view.snapshot.file, view.snapshot.version) == ("", 2)
        assert ledger.dedup_window("t/a") == [("k1-0", b"reply")]
        assert [(e.label, e.output, e.tokens) for e in ledger.journal("r").steps] == [("s1", b"out", 3)]
    finally:
        ledger.close()


def test_an_awaited_commit_ends_its_durable_turn_and_one_refused_leaves_it_running(postgres_url: str) -> None:
    now = [1_000.0]
    ledger = Ledger(PostgresDatabase(postgres_url, pool_size=1), clock=lambda: now[0])
    try:
        token = granted(ledger)
        for turn_id in ("t1", "t2"):
            ledger.write_turn(identity="t/a", fencing_token=token, turn=TurnWrite(
                turn_id=turn_id, method="go", envelope=b"e", entries=(TurnEntry(
                    position=0, kind=TurnEntryKind.STEP, name="s", state=TurnEntryState.COMPLETED, value=b"v"),)))
        ends = dataclasses.replace(checkpoint(token, 1), turn_end=TurnEnd(turn_id="t1"))
        streamed = dataclasses.replace(checkpoint(token, 1), turn_end=TurnEnd(turn_id="t1", events=(TurnEventRow(
            identity="t/a", turn_id="t1", epoch=1, seq=1, kind="completed", data="{}", at=1.0),)))
        assert ledger.commit_alone([streamed]) is None  # its end event goes in the transaction
        now[0] += 5

        async def commits() -> list[object]:
            ended = await awaited(ledger, [ends])
            refused = await awaited(ledger, [dataclasses.replace(checkpoint(token, 1), turn_end=TurnEnd(
                turn_id="t2", status="FAILED"))])  # version 1 again: not newer, nothing written
            return [ended, refused]

        ended, refused = asyncio.run(commits())
        assert ended == [None] and refused is None
        first = ledger.turn(identity="t/a", turn_id="t1")
        assert first is not None and (first.status, first.entries, first.updated) == ("COMPLETED", (), 1_005.0)
        second = ledger.turn(identity="t/a", turn_id="t2")
        assert second is not None and second.status == "RUNNING" and len(second.entries) == 1
    finally:
        ledger.close()


def test_an_awaited_commit_that_does_not_pass_writes_nothing_and_the_client_names_the_refusal(
    postgres_url: str,
) -> None:
    now = [1_000.0]
    ledger = Ledger(PostgresDatabase(postgres_url, pool_size=1), clock=lambda: now[0])
    client = LocalLedgerClient(ledger, threads=1)
    try:
        old = granted(ledger)
        now[0] += 61  # the lease lapsed; another host takes the identity under a larger token
        heir = ledger.acquire(holder="heir", identities=["t/a"], ttl=60)["t/a"]
        assert isinstance(heir, Activation) and heir.grant.fencing_token > old
        assert ledger.commit_checkpoints([checkpoint(heir.grant.fencing_token, 5)]) == [None]

        async def commits() -> list[object]:
            return [
                await awaited(ledger, [checkpoint(old, 6)]),  # a zombie's turn
                await client.commit_checkpoints([checkpoint(old, 6)]),
                await awaited(ledger, [checkpoint(heir.grant.fencing_token, 5)]),  # a repeat
                await client.commit_checkpoints([checkpoint(heir.grant.fencing_token, 5)]),
            ]

        fenced, fenced_judged, repeated, repeated_judged = asyncio.run(commits())
        assert fenced is None and repeated is None  # did not pass: nothing written, nothing said
        [refusal] = fenced_judged  # type: ignore[misc]
        assert isinstance(refusal, StaleFencingTokenError)
        assert (refusal.presented, refusal.current) == (old, heir.grant.fencing_token)
        [stale] = repeated_judged  # type: ignore[misc]
        assert isinstance(stale, StaleCheckpointVersionError)
        assert ledger.resolve(["t/a"])["t/a"].continuity.checkpoint_version == 5  # type: ignore[union-attr]
        assert [key for key, _ in ledger.dedup_window("t/a")] == ["k5-0"]
    finally:
        client.close()


def test_a_client_awaiting_a_commit_on_postgresql_uses_no_worker_thread(postgres_url: str) -> None:
    ledger = Ledger(PostgresDatabase(postgres_url, pool_size=1))
    client = LocalLedgerClient(ledger, threads=1)
    try:
        token = granted(ledger)

        async def commits() -> list[object]:
            return [await client.commit_checkpoints([checkpoint(token, version)]) for version in (1, 2, 3)]

        assert asyncio.run(commits()) == [[None], [None], [None]]
        assert client._executor is not None and not client._executor._threads  # never started
        # Called from blocking code it takes the worker thread, as every other operation does.
        assert client.commit_checkpoints([checkpoint(token, 4)]).result() == [None]
        assert ledger.resolve(["t/a"])["t/a"].continuity.checkpoint_version == 4  # type: ignore[union-attr]
        assert [key for key, _ in ledger.dedup_window("t/a")] == ["k1-0", "k2-0", "k3-0", "k4-0"]
    finally:
        client.close()


def _ended_by_the_server(url: str, application: str) -> int:
    with psycopg.connect(url, autocommit=True) as admin:
        return len(admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s", (application,),
        ).fetchall())


@contextlib.asynccontextmanager
async def committed_once_then_ended(postgres_url: str) -> AsyncIterator[tuple[Ledger, int]]:
    """A ledger that committed version 1 of ``t/a`` awaited on this loop, after which the server ended
    every connection of it (the loop's among them); yields the ledger and the lease's token."""
    application = f"rf-awaited-{uuid.uuid4().hex[:8]}"
    ledger = Ledger(PostgresDatabase(f"{postgres_url}&application_name={application}", pool_size=1))
    try:
        token = granted(ledger)
        assert await awaited(ledger, [checkpoint(token, 1)]) == [None]
        assert _ended_by_the_server(postgres_url, application) == 2  # the pool's and the loop's
        yield ledger, token
    finally:
        ledger.close()


def test_an_awaited_commit_over_a_connection_the_server_ended_is_sent_again(postgres_url: str) -> None:
    async def scenario() -> object:
        async with committed_once_then_ended(postgres_url) as (ledger, token):
            await asyncio.sleep(_postgres.ALIVE_FOR + 0.1)  # the loop's connection has not answered lately
            return await awaited(ledger, [checkpoint(token, 2)]), ledger.resolve(["t/a"])

    committed, resolved = asyncio.run(scenario())  # type: ignore[misc]
    assert committed == [None]
    assert resolved["t/a"].continuity.checkpoint_version == 2


def test_an_awaited_commit_over_a_connection_ended_just_after_it_answered_is_reported_unknown(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_postgres, "ALIVE_FOR", 3600.0)  # "just after", however slow this machine is

    async def scenario() -> tuple[LedgerUnavailableError, int]:
        async with committed_once_then_ended(postgres_url) as (ledger, token):
            with pytest.raises(LedgerUnavailableError) as caught:
                await awaited(ledger, [checkpoint(token, 2)])
            # The next commit opens a new connection for the loop.
            assert await awaited(ledger, [checkpoint(token, 3)]) == [None]
            return caught.value, ledger.resolve(["t/a"])["t/a"].continuity.checkpoint_version  # type: ignore[union-attr]

    error, version = asyncio.run(scenario())
    assert error.committed_unknown
    assert version == 3
