"""Processes beside a SQLite ledger open its file themselves: no lock-delay from them, and their operations counted."""

from __future__ import annotations

from pathlib import Path

import cloudpickle
import pytest

import rayfleet as rf
from rayfleet.ledger._ledger import Ledger
from rayfleet.ledger._local import LocalLedgerClient
from rayfleet.ledger._values import Activation, SpecRecord
from rayfleet.testing import ManualClock

TTL = 10.0


class Plain(rf.Agent):
    pass


def acquire(ledger: Ledger, holder: str) -> Activation | object:
    return ledger.acquire(holder=holder, identities=["a"], ttl=TTL)["a"]


def test_a_direct_opening_is_not_a_restart_and_does_not_delay_a_dead_holders_lease(tmp_path: Path) -> None:
    clock = ManualClock()
    path = tmp_path / "ledger.sqlite"
    authority = Ledger(path, clock=clock)
    spec = rf.AgentSpec(identity="a", agent=Plain)
    authority.register(SpecRecord(identity="a", spec=cloudpickle.dumps(spec), fingerprint=spec.fingerprint(),
                                  agent_class=spec.agent_class_path))
    assert isinstance(acquire(authority, "dead-host"), Activation)
    clock.advance(TTL - 1)
    # A host starting beside the ledger opens the file: the dead holder's lease still ends on time.
    beside = Ledger(path, clock=clock, authority=False)
    clock.advance(1.01)
    assert isinstance(acquire(beside, "live-host"), Activation)
    # The same opening as the authority (a restarted ledger actor) does apply lock-delay:
    # the live host's lease, 1 s from its end, is extended by one TTL.
    clock.advance(TTL - 1)
    restarted = Ledger(path, clock=clock)
    clock.advance(1.01)
    assert not isinstance(acquire(restarted, "third-host"), Activation)
    for ledger in (authority, beside, restarted):
        ledger.close()


def test_a_direct_client_reports_every_operation_with_its_outcome(tmp_path: Path) -> None:
    heard: list[tuple[str, str]] = []
    client = LocalLedgerClient(Ledger(tmp_path / "ledger.sqlite"), threads=2,
                               observe=lambda name, outcome, seconds: heard.append((name, outcome)))
    try:
        assert client.route == "direct"
        client.fleet_identity().result()
        with pytest.raises(rf.UnknownIdentityError):
            client.set_lifecycle(identity="nobody", fencing_token=1, lifecycle="live").result()
    finally:
        client.close()
    assert heard == [("fleet_identity", "OK"), ("set_lifecycle", "UnknownIdentityError")]
