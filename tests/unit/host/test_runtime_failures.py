"""The host runtime when ledger calls fail, lose their reply, are refused, or interleave.

A real SQLite ledger and real snapshot files throughout; ``FaultyLedgerClient`` is a
thin wrapper around the real client that makes a chosen call fail before it runs,
lose its reply after it ran, or stop at a gate until the test lets it go on, so each
interleaving is forced deterministically on the one event loop.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
from agents import Counter
from delivery import deliver

import rayfleet as rf
from rayfleet.checkpoints._store import SnapshotStore
from rayfleet.errors import is_retryable
from rayfleet.host._runtime import HostRuntime
from rayfleet.identity._values import LeaseDenied
from rayfleet.ledger._ledger import Ledger
from rayfleet.ledger._local import LocalLedgerClient
from rayfleet.ledger._values import Activation, SpecRecord
from rayfleet.testing import ManualClock


def register(ledger: Ledger, identity: str, **options: object) -> None:
    spec = rf.AgentSpec(identity=identity, agent=Counter, **options)  # type: ignore[arg-type]
    ledger.register(SpecRecord(
        identity=identity, spec=cloudpickle.dumps(spec), fingerprint=spec.fingerprint(),
        agent_class=spec.agent_class_path, labels=dict(spec.labels), addressability=spec.addressability.value,
    ))


class Gate:
    """Where a gated call stops: ``reached`` is set when it gets there, it goes on at ``release``."""

    def __init__(self) -> None:
        self.reached = asyncio.Event()
        self.release = asyncio.Event()


class FaultyLedgerClient(LocalLedgerClient):
    """The real client; a call named in ``fail`` raises before it runs, one in ``lose_reply``
    runs and then raises (its reply was lost), one in ``twice`` runs twice and answers with the
    second reply, one in ``gates`` stops after it ran until released."""

    def __init__(self, ledger: Ledger, *, during: dict[str, Callable[[], None]] | None = None) -> None:
        super().__init__(ledger)
        self.fail: dict[str, list[BaseException]] = defaultdict(list)
        self.lose_reply: dict[str, list[BaseException]] = defaultdict(list)
        self.gates: dict[str, Gate] = {}
        self.twice: set[str] = set()
        self.during = during or {}
        self.calls: dict[str, int] = defaultdict(int)

    async def _intercept(self, name: str, run: Callable[[], Awaitable[Any]]) -> Any:
        self.calls[name] += 1
        if self.fail[name]:
            raise self.fail[name].pop(0)
        if name in self.during:
            self.during[name]()
        result = await run()
        if name in self.twice:
            # The request reached the ledger twice (a transport retry); the caller sees the second reply.
            self.twice.discard(name)
            result = await run()
        gate = self.gates.pop(name, None)
        if gate is not None:
            gate.reached.set()
            await gate.release.wait()
        if self.lose_reply[name]:
            raise self.lose_reply[name].pop(0)
        return result

    def commit_checkpoints(self, commits: Any) -> Any:  # type: ignore[override]
        return self._intercept("commit_checkpoints", lambda: LocalLedgerClient.commit_checkpoints(self, commits))

    def resolve(self, identities: Any) -> Any:  # type: ignore[override]
        return self._intercept("resolve", lambda: LocalLedgerClient.resolve(self, identities))

    def acquire(self, **kwargs: Any) -> Any:  # type: ignore[override]
        return self._intercept("acquire", lambda: LocalLedgerClient.acquire(self, **kwargs))

    def renew(self, **kwargs: Any) -> Any:  # type: ignore[override]
        return self._intercept("renew", lambda: LocalLedgerClient.renew(self, **kwargs))

    def renew_holder(self, **kwargs: Any) -> Any:  # type: ignore[override]
        return self._intercept("renew_holder", lambda: LocalLedgerClient.renew_holder(self, **kwargs))

    def arm_holder(self, **kwargs: Any) -> Any:  # type: ignore[override]
        return self._intercept("arm_holder", lambda: LocalLedgerClient.arm_holder(self, **kwargs))

    def release(self, **kwargs: Any) -> Any:  # type: ignore[override]
        return self._intercept("release", lambda: LocalLedgerClient.release(self, **kwargs))

    def park(self, **kwargs: Any) -> Any:  # type: ignore[override]
        return self._intercept("park", lambda: LocalLedgerClient.park(self, **kwargs))

    def parked(self, identity: str, *, limit: int = 1000) -> Any:  # type: ignore[override]
        return self._intercept("parked", lambda: LocalLedgerClient.parked(self, identity, limit=limit))

    def set_paused(self, **kwargs: Any) -> Any:  # type: ignore[override]
        return self._intercept("set_paused", lambda: LocalLedgerClient.set_paused(self, **kwargs))

    def cancel_parked(self, **kwargs: Any) -> Any:  # type: ignore[override]
        return self._intercept("cancel_parked", lambda: LocalLedgerClient.cancel_parked(self, **kwargs))


def outage() -> rf.LedgerUnavailableError:
    return rf.LedgerUnavailableError(location="test ledger", detail="connection refused")


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(tmp_path / "ledger.sqlite")


def host_on(client: LocalLedgerClient, tmp_path: Path, **options: Any) -> HostRuntime:
    return HostRuntime(name="host-a", ledger=client, snapshots=SnapshotStore(str(tmp_path)), incarnation="a",
                       **options)


def remembered(ledger: Ledger, identity: str) -> list[str]:
    """The idempotency keys the ledger remembers for ``identity``, without their sender prefix."""
    return [key.rsplit("\x1f", 1)[-1] for key, _ in ledger.dedup_window(identity)]


async def settle() -> None:
    """Let every task that can run without waiting for time run (the ledger here never suspends)."""
    for _ in range(20):
        await asyncio.sleep(0)


# -- R3: a failed commit leaves nothing that looks acknowledged -------------------------


@pytest.mark.parametrize("failure", [outage, lambda: OSError("disk full")], ids=["ledger-outage", "storage-error"])
async def test_a_keyed_retry_after_a_failed_commit_runs_and_commits(
    ledger: Ledger, tmp_path: Path, failure: Callable[[], BaseException]
) -> None:
    register(ledger, "c/1")
    client = FaultyLedgerClient(ledger)
    snapshots = SnapshotStore(str(tmp_path))
    # Every State to a file (inline_limit=0), so that a storage error can fail the commit.
    async with HostRuntime(name="host-a", ledger=client, snapshots=snapshots, incarnation="a", inline_limit=0) as host:
        assert (await deliver(host, "c/1", "add", (), {"n": 1}, idempotency_key="k0")).value == 1
        error = failure()
        if isinstance(error, OSError):
            original = snapshots.write_batch
            calls = iter([error])

            def failing_write(**kwargs: Any) -> str:
                problem = next(calls, None)
                if problem is not None:
                    raise problem
                return original(**kwargs)

            snapshots.write_batch = failing_write  # type: ignore[method-assign]
        else:
            client.fail["commit_checkpoints"].append(error)
        with pytest.raises(type(error)):
            await deliver(host, "c/1", "add", (), {"n": 5}, idempotency_key="k1")
        retry = await deliver(host, "c/1", "add", (), {"n": 5}, idempotency_key="k1")
        assert not retry.duplicate  # the first attempt was never durable, so it never happened
        assert retry.value == 6 and retry.checkpoint_version == 2
        assert remembered(ledger, "c/1") == ["k0", "k1"]
        assert (await deliver(host, "c/1", "add", (), {"n": 0})).value == 6


async def test_an_unkeyed_turn_whose_commit_failed_leaves_no_effect(ledger: Ledger, tmp_path: Path) -> None:
    register(ledger, "c/1")
    client = FaultyLedgerClient(ledger)
    async with host_on(client, tmp_path) as host:
        await deliver(host, "c/1", "add", (), {"n": 1})
        client.fail["commit_checkpoints"].append(outage())
        with pytest.raises(rf.LedgerUnavailableError):
            await deliver(host, "c/1", "add", (), {"n": 5})
        # The reply said "failed": a later turn must not see (or make durable) its effect.
        assert (await deliver(host, "c/1", "add", (), {"n": 0})).value == 1
        view = ledger.resolve(["c/1"])["c/1"]
        assert view.continuity is not None and view.continuity.checkpoint_version == 1
        assert host.statistics().leases_lost == 0


async def test_periodic_keys_stay_pending_with_the_state_when_a_commit_fails(ledger: Ledger, tmp_path: Path) -> None:
    register(ledger, "c/1", durability=rf.Durability.PERIODIC, checkpoint_interval=3600.0)
    client = FaultyLedgerClient(ledger)
    async with host_on(client, tmp_path) as host:
        assert (await deliver(host, "c/1", "add", (), {"n": 2}, idempotency_key="k1")).value == 2
        client.fail["commit_checkpoints"].append(outage())
        with pytest.raises(rf.LedgerUnavailableError):
            await host.flush()
        assert (await deliver(host, "c/1", "add", (), {"n": 2}, idempotency_key="k1")).duplicate
        assert await host.flush() == 1
        assert remembered(ledger, "c/1") == ["k1"]


# -- R16: a lost reply is an unknown outcome, resolved by reading the ledger ------------


async def test_a_commit_whose_reply_was_lost_but_landed_is_a_success(ledger: Ledger, tmp_path: Path) -> None:
    register(ledger, "c/1")
    client = FaultyLedgerClient(ledger)
    async with host_on(client, tmp_path) as host:
        await deliver(host, "c/1", "add", (), {"n": 1})
        client.lose_reply["commit_checkpoints"].append(ConnectionResetError("reply lost"))
        landed = await deliver(host, "c/1", "add", (), {"n": 5}, idempotency_key="k1")
        assert (landed.value, landed.checkpoint_version, landed.duplicate) == (6, 2, False)
        # Still owned and consistent: the next commit moves on from the landed version.
        assert (await deliver(host, "c/1", "add", (), {"n": 1})).checkpoint_version == 3
        assert host.is_active("c/1") and host.statistics().leases_lost == 0
        assert (await deliver(host, "c/1", "add", (), {"n": 5}, idempotency_key="k1")).duplicate


async def test_a_commit_whose_outcome_cannot_be_read_is_a_retryable_unknown(ledger: Ledger, tmp_path: Path) -> None:
    register(ledger, "c/1")
    client = FaultyLedgerClient(ledger)
    async with host_on(client, tmp_path) as host:
        await deliver(host, "c/1", "add", (), {"n": 1})
        client.lose_reply["commit_checkpoints"].append(ConnectionResetError("reply lost"))
        client.fail["resolve"].append(outage())
        with pytest.raises(rf.LedgerUnavailableError) as caught:
            await deliver(host, "c/1", "add", (), {"n": 5}, idempotency_key="k1")
        assert caught.value.committed_unknown and is_retryable(caught.value)
        assert host.statistics().leases_lost == 0  # not mistaken for a fenced owner
        # The retry reloads what the ledger has: the write had landed, so its key answers.
        retry = await deliver(host, "c/1", "add", (), {"n": 5}, idempotency_key="k1")
        assert (retry.value, retry.duplicate) == (6, True)
        assert (await deliver(host, "c/1", "add", (), {"n": 0})).value == 6


async def test_a_commit_whose_reply_was_lost_and_did_not_land_is_retried_once(ledger: Ledger, tmp_path: Path) -> None:
    register(ledger, "c/1")
    client = FaultyLedgerClient(ledger)
    async with host_on(client, tmp_path) as host:
        await deliver(host, "c/1", "add", (), {"n": 1})
        # The call never reached the ledger, but the host cannot tell that from a lost reply.
        client.fail["commit_checkpoints"].append(ConnectionResetError("connection reset"))
        with pytest.raises(rf.LedgerUnavailableError) as caught:
            await deliver(host, "c/1", "add", (), {"n": 5}, idempotency_key="k1")
        assert caught.value.committed_unknown
        retry = await deliver(host, "c/1", "add", (), {"n": 5}, idempotency_key="k1")
        assert (retry.value, retry.duplicate) == (6, False)
        assert remembered(ledger, "c/1") == ["k1"]


async def test_a_commit_that_reached_the_ledger_twice_is_a_success(ledger: Ledger, tmp_path: Path) -> None:
    register(ledger, "c/1")
    client = FaultyLedgerClient(ledger)
    async with host_on(client, tmp_path) as host:
        await deliver(host, "c/1", "add", (), {"n": 1})
        client.twice.add("commit_checkpoints")  # the second run is refused: version 2 is already there
        result = await deliver(host, "c/1", "add", (), {"n": 5}, idempotency_key="k1")
        assert (result.value, result.checkpoint_version) == (6, 2)
        assert host.is_active("c/1") and host.statistics().leases_lost == 0
        assert (await deliver(host, "c/1", "add", (), {"n": 1})).checkpoint_version == 3


# -- R8: a refused fenced write drops the stale owner at once --------------------------


def supersede(ledger: Ledger, host: HostRuntime, identity: str) -> None:
    """Another owner takes over behind this host's back (e.g. after revoke-at-once)."""
    ledger.revoke_holder(host.holder)
    granted = ledger.acquire(holder="heir", identities=[identity], ttl=10.0)[identity]
    assert not isinstance(granted, LeaseDenied | rf.RayfleetError)


@pytest.mark.parametrize("operation", ["pause", "resume", "cancel_parked", "park"])
async def test_a_refused_mailbox_write_drops_the_stale_owner(ledger: Ledger, tmp_path: Path, operation: str) -> None:
    register(ledger, "c/1")
    client = FaultyLedgerClient(ledger)
    async with host_on(client, tmp_path) as host:
        await deliver(host, "c/1", "add", (), {"n": 1})
        if operation != "pause":
            await host.delivery.pause("c/1")
        supersede(ledger, host, "c/1")
        call: Awaitable[Any] = {
            "pause": lambda: host.delivery.pause("c/1"),
            "resume": lambda: host.delivery.resume("c/1"),
            "cancel_parked": lambda: host.delivery.cancel_parked("c/1"),
            "park": lambda: deliver(host, "c/1", "add", (), {"n": 1}),
        }[operation]()
        with pytest.raises(rf.LeaseLostError) as caught:
            await call
        assert isinstance(caught.value.__cause__, rf.StaleFencingTokenError)
        assert not host.is_active("c/1")
        assert host.statistics().stale_refusals == 1


# -- R4: resume and park, resume and pause ----------------------------------------------


async def test_a_message_parked_while_resume_reads_is_replayed(ledger: Ledger, tmp_path: Path) -> None:
    register(ledger, "c/1")
    client = FaultyLedgerClient(ledger)
    async with host_on(client, tmp_path) as host:
        await host.delivery.pause("c/1")
        gate = client.gates["parked"] = Gate()
        resuming = asyncio.create_task(host.delivery.resume("c/1"))
        await gate.reached.wait()  # resume has read "nothing parked"; the reply is on its way
        call = asyncio.create_task(deliver(host, "c/1", "add", (), {"n": 1}))
        await settle()
        gate.release.set()
        await resuming
        assert ledger.parked("c/1") == []  # nothing stranded
        assert not ledger.is_paused("c/1")
        assert (await call).value == 1


async def test_a_pause_issued_during_a_resume_wins(ledger: Ledger, tmp_path: Path) -> None:
    register(ledger, "c/1")
    client = FaultyLedgerClient(ledger)
    async with host_on(client, tmp_path) as host:
        await host.delivery.pause("c/1")
        parked = asyncio.create_task(deliver(host, "c/1", "add", (), {"n": 1}))
        await settle()
        assert len(ledger.parked("c/1")) == 1
        gate = client.gates["commit_checkpoints"] = Gate()
        resuming = asyncio.create_task(host.delivery.resume("c/1"))
        await gate.reached.wait()  # the replayed message is committing
        pausing = asyncio.create_task(host.delivery.pause("c/1"))
        await settle()
        gate.release.set()
        await asyncio.gather(resuming, pausing)
        assert (await parked).value == 1
        assert ledger.is_paused("c/1")
        later = asyncio.create_task(deliver(host, "c/1", "add", (), {"n": 1}))
        await settle()
        assert not later.done() and len(ledger.parked("c/1")) == 1  # paused: the new message parks
        await host.delivery.resume("c/1")
        assert (await later).value == 2


# -- R10: renewals keep leases alive through failures ----------------------------------


async def test_a_turn_renewal_dates_the_lease_from_when_it_was_sent(ledger: Ledger, tmp_path: Path) -> None:
    register(ledger, "c/1")
    clock = ManualClock()
    client = FaultyLedgerClient(ledger, during={"renew": lambda: clock.advance(0.5)})  # the round trip takes 0.5 s
    async with host_on(client, tmp_path, clock=clock, lease_ttl=10.0) as host:
        await deliver(host, "c/1", "add", (), {"n": 1})
        clock.advance(9.0)  # little lease left: the next turn renews first
        sent_at = clock.now
        await deliver(host, "c/1", "add", (), {"n": 1})
        assert client.calls["renew"] == 1
        assert host._entries["c/1"].installed_at == sent_at


@pytest.mark.parametrize("operation", ["activate", "respawn", "reset"])
async def test_a_new_lease_is_dated_from_when_it_was_requested(ledger: Ledger, tmp_path: Path, operation: str) -> None:
    register(ledger, "c/1")
    clock = ManualClock()
    client = FaultyLedgerClient(ledger, during={"acquire": lambda: clock.advance(0.5)})  # a 0.5 s round trip
    async with host_on(client, tmp_path, clock=clock, lease_ttl=10.0) as host:
        if operation != "activate":
            await host.activate("c/1")
        requested_at = clock.now
        await {"activate": host.activate, "respawn": host.respawn, "reset": host.reset}[operation]("c/1")
        assert host._entries["c/1"].installed_at == requested_at


async def test_the_next_renewal_is_due_a_third_of_the_ttl_after_the_oldest_lease_was_renewed(
    ledger: Ledger, tmp_path: Path,
) -> None:
    # A pass that takes long (a busy host renewing 50,000 leases took 6.5 s) must not
    # push the next one a full TTL/3 further: B4 lost every lease renewed late in a pass.
    register(ledger, "c/1")
    clock = ManualClock()
    slow = {"renew": lambda: clock.advance(2.0), "renew_holder": lambda: clock.advance(2.0)}  # 2 s renewals
    client = FaultyLedgerClient(ledger, during=slow)
    async with host_on(client, tmp_path, clock=clock, lease_ttl=9.0) as host:
        await deliver(host, "c/1", "add", (), {"n": 1})
        assert host.leases.next_delay() == pytest.approx(3.0)
        clock.advance(3.0)
        await host.leases.attempt()  # lease by lease, then the holder row is armed as the pass ends
        assert host.leases.next_delay() == pytest.approx(3.0)
        clock.advance(3.0)
        await host.leases.attempt()  # the holder row
        assert client.calls["renew"] == 1 and client.calls["renew_holder"] == 1
        assert host.leases.next_delay() == pytest.approx(1.0)  # renewed as sent, 2 s ago


async def test_once_its_holder_row_is_armed_a_host_renews_every_lease_with_one_write(tmp_path: Path) -> None:
    clock = ManualClock()
    ledger = Ledger(tmp_path / "ledger.sqlite", clock=clock)
    for index in range(3):
        register(ledger, f"c/{index}")
    client = FaultyLedgerClient(ledger)
    async with host_on(client, tmp_path, clock=clock, lease_ttl=10.0) as host:
        await asyncio.gather(*(deliver(host, f"c/{index}", "add", (), {"n": 1}) for index in range(3)))
        assert await host.renew_once() == 3  # lease by lease, then the row is armed
        assert (client.calls["renew"], client.calls["arm_holder"]) == (1, 1)
        for _ in range(4):  # four TTL/3 periods: every lease's own date is long past
            clock.advance(host.leases.next_delay())
            assert await host.renew_once() == 3
        assert (client.calls["renew"], client.calls["renew_holder"]) == (1, 4)
        rival = ledger.acquire(holder="rival", identities=["c/0", "c/1", "c/2"], ttl=10.0)
        assert all(isinstance(outcome, LeaseDenied) for outcome in rival.values())
        assert (await deliver(host, "c/0", "add", (), {"n": 1})).value == 2  # no turn needed a renewal of its own
        assert client.calls["renew"] == 1


async def test_a_host_whose_holder_row_lapsed_drops_what_was_taken_and_keeps_the_rest(tmp_path: Path) -> None:
    clock = ManualClock()
    ledger = Ledger(tmp_path / "ledger.sqlite", clock=clock)
    register(ledger, "c/1")
    register(ledger, "c/2")
    client = FaultyLedgerClient(ledger)
    async with host_on(client, tmp_path, clock=clock, lease_ttl=10.0) as host:
        await deliver(host, "c/1", "add", (), {"n": 1})
        await deliver(host, "c/2", "add", (), {"n": 1})
        await host.renew_once()
        clock.advance(11.0)  # frozen for longer than a TTL: the row lapsed, and a rival took c/1
        assert isinstance(ledger.acquire(holder="rival", identities=["c/1"], ttl=10.0)["c/1"], Activation)
        assert await host.renew_once() == 1
        assert host.active_identities() == ["c/2"] and host.statistics().leases_lost == 1
        assert (client.calls["renew_holder"], client.calls["renew"], client.calls["arm_holder"]) == (1, 2, 2)
        clock.advance(host.leases.next_delay())
        assert await host.renew_once() == 1 and client.calls["renew_holder"] == 2
        assert isinstance(ledger.acquire(holder="rival", identities=["c/2"], ttl=10.0)["c/2"], LeaseDenied)


async def test_a_release_that_failed_is_retried_with_the_next_renewal(tmp_path: Path) -> None:
    # A live holder row keeps every lease its holder still holds, a release that failed
    # included: without a retry the identity would stay with a host that no longer hosts it.
    clock = ManualClock()
    ledger = Ledger(tmp_path / "ledger.sqlite", clock=clock)
    register(ledger, "c/1")
    client = FaultyLedgerClient(ledger)
    async with host_on(client, tmp_path, clock=clock, lease_ttl=10.0) as host:
        await deliver(host, "c/1", "add", (), {"n": 1})
        await host.renew_once()
        client.fail["release"].append(outage())
        await host.deactivate("c/1")
        assert ledger.leases(["c/1"])["c/1"] is not None
        await host.renew_once()
        assert client.calls["release"] == 2
        assert ledger.leases(["c/1"])["c/1"] is None


@pytest.mark.parametrize("renewal", ["renew", "renew_holder"])
async def test_a_lease_survives_two_failed_renewals(tmp_path: Path, renewal: str) -> None:
    # "renew": the host's first pass, lease by lease; "renew_holder": once its holder row is armed.
    clock = ManualClock()
    ledger = Ledger(tmp_path / "ledger.sqlite", clock=clock)  # the ledger's lease expiry runs on the same clock
    register(ledger, "c/1")
    client = FaultyLedgerClient(ledger)
    async with host_on(client, tmp_path, clock=clock, lease_ttl=10.0) as host:
        await deliver(host, "c/1", "add", (), {"n": 1})
        if renewal == "renew_holder":
            assert await host.renew_once() == 1
        expires_at = clock.now + 10.0
        client.fail[renewal] += [outage(), outage()]
        for attempt in (1, 2, 3):
            delay = host.leases.next_delay()
            assert clock.now + delay < expires_at, f"attempt {attempt} would come after the lease expired"
            clock.advance(delay)
            rival = ledger.acquire(holder="rival", identities=["c/1"], ttl=10.0)["c/1"]
            assert isinstance(rival, LeaseDenied), f"the lease lapsed before renewal attempt {attempt}"
            await host.leases.attempt()
        assert client.calls[renewal] == 3 and host.is_active("c/1")
        view = ledger.resolve(["c/1"])["c/1"]
        assert view.lease is not None and view.lease.holder == host.holder
