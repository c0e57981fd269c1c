"""Rosters: the declarative list of agents a fleet should have, loaded from YAML, and the apply plan.

Plain Python, no Ray.
"""

from __future__ import annotations

from ._roster import RosterChange as RosterChange
from ._roster import load_roster as load_roster
from ._roster import plan_roster as plan_roster
from ._roster import validate_roster as validate_roster

__all__ = [
    "RosterChange",
    "load_roster",
    "plan_roster",
    "validate_roster",
]
