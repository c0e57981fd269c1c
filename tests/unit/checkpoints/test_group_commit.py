"""Many checkpoints handed to the group committer at once: one outcome each, in order, and never a hang (no Ray)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import cloudpickle

import rayfleet as rf
from rayfleet.checkpoints._committer import Checkpoint, Committed, GroupCommitter
from rayfleet.checkpoints._store import SnapshotStore
from rayfleet.errors import StaleCheckpointVersionError, StaleFencingTokenError
from rayfleet.ledger._ledger import Ledger
from rayfleet.ledger._local import LocalLedgerClient
from rayfleet.ledger._values import Activation, SpecRecord


class Tally(rf.State):
    count: int = 0


class Counter(rf.Agent):
    State = Tally


def lease(ledger: Ledger, identity: str) -> int:
    spec = rf.AgentSpec(identity=identity, agent=Counter)
    ledger.register(SpecRecord(identity=identity, spec=cloudpickle.dumps(spec), fingerprint=spec.fingerprint(),
                               agent_class=spec.agent_class_path))
    activation = ledger.acquire(holder="h", identities=[identity])[identity]
    assert isinstance(activation, Activation)
    return activation.grant.fencing_token


async def test_commit_many_answers_each_checkpoint_in_order_refusals_beside_successes(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.sqlite")
    names = [f"c/{index}" for index in range(200)]
    tokens = {name: lease(ledger, name) for name in names}
    committer = GroupCommitter(writer="h", ledger=LocalLedgerClient(ledger),
                               snapshots=SnapshotStore(str(tmp_path / "store")))
    committer.start()
    try:
        checkpoints = [Checkpoint(identity=name, fencing_token=tokens[name], version=1, state=Tally(count=index))
                       for index, name in enumerate(names)]
        checkpoints[7] = Checkpoint(identity="c/7", fencing_token=tokens["c/7"] - 1, version=1, state=Tally())
        outcomes = await committer.commit_many(checkpoints)
        again = await committer.commit_many([Checkpoint(identity="c/0", fencing_token=tokens["c/0"], version=1,
                                                        state=Tally(count=99))])
    finally:
        await committer.stop()
    assert len(outcomes) == 200 and isinstance(outcomes[7], StaleFencingTokenError)
    assert all(isinstance(outcome, Committed) and outcome.step is None
               for index, outcome in enumerate(outcomes) if index != 7)
    assert isinstance(again[0], StaleCheckpointVersionError)  # version 1 is committed already
    views = ledger.resolve(names)
    assert views["c/7"].continuity.checkpoint_version == 0
    assert {views[name].continuity.checkpoint_version for name in names if name != "c/7"} == {1}
    assert committer.checkpoints == 199


class _StuckLedger(LocalLedgerClient):
    """A ledger client whose commits never come back until released (a ledger that stopped answering)."""

    def __init__(self, ledger: Ledger) -> None:
        super().__init__(ledger)
        self.entered = threading.Event()
        self.release = asyncio.Event()

    async def _stuck(self, commits: Any) -> list[Any]:
        self.entered.set()
        await self.release.wait()
        return [None] * len(commits)

    def commit_checkpoints(self, commits: Any) -> Any:  # type: ignore[override]
        return self._stuck(list(commits))


async def test_stopping_the_committer_mid_commit_answers_its_waiters_as_unknown(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.sqlite")
    token = lease(ledger, "c/stuck")
    client = _StuckLedger(ledger)
    committer = GroupCommitter(writer="h", ledger=client, snapshots=SnapshotStore(str(tmp_path / "store")))
    committer.start()
    waiting = asyncio.ensure_future(committer.commit_many(
        [Checkpoint(identity="c/stuck", fencing_token=token, version=1, state=Tally())]))
    while not client.entered.is_set():
        await asyncio.sleep(0.001)
    await committer.stop()
    (outcome,) = await asyncio.wait_for(waiting, 10)  # before: waited for ever
    assert isinstance(outcome, rf.LedgerUnavailableError) and outcome.committed_unknown
