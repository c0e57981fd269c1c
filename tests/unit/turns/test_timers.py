"""Reminders and schedules on real host runtimes and a real SQLite ledger (no Ray)."""

from __future__ import annotations

import asyncio
import time
import zoneinfo
from datetime import datetime
from pathlib import Path

import cloudpickle
import pytest

import rayfleet as rf
from rayfleet.checkpoints._store import SnapshotStore
from rayfleet.host import _runtime
from rayfleet.host._runtime import HostRuntime
from rayfleet.ledger import TimerRow
from rayfleet.ledger._ledger import Ledger
from rayfleet.ledger._local import LocalLedgerClient
from rayfleet.ledger._values import SpecRecord
from rayfleet.turns._timers import settlement


class Desk(rf.Agent):
    class State(rf.State):
        rang: list[str] = []

    @rf.handler
    async def ring(self, what: str) -> int:
        self.state.rang.append(what)
        return len(self.state.rang)

    @rf.handler
    async def rang(self) -> list[str]:
        return list(self.state.rang)

    @rf.handler
    async def set_reminder(self, name: str, after: float | None = None, every: float | None = None,
                           at: float | None = None, method: str = "ring") -> None:
        await self.remind(name, method=method, after=after, every=every, at=at, what=name)

    @rf.handler
    async def set_schedule(self, name: str, cron: str, tz: str = "UTC", catch_up: str = "latest") -> None:
        await self.schedule(name, cron=cron, tz=tz, method=Desk.ring, catch_up=catch_up, what=name)

    @rf.handler
    async def drop(self, name: str) -> bool:
        return await self.forget(name)


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    led = Ledger(tmp_path / "ledger.sqlite")
    spec = rf.AgentSpec(identity="desk/1", agent=Desk)
    led.register(SpecRecord(identity="desk/1", spec=cloudpickle.dumps(spec), fingerprint=spec.fingerprint(),
                            agent_class=spec.agent_class_path, labels={}, addressability=spec.addressability.value))
    return led


def host(ledger: Ledger, tmp_path: Path, name: str, *, wake_interval: float = 0.05) -> HostRuntime:
    return HostRuntime(name=name, ledger=LocalLedgerClient(ledger), snapshots=SnapshotStore(str(tmp_path)),
                       incarnation=name, wake_interval=wake_interval)


async def call(runtime: HostRuntime, handler: str, **kwargs: object) -> object:
    return (await runtime.delivery.deliver(rf.Envelope(target="desk/1", method=handler, kwargs=kwargs))).value


async def until(condition, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def test_a_reminder_fires_once_and_is_gone(ledger: Ledger, tmp_path: Path) -> None:
    async with host(ledger, tmp_path, "a") as a:
        await call(a, "set_reminder", name="tea", after=0.1)
        (timer,) = ledger.timers(identity="desk/1")
        assert (timer.name, timer.method, cloudpickle.loads(timer.payload)) == ("tea", "ring", {"what": "tea"})
        await until(lambda: ledger.timers(identity="desk/1") == [])
        assert await call(a, "rang") == ["tea"]


async def test_a_periodic_reminder_fires_every_period_counts_and_stops_when_forgotten(
    ledger: Ledger, tmp_path: Path,
) -> None:
    async with host(ledger, tmp_path, "a") as a:
        await call(a, "set_reminder", name="tick", every=0.1)
        await until(lambda: (rows := ledger.timers(identity="desk/1")) != [] and rows[0].fired >= 3)
        assert await call(a, "drop", name="tick") is True
        assert await call(a, "drop", name="tick") is False
        count = len(await call(a, "rang"))  # type: ignore[arg-type]
        await asyncio.sleep(0.4)
        assert len(await call(a, "rang")) == count >= 3  # type: ignore[arg-type]


async def test_a_due_timer_activates_a_dormant_identity(ledger: Ledger, tmp_path: Path) -> None:
    async with host(ledger, tmp_path, "a", wake_interval=60.0) as a:
        await call(a, "set_reminder", name="wake-up", after=0.3)
        assert await a.deactivate("desk/1") and not a.is_active("desk/1")
    async with host(ledger, tmp_path, "b") as b:  # the first host is gone; the next one fires it
        await until(lambda: ledger.timers(identity="desk/1") == [])
        assert b.is_active("desk/1") and await call(b, "rang") == ["wake-up"]


async def test_two_hosts_firing_one_scheduled_time_have_one_effect(ledger: Ledger, tmp_path: Path) -> None:
    async with host(ledger, tmp_path, "a", wake_interval=60.0) as a:
        await call(a, "set_reminder", name="once", at=time.time() + 0.05)
        await asyncio.sleep(0.1)
        (claimed,) = ledger.claim_timers(claim_for=0.0)  # claimed, and the claim lapses at once
        (again,) = ledger.claim_timers()  # ... so another host claims the same scheduled time
        assert claimed.next_due == again.next_due
        await asyncio.gather(a._fire_timer(claimed), a._fire_timer(again))
        assert await call(a, "rang") == ["once"]  # the key timer:once:<time> made it one effect
        assert ledger.timers(identity="desk/1") == []


async def test_a_schedule_follows_its_cron_expression_in_its_time_zone(ledger: Ledger, tmp_path: Path) -> None:
    async with host(ledger, tmp_path, "a", wake_interval=60.0) as a:
        await call(a, "set_schedule", name="digest", cron="0 8 * * 1-5", tz="Europe/Paris")
        (timer,) = ledger.timers(identity="desk/1")
        due = datetime.fromtimestamp(timer.next_due, zoneinfo.ZoneInfo("Europe/Paris"))
        assert (due.hour, due.minute) == (8, 0) and due.weekday() < 5 and timer.next_due > time.time()
        assert (timer.cron, timer.tz, timer.overlap, timer.catch_up) == ("0 8 * * 1-5", "Europe/Paris", "skip",
                                                                         "latest")


async def test_a_burst_of_due_timers_is_claimed_as_fast_as_the_host_fires_them(
    ledger: Ledger, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A host that claimed a whole burst at once would hold claims it cannot work on before
    # they lapse, and another host would fire the same times again.
    monkeypatch.setattr(_runtime, "FIRING_LIMIT", 4)
    async with host(ledger, tmp_path, "a", wake_interval=3600.0) as a:
        at = time.time() + 0.2
        for index in range(10):
            await call(a, "set_reminder", name=f"r{index}", at=at)
        await asyncio.sleep(max(0.0, at - time.time()) + 0.05)
        assert await a.wake_due() == 4  # the room it has, not the 10 due
        # The rest is claimed as the firings end, without waiting for the next interval (an hour).
        await until(lambda: ledger.timers(identity="desk/1") == [])
        assert sorted(await call(a, "rang")) == sorted(f"r{index}" for index in range(10))  # type: ignore[arg-type]


def _every_minute(catch_up: str, next_due: float) -> TimerRow:
    return TimerRow(identity="desk/1", name="m", method="ring", payload=b"", next_due=next_due, every=None,
                    cron="* * * * *", tz="UTC", overlap="skip", catch_up=catch_up, created=0.0, last_fired=None,
                    fired=0, missed=0, late=0, last_lateness=None)


@pytest.mark.parametrize(("catch_up", "next_offset", "missed"), [
    ("latest", 10 * 60, 9),  # fires once more, for the latest time that passed; the 9 before it skipped
    ("all", 60, 0),          # each time that passed fires in turn
    ("none", 11 * 60, 10),   # every time that passed is skipped
])
def test_the_catch_up_policy_decides_what_times_that_passed_do(catch_up: str, next_offset: int, missed: int) -> None:
    scheduled = 1_700_000_040.0 - 1_700_000_040.0 % 60  # a whole minute
    fired = settlement(_every_minute(catch_up, scheduled), now=scheduled + 10 * 60 + 5)  # 10 minutes down
    assert (fired.next_due, fired.missed) == (scheduled + next_offset, missed)
    assert fired.late and fired.lateness == pytest.approx(605.0)


async def test_bad_timers_are_refused_naming_the_problem(ledger: Ledger, tmp_path: Path) -> None:
    cases = [
        ({"name": "x"}, "needs a time"),
        ({"name": "x", "at": time.time() - 3600}, "in the past"),
        ({"name": "x", "every": 0}, "above 0"),
        ({"name": "x", "after": 1, "at": time.time() + 5}, "not both"),
        ({"name": "x", "after": 1, "method": "shout"}, "no such handler"),
    ]
    async with host(ledger, tmp_path, "a") as a:
        for kwargs, complaint in cases:
            with pytest.raises(rf.HandlerError) as failed:
                await call(a, "set_reminder", **kwargs)
            assert failed.value.remote_type.endswith("UsageError") and complaint in failed.value.remote_message
        for kwargs, complaint in (({"cron": "every day"}, "not a cron expression"),
                                  ({"cron": "0 8 * * *", "tz": "Mars/Olympus"}, "not a time zone"),
                                  ({"cron": "0 8 * * *", "catch_up": "some"}, "catch_up")):
            with pytest.raises(rf.HandlerError) as failed:
                await call(a, "set_schedule", name="s", **kwargs)
            assert complaint in failed.value.remote_message
    assert ledger.timers() == []
