"""What every benchmark gets: the size set, fresh fleets on either ledger store, and plain Ray actors.

Each benchmark makes its own fleet (its own Ray namespace, storage folder and ledger)
and stops it afterwards, so no benchmark sees another's agents. PostgreSQL ledgers
live in one database made for the run (``bench_<hex>``), one schema per fleet; the
database is dropped when the run ends. Where the server does not answer, the
PostgreSQL variants are skipped and the reason is printed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

import psycopg
import ray

import rayfleet as rf

from ._agents import plain_actor
from ._measure import Retries
from ._report import Result

Mode = Literal["full", "quick", "smoke"]
Store = Literal["sqlite", "postgresql"]
STORES: tuple[Store, ...] = ("sqlite", "postgresql")
POSTGRES_SERVER = os.environ.get("RAYFLEET_BENCH_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres")
"""The server PostgreSQL ledgers are made on (trust auth on the local server by default)."""
HOSTS = 2
"""Host actors per fleet: one per CPU of the 2-CPU machine the figures are taken on."""
RETRIED: tuple[type[BaseException], ...] = (rf.LeaseLostError, rf.LedgerUnavailableError, rf.FleetUnavailableError)
"""Errors whose message tells the caller to retry: a call failing with one is retried (and counted)."""


def retries() -> Retries:
    """A fresh counter of retried calls (see :data:`RETRIED`)."""
    return Retries(RETRIED)


@dataclass(frozen=True, slots=True)
class Unit:
    """One benchmark on one ledger store: ``run(context, store)`` returns its rows."""

    id: str
    title: str
    run: Callable[[Context, Store], list[Result]]
    store: Store = "sqlite"

    @property
    def label(self) -> str:
        return f"{self.id} {self.title} {self.store}"


class PostgresLedgers:
    """Fresh, empty PostgreSQL ledgers: one database per run, one schema per ledger."""

    def __init__(self, server: str = POSTGRES_SERVER) -> None:
        self.server = server
        self._database: str | None = None
        self._problem: str | None = None
        self._checked = False

    def problem(self) -> str | None:
        """Why no PostgreSQL ledger can be made (checked once), or ``None`` when one can."""
        if not self._checked:
            self._checked = True
            try:
                with psycopg.connect(self.server, connect_timeout=3, autocommit=True) as connection:
                    connection.execute("SELECT 1")
            except psycopg.Error as error:
                self._problem = f"PostgreSQL at {self.server} does not answer ({type(error).__name__}: " \
                                f"{str(error).strip()})"
        return self._problem

    def _url(self, database: str, schema: str | None = None) -> str:
        query = f"options=-csearch_path%3D{schema}" if schema else ""
        return urlunsplit(urlsplit(self.server)._replace(path=f"/{database}", query=query))

    def create(self) -> tuple[str, str]:
        """A new ledger: its URL and its schema's name."""
        if self._database is None:
            name = f"bench_{uuid.uuid4().hex[:12]}"
            with psycopg.connect(self.server, autocommit=True) as connection:
                connection.execute(f'CREATE DATABASE "{name}"')
            self._database = name
        schema = f"f_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self._url(self._database), autocommit=True) as connection:
            connection.execute(f'CREATE SCHEMA "{schema}"')
        return self._url(self._database, schema), schema

    def drop_schema(self, schema: str) -> None:
        if self._database is None:
            return
        with contextlib.suppress(psycopg.Error), psycopg.connect(self._url(self._database),
                                                                   autocommit=True) as connection:
            connection.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')

    def close(self) -> None:
        """Drop the run's database (and every schema in it)."""
        if self._database is None:
            return
        with contextlib.suppress(psycopg.Error), psycopg.connect(self.server, autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{self._database}" WITH (FORCE)')
        self._database = None


class Context:
    """The run's size set and the means to make fleets and plain actors."""

    def __init__(self, mode: Mode, *, postgres: PostgresLedgers | None = None) -> None:
        self.mode: Mode = mode
        self.postgres = postgres or PostgresLedgers()

    def note(self) -> str:
        """How this run's sizes relate to the issue's (for a row's detail)."""
        if self.mode == "full":
            return "full run: the issue's sizes"
        return f"{self.mode} run: smaller sizes than the issue's (see sizes)"

    def detail(self, sizes: Any, **more: Any) -> dict[str, Any]:
        """A row's detail: the mode note, the sizes used (a dataclass), and ``more``."""
        return {"mode": self.note(), "sizes": dataclasses.asdict(sizes), **more}

    @contextlib.contextmanager
    def fleet(self, store: Store, *, hosts: int = HOSTS, **options: Any) -> Iterator[rf.Fleet]:
        """A new fleet on ``store`` in its own namespace and storage folder, stopped and removed afterwards.

        ``options`` go to :func:`rayfleet.connect` (``lease_ttl``, ``idle_timeout``).
        """
        storage = tempfile.mkdtemp(prefix="rayfleet-bench-")
        schema: str | None = None
        ledger: str | None = None
        if store == "postgresql":
            ledger, schema = self.postgres.create()
        fleet: rf.Fleet | None = None
        try:
            fleet = rf.connect(storage=storage, ledger=ledger, namespace=f"bench-{uuid.uuid4().hex[:10]}",
                               hosts=hosts, **options)
            yield fleet
        finally:
            if fleet is not None:
                fleet.shutdown(stop_actors=True)
            if schema is not None:
                self.postgres.drop_schema(schema)
            shutil.rmtree(storage, ignore_errors=True)


@contextlib.contextmanager
def plain_actors(count: int) -> Iterator[list[ray.actor.ActorHandle]]:
    """``count`` running :class:`~benchmarks._agents.PlainActor` (each answered a ping), killed afterwards."""
    handles = [plain_actor() for _ in range(count)]
    try:
        ray.get([handle.ping.remote() for handle in handles])
        yield handles
    finally:
        kill(handles)


def kill(handles: Sequence[ray.actor.ActorHandle]) -> None:
    for handle in handles:
        with contextlib.suppress(Exception):
            ray.kill(handle)
