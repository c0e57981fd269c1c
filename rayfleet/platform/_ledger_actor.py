"""The ledger as a detached, restartable Ray actor, and the client hosts use to reach it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import ray

from ..errors import RayfleetError
from ..identity._ledger import (
    Activation,
    CheckpointCommit,
    HostView,
    IdentityView,
    Ledger,
    RegisterOutcome,
)
from ..identity._types import ContinuityRecord, LeaseDenied, LeaseGrant, SnapshotPointer

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


class RayLedgerClient:
    """The ``LedgerClient`` contract over the ledger actor, for use inside async actors."""

    def __init__(self, handle: ray.actor.ActorHandle) -> None:
        self.handle = handle

    async def _call(self, method: str, **kwargs: Any) -> Any:
        return unwrap(await self.handle.call.remote(method, kwargs))

    async def acquire(
        self, *, holder: str, identities: list[str], ttl: float, create_continuity: bool = True
    ) -> dict[str, Activation | LeaseDenied | RayfleetError]:
        return await self._call("acquire", holder=holder, identities=identities, ttl=ttl,
                                create_continuity=create_continuity)

    async def renew(self, *, holder: str, tokens: dict[str, int]) -> dict[str, LeaseGrant | None]:
        return await self._call("renew", holder=holder, tokens=tokens)

    async def release(self, *, holder: str, tokens: dict[str, int]) -> int:
        return await self._call("release", holder=holder, tokens=tokens)

    async def commit_checkpoints(self, commits: list[CheckpointCommit]) -> list[RayfleetError | None]:
        return await self._call("commit_checkpoints", commits=commits)

    async def set_lifecycle(self, *, identity: str, fencing_token: int, lifecycle: str, reason: str = "") -> None:
        await self._call("set_lifecycle", identity=identity, fencing_token=fencing_token, lifecycle=lifecycle,
                         reason=reason)

    async def reset(self, *, identity: str, fencing_token: int) -> ContinuityRecord:
        return await self._call("reset", identity=identity, fencing_token=fencing_token)

    async def delete(self, *, identity: str, fencing_token: int) -> SnapshotPointer | None:
        return await self._call("delete", identity=identity, fencing_token=fencing_token)

    async def resolve(self, identities: list[str]) -> dict[str, IdentityView]:
        return await self._call("resolve", identities=identities)

    async def hosts(self) -> list[HostView]:
        return await self._call("hosts")

    async def register_host(self, *, name: str, holder: str) -> list[str]:
        return await self._call("register_host", name=name, holder=holder)


class SyncLedger:
    """Blocking access to the ledger actor for the driver (``Fleet``)."""

    def __init__(self, handle: ray.actor.ActorHandle) -> None:
        self.handle = handle

    def call(self, method: str, **kwargs: Any) -> Any:
        return unwrap(ray.get(self.handle.call.remote(method, kwargs)))

    def register(self, **kwargs: Any) -> RegisterOutcome:
        return self.call("register", **kwargs)
