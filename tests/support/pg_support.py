"""A real PostgreSQL for the tests: one database per test process, one fresh schema per use.

The database (a unique name) is created on first use and dropped when the process
exits; each use gets its own schema in it (through the connection's ``search_path``),
dropped afterwards, so tests never see each other's tables. A schema costs
milliseconds to create, a database most of a second.

The server comes from ``RAYFLEET_TEST_POSTGRES`` (default: the local server on
127.0.0.1:5432, user ``postgres``, trust auth). Where none answers, PostgreSQL tests
skip with how to run them, except under CI (``CI`` set), where they fail: CI must never
pass without running them.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import shutil
import subprocess
import uuid
from urllib.parse import parse_qs, urlsplit, urlunsplit

import psycopg
import pytest

SERVER_URL = os.environ.get("RAYFLEET_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres")
HOW_TO_RUN = (
    "start a PostgreSQL server on 127.0.0.1:5432 with trust auth for user postgres "
    "(e.g. `pg_ctlcluster --skip-systemctl-redirect <version> main start`), or set "
    "RAYFLEET_TEST_POSTGRES=postgresql://user:password@host:port/postgres"
)
_problem: str | bool | None = False  # False: not checked yet


def unavailable() -> str | None:
    """Why the test server cannot be used, or ``None`` when it can (checked once per process)."""
    global _problem
    if _problem is False:
        try:
            with psycopg.connect(SERVER_URL, connect_timeout=3, autocommit=True) as connection:
                connection.execute("SELECT 1")
            _problem = None
        except psycopg.Error as error:
            _problem = f"{type(error).__name__}: {str(error).strip()}"
    return _problem if isinstance(_problem, str) else None


def require() -> None:
    """Skip (or, under CI, fail) the calling test when the server cannot be used."""
    problem = unavailable()
    if problem is None:
        return
    message = f"PostgreSQL at {SERVER_URL} is not usable ({problem}); to run these tests, {HOW_TO_RUN}"
    if os.environ.get("CI"):
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


_database: str | None = None


def _session_database() -> str:
    global _database
    if _database is None:
        name = f"rayfleet_test_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(SERVER_URL, autocommit=True) as connection:
            connection.execute(f'CREATE DATABASE "{name}"')
        _database = name
        atexit.register(_drop_session_database)
    return _database


def _drop_session_database() -> None:
    if _database is not None:
        with contextlib.suppress(psycopg.Error), psycopg.connect(SERVER_URL, autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{_database}" WITH (FORCE)')


def _url(database: str, schema: str | None = None) -> str:
    query = f"options=-csearch_path%3D{schema}" if schema else ""
    return urlunsplit(urlsplit(SERVER_URL)._replace(path=f"/{database}", query=query))


def create_database() -> str:
    """A new, empty ledger database on the test server (a fresh schema of this process's database); its URL."""
    require()
    schema = f"t_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(_url(_session_database()), autocommit=True) as connection:
        connection.execute(f'CREATE SCHEMA "{schema}"')
    return _url(_session_database(), schema)


def drop_database(url: str) -> None:
    schema = parse_qs(urlsplit(url).query).get("options", ["=x"])[0].split("=", 1)[1]
    with psycopg.connect(_url(_session_database()), autocommit=True) as connection:
        connection.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


RESTART_LOCK = "/tmp/rayfleet-test-postgres-restart.lock"
"""Held (``flock``) around every restart of the shared test server, so two test processes never restart it at once."""


def restart_command() -> list[str] | None:
    """How to restart the local test server on port 5432 (``pg_ctlcluster``), or ``None`` when this machine cannot."""
    if shutil.which("pg_ctlcluster") is None or shutil.which("pg_lsclusters") is None:
        return None
    listing = subprocess.run(["pg_lsclusters", "--no-header"], capture_output=True, text=True, check=False)
    for line in listing.stdout.splitlines():
        version, cluster, port, *_ = line.split()
        if port == "5432":
            return ["pg_ctlcluster", "--skip-systemctl-redirect", version, cluster, "restart"]
    return None


def restart_server(command: list[str]) -> None:
    """Restart the shared test server with ``command`` (from :func:`restart_command`), holding :data:`RESTART_LOCK`."""
    with open(RESTART_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        subprocess.run(command, check=True, capture_output=True, timeout=120)
