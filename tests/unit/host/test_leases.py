"""``LeaseKeeper`` on its own: a real SQLite ledger, a small port standing in for the runtime, time moved by hand.

The ledger and the keeper share one manual clock, so a lease that lapses here lapses in
the ledger too, and a rival host can take it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
from agents import Counter

import rayfleet as rf
from rayfleet.host import _leases as leases_module
from rayfleet.host._hosted import HostedAgent
from rayfleet.host._leases import LeaseKeeper, renewal_backoff
from rayfleet.identity._values import EventKind, LeaseDenied
from rayfleet.ledger._ledger import Ledger
from rayfleet.ledger._local import LocalLedgerClient
from rayfleet.ledger._values import Activation, SpecRecord
from rayfleet.testing import ManualClock

HOLDER = "host-a@a"
TTL = 10.0


class RuntimeSide:
    """The runtime's side of the keeper, as the runtime does it: a dropped agent leaves ``entries``."""

    def __init__(self, entries: dict[str, HostedAgent]) -> None:
        self.entries = entries
        self.listening: set[str] = set()
        self.dropped: list[tuple[str, str]] = []
        self.events: list[tuple[str, EventKind, dict[str, Any]]] = []

    async def drop(self, entry: HostedAgent, reason: str) -> None:
        entry.dropped = True
        self.entries.pop(entry.spec.identity, None)
        self.dropped.append((entry.spec.identity, reason))

    def emit(self, identity: str, kind: EventKind, **details: Any) -> None:
        self.events.append((identity, kind, details))

    def listened_among(self, identities: Collection[str]) -> list[str]:
        return [identity for identity in self.listening if identity in identities]


class CountingClient(LocalLedgerClient):
    """The real client; records the leases each renewal carries, and fails a call named in ``fail`` once per entry."""

    def __init__(self, ledger: Ledger) -> None:
        super().__init__(ledger)
        self.calls: dict[str, int] = defaultdict(int)
        self.renewed: list[set[str]] = []
        self.fail: dict[str, list[BaseException]] = defaultdict(list)

    def _called(self, name: str) -> None:
        self.calls[name] += 1
        if self.fail[name]:
            raise self.fail[name].pop(0)

    async def renew(self, *, holder: str, tokens: Mapping[str, int]) -> frozenset[str]:  # type: ignore[override]
        self._called("renew")
        self.renewed.append(set(tokens))
        return await LocalLedgerClient.renew(self, holder=holder, tokens=tokens)

    async def renew_holder(self, *, holder: str, ttl: float) -> bool:  # type: ignore[override]
        self._called("renew_holder")
        return await LocalLedgerClient.renew_holder(self, holder=holder, ttl=ttl)

    async def release(self, *, holder: str, tokens: Mapping[str, int]) -> int:  # type: ignore[override]
        self._called("release")
        return await LocalLedgerClient.release(self, holder=holder, tokens=tokens)


def outage() -> rf.LedgerUnavailableError:
    return rf.LedgerUnavailableError(location="test ledger", detail="connection refused")


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def ledger(tmp_path: Path, clock: ManualClock) -> Ledger:
    return Ledger(tmp_path / "ledger.sqlite", clock=clock)


def host(ledger: Ledger, clock: ManualClock, *identities: str) -> tuple[LeaseKeeper, RuntimeSide, CountingClient]:
    """A keeper holding fresh leases on ``identities``, each dated now, as an activation leaves them."""
    entries: dict[str, HostedAgent] = {}
    for identity in identities:
        spec = rf.AgentSpec(identity=identity, agent=Counter)
        ledger.register(SpecRecord(
            identity=identity, spec=cloudpickle.dumps(spec), fingerprint=spec.fingerprint(),
            agent_class=spec.agent_class_path, labels=dict(spec.labels), addressability=spec.addressability.value,
        ))
        activation = ledger.acquire(holder=HOLDER, identities=[identity], ttl=TTL)[identity]
        assert isinstance(activation, Activation) and activation.view.continuity is not None
        entries[identity] = HostedAgent(
            spec=spec, agent=Counter(), record=activation.view.continuity, grant=activation.grant,
            installed_at=clock.now, checkpoint_version=0,
        )
    side = RuntimeSide(entries)
    client = CountingClient(ledger)
    keeper = LeaseKeeper(name="host-a", holder=HOLDER, ledger=client, entries=entries, port=side, ttl=TTL,
                         clock=clock)
    return keeper, side, client


def held_by_rival(ledger: Ledger, identity: str) -> bool:
    return isinstance(ledger.acquire(holder="rival", identities=[identity], ttl=TTL)[identity], Activation)


def test_renewal_backoff_grows_and_caps() -> None:
    assert renewal_backoff(0) == 1.0
    assert renewal_backoff(1) == 2.0
    assert renewal_backoff(6) == 60.0
    assert renewal_backoff(99) == 60.0
    assert renewal_backoff(2, cap=3.0) == 3.0


async def test_a_lost_lease_drops_its_agent_through_the_port_and_the_rest_are_renewed(
    ledger: Ledger, clock: ManualClock,
) -> None:
    keeper, side, _ = host(ledger, clock, "c/1", "c/2")
    clock.advance(TTL + 1)  # frozen past the TTL, and a rival took c/1
    assert held_by_rival(ledger, "c/1")
    assert await keeper.renew_once() == 1
    assert side.dropped == [("c/1", "lease lost at renewal")]
    assert list(side.entries) == ["c/2"] and side.entries["c/2"].installed_at == clock.now
    assert [(identity, kind) for identity, kind, _ in side.events] == [("c/2", EventKind.LEASE_UPDATED)]
    assert not held_by_rival(ledger, "c/2")
    assert keeper.renewals == 1


async def test_a_renewal_in_chunks_renews_every_lease(
    ledger: Ledger, clock: ManualClock, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(leases_module, "RENEWAL_CHUNK", 2)
    identities = [f"c/{index}" for index in range(5)]
    keeper, side, client = host(ledger, clock, *identities)
    clock.advance(TTL * 2 / 3)
    assert await keeper.renew_once() == 5
    assert [len(chunk) for chunk in client.renewed] == [2, 2, 1]
    assert set().union(*client.renewed) == set(identities)
    assert all(entry.installed_at == clock.now for entry in side.entries.values())
    clock.advance(TTL / 2)  # past every lease's first date: only the renewal keeps them here
    assert not any(held_by_rival(ledger, identity) for identity in identities)


async def test_once_the_holder_row_is_armed_one_write_renews_every_lease(ledger: Ledger, clock: ManualClock) -> None:
    keeper, side, client = host(ledger, clock, "c/1", "c/2")
    assert await keeper.renew_once() == 2  # lease by lease, then the row is armed
    side.events.clear()
    side.listening.add("c/2")
    for _ in range(3):
        clock.advance(keeper.next_delay())
        assert await keeper.renew_once() == 2
    assert (client.calls["renew"], client.calls["renew_holder"]) == (1, 3)
    # The entries keep their first dates; the holder row's renewal is what keeps them live.
    assert keeper.expiry(side.entries["c/1"]) == clock.now + TTL
    assert [(identity, kind) for identity, kind, _ in side.events] == [("c/2", EventKind.LEASE_UPDATED)] * 3
    assert not held_by_rival(ledger, "c/1")


async def test_a_failed_renewal_is_retried_sooner_and_never_after_the_lease_is_in_danger(
    ledger: Ledger, clock: ManualClock,
) -> None:
    keeper, side, client = host(ledger, clock, "c/1")
    assert keeper.next_delay() == pytest.approx(TTL / 3)
    client.fail["renew"] += [outage(), outage()]
    clock.advance(keeper.next_delay())
    await keeper.attempt()  # never raises: the loop must outlive a failure
    assert keeper.next_delay() == pytest.approx(renewal_backoff(0))
    clock.advance(keeper.next_delay())
    await keeper.attempt()
    assert keeper.next_delay() == pytest.approx(TTL * leases_module.RENEWAL_DANGER_FRACTION)  # 2 s, capped at TTL/10
    clock.advance(keeper.next_delay())
    await keeper.attempt()
    assert client.calls["renew"] == 3 and side.dropped == []
    assert side.entries["c/1"].installed_at == clock.now
    assert keeper.next_delay() == pytest.approx(TTL / 3)


async def test_ensure_healthy_renews_only_a_lease_nearly_gone(ledger: Ledger, clock: ManualClock) -> None:
    keeper, side, client = host(ledger, clock, "c/1")
    entry = side.entries["c/1"]
    clock.advance(TTL * 0.7)
    await keeper.ensure_healthy(entry)
    assert client.calls["renew"] == 0
    clock.advance(TTL * 0.15)  # less than a fifth of the TTL left
    await keeper.ensure_healthy(entry)
    assert client.calls["renew"] == 1 and entry.installed_at == clock.now and keeper.renewals == 1


async def test_ensure_healthy_drops_an_agent_whose_lease_is_gone(ledger: Ledger, clock: ManualClock) -> None:
    keeper, side, _ = host(ledger, clock, "c/1")
    entry = side.entries["c/1"]
    clock.advance(TTL + 1)
    assert held_by_rival(ledger, "c/1")
    with pytest.raises(rf.LeaseLostError):
        await keeper.ensure_healthy(entry)
    assert side.dropped == [("c/1", "lease lost at renewal")] and entry.dropped


async def test_a_release_that_failed_is_retried_with_the_next_renewal(ledger: Ledger, clock: ManualClock) -> None:
    keeper, side, client = host(ledger, clock, "c/1")
    entry = side.entries.pop("c/1")  # the runtime deactivated it
    client.fail["release"].append(outage())
    await keeper.release({"c/1": entry.grant.fencing_token})  # never raises
    assert isinstance(ledger.acquire(holder="rival", identities=["c/1"], ttl=TTL)["c/1"], LeaseDenied)
    await keeper.renew_once()
    assert client.calls["release"] == 2
    assert held_by_rival(ledger, "c/1")
