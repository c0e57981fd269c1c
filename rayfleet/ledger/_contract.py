"""The seams of the identity core: what the host runtime needs from the outside world.

:class:`LedgerClient` names every ledger operation a host uses, once; each transport
only says how one call travels (``call``). ``platform`` sends calls to the ledger
actor over Ray; :class:`LocalLedgerClient` calls a :class:`Ledger` in-process (unit
tests, embedded use).
"""

from __future__ import annotations

from typing import Any

from ..errors import RayfleetError
from ..identity._values import (
    ContinuityRecord,
    LeaseDenied,
    LeaseGrant,
    SnapshotPointer,
)
from ._ledger import Activation, CheckpointCommit, IdentityView, Ledger, StoredMessage


class LedgerClient:
    """Async access to the ledger; see :class:`Ledger` for each method's guarantees."""

    async def call(self, method: str, **kwargs: Any) -> Any:
        """Run any :class:`Ledger` method by name; each transport says how the call travels."""
        raise NotImplementedError

    async def acquire(
        self, *, holder: str, identities: list[str], ttl: float, create_continuity: bool = True
    ) -> dict[str, Activation | LeaseDenied | RayfleetError]:
        return await self.call("acquire", holder=holder, identities=identities, ttl=ttl,
                                create_continuity=create_continuity)

    async def renew(self, *, holder: str, tokens: dict[str, int]) -> dict[str, LeaseGrant | None]:
        return await self.call("renew", holder=holder, tokens=tokens)

    async def release(self, *, holder: str, tokens: dict[str, int]) -> int:
        return await self.call("release", holder=holder, tokens=tokens)

    async def commit_checkpoints(self, commits: list[CheckpointCommit]) -> list[RayfleetError | None]:
        return await self.call("commit_checkpoints", commits=commits)

    async def set_lifecycle(self, *, identity: str, fencing_token: int, lifecycle: str, reason: str = "") -> None:
        await self.call("set_lifecycle", identity=identity, fencing_token=fencing_token, lifecycle=lifecycle,
                         reason=reason)

    async def reset(self, *, identity: str, fencing_token: int) -> ContinuityRecord:
        return await self.call("reset", identity=identity, fencing_token=fencing_token)

    async def delete(self, *, identity: str, fencing_token: int) -> SnapshotPointer | None:
        return await self.call("delete", identity=identity, fencing_token=fencing_token)

    async def resolve(self, identities: list[str]) -> dict[str, IdentityView]:
        return await self.call("resolve", identities=identities)

    async def set_paused(self, *, identity: str, fencing_token: int, paused: bool) -> None:
        await self.call("set_paused", identity=identity, fencing_token=fencing_token, paused=paused)

    async def park(self, *, identity: str, fencing_token: int, message_id: str, envelope: bytes) -> int:
        return await self.call("park", identity=identity, fencing_token=fencing_token, message_id=message_id,
                                envelope=envelope)

    async def parked(self, identity: str, *, limit: int = 1000) -> list[StoredMessage]:
        return await self.call("parked", identity=identity, limit=limit)

    async def unpark(self, *, identity: str, fencing_token: int, seq: int) -> None:
        await self.call("unpark", identity=identity, fencing_token=fencing_token, seq=seq)

    async def cancel_parked(self, *, identity: str, fencing_token: int) -> int:
        return await self.call("cancel_parked", identity=identity, fencing_token=fencing_token)

    async def wired_peers(self, identities: list[str]) -> dict[str, tuple[str, ...]]:
        return await self.call("wired_peers", identities=identities)

    async def add_dead_letter(
        self, *, identity: str, message_id: str, envelope: bytes, reason: str, error: str, attempts: int
    ) -> int:
        return await self.call("add_dead_letter", identity=identity, message_id=message_id, envelope=envelope,
                                reason=reason, error=error, attempts=attempts)


class LocalLedgerClient(LedgerClient):
    """A :class:`LedgerClient` over a ``Ledger`` in the same process (tests, embedded use)."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    async def call(self, method: str, **kwargs: Any) -> Any:
        return getattr(self.ledger, method)(**kwargs)
