"""What a PostgreSQL checkpoint commit costs inside a Ray actor: ``python -m benchmarks.pg_commit [--calls 300]``.

One keyed checkpoint commit (an inline State and one idempotency key) per incoming Ray
call, made by a plain async actor holding a ``Ledger`` over ``PostgresDatabase``: on
the ledger client's worker thread (as hosts commit) and on the actor's event-loop thread
(blocking it). Beside them, from this process: the same commit in a loop, a bare
``UPDATE`` and ``COMMIT``, and ``SELECT 1``. Medians in milliseconds; results go to
``benchmarks/results/pg_commit.json``.
"""

from __future__ import annotations

import argparse
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


class Committer:
    """One identity's ledger, committing a keyed checkpoint per call."""

    def __init__(self, url: str) -> None:
        self.ledger = Ledger(PostgresDatabase(url, pool_size=4))
        identity = f"pg-commit/{time.monotonic_ns()}"
        self.ledger.register(SpecRecord(identity=identity, spec=b"s", fingerprint="f", agent_class="m:C", labels={}))
        activation = self.ledger.acquire(holder="bench", identities=[identity], ttl=3600)[identity]
        if not isinstance(activation, Activation):
            raise RuntimeError(f"no lease for {identity}: {activation}")
        self.identity, self.token = identity, activation.grant.fencing_token
        self.client = LocalLedgerClient(self.ledger, threads=4)
        self.version = 0

    def next(self) -> list[CheckpointCommit]:
        self.version += 1
        return [CheckpointCommit(
            identity=self.identity, fencing_token=self.token, version=self.version,
            pointer=SnapshotPointer(file="", row=0, version=self.version, inline=b"x" * 200),
            dedup=((f"key-{self.version}", b"reply"),),
        )]

    async def one(self, threaded: bool) -> float:
        commits = self.next()
        started = time.perf_counter()
        if threaded:
            await self.client.commit_checkpoints(commits)
        else:
            self.ledger.commit_checkpoints(commits)
        return (time.perf_counter() - started) * 1000


def median_ms(samples: list[float]) -> float:
    return round(statistics.median(samples), 3)


def measure(url: str, calls: int) -> dict[str, Any]:
    actor: Any = ray.remote(Committer).remote(url)
    figures: dict[str, float] = {}
    for threaded, name in ((True, "in an actor, one per call, on the worker thread"),
                           (False, "in an actor, one per call, on the event loop")):
        ray.get(actor.one.remote(threaded))
        figures[name] = median_ms([ray.get(actor.one.remote(threaded)) for _ in range(calls)])
    local = Committer(url)
    looped = []
    for _ in range(calls):
        commits = local.next()
        started = time.perf_counter()
        local.ledger.commit_checkpoints(commits)
        looped.append((time.perf_counter() - started) * 1000)
    figures["in this process, in a loop"] = median_ms(looped)
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
    figures["bare UPDATE and COMMIT"] = median_ms(bare)
    figures["SELECT 1"] = median_ms(select)
    ray.kill(actor)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.pg_commit")
    parser.add_argument("--calls", type=int, default=300)
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
        figures = measure(url, options.calls)
    finally:
        ledgers.close()
        ray.shutdown()
    for name, value in figures.items():
        print(f"{name}: {value:.3f} ms")
    write_figures(Path(options.out), {"calls": options.calls, "median_ms": figures})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
