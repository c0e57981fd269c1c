"""The global options every command shares, and the one way a command attaches to its fleet."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import click

from ..errors import FleetNotFoundError

if TYPE_CHECKING:
    from ..platform._fleet import Fleet
    from ..platform._stored import StoredFleet


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetOptions:
    """Where the fleet is: the root group's options, after click applied their environment variables."""

    address: str | None
    """Ray address; ``None``: RAY_ADDRESS, else a cluster ``ray start`` left on this machine."""
    storage: str | None
    """Storage folder or URI; ``None``: RAYFLEET_STORAGE, else ``./.rayfleet``."""
    ledger: str | None
    """Ledger URL; ``None``: RAYFLEET_LEDGER, else SQLite in the storage folder."""
    namespace: str
    """Ray namespace of the fleet."""


pass_options = click.make_pass_decorator(FleetOptions)


@contextlib.contextmanager
def open_fleet(options: FleetOptions, *, create: bool = False, hosts: int | None = None) -> Iterator[Fleet]:
    """The fleet the options name, disconnected afterwards.

    Without ``create`` (every command but ``apply`` and ``gateway``) it only attaches to
    a running fleet and creates nothing where there is none: no local Ray, fleet
    marker, ledger or host (``FleetNotFoundError`` instead, exit 2). With ``create`` it
    attaches to a running fleet just the same (its host count untouched), and only
    when there is none starts one, as ``rf.connect(hosts=hosts)`` does. The fleet's actors are
    stopped afterwards only when this command started the Ray under them, as
    ``fleet.shutdown()`` does: a command never stops a fleet it attached to.
    """
    from ..platform._fleet import connect  # Ray loads only for commands that reach a fleet

    def attach(*, create: bool) -> Fleet:
        return connect(address=options.address, storage=options.storage, ledger=options.ledger,
                       namespace=options.namespace, hosts=hosts, create=create)

    try:
        fleet = attach(create=False)
    except FleetNotFoundError:
        if not create:
            raise
        fleet = attach(create=True)
    try:
        yield fleet
    finally:
        fleet.shutdown(stop_actors=fleet.started_ray)


@contextlib.contextmanager
def open_records(options: FleetOptions) -> Iterator[Fleet | StoredFleet]:
    """The fleet to read from: the running fleet when a cluster runs it, else its records on disk.

    For the read-only commands (``status``, ``list``, ``export``, ``dead-letters list``,
    ``runs list|show``, ``topology export``). When :func:`open_fleet` finds no running
    fleet, the fleet's SQLite ledger and storage are read directly
    (:class:`~rayfleet.platform._stored.StoredFleet`): read-only, creating nothing, no Ray.
    Where there is nothing to read either (no fleet in the storage, no ledger file, a
    PostgreSQL ledger), the error of the attempt to attach is raised.
    """
    from ..platform._fleet import connect
    from ..platform._stored import StoredFleet

    try:
        fleet: Fleet | StoredFleet = connect(address=options.address, storage=options.storage, ledger=options.ledger,
                                             namespace=options.namespace, create=False)
    except FleetNotFoundError as not_running:
        try:
            fleet = StoredFleet.open(options.storage, options.ledger)
        except FleetNotFoundError:
            raise not_running from None
    try:
        yield fleet
    finally:
        fleet.shutdown(stop_actors=fleet.started_ray)
