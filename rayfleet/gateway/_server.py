"""``serve``: run the gateway on a host and port until SIGINT or SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from aiohttp import web

from ..platform._fleet import Fleet
from ._app import build_app
from ._auth import check_startup
from ._limits import GatewayLimits

log = logging.getLogger("rayfleet.gateway")

SHUTDOWN_GRACE = 10.0
"""Seconds in-flight requests get to finish once a stop signal arrived."""
FLEET_THREADS = 32
"""Worker threads for the fleet's blocking methods: a replay waiting out its timeout holds one."""


def serve(
    fleet: Fleet,
    *,
    host: str,
    port: int,
    token: str | None,
    insecure: bool,
    allowed_modules: tuple[str, ...] | None,
    limits: GatewayLimits | None = None,
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Serve the HTTP gateway over ``fleet`` on ``host:port``; block until SIGINT or SIGTERM, then close cleanly.

    On a stop signal the gateway stops accepting connections, ends its event streams,
    lets requests in flight finish (up to :data:`SHUTDOWN_GRACE` seconds) and returns.
    The fleet itself is left running: closing it is the caller's decision.

    Args:
        fleet: the fleet every request acts on.
        host: the address to listen on (``127.0.0.1`` keeps it on this machine).
        port: the TCP port; ``0`` picks a free one (``on_ready`` gets the URL).
        token: the bearer token clients must send (``RAYFLEET_GATEWAY_TOKEN``).
        insecure: allow ``token=None``, which is refused unless ``host`` is a loopback address.
        allowed_modules: modules whose agent classes and workflows HTTP clients may name
            (``RAYFLEET_ALLOWED_MODULES``); ``None``: only classes the fleet already hosts.
        limits: request bounds; :class:`GatewayLimits` defaults.
        on_ready: called with the base URL once the gateway listens (default: print it).

    Raises:
        UsageError: no token without ``insecure`` on a loopback address, or a malformed token.
        OSError: the address cannot be bound (e.g. the port is taken).
    """
    check_startup(host=host, token=token, insecure=insecure)
    app = build_app(fleet, token=token, allowed_modules=allowed_modules, limits=limits)
    asyncio.run(_serve(app, host=host, port=port, on_ready=on_ready or _announce))


def _announce(url: str) -> None:
    print(f"rayfleet gateway listening on {url} (OpenAPI at {url}/openapi.json); Ctrl-C stops it", flush=True)


async def _serve(app: web.Application, *, host: str, port: int, on_ready: Callable[[str], None]) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    # asyncio's default pool has only cpu + 4 threads; a few slow replays must not stall every other request.
    loop.set_default_executor(ThreadPoolExecutor(max_workers=FLEET_THREADS, thread_name_prefix="rayfleet-gateway"))
    for number in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(number, stop.set)
    runner = web.AppRunner(app, handle_signals=False, access_log=log, shutdown_timeout=SHUTDOWN_GRACE)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = runner.addresses[0]
        shown = f"[{bound[0]}]" if ":" in str(bound[0]) else str(bound[0])
        on_ready(f"http://{shown}:{bound[1]}")
        await stop.wait()
        log.info("gateway: stop signal received; closing")
    finally:
        await runner.cleanup()
        for number in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(number)
