"""A client stopped in the middle of a transaction's pipeline must not hold the ledger's rows for as long as it is stopped.

PostgreSQL ends a session left idle inside a transaction (``idle_in_transaction_session_timeout``),
but a client stopped after sending some of a pipeline's statements and before its Sync
(a host frozen in the middle of ``executemany``) leaves its session *active*, waiting for
the client's next message: no server timeout covers that wait, and the rows its statements
locked stay locked. Seen in the chaos profile: a host stopped in the middle of a batch
commit held its agents' continuity rows for its whole 8 s freeze, and the host taking
them over waited on them. These tests stop a real client that way.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest
from polling import eventually

from rayfleet.ledger._ledger import Ledger
from rayfleet.ledger._postgres import PostgresDatabase
from rayfleet.ledger._stall_watch import StallWatch
from rayfleet.ledger._values import Activation, SpecRecord

PATIENCE = 60.0
"""Upper bound on the waits below, so a broken build fails rather than hangs; never an expected duration."""


def close_all(clients: list[psycopg.Connection[Any]]) -> None:
    """Close the stopped clients (whatever the test found), which releases what they hold."""
    for connection in clients:
        connection.close()


def stopped_mid_pipeline(url: str, identity: str) -> psycopg.Connection[Any]:
    """A client that sent ``BEGIN`` and an update of ``identity``'s continuity row in a pipeline, then stopped.

    No Sync follows, as when a process is stopped between the statements of an
    ``executemany``: the server ran both, holds the row lock and waits for the rest.
    """
    connection = psycopg.connect(url, autocommit=True)
    client = connection.pgconn
    client.enter_pipeline_mode()
    client.send_query_params(b"BEGIN", None)
    client.send_query_params(b"UPDATE continuity SET generation = generation WHERE identity = $1", [identity.encode()])
    client.flush()
    return connection


def stopped_reading(url: str, identity: str) -> psycopg.Connection[Any]:
    """A client that locked ``identity``'s continuity row and stopped reading a large result.

    The server blocks writing the result once the socket's buffers are full, holding the lock.
    """
    connection = psycopg.connect(url, autocommit=True)
    sql = (f"BEGIN; UPDATE continuity SET generation = generation WHERE identity = '{identity}'; "
           "SELECT repeat('x', 1000) FROM generate_series(1, 200000)")
    connection.pgconn.send_query(sql.encode())
    connection.pgconn.flush()
    return connection


def stopped_idle_past_the_limit(url: str, identity: str) -> psycopg.Connection[Any]:
    """A client idle inside a transaction that holds ``identity``'s continuity row, which the server does not end.

    As the chaos profile found a frozen host's session: idle in its transaction long past
    ``idle_in_transaction_session_timeout`` (the server's attempt to end it blocked on the
    unread result before it). Here the session simply has no such limit.
    """
    connection = psycopg.connect(url, autocommit=True)
    connection.execute("SET idle_in_transaction_session_timeout = 0")
    connection.execute("BEGIN")
    connection.execute("UPDATE continuity SET generation = generation WHERE identity = %s", (identity,))
    return connection


STALLS = {
    "mid-pipeline": (stopped_mid_pipeline, ("active", "ClientRead")),
    "result unread": (stopped_reading, ("active", "ClientWrite")),
    "idle past the limit": (stopped_idle_past_the_limit, ("idle in transaction", "ClientRead")),
}


def session_state(url: str, pid: int) -> tuple[str, str] | None:
    with psycopg.connect(url, autocommit=True) as observer:
        row = observer.execute("SELECT state, wait_event FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
    return None if row is None else (str(row[0]), str(row[1]))


def waiting_on_a_lock(url: str) -> bool:
    with psycopg.connect(url, autocommit=True) as observer:
        row = observer.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                               "AND wait_event_type = 'Lock'").fetchone()
    return row is not None and int(row[0]) > 0


def leased(ledger: Ledger, identity: str, *, holder: str, ttl: float) -> Activation:
    activation = ledger.acquire(holder=holder, identities=[identity], ttl=ttl)[identity]
    assert isinstance(activation, Activation), activation
    return activation


def register(ledger: Ledger, *identities: str) -> None:
    for identity in identities:
        ledger.register(SpecRecord(identity=identity, spec=b"s", fingerprint="f", agent_class="m:C", labels={}))


def acquire_in_background(ledger: Ledger, identity: str, holder: str) -> tuple[threading.Thread, list[Any]]:
    outcome: list[Any] = []

    def attempt() -> None:
        try:
            outcome.append(ledger.acquire(holder=holder, identities=[identity], ttl=60)[identity])
        except Exception as error:  # the test reads what happened
            outcome.append(error)

    thread = threading.Thread(target=attempt, daemon=True)
    thread.start()
    return thread, outcome


@pytest.mark.parametrize("stall", list(STALLS))
def test_a_stopped_clients_session_that_others_wait_on_is_ended(postgres_url: str, stall: str) -> None:
    stop, state = STALLS[stall]
    ledger = Ledger(PostgresDatabase(postgres_url))
    clients: list[psycopg.Connection[Any]] = []
    try:
        register(ledger, "t/frozen", "t/idle")
        old = leased(ledger, "t/frozen", holder="frozen-host", ttl=0.2)
        stopped = stop(postgres_url, "t/frozen")
        bystander = stop(postgres_url, "t/idle")  # stalled too, but nobody waits on it
        clients += [stopped, bystander]
        pid, bystander_pid = stopped.info.backend_pid, bystander.info.backend_pid
        # What PostgreSQL's own timeout does not end.
        assert eventually(lambda: session_state(postgres_url, pid) == state, f"the stall ({state})", PATIENCE)
        time.sleep(0.3)  # the old lease lapses
        thread, outcome = acquire_in_background(ledger, "t/frozen", "live-host")
        eventually(lambda: waiting_on_a_lock(postgres_url), "the new holder waiting on the stopped client's lock",
                   PATIENCE)

        assert ledger.end_stalled_sessions(older_than=3600.0) == {}  # not stalled that long: left alone
        ended = ledger.end_stalled_sessions(older_than=0.0)

        assert list(ended) == [pid]  # the bystander blocks nobody and is left alone
        thread.join(PATIENCE)
        (activation,) = outcome
        assert isinstance(activation, Activation), activation
        assert activation.grant.holder == "live-host"
        assert activation.grant.fencing_token > old.grant.fencing_token
        assert session_state(postgres_url, pid) is None
        assert session_state(postgres_url, bystander_pid) == state
    finally:
        close_all(clients)
        ledger.close()


def test_the_stall_watch_frees_a_new_holder_waiting_on_a_stopped_client(postgres_url: str) -> None:
    ledger = Ledger(PostgresDatabase(postgres_url))
    clients: list[psycopg.Connection[Any]] = []
    watch = StallWatch(ledger, every=0.2, older_than=0.5)
    try:
        register(ledger, "t/frozen")
        leased(ledger, "t/frozen", holder="frozen-host", ttl=0.2)
        clients.append(stopped_mid_pipeline(postgres_url, "t/frozen"))
        time.sleep(0.3)
        watch.start()
        thread, outcome = acquire_in_background(ledger, "t/frozen", "live-host")
        thread.join(PATIENCE)

        # Without the watch the new holder waits for as long as the client stays stopped.
        assert outcome, "the new holder still waits on the stopped client's lock"
        (activation,) = outcome
        assert isinstance(activation, Activation), activation
        assert watch.ended == 1
    finally:
        watch.stop()
        close_all(clients)
        ledger.close()

