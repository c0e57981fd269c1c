"""B7 group-committed State snapshots per second, beside pickling each State to a file of its own.

No Ray. rayfleet side: the host's commit path itself, a
:class:`rayfleet.checkpoints._committer.GroupCommitter` over a
:class:`rayfleet.checkpoints._store.SnapshotStore` and a SQLite
:class:`rayfleet.ledger.LocalLedgerClient`: ``batch`` checkpoints are handed over
together (``commit_many``, as a host's bulk deactivation does), become one Arrow
file (written to a temporary name, fsynced, renamed, folder fsynced) and one fenced
ledger transaction moving every pointer (SQLite WAL, ``synchronous=FULL``). Each
identity holds a lease and commits under its token, at a version one higher each
round.

Baseline, durable the same way per file: each State pickled to its own file with the
same publish protocol (temporary name, fsync, rename, folder fsync), and no ledger.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from rayfleet.checkpoints._committer import Checkpoint, GroupCommitter
from rayfleet.checkpoints._store import SnapshotStore
from rayfleet.ledger import Activation, SpecRecord
from rayfleet.testing import LocalLedgerClient

from ._agents import BenchAgent
from ._context import Context, Mode, Store, Unit
from ._measure import interleave_async, summarize
from ._report import Result, Target, measured

HOLDER = "bench-b7@1"
LEASE_TTL = 24 * 3600.0
"""Long enough that no lease lapses during the run (the benchmark renews nothing)."""
REGISTER_BATCH = 5_000


@dataclass(frozen=True, slots=True)
class SnapshotSizes:
    rounds: int
    states: int
    """States committed per round (rayfleet side)."""
    batch: int
    """States per group commit."""
    files: int
    """States pickled to their own files per round (baseline side)."""


SIZES: dict[Mode, SnapshotSizes] = {
    "full": SnapshotSizes(rounds=5, states=10_000, batch=1_000, files=1_000),
    "quick": SnapshotSizes(rounds=5, states=5_000, batch=1_000, files=200),
    "smoke": SnapshotSizes(rounds=5, states=20, batch=10, files=10),
}


def _leased(ledger: LocalLedgerClient, identities: list[str]) -> dict[str, int]:
    """Register ``identities`` and lease them all to :data:`HOLDER`; each one's fencing token."""
    tokens: dict[str, int] = {}
    for start in range(0, len(identities), REGISTER_BATCH):
        chunk = identities[start:start + REGISTER_BATCH]
        ledger.register_many([SpecRecord(identity=identity, spec=b"b7", fingerprint="b7",
                                         agent_class="benchmarks._agents:BenchAgent") for identity in chunk]).result()
        granted = ledger.acquire(holder=HOLDER, identities=chunk, ttl=LEASE_TTL).result()
        for identity, outcome in granted.items():
            if not isinstance(outcome, Activation):
                raise RuntimeError(f"no lease on {identity}: {outcome}")
            tokens[identity] = outcome.grant.fencing_token
    return tokens


def _publish(folder: Path, name: str, content: bytes) -> None:
    """Write ``content`` as ``folder/name`` the way a snapshot file is published on a local disk."""
    temporary = folder / f".tmp-{name}"
    with open(temporary, "wb") as sink:
        sink.write(content)
        sink.flush()
        os.fsync(sink.fileno())
    os.replace(temporary, folder / name)
    directory = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


async def _rounds(root: Path, sizes: SnapshotSizes) -> dict[str, list[float]]:
    ledger = LocalLedgerClient(root / "ledger.sqlite")
    identities = [f"b7/{index}" for index in range(sizes.states)]
    tokens = _leased(ledger, identities)
    committer = GroupCommitter(writer="bench-b7", ledger=ledger, snapshots=SnapshotStore(str(root / "store")))
    committer.start()
    files = root / "pickles"
    files.mkdir()
    version = 0

    async def commit_all() -> float:
        nonlocal version
        version += 1
        states = [BenchAgent.State(total=version) for _ in identities]
        started = time.perf_counter()
        for start in range(0, len(identities), sizes.batch):
            outcomes = await committer.commit_many([
                Checkpoint(identity=identity, fencing_token=tokens[identity], version=version, state=state)
                for identity, state in zip(identities[start:start + sizes.batch], states[start:start + sizes.batch],
                                           strict=True)
            ])
            refused = [outcome for outcome in outcomes if isinstance(outcome, Exception)]
            if refused:
                raise RuntimeError(f"{len(refused)} checkpoints not committed, the first: {refused[0]!r}")
        return len(identities) / (time.perf_counter() - started)

    async def pickle_each() -> float:
        states = [BenchAgent.State(total=version) for _ in range(sizes.files)]
        started = time.perf_counter()
        for index, state in enumerate(states):
            _publish(files, f"{index}-{version}.pickle", pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL))
        return len(states) / (time.perf_counter() - started)

    try:
        await commit_all()  # warm-up: the codec, the file layout, the SQLite pages
        await pickle_each()
        return await interleave_async(sizes.rounds, {"rayfleet": commit_all, "baseline": pickle_each})
    finally:
        await committer.stop()
        ledger.close()


def snapshots(context: Context, store: Store) -> list[Result]:
    """B7: States group-committed per second, beside States pickled to their own fsynced files per second."""
    sizes = SIZES[context.mode]
    root = Path(tempfile.mkdtemp(prefix="rayfleet-bench-b7-"))
    try:
        rounds = asyncio.run(_rounds(root, sizes))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    detail = context.detail(
        sizes,
        rayfleet_work=f"GroupCommitter.commit_many of {sizes.batch} States at once: one Arrow file (fsync + folder "
                      "fsync) and one fenced SQLite transaction (WAL, synchronous=FULL) per batch",
        baseline="pickle.dumps of each State to its own file: temporary name, fsync, rename, folder fsync "
                 "(the snapshot files' publish protocol), no ledger",
    )
    return [measured(f"B7 snapshot commits {store}", rayfleet=summarize(rounds["rayfleet"]),
                     baseline=summarize(rounds["baseline"]), unit="states/s",
                     target=Target(text=">= 50,000/s and >= 5x", value_min=50_000.0, ratio_min=5.0), detail=detail)]


UNITS = (Unit("B7", "snapshot commits", snapshots),)
