"""Topology: desired and managed peer edges, reconcile plans, rosters and exports (pure Python, no Ray)."""

from __future__ import annotations

from ._export import export_topology as export_topology
from ._graph import Edge as Edge
from ._graph import desired_edges as desired_edges
from ._graph import peers_of as peers_of
from ._reconcile import ReconcilePlan as ReconcilePlan
from ._reconcile import ReconcileReport as ReconcileReport
from ._reconcile import apply_plan_to as apply_plan_to
from ._reconcile import backoff_delays as backoff_delays
from ._reconcile import plan_reconcile as plan_reconcile
from ._roster import RosterChange as RosterChange
from ._roster import load_roster as load_roster
from ._roster import plan_roster as plan_roster
from ._roster import validate_roster as validate_roster

__all__ = [
    # Graph
    "Edge",
    "desired_edges",
    "peers_of",
    # Reconcile
    "ReconcilePlan",
    "ReconcileReport",
    "apply_plan_to",
    "backoff_delays",
    "plan_reconcile",
    # Rosters
    "RosterChange",
    "load_roster",
    "plan_roster",
    "validate_roster",
    # Export
    "export_topology",
]
