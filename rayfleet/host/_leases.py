"""The lease keeper of a host: renews the leases of its agents, learns which were lost, releases them.

One ``LeaseKeeper`` lives in each ``HostRuntime``. It reads the runtime's hosted agents
and reaches back only through :class:`~rayfleet.host._ports.LeasePort`, to take an agent
out of service and to publish lease events; it never activates, checkpoints or runs a
turn.

What the keeper guarantees, and why:

* One renewal loop renews every lease of the host every TTL/3, so a new lease needs
  no wake-up of its own: with one write of the host's holder row while that row is
  live, else lease by lease (:data:`RENEWAL_CHUNK` per ledger call) before the row is
  armed again, which is how a host learns which leases it lost. After a failed renewal it
  retries sooner (within TTL/10), and no wait ends later than TTL/10 before the
  earliest expiry of a lease held, so a short ledger outage does not let leases
  lapse. The loop never stops retrying.
* Each turn checks its own lease before it runs (:meth:`LeaseKeeper.ensure_healthy`) and
  renews on the spot when less than a fifth of the TTL is left, so no turn starts on a
  lease that is nearly gone.
* Leases are dated from when the renewal was sent, never from its answer: the ledger
  extends a lease no earlier than it receives the call, so this host's idea of an
  expiry is never later than the ledger's.
* An agent whose lease is lost is dropped at once through the port. The runtime also
  drops one whose lease has expired by this host's own clock (:meth:`LeaseKeeper.expiry`:
  it was frozen, or could not reach the ledger), renewal or not.
* Renewal replaces only an entry's lease date (``installed_at``), without its turn lock;
  an entry replaced or dropped while its renewal was in flight is left alone.
* A release that fails is kept and retried before the next renewal: while this host's
  holder row lives the ledger keeps those leases too, so without a retry an identity
  would stay with a host that no longer hosts it. Should the host die first, they lapse
  with the row.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Mapping

from ..errors import LeaseLostError
from ..identity._values import EventKind, lease_is_healthy
from ..ledger._contract import LedgerClient
from ..retry import RetryPolicy
from ._hosted import HostedAgent
from ._ports import NO_METRICS, HostMetrics, LeasePort

log = logging.getLogger("rayfleet.runtime")

RENEWAL_RETRY = RetryPolicy(base_delay=1.0, max_delay=64.0, jitter=0.0)
"""Backoff after failed lease renewals, 1 s doubling; the renewal loop caps it at TTL/10 and never stops retrying."""
RENEWAL_BACKOFF_CAP = 60.0
RENEWAL_DANGER_FRACTION = 0.1
"""After a failed renewal the next try comes within this fraction of the TTL, and no wait
ends later than this fraction of the TTL before the earliest lease held expires."""

RENEWAL_CHUNK = 5_000
"""Leases renewed per ledger call (and transaction).

One transaction renewing every lease of a busy host (tens of thousands in benchmark B4)
can take seconds, holding a SQLite file's write lock all along, so that another host's
renewal gives up behind it after SQLite's busy timeout. In chunks, other
writers get the lock between them, and the first chunks' leases are renewed without
waiting for the last."""


def renewal_backoff(failures: int, cap: float = RENEWAL_BACKOFF_CAP) -> float:
    """Seconds to wait after ``failures`` consecutive failed renewals: 1 s x 2^n, n <= 6, capped."""
    return min(RENEWAL_RETRY.delay_for(failures), cap)


class LeaseKeeper:
    """Renews, checks and releases the leases of one host's agents.

    Args:
        name: the host's name, for logs.
        holder: the host's lease holder id, presented with every renewal and release.
        ledger: the authority for leases.
        entries: the agents hosted now, by identity. The runtime adds and removes
            entries; the keeper only reads the mapping (and an entry's lease date), so
            it must be the runtime's live one.
        port: the runtime's side: dropping an agent whose lease is lost, and its events.
        ttl: seconds each lease lasts.
        clock: monotonic seconds, the clock lease dates and expiries are read on.
        metrics: where renewals are counted for dashboards.
    """

    def __init__(
        self,
        *,
        name: str,
        holder: str,
        ledger: LedgerClient,
        entries: Mapping[str, HostedAgent],
        port: LeasePort,
        ttl: float,
        clock: Callable[[], float] = time.monotonic,
        metrics: HostMetrics = NO_METRICS,
    ) -> None:
        self._name = name
        self._holder = holder
        self._ledger = ledger
        self._entries = entries
        self._port = port
        self._ttl = ttl
        self._clock = clock
        self._metrics = metrics
        self.renewals = 0
        """Leases renewed since the host started."""
        self._failures = 0
        """Renewal attempts failed in a row; the loop retries sooner while there are any."""
        self._holder_armed = False
        """Whether the ledger keeps this host's leases through its holder row (see :meth:`renew_once`)."""
        self._holder_expiry = -math.inf
        """Every lease held here lives at least until this (monotonic seconds): the holder row's last renewal."""
        self._unreleased: dict[str, int] = {}
        """Leases whose release failed; retried with each renewal, since a live holder row keeps them."""

    def expiry(self, entry: HostedAgent) -> float:
        """When ``entry``'s lease expires by this host's clock: its own date or the holder row's, whichever is later."""
        return max(entry.installed_at + entry.grant.ttl, self._holder_expiry)

    async def ensure_healthy(self, entry: HostedAgent) -> None:
        """Return once ``entry``'s lease has more than a fifth of its TTL left, renewing it now if needed.

        Raises:
            LeaseLostError: the ledger no longer grants the lease; ``entry`` was dropped.
            Whatever the ledger call raises when it fails; the lease is left as it was.
        """
        remaining = self.expiry(entry) - self._clock()
        if lease_is_healthy(entry.grant.ttl, remaining):
            return
        # The ledger extends the lease from when it handles the call, which is no earlier
        # than the send: dating it from the send errs on the safe side, as renew_once does.
        sent_at = self._clock()
        lost = await self._ledger.renew(holder=self._holder, tokens={entry.spec.identity: entry.grant.fencing_token})
        if lost:
            await self._port.drop(entry, "lease lost at renewal")
            raise LeaseLostError(identity=entry.spec.identity, detail="the lease could not be renewed")
        self._count(1)
        entry.installed_at = sent_at

    async def release(self, tokens: dict[str, int]) -> None:
        """Give up the leases ``tokens`` (identity to fencing token) now; never raises.

        A release that fails is retried before the next renewal (see the module's guarantees).
        """
        try:
            await self._ledger.release(holder=self._holder, tokens=tokens)
        except Exception as error:  # noqa: BLE001 - nothing unsafe: a lease kept too long only delays the next owner
            self._unreleased.update(tokens)
            log.warning("releasing leases %s failed (retried with the next renewal): %s", sorted(tokens)[:10], error)

    async def renew_once(self) -> int:
        """Renew every lease this host holds; drop agents whose lease is lost. Returns how many were renewed.

        While this host's holder row in the ledger is live, one write renewing the row
        renews every lease (see ``rayfleet.ledger._leases.renew_holder``): no lease of a live holder can
        have lapsed, so none was lost. Otherwise (the first pass, or the row lapsed:
        this host was frozen or cut off for a TTL, or was declared dead) each lease is
        renewed by itself, :data:`RENEWAL_CHUNK` per ledger call, agents whose lease is
        gone are dropped, and then the row is armed again. A failed call raises after
        the chunks before it were renewed (their leases keep their new dates).
        Releases that failed earlier are retried first.
        """
        if self._unreleased:
            tokens, self._unreleased = self._unreleased, {}
            await self.release(tokens)
        if self._holder_armed:
            sent_at = self._clock()
            if await self._ledger.renew_holder(holder=self._holder, ttl=self._ttl):
                self._holder_expiry = sent_at + self._ttl
                for identity in self._port.listened_among(self._entries):
                    token = self._entries[identity].grant.fencing_token
                    self._port.emit(identity, EventKind.LEASE_UPDATED, fencing_token=token)
                return self._count(len(self._entries))
            self._holder_armed = False
            log.warning("the holder row of %s had lapsed; renewing its %d leases one by one", self._name,
                        len(self._entries))
        held = [(identity, entry.grant.fencing_token) for identity, entry in self._entries.items()]
        count = 0
        for start in range(0, len(held), RENEWAL_CHUNK):
            count += await self._renew_chunk(dict(held[start:start + RENEWAL_CHUNK]))
        sent_at = self._clock()
        await self._ledger.arm_holder(holder=self._holder, ttl=self._ttl)
        self._holder_armed = True
        self._holder_expiry = sent_at + self._ttl
        return count

    def _count(self, count: int) -> int:
        self.renewals += count
        if count:
            self._metrics.lease_renewals(count)
        return count

    async def _renew_chunk(self, held: dict[str, int]) -> int:
        sent_at = self._clock()
        lost = await self._ledger.renew(holder=self._holder, tokens=held)
        count = 0
        for identity, token in held.items():
            entry = self._entries.get(identity)
            if entry is None or entry.grant.fencing_token != token:
                continue  # replaced or dropped while the renewal was in flight
            if identity in lost:
                await self._port.drop(entry, "lease lost at renewal")
                continue
            entry.installed_at = sent_at
            self._port.emit(identity, EventKind.LEASE_UPDATED, fencing_token=token)
            count += 1
        return self._count(count)

    async def run(self) -> None:
        """The renewal loop: runs until cancelled, and survives any failed renewal."""
        while True:
            await asyncio.sleep(self.next_delay())
            await self.attempt()

    def next_delay(self) -> float:
        """Seconds until the renewal loop's next attempt.

        While renewals succeed: when the oldest lease held was renewed TTL/3 ago (TTL/3
        from now without agents), so a pass that took long (a busy host renewing
        tens of thousands of leases, chunk after chunk) does not push the next one a
        full TTL/3 further. After a failure the leases are in danger, so the next
        attempt comes sooner, not later: 1 s doubling, but never more than TTL/10.
        Either way no wait ends later than TTL/10 before the earliest expiry of a
        lease held here, so with TTL 10 s two failed renewals still leave several
        attempts before any lease lapses.
        """
        danger = self._ttl * RENEWAL_DANGER_FRACTION
        delay = renewal_backoff(self._failures - 1, cap=danger) if self._failures else self._ttl / 3
        if self._entries:
            oldest = min(entry.installed_at + entry.grant.ttl for entry in self._entries.values())
            left = max(oldest, self._holder_expiry) - self._clock()
            if not self._failures:
                # The oldest lease was renewed TTL/3 ago when TTL*2/3 of it is left.
                delay = max(left - self._ttl * 2 / 3, 0.0)
            if left > danger:
                delay = min(delay, left - danger)
        return delay

    async def attempt(self) -> None:
        """One attempt of the renewal loop; counts consecutive failures, never raises."""
        try:
            await self.renew_once()
            self._failures = 0
        except Exception as error:  # noqa: BLE001 - the loop must outlive any failure; it backs off
            self._failures += 1
            log.log(logging.WARNING if self._failures == 1 else logging.DEBUG,
                    "lease renewal on %s failed (%d in a row): %s", self._name, self._failures, error)
