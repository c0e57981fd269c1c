"""The ledger contract suite: leases, fencing tokens, continuity records, hosts, on every store.

No Ray: each store is opened in-process behind the same ``Ledger`` rules, driven by a
manual clock. Every test runs once per entry of ``BACKENDS``; a new store joins the
suite by adding one entry there.
"""

from __future__ import annotations

import contextlib
import functools
import pickle
import shutil
import tempfile
import time
from pathlib import Path

import pg_support
import psycopg
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from rayfleet.errors import (
    InvalidSpecError,
    LeaseLostError,
    RunOwnedElsewhereError,
    StaleCheckpointVersionError,
    StaleFencingTokenError,
    StaleRunTokenError,
    UnknownIdentityError,
)
from rayfleet.identity._values import (
    PERSISTED_BROKEN,
    PERSISTED_LIVE,
    PERSISTED_RETIRED,
    LeaseDenied,
    LeaseGrant,
    SnapshotPointer,
)
from rayfleet.ledger import RunRequests, StepEntry, StepJournaled, _checkpoints, _identities, _leases, _views
from rayfleet.ledger._ledger import Ledger
from rayfleet.ledger._postgres import PostgresDatabase
from rayfleet.ledger._values import Activation, CheckpointCommit, SpecRecord, TopologyChange
from rayfleet.testing import ManualClock

TTL = 10.0


FakeClock = ManualClock


class SqliteBackend:
    """The embedded store: a SQLite file under a fresh folder; reopening it is a ledger restart."""

    def __init__(self, root: Path) -> None:
        self.path = root / "ledger" / "ledger.sqlite"

    def open(self, clock: ManualClock) -> Ledger:
        return Ledger(self.path, clock=clock)

    def restart(self, clock: ManualClock) -> Ledger:
        """The process serving the file restarted: every open of a SQLite ledger is one."""
        return self.open(clock)

    def cleanup(self) -> None:
        """Nothing beyond the folder, which the caller removes."""


class PostgresBackend:
    """A fresh database on the test PostgreSQL server; dropped afterwards."""

    def __init__(self, root: Path) -> None:
        self.url = pg_support.create_database()
        self._ledgers: list[Ledger] = []

    def open(self, clock: ManualClock) -> Ledger:
        ledger = Ledger(PostgresDatabase(self.url, pool_size=2), clock=clock)
        self._ledgers.append(ledger)
        return ledger

    def restart(self, clock: ManualClock) -> Ledger:
        """Reopen as after a server restart: the ledger must find a new server incarnation.

        Restarting the real server for every example would take seconds; forgetting
        the incarnation the ledger recorded is what a new server start time looks like
        to the code under test.
        """
        with psycopg.connect(self.url, autocommit=True) as connection:
            connection.execute("DELETE FROM ledger_meta WHERE key = 'incarnation'")
        return self.open(clock)

    def cleanup(self) -> None:
        for ledger in self._ledgers:
            with contextlib.suppress(Exception):
                ledger.close()
        pg_support.drop_database(self.url)


Backend = SqliteBackend | PostgresBackend
BACKENDS: dict[str, type[Backend]] = {"sqlite": SqliteBackend, "postgresql": PostgresBackend}


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(params=sorted(BACKENDS))
def backend(request: pytest.FixtureRequest, tmp_path: Path):
    store = BACKENDS[request.param](tmp_path)
    yield store
    store.cleanup()


@pytest.fixture
def ledger(backend, clock: FakeClock):
    led = backend.open(clock)
    yield led
    with contextlib.suppress(Exception):
        led.close()


def spec_record(identity: str = "a", fingerprint: str = "f1", labels: dict | None = None, spec: bytes = b"spec",
                agent_class: str = "m:C") -> SpecRecord:
    return SpecRecord(identity=identity, spec=spec, fingerprint=fingerprint, agent_class=agent_class,
                      labels=labels or {})


def register(led: Ledger, identity: str = "a", fingerprint: str = "f1", labels: dict | None = None):
    return led.register(spec_record(identity, fingerprint, labels))


def grant(led: Ledger, holder: str, identity: str = "a", ttl: float = TTL) -> LeaseGrant:
    result = led.acquire(holder=holder, identities=[identity], ttl=ttl)[identity]
    assert isinstance(result, Activation), result
    return result.grant


def commit(identity: str, token: int, version: int, file: str = "snapshots/x.arrow", row: int = 0) -> CheckpointCommit:
    return CheckpointCommit(
        identity=identity,
        fencing_token=token,
        version=version,
        pointer=SnapshotPointer(file=file, row=row, version=version),
    )


def restart(led: Ledger, backend, clock: FakeClock) -> Ledger:
    led.close()
    return backend.restart(clock)


# -- registration ---------------------------------------------------------------------


def test_register_creates_identity(ledger):
    outcome = register(ledger, labels={"team": "x"})
    assert outcome.created is True
    assert outcome.lifecycle == PERSISTED_LIVE
    view = ledger.resolve(["a"])["a"]
    assert view.spec == b"spec" and view.fingerprint == "f1" and view.agent_class == "m:C"
    assert view.labels == {"team": "x"}
    assert view.continuity is None and view.snapshot is None and view.lease is None


def test_register_is_idempotent_for_same_fingerprint(ledger):
    register(ledger)
    again = register(ledger)
    assert again.created is False
    assert again.lifecycle == PERSISTED_LIVE


def test_register_with_different_fingerprint_raises_invalid_spec(ledger):
    register(ledger)
    with pytest.raises(InvalidSpecError) as info:
        register(ledger, fingerprint="f2")
    assert info.value.field == "spec"
    assert ledger.resolve(["a"])["a"].fingerprint == "f1"


def test_resolve_omits_unknown_identities(ledger):
    register(ledger)
    assert set(ledger.resolve(["a", "nope"])) == {"a"}


# -- grants and fencing tokens ------------------------------------------------------


def test_first_grant_has_token_one(ledger):
    register(ledger)
    assert grant(ledger, "A").fencing_token == 1
    assert ledger.high_water("a") == 1


def test_each_grant_has_strictly_larger_token_even_for_same_holder(ledger):
    register(ledger)
    tokens = [grant(ledger, "A").fencing_token for _ in range(5)]
    assert tokens == sorted(set(tokens))
    assert tokens == [1, 2, 3, 4, 5]


def test_high_water_is_zero_for_never_granted_identity(ledger):
    register(ledger)
    assert ledger.high_water("a") == 0
    assert ledger.high_water("unknown") == 0


def test_grant_is_persisted_before_acquire_returns(ledger, backend, clock):
    register(ledger)
    token = grant(ledger, "A").fencing_token
    # A second connection on the same file (the first still open) sees the committed fence.
    other = backend.open(clock)
    try:
        assert other.high_water("a") == token
        assert other.resolve(["a"])["a"].lease.fencing_token == token
    finally:
        other.close()


def test_restarted_ledger_never_reissues_a_token(ledger, backend, clock):
    register(ledger)
    first = grant(ledger, "A").fencing_token
    ledger = restart(ledger, backend, clock)
    try:
        second = grant(ledger, "A").fencing_token
        assert second > first
    finally:
        ledger.close()


def test_restart_after_expiry_and_takeover_keeps_increasing_tokens(ledger, backend, clock):
    register(ledger)
    seen = [grant(ledger, "A").fencing_token]
    for holder in ["B", "A", "B"]:
        ledger = restart(ledger, backend, clock)
        clock.advance(TTL + 1)
        seen.append(grant(ledger, holder).fencing_token)
    ledger.close()
    assert seen == sorted(set(seen))


def test_acquire_with_non_positive_ttl_is_refused(ledger):
    register(ledger)
    with pytest.raises(InvalidSpecError):
        ledger.acquire(holder="A", identities=["a"], ttl=0)


# -- acquire semantics ----------------------------------------------------------------


def test_acquire_by_other_holder_while_lease_live_is_denied(ledger, clock):
    register(ledger)
    grant(ledger, "A")
    clock.advance(TTL / 2)
    denied = ledger.acquire(holder="B", identities=["a"], ttl=TTL)["a"]
    assert isinstance(denied, LeaseDenied)
    assert denied.holder == "A"
    assert denied.expires_in == pytest.approx(TTL / 2)
    assert ledger.high_water("a") == 1  # a denial does not raise the fence


def test_expired_lease_can_be_taken_by_other_holder(ledger, clock):
    register(ledger)
    first = grant(ledger, "A")
    clock.advance(TTL + 0.01)
    second = grant(ledger, "B")
    assert second.holder == "B"
    assert second.fencing_token > first.fencing_token
    assert ledger.resolve(["a"])["a"].lease.holder == "B"


def test_lease_exactly_at_expiry_is_takeable(ledger, clock):
    register(ledger)
    grant(ledger, "A")
    clock.advance(TTL)
    assert grant(ledger, "B").holder == "B"


def test_lease_view_disappears_once_expired(ledger, clock):
    register(ledger)
    grant(ledger, "A")
    assert ledger.resolve(["a"])["a"].lease.expires_in == pytest.approx(TTL)
    clock.advance(TTL + 1)
    assert ledger.resolve(["a"])["a"].lease is None


def test_acquire_many_identities_returns_activation_per_identity(ledger):
    names = [f"agent-{i}" for i in range(5)]
    for name in names:
        register(ledger, name)
    results = ledger.acquire(holder="A", identities=names, ttl=TTL)
    assert set(results) == set(names)
    sessions = set()
    for name in names:
        activation = results[name]
        assert isinstance(activation, Activation)
        assert activation.grant == LeaseGrant(identity=name, holder="A", fencing_token=1, ttl=TTL)
        record = activation.view.continuity
        assert record is not None
        assert record.generation == 0
        assert record.runtime_id == f"rt:{name}:0"
        assert record.checkpoint_version == 0
        assert record.fencing_token == activation.grant.fencing_token
        assert activation.view.snapshot is None
        assert activation.view.lease.holder == "A"
        sessions.add(record.session_id)
    assert len(sessions) == len(names)


def test_acquire_unknown_identity_reports_error_in_result_map(ledger):
    register(ledger)
    results = ledger.acquire(holder="A", identities=["a", "ghost"], ttl=TTL)
    assert isinstance(results["a"], Activation)
    assert isinstance(results["ghost"], UnknownIdentityError)
    assert results["ghost"].identity == "ghost"
    assert ledger.high_water("ghost") == 0


def test_acquire_mixed_grant_and_denial_in_one_call(ledger):
    register(ledger, "a")
    register(ledger, "b")
    grant(ledger, "B", "b")
    results = ledger.acquire(holder="A", identities=["a", "b"], ttl=TTL)
    assert isinstance(results["a"], Activation)
    assert isinstance(results["b"], LeaseDenied) and results["b"].holder == "B"


def test_acquire_deduplicates_identities(ledger):
    register(ledger)
    results = ledger.acquire(holder="A", identities=["a", "a"], ttl=TTL)
    assert results["a"].grant.fencing_token == 1
    assert ledger.high_water("a") == 1


def test_acquire_without_create_continuity_leaves_record_absent(ledger):
    register(ledger)
    activation = ledger.acquire(holder="A", identities=["a"], ttl=TTL, create_continuity=False)["a"]
    assert activation.view.continuity is None


def test_reacquire_stamps_continuity_fence_and_keeps_generation(ledger):
    register(ledger)
    first = ledger.acquire(holder="A", identities=["a"], ttl=TTL)["a"]
    second = ledger.acquire(holder="A", identities=["a"], ttl=TTL)["a"]
    assert second.view.continuity.fencing_token == second.grant.fencing_token == 2
    assert second.view.continuity.session_id == first.view.continuity.session_id
    assert second.view.continuity.generation == 0


# -- renew / release / revoke ----------------------------------------------------------


def test_renew_keeps_token_and_extends_expiry(ledger, clock):
    register(ledger)
    g = grant(ledger, "A")
    clock.advance(TTL * 0.8)
    assert ledger.renew(holder="A", tokens={"a": g.fencing_token}) == frozenset()
    clock.advance(TTL * 0.8)  # past the original expiry, within the renewed one
    assert isinstance(ledger.acquire(holder="B", identities=["a"], ttl=TTL)["a"], LeaseDenied)


def test_renew_by_wrong_holder_fails(ledger):
    register(ledger)
    g = grant(ledger, "A")
    assert ledger.renew(holder="B", tokens={"a": g.fencing_token}) == {"a"}


def test_renew_with_wrong_token_fails(ledger):
    register(ledger)
    g = grant(ledger, "A")
    assert ledger.renew(holder="A", tokens={"a": g.fencing_token + 1}) == {"a"}
    assert ledger.renew(holder="A", tokens={"a": g.fencing_token - 1}) == {"a"}


def test_renew_with_superseded_token_fails_after_takeover(ledger, clock):
    register(ledger)
    old = grant(ledger, "A")
    clock.advance(TTL + 1)
    grant(ledger, "B")
    assert ledger.renew(holder="A", tokens={"a": old.fencing_token}) == {"a"}


def test_renew_of_unheld_identity_fails(ledger):
    register(ledger)
    assert ledger.renew(holder="A", tokens={"a": 1, "ghost": 1}) == {"a", "ghost"}


class _CountingTransaction:
    """A transaction that counts what crosses between Python and the database: statements run and rows fetched."""

    def __init__(self, tx) -> None:
        self._tx = tx
        self.statements = 0
        """Statements run: one per ``execute``, one per parameter row of ``executemany``."""
        self.executes = 0
        self.rows = 0

    @property
    def dialect(self):
        return self._tx.dialect

    def execute(self, sql, parameters=()):
        self.statements += 1
        self.executes += 1
        return _CountingCursor(self._tx.execute(sql, parameters), self)

    def executemany(self, sql, rows):
        rows = list(rows)
        self.statements += len(rows)
        return self._tx.executemany(sql, rows)


class _CountingCursor:
    def __init__(self, cursor, counter: _CountingTransaction) -> None:
        self._cursor, self._counter = cursor, counter

    @property
    def rowcount(self) -> int:
        return self._cursor.rowcount

    def fetchone(self):
        row = self._cursor.fetchone()
        self._counter.rows += row is not None
        return row

    def fetchall(self):
        rows = self._cursor.fetchall()
        self._counter.rows += len(rows)
        return rows

    def __iter__(self):
        for row in self._cursor:
            self._counter.rows += 1
            yield row


def _sqlite_steps(ledger: Ledger, operation) -> int:
    """SQLite virtual-machine steps (in thousands) ``operation`` took: a measure of work that no clock or load skews."""
    steps = 0

    def counted() -> int:
        nonlocal steps
        steps += 1
        return 0

    connection = ledger._db._connection
    connection.set_progress_handler(counted, 1000)
    try:
        operation()
    finally:
        connection.set_progress_handler(None, 1000)
    return steps


def test_registering_many_identities_asks_which_are_awaited_in_one_statement(ledger, clock):
    # Whether another identity already declared a new one as its peer was asked once per
    # new identity: 100,000 statements (and, on PostgreSQL, round trips) for a bulk spawn.
    ledger.register(SpecRecord(identity="waiting", spec=b"spec", fingerprint="f1", agent_class="m:C",
                               peers=("many/7",)))
    identities = [f"many/{index}" for index in range(300)]
    counter = _CountingTransaction(None)

    def register(tx):
        counter._tx = tx
        return _identities.register_many(counter, [spec_record(identity) for identity in identities], now=clock())

    outcomes = ledger._db.write(register)
    assert [identity for identity, outcome in zip(identities, outcomes, strict=True) if outcome.awaited] == ["many/7"]
    assert all(outcome.created for outcome in outcomes)
    assert counter.executes <= 5, counter.executes


def test_a_checkpoint_committed_alone_is_one_statement(ledger, clock):
    # A batch of one was wrapped in a savepoint, as a larger batch must be (some of it may move and
    # some not): three statements, and on PostgreSQL a subtransaction, for the commonest commit.
    register(ledger, "a")
    token = grant(ledger, "h1", "a").fencing_token
    counter = _CountingTransaction(None)

    def commit_alone(tx):
        counter._tx = tx
        return _checkpoints.commit(counter, [commit("a", token, 1)], clock())

    assert ledger._db.write(commit_alone) == [None]
    assert counter.statements == 1
    assert ledger.resolve(["a"])["a"].continuity.checkpoint_version == 1
    # A refused one still writes nothing and is explained.
    [refused] = ledger.commit_checkpoints([commit("a", token, 1)])
    assert isinstance(refused, StaleCheckpointVersionError)
    assert ledger.resolve(["a"])["a"].continuity.checkpoint_version == 1


def test_applying_many_creates_takes_a_few_statements_and_refuses_any_that_exists(ledger, clock):
    # A roster's creates were checked and inserted one identity at a time.
    register(ledger, "old")
    creates = [spec_record(f"many/{index}") for index in range(300)]
    for refused in ([*creates, spec_record("old")], [*creates, spec_record("many/3")]):
        with pytest.raises(InvalidSpecError, match="'(old|many/3)' already exists"):
            ledger.apply_specs(creates=refused, updates=[])
        assert ledger.resolve(["many/0"]) == {}  # nothing of a refused apply was written
    counter = _CountingTransaction(None)

    def apply(tx):
        counter._tx = tx
        _identities.apply_specs(counter, creates, [], now=clock())

    ledger._db.write(apply)
    assert counter.executes <= 2, counter.executes
    assert len(ledger.resolve([record.identity for record in creates])) == 300


def test_granting_leases_on_new_identities_costs_in_proportion_to_their_number(tmp_path, clock):
    # The continuity records of a grant's new identities were inserted by joining two
    # JSON parameters on their keys, which SQLite ran as a nested scan: 2 s for 5,000
    # identities, quadratic in the batch.
    ledger = Ledger(tmp_path / "ledger.sqlite", clock=clock)
    costs = {}
    for size in (1_000, 4_000):
        identities = [f"new-{size}/{index}" for index in range(size)]
        ledger.register_many([spec_record(identity) for identity in identities])
        costs[size] = _sqlite_steps(ledger, functools.partial(ledger.acquire, holder="A", identities=identities,
                                                              ttl=TTL))
        assert ledger.resolve([identities[-1]])[identities[-1]].continuity.runtime_id == f"rt:{identities[-1]}:0"
    assert costs[4_000] < 6 * costs[1_000], costs  # linear is 4x; the nested scan was 16x
    ledger.close()


def test_renewing_and_releasing_many_leases_takes_a_few_statements_and_fetches_only_the_lost(ledger, clock):
    # SQLite's Python driver hands the GIL over once per statement run and per row
    # stepped; a host renewing 40,000 leases row by row while its event loop was busy
    # took longer than the TTL, and lost every lease. The work per renewal must not
    # cross into Python once per lease.
    identities = [f"many/{index}" for index in range(300)]
    ledger.register_many([spec_record(identity) for identity in identities])
    ledger.apply_topology(TopologyChange(wire=(("many/1", "many/2"),)))
    counter = _CountingTransaction(None)

    def acquire(tx):
        counter._tx = tx
        return _leases.acquire(counter, holder="A", identities=[*identities, "ghost"], ttl=TTL,
                               create_continuity=True, now=clock())

    activations = ledger._db.write(acquire)
    assert counter.statements <= 10 and counter.rows <= 10
    assert isinstance(activations.pop("ghost"), UnknownIdentityError)
    assert activations["many/1"].view.wired_peers == ("many/2",)
    assert activations["many/2"].view.continuity.fencing_token == activations["many/2"].grant.fencing_token
    grants = {identity: outcome.grant for identity, outcome in activations.items()}
    tokens = {identity: g.fencing_token for identity, g in grants.items()}
    tokens["many/0"] += 1  # a token the ledger never issued to A for it
    tokens["ghost"] = 1  # never leased
    clock.advance(TTL * 0.8)

    counter = _CountingTransaction(None)

    def renew(tx):
        counter._tx = tx
        return _leases.renew(tx=counter, holder="A", tokens=tokens, now=clock())

    lost = ledger._db.write(renew)
    assert lost == {"many/0", "ghost"}
    assert counter.statements <= 2 and counter.rows == 2
    clock.advance(TTL * 0.8)  # past the grants' expiry, within the renewal's
    taken = ledger.acquire(holder="B", identities=["many/0", "many/1"], ttl=TTL)
    assert isinstance(taken["many/0"], Activation)  # not renewed: lapsed, and B takes it
    assert isinstance(taken["many/1"], LeaseDenied)  # renewed: still A's

    counter = _CountingTransaction(None)

    def release(tx):
        counter._tx = tx
        return _leases.release(counter, holder="A", tokens=tokens)

    assert ledger._db.write(release) == len(identities) - 1
    assert counter.statements == 1 and counter.rows == 0
    assert all(isinstance(outcome, Activation) for outcome in
               ledger.acquire(holder="B", identities=identities[1:], ttl=TTL).values())


def test_release_frees_lease_for_other_holder(ledger):
    register(ledger)
    g = grant(ledger, "A")
    assert ledger.release(holder="A", tokens={"a": g.fencing_token}) == 1
    assert grant(ledger, "B").fencing_token == g.fencing_token + 1


def test_release_with_wrong_token_or_holder_does_nothing(ledger):
    register(ledger)
    g = grant(ledger, "A")
    assert ledger.release(holder="A", tokens={"a": g.fencing_token + 1}) == 0
    assert ledger.release(holder="B", tokens={"a": g.fencing_token}) == 0
    assert isinstance(ledger.acquire(holder="B", identities=["a"], ttl=TTL)["a"], LeaseDenied)


def test_revoke_holder_frees_all_its_leases(ledger):
    for name in ["a", "b", "c"]:
        register(ledger, name)
    grant(ledger, "A", "a")
    grant(ledger, "A", "b")
    grant(ledger, "B", "c")
    assert ledger.revoke_holder("A") == ["a", "b"]
    assert grant(ledger, "B", "a").holder == "B"
    assert grant(ledger, "B", "b").holder == "B"
    assert ledger.resolve(["c"])["c"].lease.holder == "B"


def test_revoke_holder_with_no_leases_returns_empty(ledger):
    assert ledger.revoke_holder("nobody") == []


# -- holder liveness: one row keeps every lease of its holder ---------------------------


def test_a_live_holder_row_keeps_every_lease_of_its_holder(ledger, clock):
    register(ledger)
    register(ledger, "b")
    grant(ledger, "A")
    grant(ledger, "A", "b")
    assert ledger.arm_holder(holder="A", ttl=TTL) == 0
    for _ in range(3):  # three TTLs, the leases' own dates long past
        clock.advance(TTL * 0.8)
        assert ledger.renew_holder(holder="A", ttl=TTL) is True
    for identity in ("a", "b"):
        denied = ledger.acquire(holder="B", identities=[identity], ttl=TTL)[identity]
        assert isinstance(denied, LeaseDenied) and denied.holder == "A"
        assert denied.expires_in == pytest.approx(TTL)
    lease = ledger.leases(["a"])["a"]
    assert lease is not None and lease.holder == "A" and lease.expires_in == pytest.approx(TTL)
    assert ledger.resolve(["b"])["b"].lease.expires_in == pytest.approx(TTL)


def test_a_holder_row_keeps_only_the_leases_its_holder_holds(ledger, clock):
    register(ledger)
    register(ledger, "b")
    g = grant(ledger, "A")
    grant(ledger, "A", "b")
    ledger.arm_holder(holder="A", ttl=TTL)
    ledger.release(holder="A", tokens={"a": g.fencing_token})
    assert grant(ledger, "B").holder == "B"  # released: free at once, the live row of A notwithstanding
    clock.advance(TTL * 2)
    ledger.renew_holder(holder="B", ttl=TTL)  # B keeps no row: nothing to renew, nothing renewed
    assert isinstance(ledger.acquire(holder="C", identities=["a"], ttl=TTL)["a"], Activation)


def test_a_lapsed_holder_row_renews_nothing_and_its_leases_can_be_taken(ledger, clock):
    register(ledger)
    register(ledger, "b")
    old = grant(ledger, "A")
    held = grant(ledger, "A", "b")
    ledger.arm_holder(holder="A", ttl=TTL)
    clock.advance(TTL + 1)  # A was frozen for a TTL
    taken = grant(ledger, "B")
    assert taken.fencing_token > old.fencing_token
    assert ledger.renew_holder(holder="A", ttl=TTL) is False  # and nothing changed: b stays takeable
    assert ledger.leases(["b"])["b"] is None
    # A renews what it still hosts lease by lease (learning that a is lost), then arms its row again.
    assert ledger.renew(holder="A", tokens={"a": old.fencing_token, "b": held.fencing_token}) == {"a"}
    assert ledger.arm_holder(holder="A", ttl=TTL) == 0
    clock.advance(TTL * 0.8)
    assert ledger.renew_holder(holder="A", ttl=TTL) is True
    clock.advance(TTL * 0.8)
    assert isinstance(ledger.acquire(holder="C", identities=["b"], ttl=TTL)["b"], LeaseDenied)


def test_arming_a_holder_drops_its_lapsed_leases_so_the_row_cannot_revive_them(ledger, clock):
    # A lease whose release failed stays with its holder; once lapsed, a live row must
    # not bring it back, or the identity would stay with a host that no longer hosts it.
    register(ledger)
    register(ledger, "b")
    grant(ledger, "A")
    held = grant(ledger, "A", "b")
    clock.advance(TTL + 1)
    assert ledger.renew(holder="A", tokens={"b": held.fencing_token}) == frozenset()  # a is no longer hosted
    assert ledger.arm_holder(holder="A", ttl=TTL) == 1
    assert ledger.leases(["a", "b"]) == {"a": None, "b": ledger.leases(["b"])["b"]}
    assert grant(ledger, "B").holder == "B"


def test_revoking_a_holder_ends_its_row(ledger, clock):
    register(ledger)
    grant(ledger, "A")
    ledger.arm_holder(holder="A", ttl=TTL)
    assert ledger.revoke_holder("A") == ["a"]
    assert ledger.renew_holder(holder="A", ttl=TTL) is False  # a zombie learns it at its next renewal


def test_renewing_a_holder_writes_one_row_whatever_it_holds(ledger, clock):
    identities = [f"many/{index}" for index in range(300)]
    ledger.register_many([spec_record(identity) for identity in identities])
    ledger.acquire(holder="A", identities=identities, ttl=TTL)
    ledger.arm_holder(holder="A", ttl=TTL)
    counter = _CountingTransaction(None)

    def renew(tx):
        counter._tx = tx
        return _leases.renew_holder(counter, holder="A", ttl=TTL, now=clock())

    assert ledger._db.write(renew) is True
    assert counter.statements == 1 and counter.rows == 0


def test_after_restart_a_live_holder_row_is_lock_delayed_too(ledger, backend, clock):
    register(ledger)
    grant(ledger, "A")
    ledger.arm_holder(holder="A", ttl=TTL)
    clock.advance(TTL * 0.8)
    assert ledger.renew_holder(holder="A", ttl=TTL) is True  # the lease's own date is now 0.2 TTL off
    clock.advance(TTL * 0.5)
    ledger = restart(ledger, backend, clock)
    try:
        clock.advance(TTL * 0.9)  # past the row's date before the restart, within one TTL of it
        assert isinstance(ledger.acquire(holder="B", identities=["a"], ttl=TTL)["a"], LeaseDenied)
        assert ledger.renew_holder(holder="A", ttl=TTL) is True
    finally:
        ledger.close()


# -- lock-delay after restart ---------------------------------------------------------


def test_after_restart_live_lease_is_not_granted_to_other_within_one_ttl(ledger, backend, clock):
    register(ledger)
    grant(ledger, "A")
    clock.advance(TTL - 1)  # 1s left on A's lease
    ledger = restart(ledger, backend, clock)
    try:
        clock.advance(TTL - 0.5)  # well past A's original expiry, still within one TTL of the restart
        result = ledger.acquire(holder="B", identities=["a"], ttl=TTL)["a"]
        assert isinstance(result, LeaseDenied)
        assert result.holder == "A"
    finally:
        ledger.close()


def test_after_restart_other_holder_may_acquire_once_ttl_has_passed(ledger, backend, clock):
    register(ledger)
    g = grant(ledger, "A")
    ledger = restart(ledger, backend, clock)
    try:
        clock.advance(TTL + 0.01)
        taken = grant(ledger, "B")
        assert taken.fencing_token > g.fencing_token
    finally:
        ledger.close()


def test_after_restart_same_holder_may_renew_during_lock_delay(ledger, backend, clock):
    register(ledger)
    g = grant(ledger, "A")
    clock.advance(TTL - 1)
    ledger = restart(ledger, backend, clock)
    try:
        clock.advance(TTL / 2)
        assert ledger.renew(holder="A", tokens={"a": g.fencing_token}) == frozenset()
        ledger.check_fence("a", g.fencing_token)
    finally:
        ledger.close()


def test_after_restart_same_holder_may_reacquire_during_lock_delay(ledger, backend, clock):
    register(ledger)
    g = grant(ledger, "A")
    ledger = restart(ledger, backend, clock)
    try:
        clock.advance(1)
        assert grant(ledger, "A").fencing_token == g.fencing_token + 1
    finally:
        ledger.close()


def test_released_lease_is_not_lock_delayed_after_restart(ledger, backend, clock):
    register(ledger)
    g = grant(ledger, "A")
    ledger.release(holder="A", tokens={"a": g.fencing_token})
    ledger = restart(ledger, backend, clock)
    try:
        assert grant(ledger, "B").holder == "B"
    finally:
        ledger.close()


def test_lease_already_expired_at_restart_is_not_revived_by_lock_delay(ledger, backend, clock):
    # A dead holder's lease that lapsed before the restart must stay takeable: lock-delay
    # protects only owners that may still be alive, and this one's lease was gone already.
    register(ledger)
    register(ledger, "b")
    g = grant(ledger, "A")
    held = grant(ledger, "A", "b")
    clock.advance(TTL - 1)
    assert ledger.renew(holder="A", tokens={"b": held.fencing_token}) == frozenset()  # b stays live, a does not
    clock.advance(2)  # a expired 1 s ago
    ledger = restart(ledger, backend, clock)
    try:
        taken = grant(ledger, "B")
        assert taken.holder == "B" and taken.fencing_token > g.fencing_token
        denied = ledger.acquire(holder="B", identities=["b"], ttl=TTL)["b"]
        assert isinstance(denied, LeaseDenied) and denied.holder == "A"
    finally:
        ledger.close()


# -- fenced writes ----------------------------------------------------------------------


@pytest.fixture
def two_grants(ledger, clock):
    """Identity 'a' granted to A (token 1), then taken over by B (token 2)."""
    register(ledger)
    old = grant(ledger, "A")
    clock.advance(TTL + 1)
    new = grant(ledger, "B")
    return old.fencing_token, new.fencing_token


def test_check_fence_accepts_current_token(ledger, two_grants):
    ledger.check_fence("a", two_grants[1])


def test_check_fence_refuses_stale_token(ledger, two_grants):
    with pytest.raises(StaleFencingTokenError):
        ledger.check_fence("a", two_grants[0])


def test_check_fence_unknown_identity(ledger):
    with pytest.raises(UnknownIdentityError):
        ledger.check_fence("ghost", 1)


def test_commit_with_current_token_is_accepted(ledger, two_grants):
    _, current = two_grants
    assert ledger.commit_checkpoints([commit("a", current, 1)]) == [None]
    view = ledger.resolve(["a"])["a"]
    assert view.continuity.checkpoint_version == 1
    assert view.continuity.fencing_token == current
    assert view.snapshot == SnapshotPointer(file="snapshots/x.arrow", row=0, version=1)


def test_commit_with_stale_token_is_refused(ledger, two_grants):
    old, current = two_grants
    [outcome] = ledger.commit_checkpoints([commit("a", old, 1)])
    assert isinstance(outcome, StaleFencingTokenError)
    assert (outcome.identity, outcome.presented, outcome.current) == ("a", old, current)
    view = ledger.resolve(["a"])["a"]
    assert view.continuity.checkpoint_version == 0
    assert view.snapshot is None


def test_commit_with_never_issued_token_is_refused_as_lease_lost(ledger, two_grants):
    _, current = two_grants
    [outcome] = ledger.commit_checkpoints([commit("a", current + 1, 1)])
    assert isinstance(outcome, LeaseLostError)
    assert outcome.identity == "a"
    assert ledger.resolve(["a"])["a"].snapshot is None


def test_commit_with_equal_version_is_refused(ledger, two_grants):
    _, current = two_grants
    assert ledger.commit_checkpoints([commit("a", current, 3)]) == [None]
    [outcome] = ledger.commit_checkpoints([commit("a", current, 3, file="snapshots/y.arrow")])
    assert isinstance(outcome, StaleCheckpointVersionError)
    assert (outcome.presented, outcome.current) == (3, 3)
    assert ledger.resolve(["a"])["a"].snapshot.file == "snapshots/x.arrow"


def test_commit_with_lower_version_is_refused(ledger, two_grants):
    _, current = two_grants
    ledger.commit_checkpoints([commit("a", current, 5)])
    [outcome] = ledger.commit_checkpoints([commit("a", current, 4)])
    assert isinstance(outcome, StaleCheckpointVersionError)
    assert ledger.resolve(["a"])["a"].continuity.checkpoint_version == 5


def test_commit_version_zero_is_refused_before_first_checkpoint(ledger):
    register(ledger)
    g = grant(ledger, "A")
    [outcome] = ledger.commit_checkpoints([commit("a", g.fencing_token, 0)])
    assert isinstance(outcome, StaleCheckpointVersionError)


def test_latest_checkpoints_pages_every_identity_with_its_pointer_and_commit_time(ledger, clock):
    for identity, agent_class in (("a", "m:A"), ("b", "m:B"), ("c", "m:A"), ("d", "m:A")):
        ledger.register(spec_record(identity, agent_class=agent_class))
    token = grant(ledger, "H", "a").fencing_token
    clock.set(1_000.5)
    assert ledger.commit_checkpoints([commit("a", token, 1, file="snapshots/f.arrow", row=3)]) == [None]
    grant(ledger, "H", "c")  # activated, never committed
    first, rest = ledger.latest_checkpoints(limit=2), ledger.latest_checkpoints(after="b", limit=2)
    assert [row.identity for row in first + rest] == ["a", "b", "c", "d"]
    a, b, c = first[0], first[1], rest[0]
    assert (a.agent_class, a.lifecycle, a.generation, a.checkpoint_version, a.fencing_token) == (
        "m:A", PERSISTED_LIVE, 0, 1, token)
    assert a.committed_at == 1_000.5 and a.snapshot == SnapshotPointer(file="snapshots/f.arrow", row=3, version=1)
    assert b.snapshot is None and b.checkpoint_version == 0 and b.committed_at is None
    assert c.snapshot is None and c.fencing_token > 0
    assert [row.identity for row in ledger.latest_checkpoints(agent_class="m:A", after="a")] == ["c", "d"]
    reset_token = grant(ledger, "H", "a").fencing_token
    ledger.reset(identity="a", fencing_token=reset_token)
    [after_reset] = ledger.latest_checkpoints(limit=1)
    assert after_reset.snapshot is None and after_reset.committed_at is None and after_reset.generation == 1


def test_commit_for_unknown_identity_is_refused(ledger):
    [outcome] = ledger.commit_checkpoints([commit("ghost", 1, 1)])
    assert isinstance(outcome, UnknownIdentityError)


def test_commit_without_continuity_record_is_refused(ledger):
    register(ledger)
    g = ledger.acquire(holder="A", identities=["a"], ttl=TTL, create_continuity=False)["a"].grant
    [outcome] = ledger.commit_checkpoints([commit("a", g.fencing_token, 1)])
    assert isinstance(outcome, UnknownIdentityError)


def test_commit_is_fenced_even_if_lease_expired_and_untaken(ledger, clock):
    # Fencing, not the clock, decides: the current token may still write after expiry.
    register(ledger)
    g = grant(ledger, "A")
    clock.advance(TTL * 3)
    assert ledger.commit_checkpoints([commit("a", g.fencing_token, 1)]) == [None]


def test_commit_batch_applies_valid_and_refuses_stale_individually(ledger, clock):
    for name in ["a", "b", "c", "d"]:
        register(ledger, name)
    tokens = {name: grant(ledger, "A", name).fencing_token for name in ["a", "b", "c", "d"]}
    clock.advance(TTL + 1)
    taken = grant(ledger, "B", "b")  # A's token on b is now stale
    ledger.commit_checkpoints([commit("d", tokens["d"], 7)])
    outcomes = ledger.commit_checkpoints(
        [
            commit("a", tokens["a"], 1, file="snapshots/a.arrow", row=3),
            commit("b", tokens["b"], 1, file="snapshots/b.arrow"),
            commit("c", tokens["c"], 2, file="snapshots/c.arrow", row=1),
            commit("d", tokens["d"], 6, file="snapshots/d2.arrow"),
            commit("ghost", 1, 1),
        ]
    )
    assert outcomes[0] is None
    assert isinstance(outcomes[1], StaleFencingTokenError)
    assert outcomes[1].current == taken.fencing_token
    assert outcomes[2] is None
    assert isinstance(outcomes[3], StaleCheckpointVersionError)
    assert isinstance(outcomes[4], UnknownIdentityError)

    views = ledger.resolve(["a", "b", "c", "d"])
    assert views["a"].snapshot == SnapshotPointer(file="snapshots/a.arrow", row=3, version=1)
    assert views["a"].continuity.checkpoint_version == 1
    assert views["b"].snapshot is None
    assert views["b"].continuity.checkpoint_version == 0
    assert views["c"].snapshot == SnapshotPointer(file="snapshots/c.arrow", row=1, version=2)
    assert views["d"].snapshot == SnapshotPointer(file="snapshots/x.arrow", row=0, version=7)


def test_commit_batch_with_same_identity_twice_checks_versions_in_order(ledger):
    register(ledger)
    t = grant(ledger, "A").fencing_token
    outcomes = ledger.commit_checkpoints([commit("a", t, 1), commit("a", t, 1), commit("a", t, 2)])
    assert outcomes[0] is None and outcomes[2] is None
    assert isinstance(outcomes[1], StaleCheckpointVersionError)
    assert ledger.resolve(["a"])["a"].continuity.checkpoint_version == 2


def test_commits_survive_restart(ledger, backend, clock):
    register(ledger)
    t = grant(ledger, "A").fencing_token
    ledger.commit_checkpoints([commit("a", t, 4, row=9)])
    ledger = restart(ledger, backend, clock)
    try:
        view = ledger.resolve(["a"])["a"]
        assert view.snapshot == SnapshotPointer(file="snapshots/x.arrow", row=9, version=4)
        # the restarted ledger still enforces the same fence
        ledger.check_fence("a", t)
    finally:
        ledger.close()


# -- set_lifecycle ----------------------------------------------------------------------


@pytest.mark.parametrize("marker", [PERSISTED_RETIRED, PERSISTED_BROKEN, PERSISTED_LIVE])
def test_set_lifecycle_with_current_token(ledger, marker):
    register(ledger)
    t = grant(ledger, "A").fencing_token
    ledger.set_lifecycle(identity="a", fencing_token=t, lifecycle=marker, reason="why")
    view = ledger.resolve(["a"])["a"]
    assert view.lifecycle == marker
    assert view.reason == "why"


def test_set_lifecycle_with_stale_token_is_refused(ledger, two_grants):
    with pytest.raises(StaleFencingTokenError):
        ledger.set_lifecycle(identity="a", fencing_token=two_grants[0], lifecycle=PERSISTED_RETIRED)
    assert ledger.resolve(["a"])["a"].lifecycle == PERSISTED_LIVE


def test_set_lifecycle_with_never_issued_token_is_lease_lost(ledger, two_grants):
    with pytest.raises(LeaseLostError):
        ledger.set_lifecycle(identity="a", fencing_token=two_grants[1] + 1, lifecycle=PERSISTED_RETIRED)
    assert ledger.resolve(["a"])["a"].lifecycle == PERSISTED_LIVE


def test_set_lifecycle_unknown_marker_is_invalid(ledger):
    register(ledger)
    t = grant(ledger, "A").fencing_token
    with pytest.raises(InvalidSpecError):
        ledger.set_lifecycle(identity="a", fencing_token=t, lifecycle="zombie")


def test_register_reports_persisted_lifecycle(ledger):
    register(ledger)
    t = grant(ledger, "A").fencing_token
    ledger.set_lifecycle(identity="a", fencing_token=t, lifecycle=PERSISTED_RETIRED)
    assert register(ledger).lifecycle == PERSISTED_RETIRED


# -- reset ------------------------------------------------------------------------------


def test_reset_starts_new_generation(ledger):
    register(ledger)
    activation = ledger.acquire(holder="A", identities=["a"], ttl=TTL)["a"]
    t = activation.grant.fencing_token
    ledger.commit_checkpoints([commit("a", t, 3)])
    before = activation.view.continuity

    fresh = ledger.reset(identity="a", fencing_token=t)

    assert fresh.generation == before.generation + 1 == 1
    assert fresh.runtime_id == "rt:a:1"
    assert fresh.session_id != before.session_id
    assert fresh.checkpoint_version == 0
    assert fresh.fencing_token == t
    view = ledger.resolve(["a"])["a"]
    assert view.continuity == fresh
    assert view.snapshot is None
    assert "snapshots/x.arrow" not in ledger.referenced_snapshot_files()


def test_reset_twice_advances_generation_each_time(ledger):
    register(ledger)
    t = grant(ledger, "A").fencing_token
    ledger.reset(identity="a", fencing_token=t)
    assert ledger.reset(identity="a", fencing_token=t).generation == 2


def test_reset_clears_broken_marker(ledger):
    register(ledger)
    t = grant(ledger, "A").fencing_token
    ledger.set_lifecycle(identity="a", fencing_token=t, lifecycle=PERSISTED_BROKEN, reason="corrupt")
    ledger.reset(identity="a", fencing_token=t)
    view = ledger.resolve(["a"])["a"]
    assert (view.lifecycle, view.reason) == (PERSISTED_LIVE, "")


def test_reset_then_commit_restarts_versions_at_one(ledger):
    register(ledger)
    t = grant(ledger, "A").fencing_token
    ledger.commit_checkpoints([commit("a", t, 5)])
    ledger.reset(identity="a", fencing_token=t)
    assert ledger.commit_checkpoints([commit("a", t, 1)]) == [None]


def test_reset_with_stale_token_is_refused(ledger, two_grants):
    before = ledger.resolve(["a"])["a"].continuity
    with pytest.raises(StaleFencingTokenError):
        ledger.reset(identity="a", fencing_token=two_grants[0])
    assert ledger.resolve(["a"])["a"].continuity == before


def test_reset_with_never_issued_token_is_lease_lost(ledger, two_grants):
    with pytest.raises(LeaseLostError):
        ledger.reset(identity="a", fencing_token=two_grants[1] + 1)


# -- delete -----------------------------------------------------------------------------


def test_delete_removes_identity_and_returns_last_snapshot(ledger):
    register(ledger)
    t = grant(ledger, "A").fencing_token
    ledger.commit_checkpoints([commit("a", t, 2, row=4)])
    pointer = ledger.delete(identity="a", fencing_token=t)
    assert pointer == SnapshotPointer(file="snapshots/x.arrow", row=4, version=2)
    assert ledger.resolve(["a"]) == {}
    assert ledger.referenced_snapshot_files() == set()


def test_delete_without_snapshot_returns_none(ledger):
    register(ledger)
    t = grant(ledger, "A").fencing_token
    assert ledger.delete(identity="a", fencing_token=t) is None


def test_delete_with_stale_token_is_refused(ledger, two_grants):
    with pytest.raises(StaleFencingTokenError):
        ledger.delete(identity="a", fencing_token=two_grants[0])
    assert "a" in ledger.resolve(["a"])


def test_delete_with_never_issued_token_is_lease_lost(ledger, two_grants):
    with pytest.raises(LeaseLostError):
        ledger.delete(identity="a", fencing_token=two_grants[1] + 1)
    assert "a" in ledger.resolve(["a"])


def test_delete_keeps_high_water_so_reregistered_name_gets_larger_tokens(ledger):
    register(ledger)
    t = grant(ledger, "A").fencing_token
    ledger.delete(identity="a", fencing_token=t)
    assert ledger.high_water("a") == t + 1  # the delete burns one token
    assert register(ledger, fingerprint="f2").created is True
    activation = ledger.acquire(holder="B", identities=["a"], ttl=TTL)["a"]
    assert activation.grant.fencing_token == t + 2
    assert activation.view.continuity.generation == 0
    assert activation.view.continuity.checkpoint_version == 0
    [outcome] = ledger.commit_checkpoints([commit("a", t, 1)])
    assert isinstance(outcome, StaleFencingTokenError)


def test_delete_frees_the_lease(ledger):
    register(ledger)
    t = grant(ledger, "A").fencing_token
    ledger.delete(identity="a", fencing_token=t)
    register(ledger)
    assert grant(ledger, "B").holder == "B"


def test_token_from_before_delete_cannot_write_to_recreated_identity(ledger):
    register(ledger)
    t = grant(ledger, "A").fencing_token
    ledger.delete(identity="a", fencing_token=t)
    register(ledger, fingerprint="f2")
    with pytest.raises(StaleFencingTokenError):
        ledger.set_lifecycle(identity="a", fencing_token=t, lifecycle=PERSISTED_RETIRED)


# -- referenced snapshot files ----------------------------------------------------------


def test_referenced_snapshot_files_lists_current_pointers_only(ledger):
    for name in ["a", "b", "c"]:
        register(ledger, name)
    tokens = {name: grant(ledger, "A", name).fencing_token for name in ["a", "b", "c"]}
    assert ledger.referenced_snapshot_files() == set()
    ledger.commit_checkpoints(
        [
            commit("a", tokens["a"], 1, file="snapshots/1.arrow", row=0),
            commit("b", tokens["b"], 1, file="snapshots/1.arrow", row=1),
        ]
    )
    assert ledger.referenced_snapshot_files() == {"snapshots/1.arrow"}
    ledger.commit_checkpoints([commit("a", tokens["a"], 2, file="snapshots/2.arrow")])
    assert ledger.referenced_snapshot_files() == {"snapshots/1.arrow", "snapshots/2.arrow"}
    ledger.commit_checkpoints([commit("b", tokens["b"], 2, file="snapshots/2.arrow", row=1)])
    assert ledger.referenced_snapshot_files() == {"snapshots/2.arrow"}


def test_referenced_snapshot_files_ignores_refused_commits(ledger, two_grants):
    ledger.commit_checkpoints([commit("a", two_grants[0], 1, file="snapshots/stale.arrow")])
    assert ledger.referenced_snapshot_files() == set()


# -- identities listing / update_spec -----------------------------------------------------


def test_list_identities_sorted_and_filtered_by_labels(ledger):
    register(ledger, "b", labels={"team": "x", "tier": "1"})
    register(ledger, "a", labels={"team": "x"})
    register(ledger, "c", labels={"team": "y"})
    assert [v.identity for v in ledger.list_identities()] == ["a", "b", "c"]
    assert [v.identity for v in ledger.list_identities(labels={"team": "x"})] == ["a", "b"]
    assert [v.identity for v in ledger.list_identities(labels={"team": "x", "tier": "1"})] == ["b"]


def test_select_identities_names_the_live_ones_with_the_labels(ledger):
    register(ledger, "b", labels={"team": "x", "tier": "1"})
    register(ledger, "a", labels={"team": "x"})
    register(ledger, "c", labels={"team": "y"})
    register(ledger, "d", labels={"team": "x"})
    token = grant(ledger, "h1", "d").fencing_token
    ledger.set_lifecycle(identity="d", fencing_token=token, lifecycle=PERSISTED_RETIRED)
    assert ledger.select_identities(labels={"team": "x"}) == ["a", "b"]
    assert ledger.select_identities(labels={"team": "x", "tier": "1"}) == ["b"]
    assert ledger.select_identities(labels={}) == ["a", "b", "c"]
    assert ledger.select_identities(labels={"team": "z"}) == []


def test_update_spec_replaces_fingerprint(ledger):
    register(ledger)
    ledger.apply_specs(creates=[], updates=[spec_record("a", "f2", {"k": "v"}, spec=b"new", agent_class="m:D")])
    view = ledger.resolve(["a"])["a"]
    assert (view.spec, view.fingerprint, view.agent_class, view.labels) == (b"new", "f2", "m:D", {"k": "v"})
    assert register(ledger, fingerprint="f2").created is False


def test_update_spec_unknown_identity(ledger):
    with pytest.raises(UnknownIdentityError):
        ledger.apply_specs(creates=[], updates=[spec_record("ghost", "f", spec=b"")])


# -- hosts --------------------------------------------------------------------------------


def test_register_host_records_host(ledger, clock):
    assert ledger.register_host(name="h1", holder="A") == []
    [host] = ledger.hosts()
    assert (host.name, host.holder, host.started_at, host.draining) == ("h1", "A", clock.now, False)


def test_register_host_with_new_holder_frees_old_holders_leases(ledger):
    for name in ["a", "b", "c"]:
        register(ledger, name)
    ledger.register_host(name="h1", holder="A")
    grant(ledger, "A", "a")
    grant(ledger, "A", "b")
    grant(ledger, "X", "c")
    freed = ledger.register_host(name="h1", holder="A2")
    assert sorted(freed) == ["a", "b"]
    assert grant(ledger, "B", "a").holder == "B"
    assert ledger.resolve(["c"])["c"].lease.holder == "X"
    assert [h.holder for h in ledger.hosts()] == ["A2"]


def test_register_host_with_same_holder_keeps_leases(ledger):
    register(ledger)
    ledger.register_host(name="h1", holder="A")
    grant(ledger, "A")
    assert ledger.register_host(name="h1", holder="A") == []
    assert isinstance(ledger.acquire(holder="B", identities=["a"], ttl=TTL)["a"], LeaseDenied)


def test_remove_host_frees_leases_and_forgets_host(ledger):
    register(ledger)
    ledger.register_host(name="h1", holder="A")
    grant(ledger, "A")
    assert ledger.remove_host(name="h1", holder="other") == []
    assert ledger.remove_host(name="h1", holder="A") == ["a"]
    assert ledger.hosts() == []
    assert grant(ledger, "B").holder == "B"


def test_set_host_draining(ledger):
    ledger.register_host(name="h1", holder="A")
    ledger.set_host_draining(name="h1", draining=True)
    assert ledger.hosts()[0].draining is True


# -- errors pickle --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "error, attributes",
    [
        (StaleFencingTokenError(identity="a", presented=1, current=3), {"identity": "a", "presented": 1, "current": 3}),
        (StaleCheckpointVersionError(identity="a", presented=2, current=2), {"identity": "a", "presented": 2, "current": 2}),
        (LeaseLostError(identity="a", detail="gone"), {"identity": "a", "detail": "gone"}),
        (UnknownIdentityError(identity="a"), {"identity": "a"}),
        (InvalidSpecError("bad", field="spec"), {"field": "spec"}),
    ],
)
def test_errors_round_trip_through_pickle(error, attributes):
    clone = pickle.loads(pickle.dumps(error))
    assert type(clone) is type(error)
    assert str(clone) == str(error)
    for name, value in attributes.items():
        assert getattr(clone, name) == value


def test_refusal_from_commit_pickles_with_attributes(ledger, two_grants):
    [outcome] = ledger.commit_checkpoints([commit("a", two_grants[0], 1)])
    clone = pickle.loads(pickle.dumps(outcome))
    assert isinstance(clone, StaleFencingTokenError)
    assert (clone.identity, clone.presented, clone.current) == ("a", two_grants[0], two_grants[1])


# -- workflow runs: one engine per run, fenced writes, exclusive-step leases ----------------


def new_run(ledger: Ledger, run_id: str = "r") -> str:
    ledger.create_run(run_id=run_id, workflow="wf", code_version="v1", definition=None)
    return run_id


def test_run_lease_tokens_strictly_increase_and_are_persisted_with_the_grant(ledger, backend, clock):
    run = new_run(ledger)
    first = ledger.acquire_run_lease(run_id=run, holder="E1", ttl=TTL)
    assert (first.holder, first.token, first.ttl) == ("E1", 1, TTL)
    assert ledger.run(run).owner == "E1"
    again = ledger.acquire_run_lease(run_id=run, holder="E1", ttl=TTL)  # the same holder: a new, larger token
    assert again.token == 2
    assert ledger.release_run_lease(run_id=run, holder="E1", token=again.token) is True
    assert ledger.run(run).owner is None
    ledger = restart(ledger, backend, clock)
    try:
        # The high-water survives release and restart: no token is issued twice.
        assert ledger.acquire_run_lease(run_id=run, holder="E2", ttl=TTL).token == 3
    finally:
        ledger.close()


def test_a_live_run_lease_of_another_holder_is_refused_naming_the_owner(ledger, clock):
    run = new_run(ledger)
    ledger.acquire_run_lease(run_id=run, holder="E1", ttl=TTL)
    clock.advance(TTL - 2)
    with pytest.raises(RunOwnedElsewhereError) as caught:
        ledger.acquire_run_lease(run_id=run, holder="E2", ttl=TTL)
    assert (caught.value.run_id, caught.value.owner, caught.value.step) == (run, "E1", "")
    assert caught.value.expires_in == pytest.approx(2.0)
    assert "E1" in str(caught.value) and "fleet.runs.wait" in str(caught.value)
    assert ledger.run(run).owner == "E1"


def test_a_lapsed_run_lease_is_taken_over_with_a_larger_token(ledger, clock):
    run = new_run(ledger)
    old = ledger.acquire_run_lease(run_id=run, holder="E1", ttl=TTL)
    clock.advance(TTL)  # exactly at expiry: takeable, as identity leases are
    new = ledger.acquire_run_lease(run_id=run, holder="E2", ttl=TTL)
    assert new.token > old.token and ledger.run(run).owner == "E2"


def test_renewal_keeps_the_run_lease_from_lapsing(ledger, clock):
    run = new_run(ledger)
    lease = ledger.acquire_run_lease(run_id=run, holder="E1", ttl=TTL)
    for _ in range(3):
        clock.advance(TTL - 1)
        assert ledger.renew_run_lease(run_id=run, holder="E1", token=lease.token) == lease
    with pytest.raises(RunOwnedElsewhereError):
        ledger.acquire_run_lease(run_id=run, holder="E2", ttl=TTL)


def test_run_lease_already_lapsed_at_restart_is_not_revived_by_lock_delay(ledger, backend, clock):
    lapsed, live = new_run(ledger, "lapsed"), new_run(ledger, "live")
    ledger.acquire_run_lease(run_id=lapsed, holder="E1", ttl=TTL)
    clock.advance(TTL - 1)
    ledger.acquire_run_lease(run_id=live, holder="E1", ttl=TTL)
    clock.advance(2)  # "lapsed" expired 1 s ago, "live" has TTL - 2 left
    ledger = restart(ledger, backend, clock)
    try:
        assert ledger.acquire_run_lease(run_id=lapsed, holder="E2", ttl=TTL).holder == "E2"
        with pytest.raises(RunOwnedElsewhereError):
            ledger.acquire_run_lease(run_id=live, holder="E2", ttl=TTL)
    finally:
        ledger.close()


def test_a_named_dead_holder_is_taken_over_at_once_and_its_step_leases_freed(ledger):
    run = new_run(ledger)
    old = ledger.acquire_run_lease(run_id=run, holder="runner:ns:1", ttl=TTL)
    ledger.acquire_step_lease(run_id=run, label="pay", holder="s1", fencing_token=old.token, ttl=TTL)
    with pytest.raises(RunOwnedElsewhereError):  # naming someone else as dead does not help
        ledger.acquire_run_lease(run_id=run, holder="runner:ns:2", ttl=TTL, takeover_from="runner:ns:0")
    new = ledger.acquire_run_lease(run_id=run, holder="runner:ns:2", ttl=TTL, takeover_from="runner:ns:1")
    assert new.token > old.token
    assert ledger.acquire_step_lease(run_id=run, label="pay", holder="s2", fencing_token=new.token, ttl=TTL) == 2


def test_renewing_a_superseded_or_released_run_lease_is_refused(ledger, clock):
    run = new_run(ledger)
    old = ledger.acquire_run_lease(run_id=run, holder="E1", ttl=TTL)
    clock.advance(TTL + 1)
    new = ledger.acquire_run_lease(run_id=run, holder="E2", ttl=TTL)
    with pytest.raises(StaleRunTokenError) as caught:
        ledger.renew_run_lease(run_id=run, holder="E1", token=old.token)
    assert (caught.value.presented, caught.value.current) == (old.token, new.token)
    assert ledger.release_run_lease(run_id=run, holder="E1", token=old.token) is False  # not E1's to release
    assert ledger.run(run).owner == "E2"
    ledger.release_run_lease(run_id=run, holder="E2", token=new.token)
    with pytest.raises(StaleRunTokenError):
        ledger.renew_run_lease(run_id=run, holder="E2", token=new.token)


def test_a_lapsed_run_lease_nobody_took_still_renews_and_writes(ledger, clock):
    run = new_run(ledger)
    lease = ledger.acquire_run_lease(run_id=run, holder="E1", ttl=TTL)
    clock.advance(TTL * 3)
    ledger.journal_step(run_id=run, fencing_token=lease.token, label="s1", output=b"x", tokens=0)
    assert ledger.renew_run_lease(run_id=run, holder="E1", token=lease.token).token == lease.token


def test_engine_writes_are_fenced_by_the_run_token(ledger, clock):
    run = new_run(ledger)
    old = ledger.acquire_run_lease(run_id=run, holder="E1", ttl=TTL)
    ledger.journal_step(run_id=run, fencing_token=old.token, label="s1", output=b"one", tokens=3)
    clock.advance(TTL)
    new = ledger.acquire_run_lease(run_id=run, holder="E2", ttl=TTL)
    writes = {
        "journal_step": lambda token: ledger.journal_step(run_id=run, fencing_token=token, label="s2", output=b"two",
                                                          tokens=0),
        "journal_compensation": lambda token: ledger.journal_compensation(run_id=run, fencing_token=token,
                                                                          label="s1", ok=True, error=""),
        "set_run_status": lambda token: ledger.set_run_status(run_id=run, fencing_token=token, status="FAILED",
                                                              detail="zombie"),
        "acquire_step_lease": lambda token: ledger.acquire_step_lease(run_id=run, label="s2", holder="z",
                                                                      fencing_token=token, ttl=TTL),
    }
    for name, write in writes.items():
        for presented in (old.token, new.token + 1):  # superseded, and never issued
            with pytest.raises(StaleRunTokenError) as caught:
                write(presented)
            assert (caught.value.run_id, caught.value.presented, caught.value.current) == (run, presented, new.token), name
    # Nothing the refused writes carried reached the ledger.
    journal = ledger.journal(run)
    assert [entry.label for entry in journal.steps] == ["s1"] and journal.compensated == ()
    assert ledger.run(run).status == "PENDING"
    # The current token writes.
    ledger.set_run_status(run_id=run, fencing_token=new.token, status="RUNNING", detail="resumed")
    ledger.journal_step(run_id=run, fencing_token=new.token, label="s2", output=b"two", tokens=0)
    assert [entry.label for entry in ledger.journal(run).steps] == ["s1", "s2"]
    assert ledger.run(run).status == "RUNNING"


def test_writes_to_a_run_that_never_had_a_lease_are_refused(ledger):
    run = new_run(ledger)
    with pytest.raises(StaleRunTokenError) as caught:
        ledger.set_run_status(run_id=run, fencing_token=1, status="RUNNING")
    assert (caught.value.presented, caught.value.current) == (1, 0)
    assert ledger.run(run).status == "PENDING"


def test_a_repeated_journal_write_keeps_the_first_output(ledger):
    run = new_run(ledger)
    lease = ledger.acquire_run_lease(run_id=run, holder="E1", ttl=TTL)
    ledger.journal_step(run_id=run, fencing_token=lease.token, label="s1", output=b"first", tokens=1)
    ledger.journal_step(run_id=run, fencing_token=lease.token, label="s1", output=b"second", tokens=2)
    assert [(e.label, e.output, e.tokens) for e in ledger.journal(run).steps] == [("s1", b"first", 1)]


def test_step_lease_excludes_a_second_holder_until_released_or_lapsed(ledger, clock):
    run = new_run(ledger)
    token = ledger.acquire_run_lease(run_id=run, holder="E1", ttl=TTL).token
    first = ledger.acquire_step_lease(run_id=run, label="pay", holder="h1", fencing_token=token, ttl=TTL)
    for holder in ("h2", "h1"):  # exclusive whatever the name: step holder names repeat across engines
        with pytest.raises(RunOwnedElsewhereError) as caught:
            ledger.acquire_step_lease(run_id=run, label="pay", holder=holder, fencing_token=token, ttl=TTL)
        assert (caught.value.owner, caught.value.step) == ("h1", "pay")
    # Another step of the same run is not excluded, and its token is larger still.
    other = ledger.acquire_step_lease(run_id=run, label="ship", holder="h3", fencing_token=token, ttl=TTL)
    assert other > first
    assert ledger.release_step_lease(run_id=run, label="pay", holder="h2", token=first) is False
    assert ledger.release_step_lease(run_id=run, label="pay", holder="h1", token=first) is True
    second = ledger.acquire_step_lease(run_id=run, label="pay", holder="h2", fencing_token=token, ttl=TTL)
    assert second > other
    clock.advance(TTL)
    third = ledger.acquire_step_lease(run_id=run, label="pay", holder="h4", fencing_token=token, ttl=TTL)
    assert third > second


def test_run_and_step_leases_live_at_a_restart_are_kept_for_one_ttl(ledger, backend, clock):
    run = new_run(ledger)
    token = ledger.acquire_run_lease(run_id=run, holder="E1", ttl=TTL).token
    ledger.acquire_step_lease(run_id=run, label="pay", holder="h1", fencing_token=token, ttl=TTL)
    clock.advance(TTL - 1)
    ledger = restart(ledger, backend, clock)
    try:
        clock.advance(TTL - 0.5)
        with pytest.raises(RunOwnedElsewhereError):
            ledger.acquire_run_lease(run_id=run, holder="E2", ttl=TTL)
        with pytest.raises(RunOwnedElsewhereError):
            ledger.acquire_step_lease(run_id=run, label="pay", holder="h2", fencing_token=token, ttl=TTL)
        clock.advance(1)
        assert ledger.acquire_run_lease(run_id=run, holder="E2", ttl=TTL).token == token + 1
    finally:
        ledger.close()


def test_starting_a_run_grants_its_lease_and_reads_its_journal_in_one_transaction(ledger, clock):
    run = new_run(ledger)
    earlier = ledger.acquire_run_lease(run_id=run, holder="E1", ttl=TTL)
    ledger.journal_step(run_id=run, fencing_token=earlier.token, label="s1", output=b"one", tokens=2)
    ledger.journal_compensation(run_id=run, fencing_token=earlier.token, label="s1", ok=True, error="")
    with pytest.raises(RunOwnedElsewhereError):  # refused as a grant is: nothing read, nothing granted
        ledger.start_run(run_id=run, holder="E2", ttl=TTL)
    clock.advance(TTL)
    started = ledger.start_run(run_id=run, holder="E2", ttl=TTL)
    assert (started.lease.holder, started.lease.token) == ("E2", earlier.token + 1)
    assert started.journal == ledger.journal(run)
    assert [(e.label, e.output, e.tokens) for e in started.journal.steps] == [("s1", b"one", 2)]
    assert started.journal.compensated == ("s1",) and ledger.run(run).owner == "E2"
    with pytest.raises(InvalidSpecError):
        ledger.start_run(run_id=run, holder="E3", ttl=0)


def test_a_run_status_write_answers_the_requests_and_can_release_the_lease(ledger):
    run = new_run(ledger)
    lease = ledger.acquire_run_lease(run_id=run, holder="E1", ttl=TTL)
    assert ledger.set_run_status(run_id=run, fencing_token=lease.token, status="RUNNING") == RunRequests()
    ledger.request_run(run_id=run, cancel=True)
    asked = ledger.set_run_status(run_id=run, fencing_token=lease.token, status="RUNNING")
    assert asked == RunRequests(cancel=True, pause=False) and ledger.run(run).owner == "E1"
    # Only the named holder's lease is given up; the token stays the run's high-water.
    ledger.set_run_status(run_id=run, fencing_token=lease.token, status="RUNNING", release_holder="E9")
    assert ledger.run(run).owner == "E1"
    ledger.set_run_status(run_id=run, fencing_token=lease.token, status="CANCELLED", release_holder="E1")
    assert ledger.run(run).owner is None and ledger.run(run).status == "CANCELLED"
    with pytest.raises(StaleRunTokenError):
        ledger.renew_run_lease(run_id=run, holder="E1", token=lease.token)
    assert ledger.acquire_run_lease(run_id=run, holder="E2", ttl=TTL).token == lease.token + 1


def test_run_lease_ttls_must_be_positive(ledger):
    run = new_run(ledger)
    with pytest.raises(InvalidSpecError):
        ledger.acquire_run_lease(run_id=run, holder="E1", ttl=0)
    token = ledger.acquire_run_lease(run_id=run, holder="E1", ttl=TTL).token
    with pytest.raises(InvalidSpecError):
        ledger.acquire_step_lease(run_id=run, label="pay", holder="h", fencing_token=token, ttl=-1)


# -- stateful property: two holders, restarts, fencing ------------------------------------


class TwoHolderLedgerMachine(RuleBasedStateMachine):
    """Two holders race for one identity across clock jumps and ledger restarts.

    Checked: (a) a commit is accepted iff its token is the highest ever granted;
    (b) every grant's token exceeds every earlier one, across restarts;
    (c) within one TTL of a restart, the other holder cannot take a lease that was
    live at the restart.
    """

    backend: type[Backend] = SqliteBackend

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="ledger-prop-")
        self.store = self.backend(Path(self.dir))
        self.clock = FakeClock()
        self.ledger: Ledger | None = None
        self.granted: list[int] = []
        self.last_token: dict[str, int] = {}
        self.version = 0
        # model of the lease as the design states it: (holder, token, expires_at) or None
        self.lease: tuple[str, int, float] | None = None
        # after a restart: the holder whose lease was live at that moment, and until when it is protected
        self.protected: tuple[str, float] | None = None

    @initialize()
    def open(self) -> None:
        self.ledger = self.store.open(self.clock)
        register(self.ledger)

    def teardown(self) -> None:
        if self.ledger is not None:
            self.ledger.close()
        self.store.cleanup()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _live_holder(self) -> str | None:
        if self.lease is not None and self.lease[2] > self.clock.now:
            return self.lease[0]
        return None

    @rule(holder=st.sampled_from(["A", "B"]))
    def acquire(self, holder: str) -> None:
        live = self._live_holder()
        protected = self.protected if self.protected and self.clock.now < self.protected[1] else None
        result = self.ledger.acquire(holder=holder, identities=["a"], ttl=TTL)["a"]
        if isinstance(result, LeaseDenied):
            assert result.holder != holder
            assert self.lease is not None and self.lease[0] == result.holder
            return
        assert isinstance(result, Activation)
        # a live lease of the other holder is never granted away ...
        assert live is None or live == holder, f"granted to {holder} while {live} holds a live lease"
        # (c) ... nor one protected by lock-delay after a restart
        assert protected is None or protected[0] == holder, (
            f"granted to {holder} within one TTL of a restart while {protected[0]} held it"
        )
        token = result.grant.fencing_token
        # (b) strictly larger than every token granted before
        assert all(token > earlier for earlier in self.granted)
        assert self.ledger.high_water("a") == token
        assert result.view.continuity.fencing_token == token
        self.granted.append(token)
        self.last_token[holder] = token
        self.lease = (holder, token, self.clock.now + TTL)
        if self.protected and self.protected[0] != holder:
            self.protected = None

    @rule(holder=st.sampled_from(["A", "B"]))
    def renew(self, holder: str) -> None:
        if holder not in self.last_token:
            return
        token = self.last_token[holder]
        lost = self.ledger.renew(holder=holder, tokens={"a": token})
        holds = self.lease is not None and self.lease[:2] == (holder, token)
        if holds:
            assert lost == frozenset()
            self.lease = (holder, token, self.clock.now + TTL)
        else:
            assert lost == {"a"}

    @rule(holder=st.sampled_from(["A", "B"]))
    def release(self, holder: str) -> None:
        if holder not in self.last_token:
            return
        token = self.last_token[holder]
        released = self.ledger.release(holder=holder, tokens={"a": token})
        holds = self.lease is not None and self.lease[:2] == (holder, token)
        assert released == (1 if holds else 0)
        if holds:
            self.lease = None
            self.protected = None

    # Mostly fractions of a TTL, so "live at a restart, past its own expiry, still within one TTL
    # of the restart" is reached often; plus arbitrary jumps.
    @rule(
        seconds=st.one_of(
            st.sampled_from([0.3 * TTL, 0.6 * TTL, 0.9 * TTL, 1.1 * TTL]),
            st.floats(min_value=0.0, max_value=2.5 * TTL, allow_nan=False),
        )
    )
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @rule(holder=st.sampled_from(["A", "B"]))
    def commit(self, holder: str) -> None:
        if holder not in self.last_token:
            return
        token = self.last_token[holder]
        self.version += 1
        [outcome] = self.ledger.commit_checkpoints([commit("a", token, self.version)])
        high = max(self.granted)
        # (a) accepted iff the token is the high-water mark
        if token == high:
            assert outcome is None, outcome
            view = self.ledger.resolve(["a"])["a"]
            assert view.continuity.checkpoint_version == self.version
        else:
            assert token < high
            assert isinstance(outcome, StaleFencingTokenError), outcome
            assert (outcome.presented, outcome.current) == (token, high)

    @rule()
    def restart(self) -> None:
        self.ledger.close()
        self.ledger = None
        live = self._live_holder()
        self.ledger = self.store.restart(self.clock)
        now = self.clock.now
        if live is not None:
            self.protected = (live, now + TTL)
            holder, token, expires = self.lease
            self.lease = (holder, token, max(expires, now + TTL))
        else:
            self.protected = None

    @rule(seconds=st.floats(min_value=0.0, max_value=0.999 * TTL, allow_nan=False))
    def restart_then_other_acquires_within_ttl(self, seconds: float) -> None:
        live = self._live_holder()
        self.restart()
        self.clock.advance(seconds)
        other = "B" if live == "A" else "A"
        before = self.ledger.high_water("a")
        if live is not None:
            # (c) checked directly: the lease live at the restart is still protected
            result = self.ledger.acquire(holder=other, identities=["a"], ttl=TTL)["a"]
            assert isinstance(result, LeaseDenied), f"{other} took {live}'s lease {seconds:.3f}s after a restart"
            assert result.holder == live
            assert self.ledger.high_water("a") == before
        else:
            self.acquire(other)

    @invariant()
    def high_water_matches_grants(self) -> None:
        if self.ledger is not None:
            assert self.ledger.high_water("a") == (max(self.granted) if self.granted else 0)


# Each example opens a fresh store; a PostgreSQL database costs far more to create than a file.
MACHINE_EXAMPLES = {"sqlite": 200, "postgresql": 40}


def _machine_for(name: str, backend: type[Backend]) -> type:
    machine = type(f"TwoHolderLedgerMachine_{name}", (TwoHolderLedgerMachine,), {"backend": backend})
    machine.TestCase.settings = settings(
        max_examples=MACHINE_EXAMPLES[name],
        stateful_step_count=30,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    return machine.TestCase


for _name, _backend in BACKENDS.items():
    globals()[f"test_two_holders_fencing_across_restarts_{_name}"] = _machine_for(_name, _backend)


# -- concurrent writers and schema versions ---------------------------------------------


def test_concurrent_grants_from_two_ledgers_never_share_a_token(backend, clock):
    """Two processes' ledgers over one store, racing for one identity from many threads."""
    import threading

    first, second = backend.open(clock), backend.open(clock)
    register(first)
    granted: list[int] = []
    lock = threading.Lock()

    def race(ledger: Ledger, holder: str) -> None:
        for _ in range(15):
            result = ledger.acquire(holder=holder, identities=["a"], ttl=TTL)["a"]
            if isinstance(result, Activation):
                with lock:
                    granted.append(result.grant.fencing_token)
                ledger.release(holder=holder, tokens={"a": result.grant.fencing_token})

    threads = [threading.Thread(target=race, args=(ledger, f"h{index}"))
               for index, ledger in enumerate([first, second, first, second])]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert granted and len(granted) == len(set(granted))  # no token was ever issued twice
    assert first.high_water("a") == max(granted) == second.high_water("a")
    first.close()
    second.close()


def test_a_store_written_by_a_newer_rayfleet_is_refused(backend, clock, ledger):
    from rayfleet.errors import LedgerSchemaError

    register(ledger)
    ledger.close()
    if isinstance(backend, SqliteBackend):
        import sqlite3

        connection = sqlite3.connect(backend.path)
        connection.execute("PRAGMA user_version = 99")
        connection.close()
    else:
        with psycopg.connect(backend.url, autocommit=True) as connection:
            connection.execute("UPDATE rayfleet_schema SET version = 99")
    with pytest.raises(LedgerSchemaError) as caught:
        backend.open(clock)
    assert caught.value.found == 99 and "upgrade rayfleet" in str(caught.value)


def test_held_tells_are_claimed_once_per_age_and_settled_into_at_most_one_letter(ledger, clock):
    register(ledger, "t")
    assert ledger.hold_tell(identity="t", message_id="m1", envelope=b"e1") == ledger.hold_tell(
        identity="t", message_id="m1", envelope=b"other")  # the same message twice is held once
    ledger.hold_tell(identity="t", message_id="m2", envelope=b"e2")
    assert ledger.claim_tells(min_age=5.0) == []  # just accepted: its first delivery is under way
    clock.advance(6.0)
    assert [(m.message_id, m.envelope) for m in ledger.claim_tells(min_age=5.0)] == [("m1", b"e1"), ("m2", b"e2")]
    assert ledger.claim_tells(min_age=5.0) == []  # claimed: no other sweeper takes them now
    clock.advance(6.0)
    assert [m.message_id for m in ledger.claim_tells(min_age=5.0, limit=1)] == ["m1"]

    assert ledger.settle_tell(identity="t", message_id="m1") is True
    assert ledger.settle_tell(identity="t", message_id="m1") is False
    ledger.add_dead_letter(identity="t", message_id="m2", envelope=b"e2", reason="REJECTED", error="boom", attempts=1)
    assert ledger.settle_tell(identity="t", message_id="m2", reason="REJECTED", error="again") is True
    assert [(d.message_id, d.error) for d in ledger.dead_letters(identity="t")] == [("m2", "boom")]
    ledger.hold_tell(identity="t", message_id="m3", envelope=b"e3")
    assert ledger.settle_tell(identity="t", message_id="m3", reason="REJECTED", error="retired") is True
    assert [(d.message_id, d.envelope) for d in ledger.dead_letters(identity="t")][1:] == [("m3", b"e3")]
    clock.advance(60.0)
    assert ledger.claim_tells(min_age=5.0) == []


def test_leases_reports_the_live_holder_and_a_lapsed_lease_as_none(ledger, clock) -> None:
    # Routers ask this to tell a slow owner (still renewing) from a frozen one (lease lapsed).
    register(ledger, "a")
    register(ledger, "b")
    granted = grant(ledger, "A", "a")
    leases = ledger.leases(["a", "b", "nobody"])
    assert set(leases) == {"a", "b"}  # unknown identities are absent
    assert leases["b"] is None
    live = leases["a"]
    assert live is not None and live.holder == "A" and live.fencing_token == granted.fencing_token
    assert 0 < live.expires_in <= TTL
    clock.advance(TTL + 0.1)
    assert ledger.leases(["a"]) == {"a": None}
    grant(ledger, "B", "a")
    after = ledger.leases(["a"])["a"]
    assert after is not None and after.holder == "B" and after.fencing_token > granted.fencing_token


def test_the_leases_of_many_identities_are_read_in_a_few_statements(ledger, clock):
    # A host frozen with a thousand requests waiting on it has its router ask about a
    # thousand leases at once; two statements per identity were two thousand statements
    # (and, on PostgreSQL, round trips) for one look.
    identities = [f"many/{index}" for index in range(1_200)]
    ledger.register_many([spec_record(identity) for identity in identities])
    granted = ledger.acquire(holder="A", identities=identities[:700], ttl=TTL)
    clock.advance(1.0)
    asked = [*identities, "ghost", identities[3]]
    counter = _CountingTransaction(None)

    def read(tx):
        counter._tx = tx
        return _views.leases(counter, asked, clock())

    leases = ledger._db.read(read)
    assert counter.statements <= 3  # one per IN list of 500
    assert set(leases) == set(identities)  # the unknown one is absent, the repeated one once
    assert leases == ledger.leases(asked)
    for identity in identities[:700]:
        live = leases[identity]
        assert live is not None and live.holder == "A"
        assert live.fencing_token == granted[identity].grant.fencing_token
        assert live.expires_in == pytest.approx(TTL - 1.0)
    assert all(leases[identity] is None for identity in identities[700:])


def test_a_checkpoints_keys_keep_the_newest_window_and_their_first_replies(ledger):
    # The window is trimmed as keys are remembered: the newest ``dedup_capacity`` keys stay,
    # a key remembered again keeps its first reply and its place, and a batch's keys count in order.
    register(ledger, "a")
    token = grant(ledger, "h1", "a").fencing_token

    def keyed(version: int, *keys: str, capacity: int = 3) -> CheckpointCommit:
        return CheckpointCommit(
            identity="a", fencing_token=token, version=version,
            pointer=SnapshotPointer(file="", row=0, version=version, inline=b"s"),
            dedup=tuple((key, f"{key}@{version}".encode()) for key in keys), dedup_capacity=capacity,
        )

    assert ledger.commit_checkpoints([keyed(1, "k1"), keyed(2, "k2", "k3")]) == [None, None]
    assert ledger.dedup_window("a") == [("k1", b"k1@1"), ("k2", b"k2@2"), ("k3", b"k3@2")]
    assert ledger.commit_checkpoints([keyed(3, "k2")]) == [None]  # known: first reply kept, nothing trimmed
    assert ledger.dedup_window("a") == [("k1", b"k1@1"), ("k2", b"k2@2"), ("k3", b"k3@2")]
    assert ledger.commit_checkpoints([keyed(4, "k4", "k5")]) == [None]
    assert ledger.dedup_window("a") == [("k3", b"k3@2"), ("k4", b"k4@4"), ("k5", b"k5@4")]
    # A refused checkpoint remembers none of its keys.
    [refused] = ledger.commit_checkpoints([keyed(4, "k6")])
    assert isinstance(refused, StaleCheckpointVersionError)
    assert ledger.dedup_window("a") == [("k3", b"k3@2"), ("k4", b"k4@4"), ("k5", b"k5@4")]
    # A key repeated in one checkpoint counts once, with its first reply.
    assert ledger.commit_checkpoints([keyed(5, "k7", "k7", capacity=4)]) == [None]
    assert ledger.dedup_window("a") == [("k3", b"k3@2"), ("k4", b"k4@4"), ("k5", b"k5@4"), ("k7", b"k7@5")]
    # A smaller window trims on the next commit, even one whose only key is known already.
    assert ledger.commit_checkpoints([keyed(6, "k5", capacity=1)]) == [None]
    assert ledger.dedup_window("a") == [("k7", b"k7@5")]


def test_remembering_a_key_costs_the_same_however_full_the_window_is(tmp_path, clock):
    """A commit's key bookkeeping must not scan the identity's whole dedup window.

    Counted in SQLite virtual-machine instructions (its progress handler), not in
    seconds: the same one-key commit on a window of 100 and of 5,000 keys.
    """
    import sqlite3

    from rayfleet.ledger import _checkpoints
    from rayfleet.ledger._sqlite import _Statements

    backend = SqliteBackend(tmp_path)
    backend.open(clock).close()  # the file with every migration applied
    connection = sqlite3.connect(backend.path)

    def instructions_to_remember_one_key(identity: str, window: int) -> int:
        connection.executemany("INSERT INTO dedup (identity, key, reply, seq) VALUES (?, ?, ?, ?)",
                               [(identity, f"k{seq}", b"r", seq) for seq in range(1, window + 1)])
        steps = [0]

        def count() -> int:
            steps[0] += 1
            return 0

        connection.set_progress_handler(count, 100)
        statements = _Statements(connection)
        _checkpoints._remember_keys(statements, identity, (("new", b"r"),), 10_000)
        statements.close()
        connection.set_progress_handler(None, 100)
        return steps[0] * 100

    small = instructions_to_remember_one_key("small", 100)
    large = instructions_to_remember_one_key("large", 5_000)
    assert large < 3 * max(small, 100), (small, large)
    connection.close()


def test_a_journal_write_answers_what_is_asked_of_the_run(ledger):
    run = "r-asked"
    ledger.create_run(run_id=run, workflow="wf", code_version="v1", definition=None)
    token = ledger.acquire_run_lease(run_id=run, holder="engine", ttl=TTL).token
    assert ledger.journal_step(run_id=run, fencing_token=token, label="s1", output=b"x", tokens=0) == RunRequests()
    ledger.request_run(run_id=run, cancel=True)
    assert ledger.journal_step(run_id=run, fencing_token=token, label="s2", output=b"y",
                               tokens=0) == RunRequests(cancel=True)
    ledger.request_run(run_id=run, cancel=False, pause=True)
    assert ledger.journal_step(run_id=run, fencing_token=token, label="s2", output=b"z",
                               tokens=0) == RunRequests(pause=True)  # a repeat: kept the first, still answers
    assert [entry.output for entry in ledger.journal(run).steps] == [b"x", b"y"]


def test_a_batch_is_judged_in_order_whether_or_not_every_commit_passes(ledger):
    for name in ("a", "b"):
        register(ledger, name)
    a, b = grant(ledger, "h1", "a").fencing_token, grant(ledger, "h1", "b").fencing_token
    # Every commit passes (a twice, the second newer): all move, the last one of a wins.
    assert ledger.commit_checkpoints([commit("a", a, 1), commit("b", b, 1), commit("a", a, 2, row=7)]) == [None] * 3
    assert ledger.resolve(["a"])["a"].continuity.checkpoint_version == 2
    # One older than the one before it in the same batch, one under a stale token: only those two refused,
    # and nothing of the batch's failed attempt at once is left behind.
    outcomes = ledger.commit_checkpoints([commit("a", a, 4), commit("a", a, 3), commit("b", b - 1, 2),
                                          commit("b", b, 5, row=9)])
    assert outcomes[0] is None and outcomes[3] is None
    assert isinstance(outcomes[1], StaleCheckpointVersionError) and isinstance(outcomes[2], StaleFencingTokenError)
    views = ledger.resolve(["a", "b"])
    assert views["a"].continuity.checkpoint_version == 4
    assert (views["b"].continuity.checkpoint_version, views["b"].snapshot.row) == (5, 9)


@pytest.mark.parametrize("store", sorted(BACKENDS))
def test_a_checkpoint_is_stamped_by_the_stores_clock_inside_its_update(store, tmp_path, monkeypatch):
    """Without an injected clock, ``committed_at`` is the store's clock, read by the update itself.

    On PostgreSQL reading the clock first cost a round trip of its own. A commit of one
    checkpoint that passes is now one statement sent outside any transaction (one round
    trip, no exchange of a transaction at all), counted at the transaction's send.
    """
    from rayfleet.ledger import _postgres

    if store == "postgresql":
        url = pg_support.create_database()
        ledger = Ledger(PostgresDatabase(url, pool_size=2))
    else:
        ledger = Ledger(SqliteBackend(tmp_path).path)
    try:
        register(ledger, "a")
        token = grant(ledger, "H", "a").fencing_token
        sends = [0]
        real_send = _postgres._Transaction.send

        def counted(self: object) -> None:
            sends[0] += 1
            real_send(self)  # type: ignore[arg-type]

        monkeypatch.setattr(_postgres._Transaction, "send", counted)
        before = time.time()
        assert ledger.commit_checkpoints([commit("a", token, 1)]) == [None]
        after = time.time()
        [row] = ledger.latest_checkpoints(limit=1)
        assert row.committed_at is not None and before - 0.5 <= row.committed_at <= after + 0.5
        if store == "postgresql":
            assert sends[0] == 1  # the read of latest_checkpoints; the commit was one statement of its own
    finally:
        ledger.close()
        if store == "postgresql":
            pg_support.drop_database(url)


def test_a_keyed_checkpoint_on_postgresql_enters_no_pipeline(monkeypatch):
    """A checkpoint with one idempotency key: the update, then the key (remembered and the window
    trimmed in one statement), then the COMMIT, each on its own.

    The key's two statements went in a pipeline with the COMMIT, and psycopg's pipeline mode
    costs more per use than the round trips it saves (0.70 against 0.64 ms per commit in one
    process, ``/tmp/prof/keycost.py`` on 2026-12-02).
    """

    url = pg_support.create_database()
    ledger = Ledger(PostgresDatabase(url, pool_size=2))
    try:
        register(ledger, "a")
        token = grant(ledger, "H", "a").fencing_token
        pipelines = [0]
        real_pipeline = psycopg.Connection.pipeline

        def counted(self: psycopg.Connection) -> object:
            pipelines[0] += 1
            return real_pipeline(self)

        monkeypatch.setattr(psycopg.Connection, "pipeline", counted)
        keyed = CheckpointCommit(identity="a", fencing_token=token, version=1,
                                 pointer=SnapshotPointer(file="", row=0, version=1, inline=b"s"),
                                 dedup=(("k1", b"r1"),), dedup_capacity=5)
        assert ledger.commit_checkpoints([keyed]) == [None]
        assert pipelines[0] == 0
        monkeypatch.undo()
        assert ledger.dedup_window("a") == [("k1", b"r1")]
    finally:
        ledger.close()
        pg_support.drop_database(url)


# -- workflow steps journaled with a checkpoint -----------------------------------------

def _with_step(identity: str, token: int, version: int, *, run: str, run_token: int, label: str,
               output: bytes, tokens: int = 0) -> CheckpointCommit:
    return CheckpointCommit(
        identity=identity, fencing_token=token, version=version,
        pointer=SnapshotPointer(file="", row=0, version=version, inline=b"state"),
        step=StepEntry(run_id=run, run_token=run_token, label=label, output=output, tokens=tokens),
    )


def test_a_checkpoint_journals_the_step_it_carries_in_its_transaction(ledger):
    register(ledger)
    agent = grant(ledger, "h1")
    run = new_run(ledger)
    run_token = ledger.acquire_run_lease(run_id=run, holder="E1", ttl=TTL).token
    (outcome,) = ledger.commit_checkpoints([_with_step("a", agent.fencing_token, 1, run=run, run_token=run_token,
                                                       label="s1", output=b"one", tokens=7)])
    assert outcome == StepJournaled(inserted=True, requests=RunRequests())
    assert [(e.label, e.output, e.tokens) for e in ledger.journal(run).steps] == [("s1", b"one", 7)]
    assert ledger.resolve(["a"])["a"].continuity.checkpoint_version == 1
    # The same step again (an earlier attempt journaled first): the first output stays, and it says so.
    ledger.request_run(run_id=run, pause=True)
    (again,) = ledger.commit_checkpoints([_with_step("a", agent.fencing_token, 2, run=run, run_token=run_token,
                                                     label="s1", output=b"two")])
    assert again == StepJournaled(inserted=False, requests=RunRequests(pause=True))
    assert [(e.label, e.output) for e in ledger.journal(run).steps] == [("s1", b"one")]
    assert ledger.resolve(["a"])["a"].continuity.checkpoint_version == 2


def test_a_stale_run_token_journals_nothing_and_refuses_nothing(ledger, clock):
    register(ledger)
    agent = grant(ledger, "h1")
    run = new_run(ledger)
    old = ledger.acquire_run_lease(run_id=run, holder="E1", ttl=TTL).token
    clock.advance(TTL + 1)
    ledger.acquire_run_lease(run_id=run, holder="E2", ttl=TTL)
    (outcome,) = ledger.commit_checkpoints([_with_step("a", agent.fencing_token, 1, run=run, run_token=old,
                                                       label="s1", output=b"zombie")])
    assert outcome is None  # the checkpoint stands on its own; the engine journals (and is refused) itself
    assert ledger.journal(run).steps == ()
    assert ledger.resolve(["a"])["a"].continuity.checkpoint_version == 1
    # A run that never had a lease, or none at all: the same.
    (unknown,) = ledger.commit_checkpoints([_with_step("a", agent.fencing_token, 2, run="no-such-run", run_token=1,
                                                       label="s1", output=b"x")])
    assert unknown is None and ledger.journal("no-such-run").steps == ()


def test_a_refused_checkpoint_journals_no_step(ledger, clock):
    register(ledger)
    register(ledger, "b")
    old = grant(ledger, "h1", ttl=1.0)
    clock.advance(2.0)
    grant(ledger, "h2")
    other = grant(ledger, "h1", "b")
    run = new_run(ledger)
    run_token = ledger.acquire_run_lease(run_id=run, holder="E1", ttl=TTL).token
    outcomes = ledger.commit_checkpoints([
        _with_step("a", old.fencing_token, 1, run=run, run_token=run_token, label="s1", output=b"fenced"),
        _with_step("b", other.fencing_token, 1, run=run, run_token=run_token, label="s2", output=b"two"),
    ])
    assert isinstance(outcomes[0], StaleFencingTokenError)
    assert outcomes[1] == StepJournaled(inserted=True, requests=RunRequests())
    assert [(e.label, e.output) for e in ledger.journal(run).steps] == [("s2", b"two")]
