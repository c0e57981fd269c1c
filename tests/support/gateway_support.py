"""A gateway served on 127.0.0.1 from a background thread, for tests that talk to it over real HTTP."""

from __future__ import annotations

import asyncio
import threading

from aiohttp import web


class GatewayThread:
    """Serves an aiohttp application on a free port of 127.0.0.1 in its own thread and event loop.

    The fleet's blocking methods run on that loop's worker threads, as under ``serve``;
    tests reach the gateway only through ``url``.
    """

    def __init__(self, app: web.Application) -> None:
        self._app = app
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="gateway", daemon=True)
        self.url = ""

    def __enter__(self) -> GatewayThread:
        self._thread.start()
        if not self._ready.wait(timeout=60) or self._failure is not None:
            raise RuntimeError(f"the gateway did not start: {self._failure!r}")
        return self

    def __exit__(self, *exc_info: object) -> None:
        assert self._loop is not None and self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=60)

    def _run(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        runner = web.AppRunner(self._app, shutdown_timeout=5.0)
        try:
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            host, port = runner.addresses[0][:2]
            self.url = f"http://{host}:{port}"
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
        except BaseException as error:
            self._failure = error
            self._ready.set()
            raise
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            await runner.cleanup()
