"""The ledger as a detached, restartable Ray actor, and the client hosts use to reach it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import ray

from ..errors import RayfleetError
from ..ledger._contract import LedgerClient
from ..ledger._ledger import HostView, Ledger, RegisterOutcome

LEDGER_ACTOR_NAME = "rayfleet-ledger"


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0)
class LedgerActor:
    """Serves one :class:`Ledger`; Ray runs its methods one at a time, in arrival order.

    Restartable: a restarted actor reopens the same SQLite file, and the ledger's
    lock-delay keeps leases that were held from moving for one TTL.
    """

    def __init__(self, path: str) -> None:
        self._ledger = Ledger(path)

    def ping(self) -> str:
        return self._ledger.incarnation

    def call(self, method: str, kwargs: Mapping[str, Any]) -> Any:
        """Run one ledger method; refusals come back as values so Ray does not wrap them."""
        try:
            return getattr(self._ledger, method)(**kwargs)
        except RayfleetError as error:
            return _Refusal(error)


class _Refusal:
    """A ledger error carried as a return value (Ray would wrap a raised one)."""

    __slots__ = ("error",)

    def __init__(self, error: RayfleetError) -> None:
        self.error = error

    def __reduce__(self) -> Any:
        return (_Refusal, (self.error,))


def unwrap(result: Any) -> Any:
    if isinstance(result, _Refusal):
        raise result.error
    return result


class RayLedgerClient(LedgerClient):
    """The ledger client of hosts: each call is one task on the ledger actor."""

    def __init__(self, handle: ray.actor.ActorHandle) -> None:
        self.handle = handle

    async def call(self, method: str, **kwargs: Any) -> Any:
        return unwrap(await self.handle.call.remote(method, kwargs))

    async def hosts(self) -> list[HostView]:
        return await self.call("hosts")

    async def register_host(self, *, name: str, holder: str) -> list[str]:
        return await self.call("register_host", name=name, holder=holder)


class SyncLedger:
    """Blocking access to the ledger actor for the driver (``Fleet``)."""

    def __init__(self, handle: ray.actor.ActorHandle) -> None:
        self.handle = handle

    def call(self, method: str, **kwargs: Any) -> Any:
        return unwrap(ray.get(self.handle.call.remote(method, kwargs)))

    def register(self, **kwargs: Any) -> RegisterOutcome:
        return self.call("register", **kwargs)
