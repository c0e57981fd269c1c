"""The PostgreSQL server restarts mid-load: nothing acknowledged is lost, no effect happens twice."""

from __future__ import annotations

import threading
import time
from collections import Counter as Tally
from typing import Any

import pg_support
import pytest
from agents import Counter

import rayfleet as rf

AGENTS = 8
CALLS = 240
AFTER_RESTART = 20


@pytest.mark.chaos
@pytest.mark.timeout(300)
def test_a_postgresql_restart_mid_load_loses_nothing_acknowledged(postgres_ledger: str, make_fleet: Any) -> None:
    # postgres_ledger comes first, so its database outlives the fleets make_fleet shuts down.
    command = pg_support.restart_command()
    if command is None:
        pg_support.require()
        pytest.skip("the test PostgreSQL server is not a local cluster this test can restart (pg_ctlcluster)")
    fleet: rf.Fleet = make_fleet(ledger=postgres_ledger, lease_ttl=5.0)
    refs = [fleet.spawn(f"pg-restart/{index}", Counter) for index in range(AGENTS)]
    acknowledged: Tally[str] = Tally()
    retried_errors: list[str] = []
    restarted = threading.Event()

    def restart() -> None:
        pg_support.restart_server(command)  # under the lock every restart of the shared server holds
        restarted.set()

    restarter = threading.Thread(target=restart)
    calls_after_restart = 0
    index = -1
    # At least CALLS calls, and some sent after the restart completed, however long the
    # server takes to stop and start (seen: all 240 answered before the restart got going).
    while index + 1 < CALLS or calls_after_restart < AFTER_RESTART:
        index += 1
        calls_after_restart += restarted.is_set()
        if index == CALLS // 3:
            restarter.start()
        assert index <= CALLS // 3 or restarter.is_alive() or restarted.is_set(), "the restart of PostgreSQL failed"
        ref = refs[index % AGENTS]
        deadline = time.monotonic() + 90
        while True:
            # The same idempotency key on every retry: an effect that was already durable is
            # answered from the dedup window, never applied twice.
            try:
                ref.call(Counter.add, n=1, idempotency_key=f"k{index}", timeout=30)
                acknowledged[ref.identity] += 1
                break
            except (rf.RayfleetError, TimeoutError) as error:
                retried_errors.append(type(error).__name__)
                assert time.monotonic() < deadline, f"call {index} kept failing: {retried_errors[-5:]}"
                time.sleep(0.2)
    restarter.join()
    # The restart happened while calls were running: some were sent after it completed.
    assert restarted.is_set() and calls_after_restart > 0, calls_after_restart
    print(f"calls after the restart: {calls_after_restart}; retried errors: {Tally(retried_errors)}")
    totals = {ref.identity: ref.call(Counter.get) for ref in refs}
    assert totals == dict(acknowledged), retried_errors
    assert sum(totals.values()) == index + 1
