"""rayfleet's metrics on Ray's metrics pipeline (``ray.util.metrics``), scraped from Ray's Prometheus endpoint.

Hosts, the ledger actor and the workflow engine report through small typed ports
(:class:`~rayfleet.host._ports.HostMetrics`, :class:`~rayfleet.workflow._engine.RunMetrics`);
the classes here implement them with Ray's ``Counter``, ``Gauge`` and ``Histogram``.
Every metric is named ``rayfleet_*`` and listed once in :data:`METRICS` (the README's
table and the Grafana dashboard are checked against it). Ray's exporter prefixes
``ray_`` and counters get ``_total``: ``rayfleet_messages`` is scraped as
``ray_rayfleet_messages_total``.

Why hosts tally first: a message must not pay for Ray's metric calls inside its turn
(each ``Counter.inc`` or ``Histogram.observe`` costs tens of times the port's ``message``,
a dict update, and would show in benchmark B1's call latency). :class:`RayHostMetrics`
counts in plain dicts keyed by tuples, and the host actor exports once a second
(:data:`HOST_EXPORT_INTERVAL`):
one ``inc`` per series, each with a tag dict built once, and at most
:data:`LATENCY_SAMPLES_PER_EXPORT` latency observations per agent class. Ray itself
reports to the node's metrics agent every ``metrics_report_interval_ms`` (10 s by
default), so the export adds at most a second to what a scrape sees.
"""

from __future__ import annotations

import logging
import random
import threading
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ray.util.metrics import Counter, Gauge, Histogram

from ..host._ports import MessageOutcome

if TYPE_CHECKING:
    from ..workflow._definition import RunStatus
    from ..workflow._engine import StepOutcome

log = logging.getLogger("rayfleet.metrics")

HOST_EXPORT_INTERVAL = 1.0
"""Seconds between a host's exports of its tallies to Ray's metrics."""
LATENCY_SAMPLES_PER_EXPORT = 1000
"""Turn latencies one host hands to the histogram per agent class per export, at most.

Ray's ``Histogram.observe`` runs on the host's event loop and costs far more than a
turn's tally; beyond this many turns per second and class the histogram gets a uniform sample
(its ``_count`` then falls short of ``rayfleet_messages``, which stays exact)."""

LATENCY_BUCKETS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0]
"""Bucket boundaries (seconds) of the turn and ledger-operation latency histograms."""
BATCH_BUCKETS = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 4096.0]
"""Bucket boundaries (pointers per ledger call) of the commit batch size histogram."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MetricInfo:
    """One metric rayfleet defines: its name (before Ray's ``ray_`` prefix), kind, tags and meaning."""

    name: str
    kind: str
    """``counter``, ``gauge`` or ``histogram``."""
    tags: tuple[str, ...]
    description: str
    source: str
    """Who reports it: ``host``, ``ledger``, or ``engine`` (the runner actor; the driver for ``fleet.run``)."""

    @property
    def exported_names(self) -> tuple[str, ...]:
        """The series names a Prometheus scrape of Ray's endpoint shows for this metric."""
        base = f"ray_{self.name}"
        if self.kind == "counter":
            return (f"{base}_total",)
        if self.kind == "histogram":
            return (f"{base}_bucket", f"{base}_count", f"{base}_sum")
        return (base,)


METRICS: tuple[MetricInfo, ...] = (
    MetricInfo(name="rayfleet_messages", kind="counter", tags=("agent_class", "host", "outcome"), source="host",
               description="Messages delivered to agents, by how they ended (OK, DUPLICATE, HANDLER_ERROR, REFUSED, "
               "LEASE_LOST, REDIRECTED, ERROR)."),
    MetricInfo(name="rayfleet_turn_seconds", kind="histogram", tags=("agent_class", "host"), source="host",
               description="Seconds from a message reaching its host to its reply (gates, handler, commit)."),
    MetricInfo(name="rayfleet_active_agents", kind="gauge", tags=("agent_class", "host"), source="host",
               description="Agents hosted now."),
    MetricInfo(name="rayfleet_leases_held", kind="gauge", tags=("host",), source="host",
               description="Identity leases a host holds now."),
    MetricInfo(name="rayfleet_lease_renewals", kind="counter", tags=("host",), source="host",
               description="Leases renewed (batched renewals count each lease)."),
    MetricInfo(name="rayfleet_leases_lost", kind="counter", tags=("host",), source="host",
               description="Agents dropped because their lease was lost or expired."),
    MetricInfo(name="rayfleet_stale_fence_refusals", kind="counter", tags=("host", "reason"), source="host",
               description="Fenced writes of a host the ledger refused (reason: the refusal's error class)."),
    MetricInfo(name="rayfleet_checkpoints", kind="counter", tags=("agent_class", "host"), source="host",
               description="Checkpoints committed."),
    MetricInfo(name="rayfleet_commit_batch_size", kind="histogram", tags=("host",), source="host",
               description="Snapshot pointers moved per group-commit ledger call."),
    MetricInfo(name="rayfleet_dead_letters", kind="counter", tags=("agent_class", "host", "reason"), source="host",
               description="Messages sent to the dead-letter log (reason: a DeadLetterReason)."),
    MetricInfo(name="rayfleet_parked_messages", kind="counter", tags=("agent_class", "host"), source="host",
               description="Messages parked because their agent was paused."),
    MetricInfo(name="rayfleet_turn_events", kind="counter", tags=("agent_class", "host", "event"), source="host",
               description="Durable turns: steps run, turns suspended, resumed, completed, failed and interrupted, and "
               "turn stream events emitted (event: step, suspended, resumed, completed, failed, interrupted, "
               "emitted, delta)."),
    MetricInfo(name="rayfleet_ledger_operations", kind="counter", tags=("operation", "outcome"), source="ledger",
               description="Operations the SQLite ledger actor served (outcome: OK or the refusal's error class)."),
    MetricInfo(name="rayfleet_ledger_operation_seconds", kind="histogram", tags=("operation",), source="ledger",
               description="Seconds the SQLite ledger actor spent in one operation (its transaction and fsync)."),
    MetricInfo(name="rayfleet_workflow_steps", kind="counter", tags=("workflow", "outcome"), source="engine",
               description="Workflow steps by outcome (COMPLETED, REPLAYED, FAILED, COMPENSATED, "
               "COMPENSATION_FAILED)."),
    MetricInfo(name="rayfleet_workflow_runs_started", kind="counter", tags=("workflow",), source="engine",
               description="Runs an engine started or resumed."),
    MetricInfo(name="rayfleet_workflow_runs", kind="counter", tags=("workflow", "status"), source="engine",
               description="Runs ended, by final status (COMPLETED, COMPENSATED, FAILED, CANCELLED)."),
)
"""Every metric rayfleet reports; nothing else is ever registered."""

_BY_NAME = {info.name: info for info in METRICS}


class _Instruments:
    """The Ray metric objects of this process, made once (Ray registers each name once per process)."""

    _lock = threading.Lock()
    _made: _Instruments | None = None

    def __init__(self) -> None:
        self.counters: dict[str, Counter] = {}
        self.gauges: dict[str, Gauge] = {}
        self.histograms: dict[str, Histogram] = {}
        for info in METRICS:
            if info.kind == "counter":
                self.counters[info.name] = Counter(info.name, description=info.description, tag_keys=info.tags)
            elif info.kind == "gauge":
                self.gauges[info.name] = Gauge(info.name, description=info.description, tag_keys=info.tags)
            else:
                buckets = BATCH_BUCKETS if info.name == "rayfleet_commit_batch_size" else LATENCY_BUCKETS
                self.histograms[info.name] = Histogram(info.name, description=info.description,
                                                       boundaries=buckets, tag_keys=info.tags)

    @classmethod
    def get(cls) -> _Instruments:
        with cls._lock:
            if cls._made is None:
                cls._made = cls()
            return cls._made


def _tags(name: str, *values: str) -> dict[str, str]:
    return dict(zip(_BY_NAME[name].tags, values, strict=True))


class RayHostMetrics:
    """A host's :class:`~rayfleet.host._ports.HostMetrics`: tallies in memory, :meth:`export` sends them to Ray.

    Not thread-safe: every call comes from the host's event loop.
    """

    def __init__(self, host: str) -> None:
        self.host = host
        self._messages: defaultdict[tuple[str, MessageOutcome], int] = defaultdict(int)
        self._latencies: defaultdict[str, list[float]] = defaultdict(list)
        self._dead_letters: defaultdict[tuple[str, str], int] = defaultdict(int)
        self._parked: defaultdict[str, int] = defaultdict(int)
        self._checkpoints: defaultdict[str, int] = defaultdict(int)
        self._stale: defaultdict[str, int] = defaultdict(int)
        self._batches: list[int] = []
        self._turn_events: defaultdict[tuple[str, str], int] = defaultdict(int)
        self._renewals = 0
        self._leases_lost = 0
        self._active: defaultdict[str, int] = defaultdict(int)
        # Tag dicts are built once per series and reused for every export.
        self._tag_cache: dict[tuple[str, ...], dict[str, str]] = {}

    # -- the port: called per event, on the host's loop; plain counting only

    def message(self, agent_class: str, outcome: MessageOutcome, seconds: float) -> None:
        self._messages[agent_class, outcome] += 1
        self._latencies[agent_class].append(seconds)

    def dead_letter(self, agent_class: str, reason: str) -> None:
        self._dead_letters[agent_class, reason] += 1

    def parked(self, agent_class: str) -> None:
        self._parked[agent_class] += 1

    def activated(self, agent_class: str) -> None:
        self._active[agent_class] += 1

    def deactivated(self, agent_class: str) -> None:
        self._active[agent_class] -= 1

    def lease_renewals(self, count: int) -> None:
        self._renewals += count

    def lease_lost(self) -> None:
        self._leases_lost += 1

    def stale_refusal(self, reason: str) -> None:
        self._stale[reason] += 1

    def checkpoint(self, agent_class: str) -> None:
        self._checkpoints[agent_class] += 1

    def commit_batch(self, size: int) -> None:
        self._batches.append(size)

    def turn_event(self, agent_class: str, event: str, count: int = 1) -> None:
        self._turn_events[agent_class, event] += count

    # -- export ---------------------------------------------------------------------

    def _series(self, name: str, *values: str) -> dict[str, str]:
        key = (name, *values)
        tags = self._tag_cache.get(key)
        if tags is None:
            tags = self._tag_cache[key] = _tags(name, *values)
        return tags

    def export(self) -> None:
        """Hand everything tallied since the last export to Ray, and set the gauges."""
        instruments = _Instruments.get()
        counters, histograms, gauges = instruments.counters, instruments.histograms, instruments.gauges
        host = self.host
        messages, self._messages = self._messages, defaultdict(int)
        for (agent_class, outcome), count in messages.items():
            counters["rayfleet_messages"].inc(count, self._series("rayfleet_messages", agent_class, host,
                                                                    outcome.value))
        latencies, self._latencies = self._latencies, defaultdict(list)
        turn = histograms["rayfleet_turn_seconds"]
        for agent_class, values in latencies.items():
            tags = self._series("rayfleet_turn_seconds", agent_class, host)
            if len(values) > LATENCY_SAMPLES_PER_EXPORT:
                values = random.sample(values, LATENCY_SAMPLES_PER_EXPORT)
            for value in values:
                turn.observe(value, tags)
        dead, self._dead_letters = self._dead_letters, defaultdict(int)
        for (agent_class, reason), count in dead.items():
            counters["rayfleet_dead_letters"].inc(count, self._series("rayfleet_dead_letters", agent_class, host,
                                                                        reason))
        parked, self._parked = self._parked, defaultdict(int)
        for agent_class, count in parked.items():
            counters["rayfleet_parked_messages"].inc(count, self._series("rayfleet_parked_messages", agent_class,
                                                                           host))
        checkpoints, self._checkpoints = self._checkpoints, defaultdict(int)
        for agent_class, count in checkpoints.items():
            counters["rayfleet_checkpoints"].inc(count, self._series("rayfleet_checkpoints", agent_class, host))
        stale, self._stale = self._stale, defaultdict(int)
        for reason, count in stale.items():
            counters["rayfleet_stale_fence_refusals"].inc(count, self._series("rayfleet_stale_fence_refusals",
                                                                                host, reason))
        turn_events, self._turn_events = self._turn_events, defaultdict(int)
        for (agent_class, event), count in turn_events.items():
            counters["rayfleet_turn_events"].inc(count, self._series("rayfleet_turn_events", agent_class, host, event))
        batches, self._batches = self._batches, []
        sizes = histograms["rayfleet_commit_batch_size"]
        for size in batches:
            sizes.observe(size, self._series("rayfleet_commit_batch_size", host))
        if self._renewals:
            counters["rayfleet_lease_renewals"].inc(self._renewals, self._series("rayfleet_lease_renewals", host))
            self._renewals = 0
        if self._leases_lost:
            counters["rayfleet_leases_lost"].inc(self._leases_lost, self._series("rayfleet_leases_lost", host))
            self._leases_lost = 0
        # Gauges are set on every export: Ray forgets a gauge series not reported for two intervals.
        for agent_class, count in self._active.items():
            gauges["rayfleet_active_agents"].set(count, self._series("rayfleet_active_agents", agent_class, host))
        gauges["rayfleet_leases_held"].set(sum(self._active.values()), self._series("rayfleet_leases_held", host))


class RayRunMetrics:
    """The workflow engine's :class:`~rayfleet.workflow._engine.RunMetrics` on Ray: recorded at once (runs are rare)."""

    def __init__(self) -> None:
        self._tag_cache: dict[tuple[str, ...], dict[str, str]] = {}

    def _series(self, name: str, *values: str) -> dict[str, str]:
        key = (name, *values)
        tags = self._tag_cache.get(key)
        if tags is None:
            tags = self._tag_cache[key] = _tags(name, *values)
        return tags

    def run_started(self, workflow: str) -> None:
        _Instruments.get().counters["rayfleet_workflow_runs_started"].inc(
            1, self._series("rayfleet_workflow_runs_started", workflow))

    def run_ended(self, workflow: str, status: RunStatus) -> None:
        _Instruments.get().counters["rayfleet_workflow_runs"].inc(
            1, self._series("rayfleet_workflow_runs", workflow, status.value))

    def step(self, workflow: str, outcome: StepOutcome) -> None:
        _Instruments.get().counters["rayfleet_workflow_steps"].inc(
            1, self._series("rayfleet_workflow_steps", workflow, outcome.value))


class RayLedgerMetrics:
    """What the SQLite ledger actor reports per operation: its outcome and how long it took.

    The actor serves one operation at a time, so an operation only tallies (under a
    lock) and a daemon thread, started with the first operation, exports once per
    :data:`HOST_EXPORT_INTERVAL`: Ray's metric calls would otherwise add tens of
    microseconds to every operation of the fleet's one ledger.
    """

    def __init__(self) -> None:
        self._tag_cache: dict[tuple[str, ...], dict[str, str]] = {}
        self._lock = threading.Lock()
        self._counts: defaultdict[tuple[str, str], int] = defaultdict(int)
        self._latencies: defaultdict[str, list[float]] = defaultdict(list)
        self._exporter: threading.Thread | None = None

    def _series(self, name: str, *values: str) -> dict[str, str]:
        key = (name, *values)
        tags = self._tag_cache.get(key)
        if tags is None:
            tags = self._tag_cache[key] = _tags(name, *values)
        return tags

    def operation(self, operation: str, outcome: str, seconds: float) -> None:
        with self._lock:
            self._counts[operation, outcome] += 1
            self._latencies[operation].append(seconds)
            if self._exporter is None:
                self._exporter = threading.Thread(target=self._export_forever, name="rayfleet-ledger-metrics",
                                                  daemon=True)
                self._exporter.start()

    def _export_forever(self) -> None:
        stop = threading.Event()
        while not stop.wait(HOST_EXPORT_INTERVAL):
            try:
                self.export()
            except Exception as error:  # noqa: BLE001 - metrics must never take the ledger down; next round
                log.warning("the ledger could not export metrics: %s", error)

    def export(self) -> None:
        """Hand the tallies since the last export to Ray."""
        with self._lock:
            counts, self._counts = self._counts, defaultdict(int)
            latencies, self._latencies = self._latencies, defaultdict(list)
        instruments = _Instruments.get()
        for (operation, outcome), count in counts.items():
            instruments.counters["rayfleet_ledger_operations"].inc(
                count, self._series("rayfleet_ledger_operations", operation, outcome))
        histogram = instruments.histograms["rayfleet_ledger_operation_seconds"]
        for operation, values in latencies.items():
            if len(values) > LATENCY_SAMPLES_PER_EXPORT:
                values = random.sample(values, LATENCY_SAMPLES_PER_EXPORT)
            tags = self._series("rayfleet_ledger_operation_seconds", operation)
            for value in values:
                histogram.observe(value, tags)
