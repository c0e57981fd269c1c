"""What a PostgreSQL checkpoint commit costs inside a Ray actor: ``python -m benchmarks.pg_commit [--calls 200]``.

Whole Ray calls timed from this process, each making one keyed checkpoint commit (an
inline State and one idempotency key) in a plain async actor over the same identity,
rounds interleaved. The modes:

* the ledger client's commit awaited on the actor's event loop, as hosts commit
  (``LocalLedgerClient`` over ``PostgresDatabase``: one statement outside any
  transaction, see ``_checkpoints.alone``, sent with psycopg's asynchronous connection);
* the same statement sent blocking, on a worker thread (as hosts committed before) and
  on the event loop (blocking it);
* the transaction that statement replaced (the guarded update, whose row count is read,
  then the keys and the ``COMMIT``), on a worker thread;
* the call alone, with no commit.

Beside them, from this process: the ledger's commit in a loop, a bare ``UPDATE`` and
``COMMIT``, and ``SELECT 1``. Medians in milliseconds; results go to
``benchmarks/results/pg_commit.json``.
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
from rayfleet.ledger import _checkpoints
from rayfleet.ledger._ledger import Ledger
from rayfleet.ledger._local import LocalLedgerClient
from rayfleet.ledger._postgres import PostgresDatabase
from rayfleet.ledger._values import Activation, CheckpointCommit, SpecRecord

from ._context import PostgresLedgers
from ._report import write_figures

STATE = b"x" * 200

MODES = {
    "call alone, no commit": "nothing",
    "ledger client's commit, awaited on the event loop, as hosts commit": "client_awaited",
    "ledger commit (one statement), on a worker thread, as hosts committed before": "ledger_threaded",
    "ledger commit (one statement), blocking the event loop": "ledger_on_loop",
    "the transaction it replaced, worker thread": "transaction_threaded",
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
        self._thread = concurrent.futures.ThreadPoolExecutor(1)

    def next(self) -> list[CheckpointCommit]:
        self.version += 1
        return [CheckpointCommit(
            identity=self.identity, fencing_token=self.token, version=self.version,
            pointer=SnapshotPointer(file="", row=0, version=self.version, inline=STATE),
            dedup=((f"key-{self.version}", b"reply"),),
        )]

    async def nothing(self) -> None:
        return None

    async def client_awaited(self) -> None:
        if await self.client.commit_checkpoints(self.next()) != [None]:
            raise RuntimeError("the commit was refused")

    async def ledger_threaded(self) -> None:
        commits = self.next()
        outcomes = await asyncio.get_running_loop().run_in_executor(self._thread, self.ledger.commit_checkpoints,
                                                                    commits)
        if outcomes != [None]:
            raise RuntimeError(f"the commit was refused: {outcomes}")

    async def ledger_on_loop(self) -> None:
        self.ledger.commit_checkpoints(self.next())

    def _transaction(self) -> None:
        batch = self.next()
        clock = _checkpoints.StoreClock(PostgresDatabase.clock_sql)
        outcomes = self.ledger._db.write(lambda tx: _checkpoints.commit(tx, batch, clock))
        if outcomes != [None]:
            raise RuntimeError(f"the commit was refused: {outcomes}")

    async def transaction_threaded(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self._thread, self._transaction)

    async def check(self) -> int:
        """The identity's committed version: every mode moved it (a refusal would have raised)."""
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
