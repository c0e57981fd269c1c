"""Where a message for an identity goes: rendezvous placement, route cache, redirects, failover.

The lease table is the truth about who owns an identity; placement only picks where
an identity that nobody owns should be activated. A host that gets a message for an
identity leased elsewhere answers with a redirect, and the route is cached.

A request that has waited a probe interval for its reply asks the ledger who holds the
identity's lease (the requests waiting on one event loop ask in one read: see
``_lease_probes``). A live owner keeps renewing, so a slow handler is simply waited for.
When the lease has lapsed, or is held by another host, the owner is frozen, dead or
no longer the owner: the request is sent again (to the holder, or to the next live host,
which activates the identity under a larger token) and the unanswered copy is cancelled
and forgotten, so a late reply from it never reaches the caller. The suspect host is
passed over by placement for a while. Fencing keeps this safe whatever the timing: a
frozen owner that wakes up finds its lease gone, and its writes are refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError, ActorUnschedulableError, RayActorError

from ..errors import DeadlineExceededError, FleetUnavailableError
from ..host._messages import Envelope
from ..ledger._contract import LedgerClient
from ..ledger._values import DEFAULT_LEASE_TTL, HostInfo, LeaseView, holder_host
from ..retry import RetryPolicy
from ._batching import Batcher, EnvelopeRequest, submit
from ._lease_probes import LeaseProbes
from ._ray_internals import actor_state
from ._replies import ERROR, OK, REDIRECT, Reply

log = logging.getLogger("rayfleet.routing")

MAX_HOPS = 8
"""Hops a request always gets; past them it gives up once it has also been routed for the patience below."""
OWNER_PROBE_INTERVAL = 1.0
"""Seconds a request waits for its reply before the ledger is asked whether its host still owns the identity."""


def probe_interval_for(lease_ttl: float) -> float:
    """The probe interval for a fleet whose leases last ``lease_ttl``: a lapse is seen within TTL + this."""
    return min(OWNER_PROBE_INTERVAL, lease_ttl / 4)


PROBE_AFTER_LAPSE = 0.05
"""Seconds after a waited-on lease would lapse unrenewed that the next probe looks again."""


def next_probe(probe_interval: float, lease: LeaseView | None) -> float:
    """Seconds until a waiting request next asks the ledger about its host's lease (last seen as ``lease``).

    At most the probe interval; sooner when the lease would lapse before that unless
    renewed, so a frozen owner is failed over as its lease lapses rather than up to an
    interval later. A live owner renews well before that, so the next probe sees the
    lease extended and the probes of a long turn keep their pace.
    """
    if lease is None:
        return probe_interval
    return min(probe_interval, max(lease.expires_in, 0.0) + PROBE_AFTER_LAPSE)


def routing_patience_for(lease_ttl: float) -> float:
    """Seconds a request keeps being routed, past :data:`MAX_HOPS`, before it gives up.

    An owner that cannot be reached (its node died, Ray is restarting it) keeps its
    identities' leases until they lapse, within one TTL, unless Ray reports it dead or
    its restarted incarnation registers first; only then can another host take them.
    Giving up after a fixed number of quick hops would fail requests that a few more
    seconds would have served, so the budget is two TTLs: the lapse, and the hand-over.
    """
    return 2.0 * lease_ttl


DIRECTORY_MAX_AGE = 10.0
"""Seconds after which a request re-reads the ledger's host list before it is routed."""
SUSPECT_FOR = 10.0
"""Longest time placement passes over a host that held a request while the identity's lease lapsed;
a fleet with shorter leases suspects for one lease TTL (see :class:`Courier`)."""
HOLDER_MEMORY = 30.0
"""Seconds a probe's sighting of a host holding an identity's lease counts for later requests."""
HOLDER_SIGHTINGS_CAP = 10_000



def rendezvous_pick(identity: str, hosts: Iterable[str]) -> str | None:
    """The host with the highest hash of (identity, host): stable as hosts come and go."""
    best, best_score = None, b""
    for host in hosts:
        score = hashlib.blake2b(f"{identity}\x1f{host}".encode(), digest_size=8).digest()
        if score > best_score:
            best, best_score = host, score
    return best


HostRequest = Callable[[ray.actor.ActorHandle], "ray.ObjectRef[Any]"]
"""One call on a host actor, e.g. ``lambda host: host.deliver.remote(identity, envelope)``.

Requests name the actor method in code, never in a string; the courier decides which
host's handle to apply them to.
"""


class HostDirectory:
    """The live hosts of one fleet, their actor handles, and cached routes."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.suspect_for = SUSPECT_FOR
        """Seconds a host that looked frozen is passed over (the courier sets one lease TTL)."""
        self._hosts: dict[str, HostInfo] = {}
        self._handles: dict[str, ray.actor.ActorHandle] = {}
        self._routes: dict[str, str] = {}
        self.dead: set[str] = set()
        self._suspect_until: dict[str, float] = {}
        # identity -> (host, when): hosts a probe saw holding the lease of a request that
        # was not answered yet. Kept across requests because a caller's retry is a new
        # request: without it, a retry that arrives after the lapse takes a frozen owner
        # for one still activating. Only slow requests add entries; a reply removes them.
        self._sightings: dict[str, tuple[str, str, float]] = {}
        # identity -> (host, since, last): requests waiting unanswered on a host that holds
        # no lease for the identity, from the first one's start to the last probe. Kept
        # across requests for the same reason: a caller's timeout shorter than the
        # patience must not make every retry's patience begin anew.
        self._unanswered: dict[str, tuple[str, float, float]] = {}

    def update(self, hosts: Iterable[HostInfo]) -> None:
        """Replace the host list with the ledger's view."""
        self._hosts = {host.name: host for host in hosts}
        self.dead -= set(self._hosts)

    @property
    def names(self) -> list[str]:
        return sorted(self._hosts)

    def hosts(self) -> list[HostInfo]:
        """The registered hosts as last read from the ledger, by name."""
        return [self._hosts[name] for name in sorted(self._hosts)]

    def candidates(self) -> list[str]:
        live = [name for name, host in self._hosts.items() if not host.draining and name not in self.dead]
        now = time.monotonic()
        trusted = [name for name in live if self._suspect_until.get(name, 0.0) <= now]
        # Every host suspect (all frozen at once, or a tiny fleet): better to try one than none.
        return trusted or live

    def suspect(self, name: str) -> None:
        """Pass over ``name`` when placing identities for :attr:`suspect_for` seconds (it looks frozen).

        One lease TTL: a host frozen for longer lets its leases lapse again and is
        suspected again; one that came back is trusted again by then, rather than
        leaving a small fleet with no trusted host but the next one to freeze.
        """
        self._suspect_until[name] = time.monotonic() + self.suspect_for
        self._forget_host(name)

    def saw_holding(self, identity: str, host: str, holder: str) -> None:
        """A probe found ``host`` (lease holder id ``holder``) holding the live lease of ``identity``."""
        now = time.monotonic()
        if len(self._sightings) >= HOLDER_SIGHTINGS_CAP:
            self._sightings = {i: s for i, s in self._sightings.items() if now - s[2] < HOLDER_MEMORY}
        self._sightings[identity] = (host, holder, now)

    def held_recently(self, identity: str, host: str) -> str | None:
        """The holder id ``host`` was seen holding the lease of ``identity`` with, by a probe of an
        unanswered request in the last :data:`HOLDER_MEMORY` seconds; ``None`` if it was not."""
        sighting = self._sightings.get(identity)
        if sighting is None or sighting[0] != host or time.monotonic() - sighting[2] >= HOLDER_MEMORY:
            return None
        return sighting[1]

    def forget_sighting(self, identity: str) -> None:
        self._sightings.pop(identity, None)
        self._unanswered.pop(identity, None)

    def unanswered_since(self, identity: str, host: str, since: float, *, now: float, gap: float) -> float:
        """When requests for ``identity`` began waiting on ``host`` without an answer or a lease.

        ``since`` is when the asking request began; an earlier request's wait counts too
        when it was at the same host and its last probe is at most ``gap`` seconds old
        (a caller's retry), so the retries of a caller share one patience.
        """
        record = self._unanswered.get(identity)
        start = since
        if record is not None and record[0] == host and now - record[2] <= gap:
            start = min(record[1], since)
        if len(self._unanswered) >= HOLDER_SIGHTINGS_CAP:
            self._unanswered = {i: r for i, r in self._unanswered.items() if now - r[2] <= gap}
        self._unanswered[identity] = (host, start, now)
        return start

    def pick(self, identity: str) -> str:
        route = self._routes.get(identity)
        if route is not None and route in self._hosts and route not in self.dead:
            return route
        choice = rendezvous_pick(identity, self.candidates())
        if choice is None:
            raise FleetUnavailableError(detail="no live rayfleet host is registered")
        return choice

    def remember(self, identity: str, host: str) -> None:
        self._routes[identity] = host
        self.forget_sighting(identity)

    def forget(self, identity: str) -> None:
        self._routes.pop(identity, None)
        self.forget_sighting(identity)

    def handle(self, name: str) -> ray.actor.ActorHandle:
        """The actor handle of host ``name``, looked up once and kept.

        Raises:
            HostGone: Ray has no actor of that name (it is marked dead here).
        """
        handle = self._handles.get(name)
        if handle is None:
            try:
                handle = ray.get_actor(name, namespace=self.namespace)
            except ValueError:
                self.mark_dead(name)
                raise HostGone(name) from None
            self._handles[name] = handle
        return handle

    def mark_dead(self, name: str) -> None:
        self.dead.add(name)
        self._handles.pop(name, None)
        self._forget_host(name)

    def _forget_host(self, name: str) -> None:
        for identity in [i for i, host in self._routes.items() if host == name]:
            del self._routes[identity]
        for identity in [i for i, (host, _, _) in self._sightings.items() if host == name]:
            del self._sightings[identity]

    def holder_of(self, name: str) -> str | None:
        host = self._hosts.get(name)
        return None if host is None else host.holder


class HostGone(Exception):
    """A host named in the directory no longer exists in Ray."""


class CallPlan:
    """The routing decisions of one request, shared by the sync and async call paths.

    ``target()`` names the next host to try; ``on_reply`` and ``on_failure`` turn a
    host's answer into a final value, an error, or another hop. Death reports go to
    ``report_dead`` so the ledger frees the dead host's leases at once.
    """

    def __init__(
        self, directory: HostDirectory, identity: str, *, patience: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.directory = directory
        self.identity = identity
        self.patience = patience
        """Seconds of routing after which a request past :data:`MAX_HOPS` gives up (:func:`routing_patience_for`)."""
        self._clock = clock
        self._started = clock()
        self.hops = 0
        self.needs_refresh = False
        self.dead_hosts: list[tuple[str, str | None]] = []
        self._regrace: dict[str, float] = {}
        """When (seconds into the wait) a host was found restarted: its patience counts from then."""

    def target(self) -> tuple[str, ray.actor.ActorHandle] | None:
        """The next host to send to, or ``None`` when no host is registered right now.

        ``None`` means: refresh the host list (``needs_refresh`` is set), pause, and ask
        again. It is answered only within the routing patience: a host Ray is restarting
        is briefly not registered (its dead incarnation was removed, the new one has not
        registered yet), and a one-host fleet then has none. Past the patience the
        :class:`FleetUnavailableError` from placement reaches the caller.
        """
        while True:
            self.hops += 1
            elapsed = self._clock() - self._started
            if self.hops > MAX_HOPS and elapsed >= self.patience:
                raise FleetUnavailableError(
                    detail=f"gave up routing {self.identity!r} after {self.hops - 1} hops in {elapsed:.1f} s "
                    f"(hosts: {', '.join(self.directory.names) or 'none'})"
                )
            try:
                name = self.directory.pick(self.identity)
            except FleetUnavailableError:
                if elapsed >= self.patience:
                    raise
                self.needs_refresh = True
                return None
            try:
                return name, self.directory.handle(name)
            except HostGone:
                # Only passed over, never deregistered: Ray can fail the name lookup of an
                # actor it is restarting, and by then the holder this directory knows may be
                # the new incarnation's, whose registration and leases must stay. A call to a
                # dead handle (on_failure) deregisters the holder it was made to.
                self.needs_refresh = True
                continue

    def on_reply(self, host: str, reply: tuple[str, Any]) -> tuple[bool, Any]:
        """Returns ``(True, value)`` when done, ``(False, None)`` to try again; raises errors."""
        kind, payload = reply
        if kind == OK:
            self.directory.remember(self.identity, host)
            return True, payload
        if kind == ERROR:
            raise payload
        if kind == REDIRECT:
            if payload == host:
                self.needs_refresh = True
                self.directory.forget(self.identity)
            else:
                self.directory.remember(self.identity, payload)
                # A host this directory has not heard of (started by another driver): learn it.
                self.needs_refresh = payload not in self.directory.names
            return False, None
        # RETRY: the host is draining or lost the lease mid-way; look again.
        self.directory.forget(self.identity)
        self.needs_refresh = True
        return False, None

    def lapsed_while_held(self, host: str, lease: LeaseView | None) -> bool:
        """Whether ``host`` held the lease earlier in this wait and holds none now (ask who ``host`` is now)."""
        return lease is None and self.directory.held_recently(self.identity, host) is not None

    def on_probe(
        self, host: str, lease: LeaseView | None, *, waited: float, patience: float, holder_now: str | None = None,
        restarting: bool = False,
    ) -> bool:
        """Decide about a request ``host`` has not answered for ``waited`` seconds.

        Returns ``True`` to keep waiting, ``False`` to abandon the request and send it
        again. ``restarting`` (Ray is restarting ``host``: the process the request went to
        is dead, as when its node was removed): fail over at once, and have the dead
        incarnation's leases freed (if it holds this one) so that a live host takes the
        identity now rather than when the host is back or the lease lapses.
        ``host`` holding a live lease is alive and renewing: wait. Another holder:
        re-send to it. No live lease: if a probe saw ``host`` hold it while this request, or
        an earlier unanswered one for the identity (a caller's timed-out attempt), waited,
        it let it lapse (frozen, or cut off from the ledger): fail over at once; unless
        ``holder_now`` (the host's lease holder id in the ledger's host list, read after
        :meth:`lapsed_while_held`) shows a new incarnation: Ray restarted the host (its
        node died), the new one freed the old one's leases when it registered, and Ray
        hands it the waiting request, so it is waited for like any host activating the
        identity. A host that never held the lease may still be activating under load
        (acquiring, loading the snapshot), so it gets ``patience`` seconds (a lease TTL)
        before it is taken for frozen, counted from the first of the caller's retries
        that waited on it (:meth:`HostDirectory.unanswered_since`): a caller whose timeout
        is shorter than the patience would otherwise wait out a frozen host's whole freeze.
        """
        if restarting and (lease is None or holder_host(lease.holder) == host):
            log.warning("%s is being restarted by Ray while it holds %s's request; failing over", host, self.identity)
            if lease is not None:
                self.dead_hosts.append((host, lease.holder))  # freed before the next hop
            self.directory.suspect(host)
            self.needs_refresh = True
            return False
        if lease is not None:
            owner = holder_host(lease.holder)
            if owner == host:
                self.directory.saw_holding(self.identity, host, lease.holder)
                return True
            log.warning("%s moved from %s to %s while a request waited; re-sending", self.identity, host, owner)
            self.directory.remember(self.identity, owner)
            self.needs_refresh = owner not in self.directory.names
            return False
        held = self.directory.held_recently(self.identity, host)
        if held is not None and holder_now is not None and holder_now != held:
            log.warning("%s restarted (now %s) while it held %s's request; waiting for it", host, holder_now,
                        self.identity)
            self.directory.forget_sighting(self.identity)
            self._regrace[host] = waited
            return True
        if held is None:
            now = self._clock()
            began = self.directory.unanswered_since(
                self.identity, host, now - (waited - self._regrace.get(host, 0.0)), now=now, gap=patience,
            )
            if now - began < patience:
                return True
        log.warning("%s has no live lease while %s holds its request; %s looks frozen, failing over",
                    self.identity, host, host)
        self.directory.suspect(host)
        # Re-read the host list before the next hop: a host this directory still believes
        # draining may have been undrained by another driver, and may be the only one left.
        self.needs_refresh = True
        return False

    def on_failure(self, host: str, error: BaseException) -> None:
        """Absorb a dead or unreachable host (try elsewhere); re-raise anything else."""
        # Unschedulable: the host was pinned to a node that is gone (see ``_placement``), so it is dead for good.
        if isinstance(error, (ActorDiedError, ActorUnschedulableError)) or (
            isinstance(error, RayActorError) and not isinstance(error, ActorUnavailableError)
        ):
            log.warning("host %s is dead; re-routing %s", host, self.identity)
            self.dead_hosts.append((host, self.directory.holder_of(host)))
            self.directory.mark_dead(host)
            self.needs_refresh = True
            return
        if isinstance(error, ActorUnavailableError):
            self.directory.forget(self.identity)
            self.needs_refresh = True
            return
        raise error


@dataclass(frozen=True, slots=True)
class _SharedRead:
    """One read of the host list in flight (or done), on ``loop``, begun at ``started`` (monotonic)."""

    loop: asyncio.AbstractEventLoop
    started: float
    task: asyncio.Task[None]


class Courier:
    """Sends requests to whichever host owns an identity, following redirects.

    The same :class:`CallPlan` drives both paths: ``route_sync`` for the driver's
    blocking API and ``route_async`` for ``ask`` and for agents inside hosts.
    """

    def __init__(
        self, directory: HostDirectory, ledger: LedgerClient, *, lease_ttl: float = DEFAULT_LEASE_TTL
    ) -> None:
        self.directory = directory
        directory.suspect_for = min(SUSPECT_FOR, lease_ttl)
        self.ledger = ledger
        self.probe_interval = probe_interval_for(lease_ttl)
        self.patience = lease_ttl
        """Seconds a host that never held the identity's lease gets to activate it before it is suspect."""
        self.routing_patience = routing_patience_for(lease_ttl)
        self._refreshed_at = time.monotonic()
        self._restart_checks: dict[str, tuple[float, bool]] = {}
        self._removed_hosts: set[tuple[str, str | None]] = set()
        self._removals: dict[tuple[str, str | None], asyncio.Task[None]] = {}
        """Removals of dead hosts under way (on the loop of the request that found each first)."""
        self._host_read: _SharedRead | None = None
        self._batcher = Batcher()
        self._probes = LeaseProbes(ledger)

    def _known_restarting(self, host: str, lease: LeaseView | None) -> bool | None:
        """Whether Ray is restarting ``host``, if that need not (or was just) asked; ``None``: ask."""
        if lease is not None and holder_host(lease.holder) != host:
            return False  # the request is re-sent to the holder anyway
        checked = self._restart_checks.get(host)
        if checked is not None and time.monotonic() - checked[0] < self.probe_interval / 2:
            return checked[1]  # one GCS read per host per probe round, however many requests wait on it
        return None

    def _restarting_sync(self, host: str, lease: LeaseView | None) -> bool:
        known = self._known_restarting(host, lease)
        if known is not None:
            return known
        try:
            answer = actor_restarting(self.directory.handle(host))
        except HostGone:
            answer = True
        self._restart_checks[host] = (time.monotonic(), answer)
        return answer

    async def _restarting_async(self, host: str, lease: LeaseView | None) -> bool:
        known = self._known_restarting(host, lease)
        if known is not None:
            return known
        try:
            handle = self.directory.handle(host)
        except HostGone:
            answer = True
        else:
            answer = await asyncio.to_thread(actor_restarting, handle)  # a GCS read: off the event loop
        self._restart_checks[host] = (time.monotonic(), answer)
        return answer

    def _plan(self, identity: str, timeout: float | None) -> CallPlan:
        # A caller that said how long it waits is routed that long: a host Ray restarts on a
        # loaded machine can take longer than the routing patience to register again.
        patience = self.routing_patience if timeout is None else max(self.routing_patience, timeout)
        plan = CallPlan(self.directory, identity, patience=patience)
        # Other drivers add, drain and undrain hosts; a directory older than this re-reads the
        # host list first, so placement never keeps passing over a host that is back.
        plan.needs_refresh = time.monotonic() - self._refreshed_at > DIRECTORY_MAX_AGE
        return plan

    def refresh_sync(self, plan: CallPlan | None = None) -> None:
        for name, holder in (plan.dead_hosts if plan else []):
            if (name, holder) not in self._removed_hosts:
                self.ledger.remove_host(name=name, holder=holder).result()
                self._removed_hosts.add((name, holder))
        if plan:
            plan.dead_hosts.clear()
            plan.needs_refresh = False
        self.directory.update(self.ledger.hosts().result())
        self._refreshed_at = time.monotonic()

    async def refresh_async(self, plan: CallPlan | None = None) -> None:
        """Free dead hosts' leases and re-read the host list; many requests failing over at once share the reads.

        A dead incarnation is removed once per courier (a removal repeated is a no-op in
        the ledger): the requests that found it dead while its removal is under way wait
        for that one write. The host list comes from a read that started after this call
        did, shared by every request that asked meanwhile: a host frozen or killed with a
        thousand requests waiting on it costs one write and a couple of reads, not a
        thousand of each. A removal that fails fails each request waiting on it; the next
        request to find the host dead tries again.
        """
        loop = asyncio.get_running_loop()
        for name, holder in (plan.dead_hosts if plan else []):
            key = (name, holder)
            if key in self._removed_hosts:
                continue
            removal = self._removals.get(key)
            if removal is None or removal.get_loop() is not loop:
                removal = self._removals[key] = loop.create_task(self._remove_host(name, holder))
            await asyncio.shield(removal)
        if plan:
            plan.dead_hosts.clear()
            plan.needs_refresh = False
        asked = time.monotonic()
        while True:
            shared = self._host_read
            if shared is None or shared.loop is not loop or (shared.task.done() and shared.started < asked):
                shared = self._host_read = _SharedRead(loop, time.monotonic(), loop.create_task(self._read_hosts()))
            if shared.started >= asked:
                await asyncio.shield(shared.task)
                return
            # A read that began before this call may miss what made it ask: wait it out, then join the next.
            with contextlib.suppress(Exception):
                await asyncio.shield(shared.task)

    async def _remove_host(self, name: str, holder: str | None) -> None:
        try:
            await self.ledger.remove_host(name=name, holder=holder)
            self._removed_hosts.add((name, holder))
        finally:
            if self._removals.get((name, holder)) is asyncio.current_task():
                del self._removals[(name, holder)]

    async def _read_hosts(self) -> None:
        self.directory.update(await self.ledger.hosts())
        self._refreshed_at = time.monotonic()

    def route_sync(self, identity: str, request: HostRequest, *, method: str, timeout: float | None = None) -> Any:
        """Apply ``request`` to the owner of ``identity`` and return its value, following redirects.

        ``method`` names the handler or operation, for error messages. Waiting longer
        than a probe interval asks the ledger whether the host still owns the identity,
        and fails over when it does not (see the module docstring).

        Raises:
            ray.exceptions.GetTimeoutError: no reply within ``timeout`` seconds.
            FleetUnavailableError: no host to route to (or too many hops) within the routing
                patience (two lease TTLs), or within ``timeout`` when that is longer.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        plan = self._plan(identity, timeout)  # begun after the deadline was set: it gives up no sooner
        while True:
            if plan.needs_refresh:
                _pause(plan.hops)
                self.refresh_sync(plan)
            if deadline is not None and time.monotonic() >= deadline:
                raise ray.exceptions.GetTimeoutError(f"no host to route {identity!r} to within the timeout")
            chosen = plan.target()
            if chosen is None:
                continue
            name, handle = chosen
            pending = submit(handle, request, identity, method)
            try:
                reply = self._wait_sync(plan, name, pending, deadline)
            except ray.exceptions.GetTimeoutError:
                raise
            except Exception as error:  # noqa: BLE001 - on_failure re-raises all but a dead or busy host
                plan.on_failure(name, error)
                continue
            if reply is _ABANDONED:
                continue
            done, value = plan.on_reply(name, reply)
            if done:
                return value

    def _wait_sync(self, plan: CallPlan, host: str, pending: ray.ObjectRef[Any], deadline: float | None) -> Any:
        """The reply to ``pending``, or :data:`_ABANDONED` when its host no longer owns the identity."""
        sent = time.monotonic()
        probe_in = self.probe_interval
        while True:
            wait = probe_in
            if deadline is not None:
                wait = min(wait, max(deadline - time.monotonic(), 0.0))
            try:
                # One call on the hot path: a reply within the probe interval is returned at once.
                return ray.get(pending, timeout=wait)
            except ray.exceptions.GetTimeoutError:
                pass
            if deadline is not None and time.monotonic() >= deadline:
                # The caller stops waiting; the turn is not cancelled (it may commit, and a
                # retry under the same idempotency key then gets its reply).
                raise ray.exceptions.GetTimeoutError(f"no reply for {plan.identity!r} within the timeout")
            lease = self.ledger.leases([plan.identity]).result().get(plan.identity)
            probe_in = next_probe(self.probe_interval, lease)
            holder_now = None
            if plan.lapsed_while_held(host, lease):
                self.refresh_sync()
                holder_now = self.directory.holder_of(host)
            if plan.on_probe(host, lease, waited=time.monotonic() - sent, patience=self.patience,
                             holder_now=holder_now, restarting=self._restarting_sync(host, lease)):
                continue
            ready, _ = ray.wait([pending], timeout=0)
            if ready:  # answered while the ledger was asked: the reply stands
                return ray.get(pending)
            _cancel(pending)
            return _ABANDONED

    async def route_async(
        self, identity: str, request: HostRequest, *, method: str, timeout: float | None = None
    ) -> Any:
        """:meth:`route_sync`, awaited; no reply within ``timeout`` seconds raises ``DeadlineExceededError``
        (routing is given up, as there, after the routing patience or ``timeout``, whichever is longer).

        The deadline is kept here rather than by an ``asyncio.wait_for`` around the call,
        which costs a task of its own per request.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        plan = self._plan(identity, timeout)  # begun after the deadline was set: it gives up no sooner
        while True:
            if plan.needs_refresh:
                await _pause_async(plan.hops)
                await self.refresh_async(plan)
            if deadline is not None and time.monotonic() >= deadline:
                raise DeadlineExceededError(identity=identity, method=method, timeout=timeout or 0.0)
            chosen = plan.target()
            if chosen is None:
                continue
            name, handle = chosen
            if isinstance(request, EnvelopeRequest):
                answer, pending = self._batcher.submit(name, handle, request), None
            else:
                pending = submit(handle, request, identity, method)
                answer = asyncio.wrap_future(pending.future())
            try:
                reply = await self._wait_async(plan, name, answer, pending, deadline)
            except Exception as error:  # noqa: BLE001 - on_failure re-raises all but a dead or busy host
                plan.on_failure(name, error)
                continue
            if reply is _TIMED_OUT:
                raise DeadlineExceededError(identity=identity, method=method, timeout=timeout or 0.0)
            if reply is _ABANDONED:
                continue
            done, value = plan.on_reply(name, reply)
            if done:
                return value

    async def _wait_async(
        self, plan: CallPlan, host: str, reply: asyncio.Future[Reply], pending: ray.ObjectRef[Any] | None,
        deadline: float | None,
    ) -> Any:
        """:meth:`_wait_sync`, awaited: ``reply`` answers the request, sent alone as ``pending`` or batched;
        :data:`_TIMED_OUT` once ``deadline`` (monotonic) has passed.

        A caller that is cancelled (a timeout, a ``FirstOf`` already decided) only stops
        waiting: the turn goes on, as with the blocking path's timeout. An abandoned
        request sent alone is cancelled on its host; a batched one is left to finish.
        """
        sent = time.monotonic()
        probe_in = self.probe_interval
        while True:
            wait = probe_in if deadline is None else min(probe_in, max(deadline - time.monotonic(), 0.0))
            done, _ = await asyncio.wait({reply}, timeout=wait)
            if done:
                return reply.result()
            if deadline is not None and time.monotonic() >= deadline:
                # The caller stops waiting; the turn goes on (a retry under the same key gets its reply).
                reply.add_done_callback(lambda future: future.cancelled() or future.exception())
                return _TIMED_OUT
            lease = await self._probes.lease(plan.identity)
            probe_in = next_probe(self.probe_interval, lease)
            holder_now = None
            if plan.lapsed_while_held(host, lease):
                await self.refresh_async()
                holder_now = self.directory.holder_of(host)
            restarting = await self._restarting_async(host, lease)
            if plan.on_probe(host, lease, waited=time.monotonic() - sent, patience=self.patience,
                             holder_now=holder_now, restarting=restarting):
                continue
            if reply.done():
                return reply.result()
            # Whatever the abandoned copy ends with (most often TaskCancelledError) is nobody's news.
            reply.add_done_callback(lambda future: future.cancelled() or future.exception())
            if pending is not None:
                _cancel(pending)
            return _ABANDONED


def actor_restarting(handle: ray.actor.ActorHandle) -> bool:
    """Whether Ray is restarting the actor behind ``handle`` (or has given it up): its process is dead.

    Not knowing answers ``False``: the request is then treated as before, waiting for
    the lease to lapse, which is slower but as safe.
    """
    return actor_state(handle) in ("RESTARTING", "DEAD")


_ABANDONED: Any = object()
"""What a wait returns when its request was given up on because the host no longer owns the identity."""
_TIMED_OUT: Any = object()
"""What an awaited wait returns when the caller's deadline passed first."""


def _cancel(pending: ray.ObjectRef[Any]) -> None:
    """Cancel an abandoned request, best effort: whatever its host does with it, nobody hears the reply."""
    with contextlib.suppress(Exception):
        ray.cancel(pending)


def deliver_request(envelope: Envelope) -> EnvelopeRequest:
    """Run one turn on the owner; its reply is a :data:`~rayfleet.platform._replies.TurnReplyWire`
    (decode it with ``turn_value`` or ``turn_reply_from_wire``). Batched on the async path."""
    return EnvelopeRequest(envelope)


def tell_request(envelope: Envelope) -> HostRequest:
    """Hand a message to the owner, which runs it in the background."""
    return lambda host: host.tell.remote(envelope.target, envelope.wire())
ROUTING_RETRY = RetryPolicy(max_attempts=MAX_HOPS, base_delay=0.05, max_delay=1.0, jitter=0.0)
"""Waits before re-reading the host directory on a routing retry; hops are counted by ``CallPlan``."""


def _backoff(hops: int) -> float:
    # No wait before the first re-read of the directory (hop 1); then 0.05 s, doubling up to 1 s.
    return ROUTING_RETRY.delay_for(hops - 2) if hops > 1 else 0.0


def _pause(hops: int) -> None:
    time.sleep(_backoff(hops))


async def _pause_async(hops: int) -> None:
    await asyncio.sleep(_backoff(hops))
