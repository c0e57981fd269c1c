"""Topology: desired and managed peer edges, reconcile plans and exports (pure Python, no Ray)."""

from __future__ import annotations

from ._export import export_topology as export_topology
from ._graph import Edge as Edge
from ._graph import LiveEdge as LiveEdge
from ._graph import desired_edges as desired_edges
from ._graph import peers_of as peers_of
from ._reconcile import ReconcilePlan as ReconcilePlan
from ._reconcile import ReconcileReport as ReconcileReport
from ._reconcile import plan_reconcile as plan_reconcile

__all__ = [
    # Graph
    "Edge",
    "LiveEdge",
    "desired_edges",
    "peers_of",
    # Reconcile
    "ReconcilePlan",
    "ReconcileReport",
    "plan_reconcile",
    # Export
    "export_topology",
]
