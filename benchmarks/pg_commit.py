"""What a PostgreSQL checkpoint commit costs inside a Ray actor: ``python -m benchmarks.pg_commit [--calls 200]``.

Whole Ray calls timed from this process, each making one keyed checkpoint commit (an
inline State and one idempotency key) in a plain async actor over the same identity,
rounds interleaved. The modes:

* the ledger's commit (``Ledger`` over ``PostgresDatabase``: two exchanges, the
  conditional update whose row count is read, then the keys and the ``COMMIT``) on the
  ledger client's worker thread, as hosts commit, and on the event loop (blocking it);
* the same writes as one exchange (the update guarded in SQL by a function that
  raises when the row did not move, so the ``COMMIT`` can travel with it), on a
  worker thread and on psycopg's asynchronous connection on the event loop;
* one statement in autocommit (a ``WITH`` query that moves the pointer, remembers the
  key and trims the window: one round trip, no ``BEGIN`` or ``COMMIT`` of its own), on a
  worker thread;
* a lower bound: one exchange without the fence check, the guard or the trim of the
  key window, asynchronous;
* the call alone, with no commit.

Beside them, from this process: the ledger's commit in a loop, a bare ``UPDATE`` and
``COMMIT``, and ``SELECT 1``. Medians in milliseconds; results go to
``benchmarks/results/pg_commit.json``. The question this answers: would an
asynchronous or single-exchange commit path make an ``EVERY_TURN`` call on PostgreSQL
cheaper (README, "Where the targets are missed").
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import statistics
import time
from pathlib import Path
from typing import Any

import psycopg
import ray

from rayfleet.identity._values import SnapshotPointer
from rayfleet.ledger._ledger import Ledger
from rayfleet.ledger._local import LocalLedgerClient
from rayfleet.ledger._postgres import PostgresDatabase
from rayfleet.ledger._values import Activation, CheckpointCommit, SpecRecord

from ._context import PostgresLedgers
from ._report import write_figures

GUARD = """CREATE OR REPLACE FUNCTION bench_require(ok boolean) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN IF NOT ok THEN RAISE EXCEPTION 'the checkpoint did not pass' USING ERRCODE = 'RF001'; END IF; RETURN true; END
$$"""
MOVE = ("UPDATE continuity SET checkpoint_version = %s, snapshot_inline = %s, "
        "committed_at = EXTRACT(EPOCH FROM clock_timestamp())::float8 WHERE identity = %s AND checkpoint_version < %s")
FENCED = " AND EXISTS (SELECT 1 FROM fences WHERE fences.identity = continuity.identity AND fences.high_water = %s)"
GUARDED_MOVE = f"WITH moved AS ({MOVE}{FENCED} RETURNING 1) SELECT bench_require(EXISTS (SELECT 1 FROM moved))"
KEY = ("INSERT INTO dedup (identity, key, reply, seq) SELECT %s, %s, %s, COALESCE(MAX(seq), 0) + 1 "
       "FROM dedup WHERE identity = %s ON CONFLICT DO NOTHING")
ONE_STATEMENT = (
    "WITH moved AS (" + MOVE + FENCED + " RETURNING identity), "
    "base AS (SELECT COALESCE(MAX(seq), 0) AS top FROM dedup WHERE identity = %s), "
    "added AS (INSERT INTO dedup (identity, key, reply, seq) SELECT moved.identity, %s, %s, base.top + 1 "
    "FROM moved, base ON CONFLICT DO NOTHING RETURNING seq), "
    "trimmed AS (DELETE FROM dedup WHERE identity IN (SELECT identity FROM moved) "
    "AND seq <= (SELECT top FROM base) + 1 - %s) "
    "SELECT (SELECT count(*) FROM moved)"
)
TRIM = "DELETE FROM dedup WHERE identity = %s AND seq <= (SELECT MAX(seq) FROM dedup WHERE identity = %s) - %s"
STATE = b"x" * 200
WINDOW = 64

MODES = {
    "call alone, no commit": "nothing",
    "ledger commit (two exchanges), worker thread": "ledger_threaded",
    "ledger commit (two exchanges), on the event loop": "ledger_on_loop",
    "one exchange, guarded in SQL, worker thread": "one_threaded",
    "one exchange, guarded in SQL, asynchronous psycopg": "one_async",
    "one statement in autocommit, worker thread": "statement_threaded",
    "one exchange, unfenced and unguarded, asynchronous psycopg": "bound_async",
}


class Committer:
    """One identity's ledger, committing a keyed checkpoint per call in each of the ways :data:`MODES` names."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.ledger = Ledger(PostgresDatabase(url, pool_size=4))
        identity = f"pg-commit/{time.monotonic_ns()}"
        self.ledger.register(SpecRecord(identity=identity, spec=b"s", fingerprint="f", agent_class="m:C", labels={}))
        activation = self.ledger.acquire(holder="bench", identities=[identity], ttl=3600)[identity]
        if not isinstance(activation, Activation):
            raise RuntimeError(f"no lease for {identity}: {activation}")
        self.identity, self.token = identity, activation.grant.fencing_token
        self.client = LocalLedgerClient(self.ledger, threads=4)
        self.version = 0
        self._sync = psycopg.connect(url, autocommit=False)
        self._sync.isolation_level = psycopg.IsolationLevel.SERIALIZABLE
        self._sync.execute(GUARD)
        self._sync.commit()
        self._autocommit = psycopg.connect(url, autocommit=True)
        # A statement outside a transaction block runs as its own transaction at this level.
        self._autocommit.execute("SET default_transaction_isolation = 'serializable'")
        self._thread = concurrent.futures.ThreadPoolExecutor(1)
        self._async: psycopg.AsyncConnection[Any] | None = None

    def next(self) -> list[CheckpointCommit]:
        self.version += 1
        return [CheckpointCommit(
            identity=self.identity, fencing_token=self.token, version=self.version,
            pointer=SnapshotPointer(file="", row=0, version=self.version, inline=STATE),
            dedup=((f"key-{self.version}", b"reply"),),
        )]

    async def nothing(self) -> None:
        return None

    async def ledger_threaded(self) -> None:
        await self.client.commit_checkpoints(self.next())

    async def ledger_on_loop(self) -> None:
        self.ledger.commit_checkpoints(self.next())

    def _one_exchange(self) -> None:
        self.version += 1
        version, connection = self.version, self._sync
        with connection.pipeline():
            connection.execute(GUARDED_MOVE, (version, STATE, self.identity, version, self.token))
            connection.execute(KEY, (self.identity, f"key-{version}", b"reply", self.identity))
            connection.execute(TRIM, (self.identity, self.identity, WINDOW))
            connection.commit()

    async def one_threaded(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self._thread, self._one_exchange)

    def _one_statement(self) -> None:
        self.version += 1
        version = self.version
        row = self._autocommit.execute(ONE_STATEMENT, (
            version, STATE, self.identity, version, self.token, self.identity, f"key-{version}", b"reply", WINDOW,
        )).fetchone()
        if row != (1,):
            raise RuntimeError(f"the pointer did not move: {row}")

    async def statement_threaded(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self._thread, self._one_statement)

    async def _connection(self) -> psycopg.AsyncConnection[Any]:
        if self._async is None:
            self._async = await psycopg.AsyncConnection.connect(self.url, autocommit=False)
            await self._async.set_isolation_level(psycopg.IsolationLevel.SERIALIZABLE)
        return self._async

    async def one_async(self) -> None:
        connection = await self._connection()
        self.version += 1
        version = self.version
        async with connection.pipeline():
            await connection.execute(GUARDED_MOVE, (version, STATE, self.identity, version, self.token))
            await connection.execute(KEY, (self.identity, f"key-{version}", b"reply", self.identity))
            await connection.execute(TRIM, (self.identity, self.identity, WINDOW))
            await connection.commit()

    async def bound_async(self) -> None:
        connection = await self._connection()
        self.version += 1
        version = self.version
        async with connection.pipeline():
            await connection.execute(MOVE, (version, STATE, self.identity, version))
            await connection.execute(KEY, (self.identity, f"key-{version}", b"reply", self.identity))
            await connection.commit()

    async def check(self) -> int:
        """The identity's committed version: every mode moved it (a failed guard would have raised)."""
        rows = self.ledger.latest_checkpoints(after="", limit=10)
        return next(row.checkpoint_version for row in rows if row.identity == self.identity)


def median_ms(samples: list[float]) -> float:
    return round(statistics.median(samples), 3)


def measure(url: str, calls: int, rounds: int) -> dict[str, Any]:
    actor: Any = ray.remote(Committer).remote(url)
    per_round: dict[str, list[float]] = {name: [] for name in MODES}
    for method in MODES.values():
        for _ in range(20):
            ray.get(getattr(actor, method).remote())
    for _ in range(rounds):
        for name, method in MODES.items():
            remote = getattr(actor, method)
            started = time.perf_counter()
            for _ in range(calls):
                ray.get(remote.remote())
            per_round[name].append((time.perf_counter() - started) * 1000 / calls)
    committed = ray.get(actor.check.remote())
    ray.kill(actor)
    figures: dict[str, Any] = {"whole call from the driver": {name: median_ms(values)
                                                              for name, values in per_round.items()}}
    figures["versions committed"] = committed
    local = Committer(url)
    looped = []
    for _ in range(calls):
        commits = local.next()
        started = time.perf_counter()
        local.ledger.commit_checkpoints(commits)
        looped.append((time.perf_counter() - started) * 1000)
    in_process = {"ledger commit in a loop": median_ms(looped)}
    with psycopg.connect(url) as connection:
        bare, select = [], []
        for _ in range(calls):
            started = time.perf_counter()
            connection.execute("UPDATE continuity SET committed_at = 1 WHERE identity = %s", (local.identity,))
            connection.commit()
            bare.append((time.perf_counter() - started) * 1000)
        for _ in range(calls):
            started = time.perf_counter()
            connection.execute("SELECT 1").fetchone()
            select.append((time.perf_counter() - started) * 1000)
    in_process["bare UPDATE and COMMIT"] = median_ms(bare)
    in_process["SELECT 1"] = median_ms(select)
    figures["in this process"] = in_process
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.pg_commit")
    parser.add_argument("--calls", type=int, default=200, help="calls per mode and round")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "pg_commit.json"))
    options = parser.parse_args(argv)
    ledgers = PostgresLedgers()
    problem = ledgers.problem()
    if problem:
        print(f"nothing measured: {problem}")
        return 1
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        url, _ = ledgers.create()
        figures = measure(url, options.calls, options.rounds)
    finally:
        ledgers.close()
        ray.shutdown()
    for group in ("whole call from the driver", "in this process"):
        print(group)
        for name, value in figures[group].items():
            print(f"  {name}: {value:.3f} ms")
    write_figures(Path(options.out), {"calls": options.calls, "rounds": options.rounds, "median_ms": figures})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
