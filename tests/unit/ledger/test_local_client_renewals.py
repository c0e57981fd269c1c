"""A lease renewal is not queued behind the other ledger calls of a busy process.

A host under activation load submits lease grants faster than its worker threads run
them; a renewal queued behind hundreds of them came back after the leases it renewed
had lapsed, and the host dropped every agent it held (B4 at 60,000 agents).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from rayfleet.ledger._ledger import Ledger
from rayfleet.ledger._local import LocalLedgerClient
from rayfleet.ledger._values import Activation, SpecRecord


def test_a_renewal_is_answered_while_a_backlog_of_other_calls_waits(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.sqlite")
    ledger.register(SpecRecord(identity="a", spec=b"s", fingerprint="f", agent_class="m:C", labels={}))
    activation = ledger.acquire(holder="h", identities=["a"], ttl=60.0)["a"]
    assert isinstance(activation, Activation)
    client = LocalLedgerClient(ledger, threads=2)
    gate = threading.Event()
    real_select = ledger.select_identities

    def blocked_select(**kwargs: Any) -> list[str]:
        gate.wait(30)
        return real_select(**kwargs)

    ledger.select_identities = blocked_select  # type: ignore[method-assign]
    try:
        backlog = [client.select_identities(labels={}) for _ in range(20)]  # 2 running, 18 queued
        lost = client.renew(holder="h", tokens={"a": activation.grant.fencing_token}).result(timeout=10)
        assert lost == frozenset()
        released = client.release(holder="h", tokens={"a": activation.grant.fencing_token}).result(timeout=10)
        assert released == 1
        assert not any(call._future.done() for call in backlog)  # type: ignore[attr-defined]
    finally:
        gate.set()
        client.close()
