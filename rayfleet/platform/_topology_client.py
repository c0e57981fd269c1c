"""``fleet.topology`` and ``fleet.apply``: managed peer wiring and declarative rosters over Ray.

The arithmetic (what to wire, adopt, unwire) is pure and lives in
``rayfleet.topology``; this module reads the ledger, applies a plan in one ledger
transaction, and tells the hosts to reload their agents' peers.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import cloudpickle
import ray

from ..identity._names import validate_identity
from ..identity._spec import AgentSpec
from ..identity._values import PERSISTED_LIVE, LifecycleState
from ..retry import RetryPolicy
from ..roster._roster import RosterChange, load_roster, plan_roster, validate_roster
from ..topology import Edge, ReconcileReport, export_topology, plan_reconcile

if TYPE_CHECKING:
    from ._fleet import Fleet

HOST_NOTIFY_CONCURRENCY = 64
NOTIFY_RETRY = RetryPolicy(max_attempts=4, base_delay=0.05, max_delay=2.0, jitter=0.0)
"""Rounds of telling hosts to reload peers: fast first retries for transient hiccups, bounded so a
reconcile never stalls long on one bad host. No jitter: reconciles never overlap, so nothing to spread."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ApplyReport:
    """What ``fleet.apply`` did (or, with ``dry_run``, would do)."""

    created: tuple[str, ...]
    updated: dict[str, list[str]]
    """Identity to the names of the spec fields that changed."""
    unchanged: tuple[str, ...]
    retired: tuple[str, ...]
    topology: ReconcileReport | None
    dry_run: bool

    @property
    def changed(self) -> bool:
        return bool(self.created or self.updated or self.retired or (self.topology and self.topology.changed))


class TopologyClient:
    """Desired and managed peer edges of one fleet (``fleet.topology``)."""

    def __init__(self, fleet: Fleet) -> None:
        self._fleet = fleet

    def wire(self, a: str, b: str) -> ReconcileReport:
        """Declare an edge between two identities and reconcile; both must exist."""
        edge = Edge.of(validate_identity(a), validate_identity(b))
        self._fleet._ledger.call("set_desired_edge", a=edge.a, b=edge.b, desired=True)
        return self.reconcile()

    def unwire(self, a: str, b: str) -> ReconcileReport:
        """Withdraw an explicit edge and reconcile (edges from specs' ``peers`` stay)."""
        edge = Edge.of(validate_identity(a), validate_identity(b))
        self._fleet._ledger.call("set_desired_edge", a=edge.a, b=edge.b, desired=False)
        return self.reconcile()

    def edges(self) -> list[tuple[Edge, bool]]:
        """Live edges with whether the platform manages them, sorted."""
        live = self._fleet._ledger.call("topology")["live"]
        return [(Edge(a=a, b=b), managed) for a, b, managed in live]

    def reconcile(self) -> ReconcileReport:
        """Make the live edges match the desired ones; returns what changed.

        Adopts desired edges already live, wires missing ones in one batch, unwires
        only edges it manages (never ones it found), and then tells every host to
        reload its agents' peers, retrying a host that fails with backoff.
        """
        view = self._fleet._ledger.call("topology")
        lifecycles: dict[str, str] = view["identities"]
        desired = {Edge(a=a, b=b) for a, b in view["explicit"]}
        for identity, peers in view["declared"].items():
            desired.update(Edge.of(identity, peer) for peer in peers if peer != identity)
        live = {Edge(a=a, b=b) for a, b, _ in view["live"]}
        managed = {Edge(a=a, b=b) for a, b, is_managed in view["live"] if is_managed}
        eligible = frozenset(identity for identity, lifecycle in lifecycles.items() if lifecycle == PERSISTED_LIVE)
        plan = plan_reconcile(desired=frozenset(desired), live=frozenset(live), managed=frozenset(managed),
                              eligible=eligible)
        failures: list[str] = []
        if not plan.is_empty:
            self._fleet._ledger.call(
                "apply_topology",
                wire=[(e.a, e.b) for e in plan.wire], adopt=[(e.a, e.b) for e in plan.adopt],
                unwire=[(e.a, e.b) for e in plan.unwire], forget=[(e.a, e.b) for e in plan.forget],
            )
            failures = self._notify_hosts()
        return ReconcileReport.from_plan(plan, failures=failures)

    def _notify_hosts(self) -> list[str]:
        courier = self._fleet._courier
        courier.refresh_sync()
        pending = [name for name in courier.directory.names if name not in courier.directory.dead]
        failures: dict[str, str] = {}
        for delay in [0.0, *NOTIFY_RETRY.delays()]:
            if not pending:
                break
            time.sleep(delay)
            failed = []
            for start in range(0, len(pending), HOST_NOTIFY_CONCURRENCY):
                chunk = pending[start:start + HOST_NOTIFY_CONCURRENCY]
                refs = [courier.directory.handle(name).refresh_peers.remote() for name in chunk]
                for name, ref in zip(chunk, refs, strict=True):
                    try:
                        ray.get(ref, timeout=30)
                        failures.pop(name, None)
                    except Exception as error:  # a host that cannot be told reloads peers on its next activation
                        failures[name] = f"host {name} did not reload peers: {type(error).__name__}: {error}"
                        failed.append(name)
            pending = failed
        return sorted(failures.values())

    def export(self, fmt: str = "dot") -> str:
        """The topology as ``dot``, ``mermaid`` or ``json`` text, with each identity's state."""
        nodes = {status.identity: status.state.value for status in self._fleet.list()}
        edges = self.edges()
        return export_topology(nodes, [edge for edge, _ in edges],
                               managed=[edge for edge, managed in edges if managed], fmt=fmt)


def apply_roster(
    fleet: Fleet, roster: str | os.PathLike[str] | list[AgentSpec] | list[dict[str, Any]], *, dry_run: bool = False,
    prune: bool = False,
) -> ApplyReport:
    """Make the fleet's identities match a roster, like ``kubectl apply``.

    The whole roster is validated before anything is written (duplicate identities,
    unknown agent classes, self edges, peers that exist nowhere); creates and updates
    are one ledger transaction, so a bad roster changes nothing.
    """
    specs = load_roster(roster)
    current = _current_specs(fleet)
    validate_roster(specs, existing=current.keys())
    change: RosterChange = plan_roster(specs, current, prune=prune)
    # Pruning an identity that is already retired would change nothing but its token.
    retired_now = {status.identity for status in fleet.list() if status.state is LifecycleState.RETIRING}
    to_retire = tuple(identity for identity in change.prune if identity not in retired_now)
    report_fields: dict[str, Any] = {
        "created": tuple(spec.identity for spec in change.create),
        "updated": {spec.identity: list(fields) for spec, fields in change.update},
        "unchanged": tuple(change.unchanged),
        "retired": to_retire,
    }
    if dry_run:
        return ApplyReport(**report_fields, topology=None, dry_run=True)
    fleet._ledger.call(
        "apply_specs",
        creates=[fleet._spec_record(spec) for spec in change.create],
        updates=[fleet._spec_record(spec) for spec, _ in change.update],
    )
    for spec, _ in change.update:
        # The owner reloads the new spec when the agent next activates.
        fleet.deactivate(spec.identity)
    for identity in to_retire:
        fleet.retire(identity, reconcile=False)
    return ApplyReport(**report_fields, topology=fleet.topology.reconcile(), dry_run=False)


def _current_specs(fleet: Fleet) -> Mapping[str, AgentSpec]:
    return {view.identity: cloudpickle.loads(view.spec) for view in fleet._ledger.call("list_identities")}
