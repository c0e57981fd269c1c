"""Rosters: the declarative list of agents a fleet should have, loaded from YAML, and the apply plan.

Plain Python, no Ray.
"""

from __future__ import annotations

from ._roster import RosterAgent as RosterAgent
from ._roster import RosterChange as RosterChange
from ._roster import RosterFile as RosterFile
from ._roster import load_roster as load_roster
from ._roster import plan_roster as plan_roster
from ._roster import roster_json_schema as roster_json_schema
from ._roster import validate_roster as validate_roster

__all__ = [
    "RosterAgent",
    "RosterChange",
    "RosterFile",
    "load_roster",
    "plan_roster",
    "roster_json_schema",
    "validate_roster",
]
