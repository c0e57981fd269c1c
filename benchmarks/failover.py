"""B8 failover: a host holding ``agents`` agents is killed, or frozen, and every one of them must answer again.

Each round spawns ``agents`` new identities placed on one host (by the fleet's own
rendezvous placement), activates them with a first call, and checks where they live.
Then the host holding the most of them is faulted:

* kill: ``ray.kill`` of its actor (by name in the fleet's namespace, no restart); after
  the round a new host takes its place (``fleet.add_host()``, not timed);
* freeze: ``SIGSTOP`` of its process (its pid from an agent handler), ``SIGCONT``
  once every agent answered again.

From the fault on, every agent of that host is asked for its process id (all at once,
each retried until it answers from another process: ``ray.kill`` returns before the
actor is gone, and the dying actor may still serve a call); the figure is the seconds
until the last one answered. Kill and freeze rounds alternate, the order rotating, and
each round's entry in the detail says how long after the previous fault it began (a
host that took over a frozen host's requests stays suspect for the router a while,
which a fault soon after that can feel). The lease TTL is passed to ``rf.connect``
explicitly; the target is that TTL plus 2 s. No baseline: Ray itself has no failover
for actor state.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import ray

import rayfleet as rf
from rayfleet.platform._routing import rendezvous_pick

from ._agents import BenchAgent
from ._context import Context, Mode, Store, Unit
from ._measure import in_flight, interleave_async, percentile, summarize
from ._report import Result, Target, measured


@dataclass(frozen=True, slots=True)
class FailoverSizes:
    rounds: int
    """Rounds of each fault (kill and freeze)."""
    agents: int
    """Agents placed on the faulted host each round."""
    lease_ttl: float


SIZES: dict[Mode, FailoverSizes] = {
    "full": FailoverSizes(rounds=5, agents=1_000, lease_ttl=5.0),
    "quick": FailoverSizes(rounds=3, agents=100, lease_ttl=3.0),
    "smoke": FailoverSizes(rounds=2, agents=20, lease_ttl=2.0),
}
ACTIVATE_IN_FLIGHT = 256


class _Rounds:
    """The state of one fleet's fault rounds: identities made so far, and what each round saw."""

    def __init__(self, fleet: rf.Fleet, sizes: FailoverSizes) -> None:
        self.fleet = fleet
        self.sizes = sizes
        self.made = 0
        self.rounds: list[dict[str, Any]] = []
        self.last_fault: float | None = None
        self.deadline = 3 * sizes.lease_ttl + 20.0
        """Seconds after the fault past which an agent that has not answered counts as lost."""

    async def place(self, kind: str) -> tuple[str, list[rf.AgentRef]]:
        """``agents`` new live agents on one host; that host's name and refs to its agents of this round."""
        hosts = sorted(host.name for host in self.fleet.hosts() if not host.draining)
        target = hosts[len(self.rounds) % len(hosts)]
        identities: list[str] = []
        while len(identities) < self.sizes.agents:
            identity = f"b8/{kind}/{self.made}"
            self.made += 1
            if rendezvous_pick(identity, hosts) == target:
                identities.append(identity)
        refs = self.fleet.spawn_many([rf.AgentSpec(identity=identity, agent=BenchAgent) for identity in identities])

        async def first(index: int) -> object:
            return await refs[index].ask("ping")

        await in_flight(len(refs), ACTIVATE_IN_FLIGHT, first)
        owners = {status.identity: status.host for status in self.fleet.list_agents()
                  if status.identity in set(identities)}
        holder, _ = Counter(owners.values()).most_common(1)[0]
        if holder is None:
            raise RuntimeError("the round's agents are not live on any host after their first call")
        return holder, [ref for ref in refs if owners.get(ref.identity) == holder]

    async def recover(self, refs: list[rf.AgentRef], faulted: int, started: float) -> list[float]:
        """Seconds from ``started`` until each of ``refs`` answered from a process other than ``faulted``.

        An answer from the faulted process itself does not count: ``ray.kill`` returns
        before the actor is gone, and the dying actor may still serve a call or two.
        An agent that has not answered by the deadline counts as the deadline.
        """

        async def answered(ref: rf.AgentRef) -> float:
            while True:
                remaining = started + self.deadline - time.perf_counter()
                if remaining <= 0:
                    return self.deadline
                try:
                    if await ref.ask("pid", timeout=remaining) != faulted:
                        return time.perf_counter() - started
                except Exception:  # noqa: BLE001 - every error during failover is retried until the deadline
                    pass
                await asyncio.sleep(0.05)

        return list(await asyncio.gather(*(answered(ref) for ref in refs)))

    def record(self, kind: str, host: str, started: float, seconds: list[float]) -> float:
        last = max(seconds)
        since = None if self.last_fault is None else round(started - self.last_fault, 1)
        self.last_fault = started
        self.rounds.append({"fault": kind, "host": host, "agents": len(seconds), "seconds": round(last, 3),
                            "p50_seconds": round(percentile(seconds, 0.5), 3),
                            "unanswered": sum(1 for value in seconds if value >= self.deadline),
                            "seconds_since_previous_fault": since})
        return last

    async def kill(self) -> float:
        host, refs = await self.place("kill")
        pid = int(await refs[0].ask("pid"))
        handle = ray.get_actor(host, namespace=self.fleet.config.namespace)
        started = time.perf_counter()
        ray.kill(handle, no_restart=True)
        seconds = await self.recover(refs, pid, started)
        self.fleet.add_host()  # back to the fleet's size for the next round
        return self.record("kill", host, started, seconds)

    async def freeze(self) -> float:
        host, refs = await self.place("freeze")
        pid = int(await refs[0].ask("pid"))
        started = time.perf_counter()
        os.kill(pid, signal.SIGSTOP)
        try:
            seconds = await self.recover(refs, pid, started)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        return self.record("freeze", host, started, seconds)


def failover(context: Context, store: Store) -> list[Result]:
    """B8: seconds until every agent of a killed (or frozen) host answered again; target lease TTL + 2 s."""
    sizes = SIZES[context.mode]
    # Every re-routed request logs a warning (one per agent per fault): expected here, so not shown.
    routing = logging.getLogger("rayfleet")
    level = routing.level
    routing.setLevel(logging.ERROR)
    try:
        with context.fleet(store, lease_ttl=sizes.lease_ttl) as fleet:
            rounds = _Rounds(fleet, sizes)
            figures = asyncio.run(interleave_async(sizes.rounds, {"kill": rounds.kill, "freeze": rounds.freeze}))
    finally:
        routing.setLevel(level)
    limit = sizes.lease_ttl + 2.0
    target = Target(text=f"<= {limit:g} s (lease TTL {sizes.lease_ttl:g} s + 2 s)", value_max=limit)
    results = []
    for kind, verb in (("kill", "killed"), ("freeze", "frozen")):
        detail = context.detail(sizes, fault=f"host {verb} ({'ray.kill, no restart' if kind == 'kill' else 'SIGSTOP'})",
                                rounds=[entry for entry in rounds.rounds if entry["fault"] == kind])
        results.append(measured(f"B8 failover after host {kind} {store}", rayfleet=summarize(figures[kind]),
                                baseline=None, unit="s", target=target, detail=detail))
    return results


UNITS = (Unit("B8", "failover", failover),)
