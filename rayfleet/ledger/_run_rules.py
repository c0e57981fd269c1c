"""The rules of run ownership and run fencing, once, free of any store.

The ledger's run tables (``_runs``) and the in-memory journal of ``rayfleet.testing``
both decide with these functions, so a unit test against the double meets exactly
the refusals the real ledger gives.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import RunOwnedElsewhereError, StaleRunTokenError
from ._values import DEFAULT_LEASE_TTL

DEFAULT_RUN_LEASE_TTL = DEFAULT_LEASE_TTL
"""Seconds a run lease lasts without renewal, like an identity's; engines renew every TTL/3."""


@dataclass(frozen=True, slots=True)
class Holding:
    """What a store holds for one run or step lease: who, under which token, until when."""

    holder: str | None
    token: int
    expires_at: float


def grant_refusal(
    *, run_id: str, current: Holding | None, holder: str, now: float, takeover_from: str | None = None,
    step: str = "",
) -> RunOwnedElsewhereError | None:
    """Why ``holder`` may not take the lease held as ``current`` now, or ``None`` when it may.

    Free: never granted, released, or lapsed (``expires_at <= now``). Run leases (no
    ``step``) also go to their own holder again, and to a caller naming the current
    holder as dead in ``takeover_from``. A step lease is exclusive whatever the name:
    step holder names repeat across engines (``workflow:<run>:<label>:<attempt>``).
    """
    if current is None or current.holder is None or current.expires_at <= now:
        return None
    if not step and current.holder in (holder, takeover_from):
        return None
    return RunOwnedElsewhereError(run_id=run_id, owner=current.holder, expires_in=current.expires_at - now, step=step)


def renew_refusal(*, run_id: str, current: Holding | None, holder: str, token: int) -> StaleRunTokenError | None:
    """Why ``holder`` may not renew its lease under ``token``, or ``None`` when it may.

    Renewal needs the run's current token and the lease still held by ``holder`` under
    it: a released lease is gone even though no larger token exists. A lapsed lease
    nobody took is renewed.
    """
    high_water = 0 if current is None else current.token
    if token != high_water or current is None or current.holder != holder:
        return StaleRunTokenError(run_id=run_id, presented=token, current=high_water)
    return None


def fence_refusal(*, run_id: str, high_water: int, presented: int) -> StaleRunTokenError | None:
    """The one fencing check of runs: ``None`` only when ``presented`` is the run's high-water token."""
    if presented == high_water:
        return None
    return StaleRunTokenError(run_id=run_id, presented=presented, current=high_water)
