"""A SQLite ledger actor that is gone answers with the typed, retryable rf.LedgerUnavailableError.

Found by the chaos suite: while the ledger actor restarted, a turn whose commit was in
flight reached its caller as a generic "internal error ... this is a rayfleet bug" from
the host, and driver calls raised Ray's own ``ActorDiedError``/``ActorUnavailableError``.
Hosts and drivers on the file's node now write the file themselves, so only callers
that go through the actor (a driver that attaches, ``connect(create=False)``, like every
``rayfleet`` command) meet its absence.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import ray
from agents import Counter

import rayfleet as rf


@pytest.mark.timeout(120)
def test_calls_while_the_ledger_actor_is_gone_raise_ledger_unavailable(tmp_path: Path) -> None:
    options = {"storage": tmp_path / "store", "namespace": f"t-{uuid.uuid4().hex[:10]}", "hosts": 1}
    fleet = rf.connect(**options)  # type: ignore[arg-type]
    try:
        ref = fleet.spawn("outage/counter", Counter)
        assert ref.call("add", n=1) == 1
        attached = rf.connect(create=False, **options)  # type: ignore[arg-type]
        # Gone for good (no restart), so every later ledger call through it meets a dead actor.
        ray.kill(ray.get_actor("rayfleet-ledger", namespace=fleet.config.namespace), no_restart=True)
        with pytest.raises(rf.LedgerUnavailableError) as from_driver:
            for _ in range(50):  # ray.kill returns before the actor is dead
                attached.status("outage/counter")
        assert from_driver.value.committed_unknown and "rayfleet-ledger" in str(from_driver.value)
        assert isinstance(from_driver.value, ConnectionError)  # retryable, like every LedgerUnavailableError
        # The host and the driver that started the fleet run on the file's node and write it themselves.
        host = ray.get_actor("rayfleet-host-0", namespace=fleet.config.namespace)
        assert ray.get(host.statistics.remote()).ledger_route == "direct"
        assert ref.call("add", n=1, timeout=30) == 2
        assert fleet.status("outage/counter").checkpoint_version == 2
    finally:
        # A second connect starts a new ledger actor on the same file, so the fleet can be shut down.
        rf.connect(**options).shutdown(stop_actors=True)  # type: ignore[arg-type]
