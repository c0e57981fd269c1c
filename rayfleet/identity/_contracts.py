"""The seams of the identity core: what the host runtime needs from the outside world.

``platform`` implements these over Ray actors; unit tests and the embedded mode use
:class:`LocalLedgerClient`, which calls a real :class:`Ledger` in-process.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from ..errors import RayfleetError
from ._ledger import Activation, CheckpointCommit, IdentityView, Ledger
from ._types import ContinuityRecord, LeaseDenied, LeaseGrant, SnapshotPointer


class LedgerClient(Protocol):
    """Async access to the ledger (see :class:`Ledger` for each method's guarantees)."""

    async def acquire(
        self, *, holder: str, identities: list[str], ttl: float, create_continuity: bool = True
    ) -> dict[str, Activation | LeaseDenied | RayfleetError]: ...

    async def renew(self, *, holder: str, tokens: dict[str, int]) -> dict[str, LeaseGrant | None]: ...

    async def release(self, *, holder: str, tokens: dict[str, int]) -> int: ...

    async def commit_checkpoints(self, commits: list[CheckpointCommit]) -> list[RayfleetError | None]: ...

    async def set_lifecycle(self, *, identity: str, fencing_token: int, lifecycle: str, reason: str = "") -> None: ...

    async def reset(self, *, identity: str, fencing_token: int) -> ContinuityRecord: ...

    async def delete(self, *, identity: str, fencing_token: int) -> SnapshotPointer | None: ...

    async def resolve(self, identities: list[str]) -> dict[str, IdentityView]: ...


class Router(Protocol):
    """How an agent reaches another agent (``await self.send(peer, ...)``)."""

    async def send(self, *, sender: str, target: str, method: str, kwargs: Mapping[str, Any]) -> Any: ...


class LocalLedgerClient:
    """A :class:`LedgerClient` over a ``Ledger`` in the same process (tests, embedded use)."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    async def acquire(
        self, *, holder: str, identities: list[str], ttl: float, create_continuity: bool = True
    ) -> dict[str, Activation | LeaseDenied | RayfleetError]:
        return self.ledger.acquire(holder=holder, identities=identities, ttl=ttl, create_continuity=create_continuity)

    async def renew(self, *, holder: str, tokens: dict[str, int]) -> dict[str, LeaseGrant | None]:
        return self.ledger.renew(holder=holder, tokens=tokens)

    async def release(self, *, holder: str, tokens: dict[str, int]) -> int:
        return self.ledger.release(holder=holder, tokens=tokens)

    async def commit_checkpoints(self, commits: list[CheckpointCommit]) -> list[RayfleetError | None]:
        return self.ledger.commit_checkpoints(commits)

    async def set_lifecycle(self, *, identity: str, fencing_token: int, lifecycle: str, reason: str = "") -> None:
        self.ledger.set_lifecycle(identity=identity, fencing_token=fencing_token, lifecycle=lifecycle, reason=reason)

    async def reset(self, *, identity: str, fencing_token: int) -> ContinuityRecord:
        return self.ledger.reset(identity=identity, fencing_token=fencing_token)

    async def delete(self, *, identity: str, fencing_token: int) -> SnapshotPointer | None:
        return self.ledger.delete(identity=identity, fencing_token=fencing_token)

    async def resolve(self, identities: Iterable[str]) -> dict[str, IdentityView]:
        return self.ledger.resolve(identities)
