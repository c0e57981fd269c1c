"""A Jepsen-style chaos harness for rayfleet: a workload, a nemesis, a history and a checker.

The workload runs against one fleet (its own namespace and storage) while a nemesis
thread injects faults; every operation is recorded as a history of events
(``invoke`` / ``ok`` / ``fail`` / ``info``: client id, identity, key, time, reply or
error), every fault in a fault log (kind, target, start, end, the identities it hit).
Afterwards the checker reads the final State of every agent and the run registry and
reports violations (there must be none) and, per fault kind, the longest time an
identity hit by that fault could not be served.

Workload:

* increments ``add(n=1, key=k)`` over ``identities`` counters from concurrent ``ask``
  coroutines, every other one with ``idempotency_key=k``: a keyed call that failed or
  timed out is recorded (``info``: outcome unknown) and retried with the same key; an
  un-keyed one is sent once and never retried (a retry would be a new call), so the
  platform's own re-sends after a fault must not apply it twice either. The handler
  records ``k`` in its State, so the checker counts every application of every call;
* saga runs submitted to the runner: ``reserve`` (compensated by ``cancel``) then
  ``charge``, which fails on purpose for every third run;
* paused agents with parked work: a parker pauses an identity, sends calls that park,
  and resumes it later.

Faults (one at a time, from the nemesis thread): ``host_kill`` (``ray.kill`` of a host;
Ray restarts it, ``max_restarts=-1``), ``host_freeze`` (SIGSTOP of a host's process
past the lease TTL, then SIGCONT), ``zombie_host`` (a frozen host is declared dead and
another host serves its agents until it wakes with their old States in memory), ``ledger_kill`` (the SQLite ledger actor; Ray
restarts it on the same file), ``pg_restart`` (the PostgreSQL server, at most once per
run, under ``pg_support.RESTART_LOCK``), ``runner_kill``, ``drain`` (then ``undrain``) and ``zombie``
(a lifecycle operation moves an identity's token on, then writes presented with the
old token must be refused).

Used by ``tests/chaos/test_chaos.py`` (short profile, in CI) and by
``python -m tests.chaos.run --profile long`` (by hand).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import random
import re
import signal
import sys
import threading
import time
import traceback
import uuid
from collections import Counter as Tally
from collections import defaultdict
from collections.abc import Callable, Coroutine
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pg_support
import pydantic
import ray

import rayfleet as rf
from rayfleet.ledger import CheckpointCommit, SnapshotPointer
from rayfleet.ledger._values import holder_host

T = TypeVar("T")

LEDGER_ACTOR = "rayfleet-ledger"
_ENDED = "; ended while stopped (it held the SQLite ledger's write lock), restarted by Ray"
RUNNER_ACTOR = "rayfleet-runner"


# --------------------------------------------------------------------------- profiles


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    duration: float
    """Seconds of workload under faults."""
    identities: int = 500
    clients: int = 12
    paused: int = 10
    parked_per_pause: int = 3
    saga_every: float = 2.0
    fault_gap: float = 4.0
    """Seconds of calm between two faults."""
    freeze: float = 8.0
    """How long a frozen host stays stopped: past the lease TTL plus the 2 s failover target, so the
    measured unavailability shows whether another host took over (target: TTL + 2 s) or not (freeze)."""
    lease_ttl: float = 3.0
    hosts: int = 2
    call_timeout: float = 2.0
    op_patience: float = 60.0
    """How long one increment is retried (same key) before it is left with an unknown outcome."""
    seed: int = 10
    turns: int = 8
    """Identities running durable turns (steps and a sleep) beside the increments."""
    turn_nap: float = 0.3
    """Seconds each durable turn sleeps (suspended) between its two steps."""
    tick_every: float = 0.5
    """Period of the reminder one of them sets; its ticks are checked against the timer's count."""
    streams: int = 2
    """Identities whose turns a reader follows, reconnecting across faults with its last event id."""
    stream_parts: int = 8
    """Persisted events (and deltas) a streamed turn emits, each after a journaled step."""
    stream_nap: float = 0.1
    """Seconds a streamed turn waits (in memory, not suspended) after each part: faults land mid-turn."""
    faults: tuple[str, ...] = ()
    """Only these fault kinds (empty: all of them); ``CHAOS_FAULTS=ledger_kill,zombie_host`` in the test."""


PROFILES = {
    "short": Profile("short", duration=100.0),
    "long": Profile("long", duration=1200.0, clients=16, paused=20),
    "smoke": Profile("smoke", duration=30.0, identities=60, clients=4, paused=3, fault_gap=2.0),
}


# --------------------------------------------------------------------------- agents


class ChaosCounter(rf.Agent):
    """``add`` returns the new total and records the key it applied, in order."""

    class State(rf.State):
        total: int = 0
        applied: list[str] = pydantic.Field(default_factory=list)

    @rf.handler
    async def add(self, n: int, key: str) -> int:
        self.state.total += n
        self.state.applied = [*self.state.applied, key]
        total: int = self.state.total
        return total

    @rf.handler
    async def read(self) -> dict[str, Any]:
        return {"total": self.state.total, "applied": list(self.state.applied)}


def record_effect(path: str, key: str) -> str:
    """An outside effect keyed by its step key: one line appended per run of the step's function."""
    with open(path, "a") as effects:  # one short O_APPEND write: lines from several hosts never interleave
        effects.write(key + "\n")
    return key


class ChaosTurns(rf.Agent):
    """A durable turn: a step, a durable sleep (the turn suspends), a second step; and a reminder's ticks."""

    class State(rf.State):
        completed: list[str] = pydantic.Field(default_factory=list)
        ticks: int = 0

    @rf.handler
    async def work(self, key: str, effects: str, nap: float) -> list[str]:
        first = await self.step("charge", lambda: record_effect(effects, self.step_key))
        await self.sleep(nap)
        second = await self.step("ship", lambda: record_effect(effects, self.step_key))
        self.state.completed = [*self.state.completed, key]
        return [first, second]

    @rf.handler
    async def narrate(self, key: str, parts: int, nap: float) -> str:
        for index in range(parts):
            await self.step(f"part-{index}", lambda index=index: index)
            self.emit("part", {"key": key, "index": index})
            self.emit_delta(f"{index} ")
            await asyncio.sleep(nap)
        self.state.completed = [*self.state.completed, key]
        return key

    @rf.handler
    async def start_ticking(self, every: float) -> None:
        await self.remind("tick", every=every, method="tick")

    @rf.handler
    async def stop_ticking(self) -> bool:
        return await self.forget("tick")

    @rf.handler
    async def tick(self) -> int:
        self.state.ticks += 1
        return self.state.ticks

    @rf.handler
    async def read(self) -> dict[str, Any]:
        return {"completed": list(self.state.completed), "ticks": self.state.ticks}


class ChaosHotel(rf.Agent):
    class State(rf.State):
        reserved: dict[str, int] = pydantic.Field(default_factory=dict)
        cancelled: dict[str, int] = pydantic.Field(default_factory=dict)

    @rf.handler
    async def reserve(self, run: str) -> dict[str, str]:
        self.state.reserved = {**self.state.reserved, run: self.state.reserved.get(run, 0) + 1}
        return {"run": run}

    @rf.handler
    async def cancel(self, run: str) -> dict[str, str]:
        reserved = dict(self.state.reserved)
        reserved.pop(run, None)
        self.state.reserved = reserved
        self.state.cancelled = {**self.state.cancelled, run: self.state.cancelled.get(run, 0) + 1}
        return {"run": run}

    @rf.handler
    async def report(self) -> dict[str, Any]:
        return {"reserved": dict(self.state.reserved), "cancelled": dict(self.state.cancelled)}


class ChaosBank(rf.Agent):
    class State(rf.State):
        charged: dict[str, int] = pydantic.Field(default_factory=dict)

    @rf.handler
    async def charge(self, run: str, fail: bool) -> dict[str, str]:
        if fail:
            raise ValueError(f"charge for {run} declined on purpose")
        self.state.charged = {**self.state.charged, run: self.state.charged.get(run, 0) + 1}
        return {"run": run}

    @rf.handler
    async def report(self) -> dict[str, Any]:
        return {"charged": dict(self.state.charged)}


def saga(hotel: str, bank: str, fail: bool) -> rf.Workflow:
    workflow = rf.Workflow("chaos-saga")
    workflow.step("reserve", to=hotel, call="reserve", payload=lambda ctx: {"run": ctx.run_id}).compensate("cancel")
    workflow.step("charge", to=bank, call="charge", payload=lambda ctx: {"run": ctx.run_id, "fail": fail},
                  after=["reserve"])
    return workflow


# --------------------------------------------------------------------------- history and fault log


@dataclass(frozen=True, slots=True)
class Event:
    type: str
    """invoke, ok, fail (definitely not applied) or info (outcome unknown)."""
    process: str
    op: int
    identity: str
    key: str
    time: float
    value: Any = None


@dataclass(slots=True)
class Fault:
    kind: str
    target: str
    start: float
    end: float = 0.0
    wall: float = field(default_factory=time.time)
    """``time.time()`` at the start (run records carry wall-clock times)."""
    hit: list[str] | None = None
    """Identities the fault hit; ``None`` means every identity."""
    detail: str = ""
    longest: str = ""
    """The operation that waited longest because of this fault: seconds, process, identity."""
    longest_op: int | None = None
    """That operation's id in the history (its events go into the JSON report)."""


class History:
    """Thread-safe event log; times are ``time.monotonic()``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.events: list[Event] = []
        self.faults: list[Fault] = []
        self._ops = 0

    def new_op(self) -> int:
        with self._lock:
            self._ops += 1
            return self._ops

    def record(self, type_: str, process: str, op: int, identity: str, key: str, value: Any = None) -> None:
        event = Event(type_, process, op, identity, key, time.monotonic(), value)
        with self._lock:
            self.events.append(event)

    def fault(self, fault: Fault) -> Fault:
        with self._lock:
            self.faults.append(fault)
        return fault


# --------------------------------------------------------------------------- the run


@dataclass
class ChaosResult:
    profile: str
    ledger: str
    operations: dict[str, Any]
    faults: dict[str, int]
    violations: list[str]
    unavailability: dict[str, float]
    recovery: dict[str, float]
    notes: list[str] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)

    def table(self) -> str:
        lines = [f"chaos profile {self.profile!r} on the {self.ledger} ledger", ""]
        lines.append(f"{'operations':<34}{'count':>10}")
        lines += [f"  {name:<32}{count:>10}" for name, count in self.operations.items()]
        lines.append("")
        lines.append(f"{'fault':<20}{'count':>6}{'longest unavailability (s)':>30}{'recovery (s)':>14}")
        for kind, count in sorted(self.faults.items()):
            unavailable = self.unavailability.get(kind)
            shown = f"{unavailable:.2f}" if unavailable is not None else "-"
            recovery = self.recovery.get(kind)
            lines.append(f"  {kind:<18}{count:>6}{shown:>30}{(f'{recovery:.2f}' if recovery is not None else '-'):>14}")
        lines.append("")
        lines.append(f"violations: {len(self.violations)}")
        lines += [f"  {violation}" for violation in self.violations[:40]]
        if self.notes:
            lines.append("notes:")
            lines += [f"  {note}" for note in self.notes]
        if self.stats:
            lines.append("stats: " + ", ".join(f"{k}={v}" for k, v in self.stats.items()))
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class ChaosRun:
    """One chaos run on a fresh fleet; :meth:`run` returns the checked result."""

    def __init__(self, profile: Profile, *, storage: Path, ledger: str | None = None, log: Any = print) -> None:
        self.profile = profile
        self.storage = storage
        self.host_log = Path(storage).parent / "host-log.txt"
        """Where every host writes rayfleet's log (see ``_log_hosts``)."""
        self.ledger_url = ledger
        self.ledger_kind = "postgresql" if ledger and ledger.startswith("postgresql") else "sqlite"
        self.namespace = f"chaos-{uuid.uuid4().hex[:8]}"
        self.history = History()
        self.log = log
        self.random = random.Random(profile.seed)
        self.stop = threading.Event()
        self.counters = [f"chaos/c/{index}" for index in range(profile.identities)]
        self.paused_ids = [f"chaos/p/{index}" for index in range(profile.paused)]
        self.hotels = ["chaos/w/hotel-0", "chaos/w/hotel-1"]
        self.banks = ["chaos/w/bank-0", "chaos/w/bank-1"]
        self.turn_ids = [f"chaos/t/{index}" for index in range(profile.turns)]
        self.stream_ids = [f"chaos/s/{index}" for index in range(profile.streams)]
        self.stream_reads: list[StreamRead] = []
        self.loops: dict[str, asyncio.AbstractEventLoop] = {}
        self.stream_stats: dict[str, Any] = {}
        self.effects_path = str(storage.parent / "turn-effects.log")
        self.turn_stats: dict[str, Any] = {}
        self.runs: dict[str, dict[str, Any]] = {}
        self.parked_sent: dict[str, list[str]] = defaultdict(list)
        self.parked_seen: set[str] = set()
        self.ownership: dict[str, str] = {}
        self.tokens: dict[str, list[tuple[float, int, str]]] = defaultdict(list)
        self.zombie_attempts = 0
        self.zombie_refused = 0
        self.violations: list[str] = []
        self.notes: list[str] = []
        self.frozen: set[int] = set()
        self.ended: set[int] = set()
        """Frozen hosts that no longer existed when woken (ended by the fleet)."""
        self.pg_restarted = False
        self._lock = threading.Lock()

    # -- setup ------------------------------------------------------------------------

    def connect(self) -> rf.Fleet:
        options: dict[str, Any] = {"namespace": self.namespace, "hosts": self.profile.hosts,
                                   "lease_ttl": self.profile.lease_ttl}
        if self.ledger_url:
            options["ledger"] = self.ledger_url
        return rf.connect(storage=self.storage, **options)

    def setup(self) -> None:
        self.fleet = self.connect()
        specs = [rf.AgentSpec(identity=identity, agent=ChaosCounter, durability=rf.Durability.EVERY_TURN)
                 for identity in [*self.counters, *self.paused_ids]]
        self.fleet.spawn_many(specs)
        self.fleet.spawn_many([rf.AgentSpec(identity=identity, agent=ChaosTurns)
                               for identity in [*self.turn_ids, *self.stream_ids]])
        if self.turn_ids:
            self.fleet.agent(self.turn_ids[0]).call("start_ticking", every=self.profile.tick_every)
        for identity in self.hotels:
            self.fleet.spawn(identity, ChaosHotel)
        for identity in self.banks:
            self.fleet.spawn(identity, ChaosBank)
        # One driver-side handle per thread that talks to the fleet: the courier of one
        # Fleet is not shared between the workload's event loop and the other threads.
        self.control = self.connect()
        self.sampler_fleet = self.connect()
        self.saga_fleet = self.connect()
        self.parker_fleet = self.connect()
        self.turns_fleet = self.connect()
        self._log_hosts(self.control)

    def teardown(self) -> None:
        for pid in list(self.frozen):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        for extra in ("control", "sampler_fleet", "saga_fleet", "parker_fleet", "turns_fleet"):
            fleet = getattr(self, extra, None)
            if fleet is not None:
                with contextlib.suppress(Exception):
                    fleet.shutdown(stop_actors=False)
        if getattr(self, "fleet", None) is not None:
            self.fleet.shutdown(stop_actors=True)

    # -- workload: keyed increments from concurrent ask coroutines --------------------

    async def _client(self, index: int) -> None:
        process = f"client-{index}"
        rng = random.Random(self.profile.seed * 1000 + index)
        refs = {identity: self.fleet.agent(identity) for identity in self.counters}
        seq = 0
        while not self.stop.is_set():
            identity = rng.choice(self.counters)
            seq += 1
            key = f"{process}-{seq}"
            await self._increment(process, refs[identity], key, keyed=seq % 2 == 0)

    async def _increment(self, process: str, ref: rf.AgentRef, key: str, *, keyed: bool) -> None:
        op = self.history.new_op()
        give_up = time.monotonic() + self.profile.op_patience
        while True:
            self.history.record("invoke", process, op, ref.identity, key)
            try:
                value = await ref.ask("add", n=1, key=key, idempotency_key=key if keyed else None,
                                      timeout=self.profile.call_timeout)
            except rf.HandlerError as error:
                self.history.record("fail", process, op, ref.identity, key, repr(error)[:200])
                return
            except Exception as error:  # any failure: outcome unknown; a keyed call retries with the same key
                self.history.record("info", process, op, ref.identity, key, _describe(error))
                if not keyed or time.monotonic() > give_up:
                    return
                await asyncio.sleep(0.1 + random.random() * 0.2)
                continue
            self.history.record("ok", process, op, ref.identity, key, value)
            return

    def _workload(self) -> None:
        async def main() -> None:
            await asyncio.gather(*(self._client(index) for index in range(self.profile.clients)))

        self._run_loop("workload", main())

    # -- workload: durable turns (steps, suspension) ----------------------------------------

    async def _turn_client(self, index: int, identity: str) -> None:
        process = f"turns-{index}"
        ref = self.turns_fleet.agent(identity)
        seq = 0
        while not self.stop.is_set():
            seq += 1
            key = f"{process}-{seq}"
            keyed = seq % 2 == 0
            op = self.history.new_op()
            give_up = time.monotonic() + self.profile.op_patience
            while True:
                self.history.record("invoke", process, op, identity, key)
                try:
                    value = await ref.ask("work", key=key, effects=self.effects_path, nap=self.profile.turn_nap,
                                          idempotency_key=key if keyed else None,
                                          timeout=self.profile.call_timeout + self.profile.turn_nap + 5)
                except rf.HandlerError as error:
                    self.history.record("fail", process, op, identity, key, repr(error)[:200])
                    break
                except Exception as error:  # outcome unknown; a keyed call retries with the same key
                    self.history.record("info", process, op, identity, key, _describe(error))
                    if not keyed or time.monotonic() > give_up:
                        break
                    await asyncio.sleep(0.1 + random.random() * 0.2)
                    continue
                self.history.record("ok", process, op, identity, key, value)
                break

    def _turns(self) -> None:
        async def main() -> None:
            await asyncio.gather(*(self._turn_client(index, identity) for index, identity in enumerate(self.turn_ids)),
                                 *(self._stream_client(index, identity)
                                   for index, identity in enumerate(self.stream_ids)))

        self._run_loop("turns", main())

    def _run_loop(self, name: str, main: Coroutine[Any, Any, None]) -> None:
        """Run ``main`` on a loop of this thread's own, kept so that a thread that does not stop can be shown."""
        with asyncio.Runner() as runner:
            self.loops[name] = runner.get_loop()
            runner.run(main)

    def _where_stuck(self, thread: threading.Thread) -> str:
        """Where a thread that did not stop waits: its asyncio tasks' innermost frames, or its own stack."""
        places: list[str] = []
        loop = self.loops.get(thread.name)
        if loop is not None and not loop.is_closed():
            for task in list(asyncio.all_tasks(loop)):
                frames = task.get_stack()
                if frames:
                    inner = frames[-1]
                    places.append(f"{task.get_coro()!r:.60}: {inner.f_code.co_filename.rsplit('/', 1)[-1]}:"
                                  f"{inner.f_lineno} in {inner.f_code.co_name}")
        frame = sys._current_frames().get(thread.ident or -1)
        if frame is not None:
            stack = traceback.extract_stack(frame)[-4:]
            places.append("thread: " + " <- ".join(f"{entry.filename.rsplit('/', 1)[-1]}:{entry.lineno} "
                                                   f"{entry.name}" for entry in reversed(stack)))
        return "; ".join(places)[:3000]

    # -- workload: stream readers ------------------------------------------------------

    async def _stream_client(self, index: int, identity: str) -> None:
        """Start a turn and read its stream to the end, reconnecting with the last event id after any error.

        Every other turn is keyed. The reader keeps every event it got; the checker holds
        them against the turn's stream as the ledger keeps it.
        """
        process = f"streams-{index}"
        rng = random.Random(self.profile.seed * 2000 + index)
        ref = self.turns_fleet.agent(identity)
        seq = 0
        while not self.stop.is_set():
            seq += 1
            key = f"{process}-{seq}"
            keyed = seq % 2 == 0
            op = self.history.new_op()
            self.history.record("invoke", process, op, identity, key)
            try:
                handle = ref.start("narrate", key=key, parts=self.profile.stream_parts, nap=self.profile.stream_nap,
                                   idempotency_key=key if keyed else None, timeout=self.profile.op_patience)
            except Exception as error:  # the send itself failed: nothing to read
                self.history.record("info", process, op, identity, key, _describe(error))
                await asyncio.sleep(0.2)
                continue
            read = StreamRead(identity=identity, turn_id=handle.id, key=key)
            give_up = time.monotonic() + self.profile.op_patience
            while True:
                after = read.events[-1].id if read.events else None
                try:
                    async for event in handle.aevents(after=after):
                        read.events.append(event)
                        if event.kind not in STREAM_ENDS and rng.random() < 0.2:
                            break  # the client drops the connection, as a flaky network would
                    else:
                        break
                    read.dropped += 1
                    continue
                except Exception as error:  # a fault cut the reader off: reconnect after the last id it got
                    read.reconnects += 1
                    read.errors.append(_describe(error))
                    if time.monotonic() > give_up:
                        break
                    await asyncio.sleep(0.1 + random.random() * 0.2)
            try:
                value = await asyncio.wait_for(handle.wait(), self.profile.op_patience)
            except Exception as error:  # outcome unknown
                read.outcome = _describe(error)
                self.history.record("info", process, op, identity, key, read.outcome)
            else:
                self.history.record("ok", process, op, identity, key, value)
                read.acknowledged = True
            self.stream_reads.append(read)

    # -- workload: sagas ---------------------------------------------------------------

    def _sagas(self) -> None:
        fleet = self.saga_fleet
        index = 0
        while not self.stop.wait(self.profile.saga_every):
            index += 1
            fail = index % 3 == 0
            hotel, bank = self.hotels[index % 2], self.banks[index % 2]
            run_id = f"chaos-run-{index}"
            self.runs[run_id] = {"fail": fail, "hotel": hotel, "bank": bank, "submitted": None}
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not self.stop.is_set():
                try:
                    fleet.submit(saga(hotel, bank, fail), run_id=run_id)
                    self.runs[run_id]["submitted"] = time.monotonic()
                    self.runs[run_id]["submitted_wall"] = time.time()
                    break
                except Exception as error:  # ledger or runner down: submit again, same run id
                    self.runs[run_id]["submit_error"] = type(error).__name__
                    time.sleep(0.5)

    # -- workload: paused agents with parked work -------------------------------------

    def _parker(self) -> None:
        fleet = self.parker_fleet
        try:
            rounds = 0
            while not self.stop.is_set():
                rounds += 1
                identity = self.paused_ids[rounds % len(self.paused_ids)]
                if not _retry(lambda identity=identity: fleet.pause(identity) or True, self.stop, patience=20):
                    continue
                ref = fleet.agent(identity)
                for number in range(self.profile.parked_per_pause):
                    key = f"park-{rounds}-{number}"
                    self.parked_sent[identity].append(key)
                    op = self.history.new_op()
                    self.history.record("invoke", "parker", op, identity, key)
                    try:
                        value = ref.call("add", n=1, key=key, idempotency_key=key, timeout=0.3)
                        self.history.record("ok", "parker", op, identity, key, value)
                    except Exception as error:  # a parked call times out; that is the point
                        self.history.record("info", "parker", op, identity, key, type(error).__name__)
                with contextlib.suppress(Exception):
                    self.parked_seen.update(message.envelope.idempotency_key or ""
                                            for message in fleet.parked(identity))
                if self.stop.wait(3.0):
                    break
                _retry(lambda identity=identity: fleet.resume(identity), self.stop, patience=20)
        except Exception as error:  # recorded, the run goes on without the parker
            self.notes.append(f"parker stopped: {type(error).__name__}: {error}"[:200])

    # -- sampler: ownership and fencing tokens over time -----------------------------

    def _sampler(self) -> None:
        fleet = self.sampler_fleet
        while not self.stop.wait(1.0):
            try:
                statuses = fleet.list_agents()
            except Exception:  # the ledger may be down; sample again later
                continue
            now = time.monotonic()
            owners: dict[str, str] = {}
            for status in statuses:
                if status.lease is None or status.host is None:
                    continue
                owners[status.identity] = status.host
                samples = self.tokens[status.identity]
                if not samples or samples[-1][1:] != (status.lease.fencing_token, status.host):
                    samples.append((now, status.lease.fencing_token, status.host))
            self.ownership = owners

    # -- nemesis ----------------------------------------------------------------------

    def _schedule(self) -> list[str]:
        kinds = ["host_kill", "host_freeze", "zombie_host", "ledger_kill", "drain", "runner_kill", "zombie"]
        if self.ledger_kind == "postgresql":
            kinds.remove("ledger_kill")
        if self.profile.faults:
            kinds = [kind for kind in self.profile.faults if kind != "pg_restart"]
        order: list[str] = []
        while len(order) < 400:
            cycle = kinds[:]
            self.random.shuffle(cycle)
            order += cycle
        if self.ledger_kind == "postgresql":
            order.insert(2, "pg_restart")
        return order

    def _nemesis(self) -> None:
        fleet = self.control
        self.stop.wait(5.0)  # let the workload warm up first
        for kind in self._schedule():
            if self.stop.is_set():
                return
            try:
                getattr(self, f"_fault_{kind}")(fleet)
            except Exception as error:  # a fault that could not be injected is a note, not a crash
                self.notes.append(f"{kind} not injected: {type(error).__name__}: {error}"[:200])
            self._log_hosts(fleet)
            if self.stop.wait(self.profile.fault_gap):
                return

    def _log_hosts(self, fleet: rf.Fleet) -> None:
        """Have every host write rayfleet's log (INFO and up) to ``host-log.txt`` beside the storage, once
        per process: what a host did with a turn that a violation names is read from there."""
        path = str(self.host_log)

        def attach(actor: Any) -> None:
            logger = logging.getLogger("rayfleet")
            if not any(getattr(handler, "chaos_log", False) for handler in logger.handlers):
                handler = logging.FileHandler(path)
                handler.chaos_log = True  # type: ignore[attr-defined]
                handler.setFormatter(logging.Formatter(f"%(created).1f {os.getpid()} %(name)s %(message)s"))
                logger.addHandler(handler)
                logger.setLevel(logging.INFO)

        for name in self._hosts_named(fleet):
            with contextlib.suppress(Exception):
                self._in_actor(name, attach)

    def _hosts_named(self, fleet: rf.Fleet) -> list[str]:
        return sorted(host.name for host in fleet.hosts())

    def _owned_by(self, host: str) -> list[str]:
        return [identity for identity, owner in self.ownership.items() if owner == host]

    def _await_hosts(self, fleet: rf.Fleet, name: str, patience: float = 30.0) -> None:
        """Wait until ``name`` is registered again; start it again (``add_host``) if Ray restarted it quietly."""
        deadline = time.monotonic() + patience
        while time.monotonic() < deadline:
            try:
                if name in self._hosts_named(fleet):
                    return
                # Ray restarted the actor (max_restarts=-1), but a restarted host registers
                # only when it is started: add_host starts the lowest free name, this one.
                fleet.add_host()
            except Exception:  # the actor may still be restarting
                time.sleep(0.2)
        self.notes.append(f"{name} did not come back within {patience:.0f} s")

    def _in_actor(self, name: str, read: Callable[[Any], T], timeout: float = 5.0) -> T:
        """``read(actor)`` run inside the named actor of this fleet (Ray's public ``__ray_call__``)."""
        handle = ray.get_actor(name, namespace=self.namespace)
        return ray.get(handle.__ray_call__.remote(read), timeout=timeout)

    def _pid(self, name: str) -> int:
        """The process id of a named actor of this fleet."""
        return int(self._in_actor(name, lambda actor: os.getpid()))

    def _await_new_process(self, name: str, old_pid: int, patience: float = 60.0) -> bool:
        """Wait until Ray has restarted ``name`` in a new process (``ray.kill`` returns before it dies)."""
        deadline = time.monotonic() + patience
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                if self._pid(name) != old_pid:
                    return True
            time.sleep(0.1)
        self.notes.append(f"{name} was not restarted within {patience:.0f} s")
        return False

    def _fault_host_kill(self, fleet: rf.Fleet) -> None:
        name = self.random.choice(self._hosts_named(fleet))
        old_pid = self._pid(name)
        fault = self.history.fault(Fault("host_kill", name, time.monotonic(), hit=self._owned_by(name)))
        ray.kill(ray.get_actor(name, namespace=self.namespace), no_restart=False)
        self._await_new_process(name, old_pid)
        fault.end = time.monotonic()
        self._await_hosts(fleet, name)
        fault.detail = f"restarted after {fault.end - fault.start:.2f} s"
        self._recovered(fault)

    def _fault_host_freeze(self, fleet: rf.Fleet) -> None:
        name = self.random.choice(self._hosts_named(fleet))
        pid = self._pid(name)
        fault = self.history.fault(Fault("host_freeze", name, time.monotonic(), hit=self._owned_by(name)))
        self.frozen.add(pid)
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(self.profile.freeze)
        finally:
            ended = not self._wake(pid)
        fault.end = time.monotonic()
        fault.detail = f"pid {pid} stopped {fault.end - fault.start:.2f} s" + (_ENDED if ended else "")
        self._recovered(fault)

    def _fault_zombie_host(self, fleet: rf.Fleet) -> None:
        """A frozen host is declared dead while it holds agents in memory; another host serves them; it wakes.

        What the router will do by itself once frozen-host failover lands: after one TTL the
        frozen host's leases are revoked (``revoke_holder``, what the driver does for a host
        Ray reports dead), and keyed increments for the identities it owned are sent to the
        other host directly (recorded in the history as ``failover``). When the zombie wakes
        it still has the old States in memory and the clients' queued turns to run: none of
        its writes may be accepted.
        """
        hosts = {host.name: host for host in fleet.hosts()}
        if len(hosts) < 2:
            self.notes.append("zombie_host skipped: only one host")
            return
        name = self.random.choice(sorted(hosts))
        other = self.random.choice(sorted(set(hosts) - {name}))
        victims = self._owned_by(name)
        pid = self._pid(name)
        fault = self.history.fault(Fault("zombie_host", name, time.monotonic(), hit=victims))
        self.frozen.add(pid)
        os.kill(pid, signal.SIGSTOP)
        # The host wakes on a timer, whatever the ledger does meanwhile (a ledger call can
        # block on locks the frozen host holds: see the note written below).
        waker = threading.Timer(self.profile.freeze, self._wake, args=(pid,))
        waker.start()
        served = 0
        revoke = ""
        refused: list[str] = []
        try:
            time.sleep(self.profile.lease_ttl + 0.5)
            asked = time.monotonic()
            try:
                fleet._ledger.revoke_holder(hosts[name].holder).result(timeout=self.profile.freeze)
            except Exception as error:
                revoke = f"revoke_holder of the frozen host did not answer: {_describe(error)}"
                self.notes.append(f"zombie_host {name}: {revoke} (waited {time.monotonic() - asked:.1f} s)")
            handle = ray.get_actor(other, namespace=self.namespace)
            addable = [identity for identity in victims if identity not in {*self.banks, *self.hotels}]  # no add
            for identity in addable[:20] if not revoke else []:
                if not waker.is_alive():
                    break  # the zombie is awake again: the window is over
                key = f"failover-{uuid.uuid4().hex[:10]}"
                op = self.history.new_op()
                self.history.record("invoke", "failover", op, identity, key)
                envelope = rf.Envelope(target=identity, method="add", kwargs={"n": 1, "key": key}, idempotency_key=key)
                try:
                    kind, value = ray.get(handle.deliver.remote(identity, envelope), timeout=10)
                except Exception as error:
                    self.history.record("info", "failover", op, identity, key, _describe(error))
                    refused.append(_describe(error))
                    continue
                if kind == "ok":
                    value = value[0]  # the turn's wire form: (value, usage, journaled step)
                    self.history.record("ok", "failover", op, identity, key, value)
                    served += 1
                else:
                    # A redirect (still owned by the frozen host) or an error: never applied here.
                    self.history.record("info", "failover", op, identity, key, f"{kind}: {value!r}"[:200])
                    refused.append(f"{kind}: {value!r}"[:200])
        finally:
            waker.join()
        fault.end = time.monotonic()
        fault.detail = f"{len(victims)} owned, {served} served by {other} meanwhile" + (f" ({revoke})" if revoke else "")
        if pid in self.ended:
            fault.detail += _ENDED
        if refused:
            fault.detail += f"; {len(refused)} not served, the first: {refused[0]}"
        self._recovered(fault)

    def _wake(self, pid: int) -> bool:
        """Continue a frozen host; ``False`` if it no longer exists (a host ended it: it held the SQLite
        ledger's write lock while stopped, and Ray restarted it)."""
        self.frozen.discard(pid)
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            self.ended.add(pid)
            return False
        return True

    def _fault_ledger_kill(self, fleet: rf.Fleet) -> None:
        old_pid = self._pid(LEDGER_ACTOR)
        fault = self.history.fault(Fault("ledger_kill", LEDGER_ACTOR, time.monotonic()))
        ray.kill(ray.get_actor(LEDGER_ACTOR, namespace=self.namespace), no_restart=False)
        self._await_new_process(LEDGER_ACTOR, old_pid)
        fault.end = time.monotonic()
        _retry(fleet.hosts, self.stop, patience=60)
        fault.detail = f"answering after {time.monotonic() - fault.start:.2f} s"
        self._recovered(fault)

    def _fault_runner_kill(self, fleet: rf.Fleet) -> None:
        try:
            handle = ray.get_actor(RUNNER_ACTOR, namespace=self.namespace)
        except ValueError:
            self.notes.append("runner_kill skipped: no runner yet")
            return
        old_pid = self._pid(RUNNER_ACTOR)
        fault = self.history.fault(Fault("runner_kill", RUNNER_ACTOR, time.monotonic(), hit=[]))
        ray.kill(handle, no_restart=False)
        self._await_new_process(RUNNER_ACTOR, old_pid)
        fault.end = time.monotonic()
        fault.detail = f"restarted after {fault.end - fault.start:.2f} s"
        self._recovered(fault)

    def _fault_drain(self, fleet: rf.Fleet) -> None:
        names = self._hosts_named(fleet)
        if len(names) < 2:
            self.notes.append("drain skipped: only one host")
            return
        # The busiest host: identities stay where they moved, so a random pick is often empty.
        name = max(names, key=lambda host: (len(self._owned_by(host)), self.random.random()))
        fault = self.history.fault(Fault("drain", name, time.monotonic(), hit=self._owned_by(name)))
        try:
            released = fleet.drain(name, timeout=15)
            fault.detail = f"released {released}"
            time.sleep(1.0)
        finally:
            _retry(lambda: fleet.undrain(name), self.stop, patience=30)
            fault.end = time.monotonic()
        self._recovered(fault)

    def _fault_zombie(self, fleet: rf.Fleet) -> None:
        """Move an identity's token on (respawn), then write with the old token: both writes must be refused."""
        counters = set(self.counters)
        candidates = [identity for identity in self.ownership if identity in counters]
        if not candidates:
            self.notes.append("zombie skipped: no active identity sampled yet")
            return
        identity = self.random.choice(candidates)
        before = fleet.status(identity)
        if before.lease is None:
            return
        old = before.lease.fencing_token
        fault = self.history.fault(Fault("zombie", identity, time.monotonic(), hit=[identity]))
        after = fleet.respawn(identity)
        fault.end = time.monotonic()
        new = after.lease.fencing_token if after.lease else None
        if new is None or new <= old:
            self.violations.append(f"zombie: respawn of {identity} did not raise its token ({old} -> {new})")
        ledger = fleet._ledger  # the typed ledger client: the one private hook the integration tests use too
        version = 10**9
        self.zombie_attempts += 2
        pointer = SnapshotPointer(file="snapshots/zombie/none.arrow", row=0, version=version)
        refusals = ledger.commit_checkpoints(
            [CheckpointCommit(identity=identity, fencing_token=old, version=version, pointer=pointer)]
        ).result()
        if isinstance(refusals[0], rf.StaleFencingTokenError):
            self.zombie_refused += 1
        else:
            self.violations.append(f"zombie: commit of {identity} with old token {old} (now {new}) not refused: "
                                   f"{refusals[0]!r}")
        try:
            ledger.park(identity=identity, fencing_token=old, message_id=f"zombie-{uuid.uuid4().hex}",
                        envelope=b"zombie").result()
            self.violations.append(f"zombie: park on {identity} with old token {old} (now {new}) accepted")
        except rf.StaleFencingTokenError:
            self.zombie_refused += 1
        fault.detail = f"token {old} -> {new}"
        self._recovered(fault)

    def _fault_pg_restart(self, fleet: rf.Fleet) -> None:
        if self.pg_restarted:
            return
        command = pg_support.restart_command()
        if command is None:
            self.notes.append("pg_restart skipped: no local cluster to restart (pg_ctlcluster)")
            return
        self.pg_restarted = True
        fault = self.history.fault(Fault("pg_restart", "postgresql", time.monotonic()))
        pg_support.restart_server(command)  # holds pg_support.RESTART_LOCK, as test_ledger_restart.py does
        fault.end = time.monotonic()
        _retry(fleet.hosts, self.stop, patience=60)
        self._recovered(fault)

    def _recovered(self, fault: Fault) -> None:
        fault.detail = (fault.detail + f"; recovered {time.monotonic() - fault.start:.2f} s").lstrip("; ")
        self.log(f"[nemesis] {fault.kind} {fault.target}: {fault.detail}")

    # -- the whole run ----------------------------------------------------------------

    def run(self) -> ChaosResult:
        started = time.monotonic()
        self.setup()
        try:
            threads = [threading.Thread(target=target, name=name, daemon=True) for name, target in (
                ("workload", self._workload), ("turns", self._turns), ("sagas", self._sagas), ("parker", self._parker),
                ("sampler", self._sampler), ("nemesis", self._nemesis),
            )]
            for thread in threads:
                thread.start()
            self.stop.wait(self.profile.duration)
            self.stop.set()
            for thread in threads:
                thread.join(timeout=self.profile.op_patience + 30)
                if thread.is_alive():
                    self.violations.append(f"thread {thread.name} did not stop")
                    self.notes.append(f"thread {thread.name} waits at: {self._where_stuck(thread)}")
            self.workload_seconds = time.monotonic() - started
            return self.check()
        finally:
            self.teardown()

    # -- the checker ------------------------------------------------------------------

    def check(self) -> ChaosResult:
        fleet = self.control
        never = threading.Event()
        # Parked work: resume every paused identity (retrying through whatever is still recovering).
        for identity in self.paused_ids:
            _retry(lambda identity=identity: fleet.resume(identity), never, patience=30)
        finals = asyncio.run(self._read_finals([*self.counters, *self.paused_ids]))
        for identity in [*self.counters, *self.paused_ids]:
            if identity not in finals:
                self.violations.append(f"{identity}: final State could not be read")
        self._check_turns(fleet)
        self._check_streams(fleet)
        self._check_increments(finals)
        self._check_parked(fleet, finals)
        self._check_runs(fleet)
        self._check_tokens()
        return self._result(fleet)

    async def _read_finals(self, identities: list[str], *, patience: float = 60.0) -> dict[str, dict[str, Any]]:
        """The final State of every identity, 64 reads at a time, each retried until ``patience`` passes."""
        finals: dict[str, dict[str, Any]] = {}
        limit = asyncio.Semaphore(64)

        async def read(identity: str) -> None:
            deadline = time.monotonic() + patience
            async with limit:
                while True:
                    try:
                        finals[identity] = await self.fleet.agent(identity).ask("read", timeout=10)
                        return
                    except Exception:
                        if time.monotonic() > deadline:
                            return
                        await asyncio.sleep(0.25)

        await asyncio.gather(*(read(identity) for identity in identities))
        return finals

    def _turns_in_progress(self, fleet: rf.Fleet, identity: str) -> str:
        """What holds ``identity``'s mailbox, as the ledger has it: its turns in progress, its lease and
        whether messages are parked (the detail of a final State that could not be read)."""
        try:
            ledger = fleet._ledger
            turns = ledger.turns(identity=identity, statuses=("RUNNING", "SUSPENDED")).result()
            lease = ledger.leases([identity]).result().get(identity)
            parked = len(ledger.parked(identity, limit=100).result())
        except Exception as error:  # a detail of a violation already reported
            return f"{identity}: its turns could not be read ({type(error).__name__}: {error})"[:300]
        shown = [f"{turn.turn_id[:8]} {turn.status} waiting_for={turn.waiting_for!r} wake_at={turn.wake_at} "
                 f"updated={turn.updated:.1f} steps={turn.steps}" for turn in turns]
        return (f"{identity} at {time.time():.1f}: lease {lease}; {parked} parked; turns in progress: "
                f"{'; '.join(shown) or 'none'}; on its holder: {self._hosted_entry(lease, identity)}"
                f"{self._host_log_of(identity)}")

    def _hosted_entry(self, lease: Any, identity: str) -> str:
        """What the lease holder keeps in memory for ``identity`` (read in its actor with Ray's
        ``__ray_call__``): the detail of a mailbox a suspended turn still holds."""
        if lease is None:
            return "no lease"
        name = holder_host(lease.holder)

        def read(actor: Any) -> str:
            entry = actor.runtime._entries.get(identity)
            if entry is None:
                return "not hosted"
            return (f"suspended_turn={entry.suspended_turn} recovered_turn={entry.recovered_turn} "
                    f"running_turn={entry.running_turn} dropped={entry.dropped} paused={entry.paused} "
                    f"draining_parked={entry.draining_parked} parks_behind_running={entry.parks_behind_running} "
                    f"parking={len(entry.parking)} lock_locked={entry.turn_lock.locked()} "
                    f"lock_waiters={entry.lock_waiters} token={entry.grant.fencing_token}")

        try:
            return self._in_actor(name, read, timeout=10)
        except Exception as error:  # a detail of a violation already reported
            return f"{name} could not be read ({type(error).__name__}: {error})"[:300]

    def _host_log_of(self, identity: str, lines: int = 20) -> str:
        """The hosts' last log lines naming ``identity`` (see ``_log_hosts``)."""
        if not self.host_log.exists():
            return ""
        pattern = re.compile(re.escape(identity) + r"(?![\w/-])")
        named = [line for line in self.host_log.read_text(errors="replace").splitlines() if pattern.search(line)]
        return "".join(f"\n    {line[:400]}" for line in named[-lines:])

    def _check_turns(self, fleet: rf.Fleet) -> None:
        """Durable turns: acknowledged ones completed exactly once (keyed) or at least once, each step's key
        stable across replays, both steps' effects present for every acknowledged turn; the reminder's ticks
        match its fired count (one effect per scheduled time)."""
        if not self.turn_ids:
            return
        never = threading.Event()
        timers = _retry(lambda: fleet.timers(self.turn_ids[0]), never, patience=30) or []
        fired = timers[0].fired if timers else 0
        _retry(lambda: fleet.agent(self.turn_ids[0]).call("stop_ticking"), never, patience=30)
        finals = asyncio.run(self._read_finals(self.turn_ids))
        effects = Tally(Path(self.effects_path).read_text().split()) if Path(self.effects_path).exists() else Tally()
        turns_with_effects: dict[str, set[int]] = defaultdict(set)
        for key in effects:
            identity, turn_id, position = key.rsplit(":", 2)
            turns_with_effects[f"{identity}:{turn_id}"].add(int(position))
        for turn, positions in turns_with_effects.items():
            if not positions <= {0, 2}:
                self.violations.append(f"turn {turn}: step keys at positions {sorted(positions)}, not 0 and 2")
        completed: Tally[str] = Tally()
        for identity in self.turn_ids:
            final = finals.get(identity)
            if final is None:
                self.violations.append(f"{identity}: final State could not be read")
                self.notes.append(self._turns_in_progress(fleet, identity))
                continue
            completed.update(final["completed"])
        ops: dict[int, list[Event]] = defaultdict(list)
        for event in self.history.events:
            if event.process.startswith("turns-"):
                ops[event.op].append(event)
        acknowledged = 0
        for events in ops.values():
            last = events[-1]
            keyed = int(last.key.rsplit("-", 1)[1]) % 2 == 0
            if last.type == "ok":
                acknowledged += 1
                if keyed and completed[last.key] != 1:
                    self.violations.append(f"turn {last.key}: acknowledged, completed {completed[last.key]} times")
                if not keyed and completed[last.key] < 1:
                    self.violations.append(f"turn {last.key}: acknowledged, never completed")
                for step_key in last.value:
                    if effects[step_key] < 1:
                        self.violations.append(f"turn {last.key}: acknowledged, step {step_key} has no effect")
            if keyed and completed[last.key] > 1:
                self.violations.append(f"turn {last.key}: keyed, completed {completed[last.key]} times")
        ticks = finals.get(self.turn_ids[0], {}).get("ticks", 0)
        # A settled firing had its effect first; at most the firings in flight when the count was read
        # (the one settling, the next one) came after. More would be a scheduled time with two effects.
        if not fired <= ticks <= fired + 2:
            self.violations.append(f"reminder: {ticks} ticks for {fired} settled firings")
        self.turn_stats = {"turns acknowledged": acknowledged, "turns completed": sum(completed.values()),
                           "step effects": sum(effects.values()), "step keys": len(effects),
                           "step effects re-run (same key)": sum(effects.values()) - len(effects),
                           "reminder ticks": ticks, "reminder firings settled": fired}
        with contextlib.suppress(Exception):
            self.turn_stats["suspended turns left"] = len(fleet._ledger.turns(statuses=("SUSPENDED",)).result())

    def _check_streams(self, fleet: rf.Fleet) -> None:
        """Stream readers across faults: every persisted event of the turn reached its reader once, in
        order; an event the reader got that the ledger does not keep (seen live from an owner that died
        before writing it) is behind a ``reset`` seam; at most one reset per failover of the turn (each
        owner's epoch has at most one)."""
        never = threading.Event()
        stats: Tally[str] = Tally()
        for read in self.stream_reads:
            where = f"{read.identity}: turn {read.turn_id} ({read.key})"
            if not read.events or read.events[-1].kind not in STREAM_ENDS:
                if read.acknowledged:
                    self.violations.append(f"{where}: acknowledged, but its stream did not end "
                                           f"({read.reconnects} reconnects: {read.errors[-3:]})")
                stats["streams not read to the end"] += 1
                self.notes.append(f"{where}: stream not read to the end (acknowledged: {read.acknowledged}; last "
                                  f"events {[(event.id, event.kind) for event in read.events[-3:]]}; errors "
                                  f"{read.errors[-2:]}; the reply: {read.outcome or 'none'})")
                continue
            kept = _retry(lambda read=read: [event for event in fleet.turn_events(read.identity, read.turn_id)
                                             if event.persisted], never, patience=30)
            if kept is None:
                self.violations.append(f"{where}: its stream could not be read from the ledger")
                continue
            seen = [event for event in read.events if event.persisted]
            ids = [_event_key(event.id) for event in read.events]
            if ids != sorted(set(ids)):
                self.violations.append(f"{where}: the reader got events out of order or twice: "
                                       f"{[event.id for event in read.events]}")
            got = {event.id for event in seen}
            missing = [event.id for event in kept if event.id not in got]
            if missing:
                self.violations.append(
                    f"{where}: persisted events {missing} never reached the reader (the ledger kept "
                    f"{[(event.id, event.kind) for event in kept]}; the reader got "
                    f"{[(event.id, event.kind, event.persisted) for event in read.events]}; {read.dropped} drops, "
                    f"{read.reconnects} reconnects: {read.errors[-3:]})")
            kept_ids = {event.id for event in kept}
            for position, event in enumerate(read.events):
                if event.persisted and event.id not in kept_ids and not any(
                        later.kind == "reset" for later in read.events[position + 1:]):
                    self.violations.append(f"{where}: the reader got {event.id} ({event.kind}), which the ledger "
                                           "does not keep, with no reset after it")
            # A failover gives the turn a new owner, whose epoch (fencing token) starts its part of the stream
            # with one reset. A retried attempt (a ledger fault failed a journal write) voids what its failed
            # attempt streamed with a reset of its own, marked with the attempt: not a failover's.
            resets = Tally(_event_key(event.id)[0] for event in kept if event.kind == "reset"
                           and not (isinstance(event.data, dict) and "retry" in event.data))
            if any(count > 1 for count in resets.values()):
                self.violations.append(f"{where}: more than one reset from one owner: {dict(resets)}")
            resets_total = sum(resets.values())
            parts = [event.data["index"] for event in kept if event.kind == "part"]
            if read.acknowledged and (not parts or parts[-1] != self.profile.stream_parts - 1):
                self.violations.append(f"{where}: acknowledged, but its last part is not in its stream: {parts}")
            if read.acknowledged and (not kept or kept[-1].kind != "completed"):
                self.violations.append(f"{where}: acknowledged, but the ledger keeps no end event for it: "
                                       f"{[(event.id, event.kind) for event in kept[-3:]]}")
            stats["streams read to the end"] += 1
            stats["stream reconnects after an error"] += read.reconnects
            stats["stream reconnects after a drop"] += read.dropped
            stats["stream resets"] += resets_total
            stats["stream resets by the reader"] += sum(1 for event in read.events
                                                        if event.kind == "reset" and not event.persisted)
            stats["stream events kept"] += len(kept)
            stats["stream events seen live only"] += sum(1 for event in seen if event.id not in kept_ids)
        stats["streamed turns acknowledged"] = sum(1 for read in self.stream_reads if read.acknowledged)
        self.stream_stats = dict(stats)

    def _check_increments(self, finals: dict[str, dict[str, Any]]) -> None:
        ops: dict[int, list[Event]] = defaultdict(list)
        for event in self.history.events:
            ops[event.op].append(event)
        outcome: dict[str, tuple[str, Any, str]] = {}  # key -> (final type, value, identity)
        for events in ops.values():
            last = events[-1]
            if last.process == "parker":
                continue
            outcome[last.key] = (last.type, last.value, last.identity)
        invoked = {key: identity for key, (_, _, identity) in outcome.items()}
        for identity in self.counters:
            final = finals.get(identity)
            if final is None:
                continue
            applied: list[str] = final["applied"]
            counts = Tally(applied)
            position = {key: index + 1 for index, key in enumerate(applied)}
            for key, count in counts.items():
                if count > 1:
                    self.violations.append(f"{identity}: {key} applied {count} times")
                if invoked.get(key) != identity:
                    self.violations.append(f"{identity}: {key} applied but never sent to it")
            if final["total"] != len(applied):
                self.violations.append(f"{identity}: total {final['total']} != {len(applied)} applied keys")
            replies: list[int] = []
            for key, (kind, value, target) in outcome.items():
                if target != identity:
                    continue
                if kind == "ok":
                    replies.append(value)
                    if counts[key] != 1:
                        self.violations.append(f"{identity}: acknowledged {key} applied {counts[key]} times")
                    elif value != position[key]:
                        self.violations.append(f"{identity}: {key} answered {value} but was applied as #{position[key]}")
                elif kind == "fail" and counts[key]:
                    self.violations.append(f"{identity}: failed {key} was applied")
            if len(set(replies)) != len(replies):
                self.violations.append(f"{identity}: two acknowledged increments got the same reply "
                                       f"{[v for v, c in Tally(replies).items() if c > 1][:5]}")
            if replies and not set(replies) <= set(range(1, final["total"] + 1)):
                self.violations.append(f"{identity}: replies outside 1..{final['total']}")

    def _check_parked(self, fleet: rf.Fleet, finals: dict[str, dict[str, Any]]) -> None:
        self.parked_stats = Tally()
        for identity in self.paused_ids:
            final = finals.get(identity)
            if final is None:
                continue
            counts = Tally(final["applied"])
            try:
                still = Tally(message.envelope.idempotency_key for message in fleet.parked(identity))
            except Exception as error:
                self.violations.append(f"{identity}: parked list unreadable: {error!r}")
                continue
            for key in self.parked_sent[identity]:
                handled, listed = counts[key], still[key]
                if handled > 1 or (handled and listed) or listed > 1:
                    self.violations.append(f"{identity}: parked {key} handled {handled}x, still listed {listed}x")
                elif key in self.parked_seen and handled + listed == 0:
                    self.violations.append(f"{identity}: parked {key} neither handled nor listed (lost)")
                self.parked_stats["handled" if handled else "listed" if listed else "never parked"] += 1
            if final["total"] != len(final["applied"]):
                self.violations.append(f"{identity}: total {final['total']} != {len(final['applied'])} applied")

    def _check_runs(self, fleet: rf.Fleet) -> None:
        self.run_stats = Tally()
        reports: dict[str, dict[str, Any]] = {}
        # Every run is waited for before any agent's State is read: a report taken when an
        # earlier run finished could predate a later run's steps on the same agents.
        outcomes: dict[str, Any] = {}
        for run_id, plan in self.runs.items():
            if plan["submitted"] is None:
                self.run_stats["not submitted"] += 1
                continue
            outcome = None
            for attempt in range(3):
                try:
                    outcome = fleet.runs.wait(run_id, timeout=30)
                    break
                except Exception as error:  # e.g. a timeout: nudge the runner, wait again
                    plan["wait_error"] = f"{type(error).__name__}: {error}"[:200]
                    if attempt == 1:
                        with contextlib.suppress(Exception):
                            fleet.runs.resume(run_id)
            if outcome is None:
                self.violations.append(f"run {run_id} did not finish: {plan.get('wait_error')}")
                continue
            outcomes[run_id] = outcome
        for run_id, outcome in outcomes.items():
            plan = self.runs[run_id]
            status = outcome.status
            with contextlib.suppress(Exception):
                plan["finished_wall"] = fleet.runs.get(run_id).updated_at
            self.run_stats[f"{'fail' if plan['fail'] else 'ok'}->{status.value}"] += 1
            for agent in (plan["hotel"], plan["bank"]):
                if agent not in reports:
                    reports[agent] = fleet.agent(agent).call("report", timeout=30)
            hotel, bank = reports[plan["hotel"]], reports[plan["bank"]]
            reserved = hotel["reserved"].get(run_id, 0)
            charged = bank["charged"].get(run_id, 0)
            if status is rf.RunStatus.COMPLETED:
                if plan["fail"]:
                    self.violations.append(f"run {run_id} should have failed but COMPLETED")
                if (reserved, charged) != (1, 1):
                    self.violations.append(f"run {run_id} COMPLETED with reserved={reserved} charged={charged}")
            elif status in (rf.RunStatus.COMPENSATED, rf.RunStatus.FAILED):
                journal = fleet._ledger.journal(run_id).result()
                journaled = {entry.label for entry in journal.steps}
                if "reserve" in journaled and "reserve" not in journal.compensated and status is rf.RunStatus.COMPENSATED:
                    self.violations.append(f"run {run_id} COMPENSATED but reserve's compensation is not journaled")
                if status is rf.RunStatus.COMPENSATED and reserved:
                    self.violations.append(f"run {run_id} COMPENSATED but the reservation is still held")
                if charged:
                    self.violations.append(f"run {run_id} {status.value} but charged {charged}x")
                if not plan["fail"]:
                    self.notes.append(f"run {run_id} failed without a planned failure: {outcome.error!r}"[:200])
            else:
                self.violations.append(f"run {run_id} ended {status.value}")
            if hotel["cancelled"].get(run_id, 0) > 1:
                self.notes.append(f"run {run_id}: cancel ran {hotel['cancelled'][run_id]}x (compensations tolerate it)")

    def _check_tokens(self) -> None:
        for identity, samples in self.tokens.items():
            for (_, token_a, host_a), (_, token_b, host_b) in itertools.pairwise(samples):
                if token_b < token_a:
                    self.violations.append(f"{identity}: fencing token went back {token_a} -> {token_b}")
                elif token_b == token_a and host_b != host_a:
                    self.violations.append(f"{identity}: token {token_a} held by {host_a} and then {host_b}")

    def _unavailability(self) -> dict[str, float]:
        """Per fault kind: the longest an operation on an identity hit by it waited to be served.

        For each operation whose span (first invoke to ok) overlaps the fault, the time
        from ``max(first invoke, fault start)`` to its ok; operations on identities the
        fault did not hit are not counted.
        """
        spans: dict[str, list[tuple[float, float, str, int]]] = defaultdict(list)
        first: dict[int, float] = {}
        for event in self.history.events:
            if event.process == "parker":
                continue
            if event.type == "invoke":
                first.setdefault(event.op, event.time)
            elif event.type == "ok":
                spans[event.identity].append((first[event.op], event.time, event.process, event.op))
        worst: dict[str, float] = {}
        for fault in self.history.faults:
            end = fault.end or fault.start
            hit = spans.keys() if fault.hit is None else fault.hit
            longest = 0.0
            for identity in hit:
                for begin, done, process, op in spans.get(identity, ()):
                    if begin <= end + 1.0 and done >= fault.start and done - max(begin, fault.start) > longest:
                        longest = done - max(begin, fault.start)
                        fault.longest_op = op
                        fault.longest = (f"{longest:.2f} s: {process} on {identity}, invoked "
                                         f"{begin - fault.start:+.2f} s from the fault's start")
            if fault.kind == "runner_kill":
                # Runs in flight when the runner died: how long after the kill they ended.
                for plan in self.runs.values():
                    begin, done = plan.get("submitted_wall"), plan.get("finished_wall")
                    if begin is not None and done is not None and begin <= fault.wall + (end - fault.start) + 1.0 \
                            and done >= fault.wall:
                        longest = max(longest, done - max(begin, fault.wall))
            worst[fault.kind] = max(worst.get(fault.kind, 0.0), longest)
        return worst

    def _result(self, fleet: rf.Fleet) -> ChaosResult:
        clients = [event for event in self.history.events if event.process.startswith("client-")]
        types = Tally(event.type for event in clients)
        ops: dict[int, str] = {event.op: event.type for event in clients if event.type != "invoke"}
        finals = Tally(ops.values())
        failover = Tally(event.type for event in self.history.events if event.process == "failover")
        operations = {
            "increments acknowledged": finals["ok"],
            "increments unknown (gave up)": finals["info"],
            "increments failed": finals["fail"],
            "attempts (invoke events)": types["invoke"],
            "attempts retried (info events)": types["info"],
            "failover increments ok / unknown": f"{failover['ok']} / {failover['info']}",
            "saga runs submitted": sum(1 for plan in self.runs.values() if plan["submitted"] is not None),
            "parked messages sent": sum(len(keys) for keys in self.parked_sent.values()),
            "zombie writes attempted": self.zombie_attempts,
            "zombie writes refused": self.zombie_refused,
        }
        kinds = Tally(str(event.value).split(":")[0] for event in clients if event.type == "info")
        operations["errors seen by clients"] = ", ".join(f"{name} {count}" for name, count in kinds.most_common())
        operations.update(self.turn_stats)
        operations.update(self.stream_stats)
        operations.update({f"runs {name}": count for name, count in sorted(self.run_stats.items())})
        operations.update({f"parked {name}": count for name, count in sorted(self.parked_stats.items())})
        faults = Tally(fault.kind for fault in self.history.faults)
        recovery: dict[str, float] = {}
        for fault in self.history.faults:
            if "recovered " in fault.detail:
                seconds = float(fault.detail.rsplit("recovered ", 1)[1].split()[0])
                recovery[fault.kind] = max(recovery.get(fault.kind, 0.0), seconds)
        stats: dict[str, Any] = {}
        with contextlib.suppress(Exception):
            host_stats = fleet.host_statistics()
            stats = {"stale_refusals": sum(s.stale_refusals for s in host_stats),
                     "leases_lost": sum(s.leases_lost for s in host_stats),
                     "duplicates": sum(s.duplicates for s in host_stats)}
        stats["seconds"] = round(getattr(self, "workload_seconds", 0.0), 1)
        return ChaosResult(
            profile=self.profile.name, ledger=self.ledger_kind, operations=operations, faults=dict(faults),
            violations=self.violations, unavailability=self._unavailability(), recovery=recovery,
            notes=self.notes, stats=stats,
        )

    def write_json(self, result: ChaosResult, path: Path) -> None:
        document = result.to_json()
        document["fault_log"] = [asdict(fault) | {"hit": None if fault.hit is None else len(fault.hit)}
                                 for fault in self.history.faults]
        # The evidence behind each violation: every event and token sample of the identities named.
        named = {violation.split(":", 1)[0] for violation in result.violations}
        document["evidence"] = {
            identity: {"events": [asdict(event) for event in self.history.events if event.identity == identity],
                       "tokens": self.tokens.get(identity, [])}
            for identity in sorted(named) if identity.startswith("chaos/")
        }
        # And the events of each fault's longest wait, with times from the fault's start.
        document["longest_waits"] = [
            {"fault": f"{fault.kind} {fault.target}", "longest": fault.longest,
             "events": [asdict(event) | {"time": round(event.time - fault.start, 3)}
                        for event in self.history.events if event.op == fault.longest_op]}
            for fault in self.history.faults if fault.longest_op is not None
        ]
        path.write_text(json.dumps(document, indent=2, default=str))


@dataclass
class StreamRead:
    """What one reader got of one turn's stream, across its reconnections."""

    identity: str
    turn_id: str
    key: str
    events: list[rf.TurnEvent] = field(default_factory=list)
    reconnects: int = 0
    """Reconnections after an error."""
    dropped: int = 0
    """Reconnections after the reader itself dropped the connection."""
    errors: list[str] = field(default_factory=list)
    acknowledged: bool = False
    outcome: str = ""
    """Why the turn's reply never came (its error, described), if it did not."""


STREAM_ENDS = {"completed", "failed", "interrupted"}


def _event_key(event_id: str) -> tuple[int, ...]:
    """An event id (``12.3``, or ``12.3.4`` for a delta) as the tuple that orders the stream."""
    return tuple(int(part) for part in event_id.split("."))


def _describe(error: BaseException) -> str:
    """``Type: message`` of an error, short enough for the history."""
    text = str(error).split(". ")[0]
    return f"{type(error).__name__}: {text}"[:160]


def _retry(operation: Any, stop: threading.Event, *, patience: float) -> Any:
    """Call ``operation`` until it succeeds or ``patience`` seconds pass; its value, or ``None``."""
    deadline = time.monotonic() + patience
    while True:
        try:
            return operation()
        except Exception:  # whatever is recovering; try again
            if time.monotonic() > deadline:
                return None
            time.sleep(0.25)

