"""Ray attach: how a driver finds and joins the Ray cluster its fleet runs on, or starts a local one."""

from __future__ import annotations

import os
import socket
from urllib.parse import urlsplit

import ray

from ..errors import FleetNotFoundError, FleetUnavailableError
from ._ray_internals import bootstrap_address, started_head_node

RAY_PROBE_TIMEOUT = 5.0
"""Seconds to wait for a TCP connection to a Ray address before ``ray.init`` is even tried."""


def join_ray(address: str | None, *, namespace: str, create: bool) -> bool:
    """``ray.init`` this process into ``namespace``; returns whether that started a new local Ray.

    With ``create`` and no ``address``, Ray attaches to a cluster it discovers
    (``RAY_ADDRESS``, or the address file a ``ray start`` on this machine wrote) and
    otherwise starts a local one; without ``create`` it only attaches (see
    :func:`attach_address`). The answer is what ``ray.init`` did, never inferred from
    the address: a discovered cluster's fleet must outlive this driver.

    Raises:
        FleetNotFoundError: without ``create``, no address was given and no cluster was found.
        FleetUnavailableError: nothing answers at the address, or Ray refused the connection.
    """
    address = address if create else attach_address(address)
    if address:
        require_listener(address)
    try:
        ray.init(address=address, namespace=namespace, log_to_driver=True,
                 include_dashboard=None if address else False)
    except ConnectionError as error:
        # Ray reports a missing auth token only in its own log lines, as a failed connection.
        hint = "" if os.environ.get("RAY_AUTH_MODE") == "token" else (
            " (a cluster with Ray's token authentication, which `ray start` enables, also needs "
            "RAY_AUTH_MODE=token on this client)")
        raise FleetUnavailableError(detail=f"cannot connect to Ray at {address!r}: {error}{hint}") from error
    return started_head_node()


def require_listener(address: str) -> None:
    """Fail fast when nothing listens at a ``host:port`` (or ``ray://host:port``) Ray address.

    ``ray.init`` retries an address where nothing listens for many minutes; one TCP
    connection tells at once. Addresses in another form (``auto``, ``local``) are left
    to Ray.

    Raises:
        FleetUnavailableError: the connection was refused or timed out.
    """
    parts = urlsplit("//" + address.removeprefix("ray://"))
    try:
        host, port = parts.hostname, parts.port
    except ValueError:  # a port that is not a number: Ray's own message says more
        return
    if not host or port is None:
        return
    try:
        with socket.create_connection((host, port), timeout=RAY_PROBE_TIMEOUT):
            pass
    except OSError as error:
        raise FleetUnavailableError(
            detail=f"nothing answers at the Ray address {address!r} ({error}); start the cluster "
                   f"(`ray start --head --port {port}`) or give the right address (connect(address=...), RAY_ADDRESS "
                   f"or rayfleet --address)"
        ) from None


def attach_address(address: str | None) -> str:
    """The Ray address to attach to without starting a local Ray: ``address``, else the one ``ray.init()`` finds.

    Raises:
        FleetNotFoundError: no address was given and ``ray.init()`` would find no cluster.
    """
    if address:
        return address
    found = bootstrap_address()
    if not found:
        raise FleetNotFoundError(
            missing="no running Ray cluster was found (RAY_ADDRESS is not set and no `ray start` cluster was found "
                    "on this machine)",
            remedy="start the fleet's cluster (`ray start --head --port <port>`) or give its address "
                   "(connect(address=...), RAY_ADDRESS or rayfleet --address)",
        )
    return found
