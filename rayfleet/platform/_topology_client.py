"""``fleet.topology``: managed peer wiring over Ray.

The arithmetic (what to wire, adopt, unwire) is pure and lives in
``rayfleet.topology``; this client reads one ledger snapshot, applies a plan in one
ledger transaction, and tells the hosts to reload their agents' peers.
"""

from __future__ import annotations

import time

import ray

from ..identity._names import validate_identity
from ..identity._values import PERSISTED_LIVE
from ..ledger._contract import LedgerClient
from ..ledger._values import TopologyChange
from ..retry import RetryPolicy
from ..topology._export import export_topology
from ..topology._graph import Edge, LiveEdge
from ..topology._reconcile import ReconcileReport, plan_reconcile
from ._routing import Courier
from ._status import identity_status

HOST_NOTIFY_CONCURRENCY = 64
NOTIFY_RETRY = RetryPolicy(max_attempts=4, base_delay=0.05, max_delay=2.0, jitter=0.0)
"""Rounds of telling hosts to reload peers: fast first retries for transient hiccups, bounded so a
reconcile never stalls long on one bad host. No jitter: reconciles never overlap, so nothing to spread."""


class HostNotifier:
    """Tells every live host to reload its agents' peers after the live edges changed."""

    def __init__(self, courier: Courier) -> None:
        self._courier = courier

    def refresh_peers(self) -> list[str]:
        """Notify every live host, retrying failed ones with backoff; returns what still failed, one line each."""
        courier = self._courier
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
                    except Exception as error:  # noqa: BLE001 - an unreachable host reloads peers when it next activates
                        failures[name] = f"host {name} did not reload peers: {type(error).__name__}: {error}"
                        failed.append(name)
            pending = failed
        return sorted(failures.values())


class TopologyView:
    """The live peer edges of one fleet as read: it only reads the ledger.

    Args:
        ledger: holds the desired and live edges.
    """

    def __init__(self, ledger: LedgerClient) -> None:
        self._ledger = ledger

    def edges(self) -> list[LiveEdge]:
        """Live edges with whether the platform manages them, sorted."""
        return [LiveEdge(a=row.a, b=row.b, managed=row.managed) for row in self._ledger.topology().result().live]

    def export(self, fmt: str = "dot") -> str:
        """The topology as ``dot``, ``mermaid`` or ``json`` text, with each identity's state."""
        nodes = {view.identity: identity_status(view).state.value for view in self._ledger.list_identities().result()}
        edges = self.edges()
        return export_topology(nodes, [live.edge for live in edges],
                               managed=[live.edge for live in edges if live.managed], fmt=fmt)


class TopologyClient(TopologyView):
    """Desired and managed peer edges of one fleet (``fleet.topology``).

    Args:
        ledger: holds the desired and live edges.
        notifier: tells hosts to reload peers once live edges changed.
    """

    def __init__(self, ledger: LedgerClient, notifier: HostNotifier) -> None:
        super().__init__(ledger)
        self._notifier = notifier

    def wire(self, a: str, b: str) -> ReconcileReport:
        """Declare an edge between two identities and reconcile; both must exist."""
        edge = Edge.of(validate_identity(a), validate_identity(b))
        self._ledger.set_desired_edge(a=edge.a, b=edge.b, desired=True).result()
        return self.reconcile()

    def unwire(self, a: str, b: str) -> ReconcileReport:
        """Withdraw an explicit edge and reconcile (edges from specs' ``peers`` stay)."""
        edge = Edge.of(validate_identity(a), validate_identity(b))
        self._ledger.set_desired_edge(a=edge.a, b=edge.b, desired=False).result()
        return self.reconcile()

    def reconcile(self) -> ReconcileReport:
        """Make the live edges match the desired ones; returns what changed.

        Adopts desired edges already live, wires missing ones in one batch, unwires
        only edges it manages (never ones it found), and then tells every host to
        reload its agents' peers, retrying a host that fails with backoff.
        """
        view = self._ledger.topology().result()
        desired = {Edge(a=a, b=b) for a, b in view.explicit}
        for identity, peers in view.declared.items():
            desired.update(Edge.of(identity, peer) for peer in peers if peer != identity)
        live = {Edge(a=row.a, b=row.b) for row in view.live}
        managed = {Edge(a=row.a, b=row.b) for row in view.live if row.managed}
        eligible = frozenset(identity for identity, lifecycle in view.lifecycles.items() if lifecycle == PERSISTED_LIVE)
        plan = plan_reconcile(desired=frozenset(desired), live=frozenset(live), managed=frozenset(managed),
                              eligible=eligible)
        failures: list[str] = []
        if not plan.is_empty:
            self._ledger.apply_topology(TopologyChange(
                wire=tuple((e.a, e.b) for e in plan.wire), adopt=tuple((e.a, e.b) for e in plan.adopt),
                unwire=tuple((e.a, e.b) for e in plan.unwire), forget=tuple((e.a, e.b) for e in plan.forget),
            )).result()
            failures = self._notifier.refresh_peers()
        return ReconcileReport.from_plan(plan, failures=failures)
