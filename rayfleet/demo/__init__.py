"""The demo: the agents it spawns (also used by ``examples/``) and the script ``rayfleet demo`` runs.

``python -m rayfleet.jobs.demo`` runs the same script as a Ray job. Rosters name these
agents by path, e.g. ``agent: rayfleet.demo.agents:Planner``.
"""

from __future__ import annotations

from .agents import Bank as Bank
from .agents import Booking as Booking
from .agents import Counter as Counter
from .agents import Notebook as Notebook
from .agents import Planner as Planner
from .agents import Refunds as Refunds
from .agents import Researcher as Researcher
from .agents import Reviewer as Reviewer

__all__ = [
    "Bank",
    "Booking",
    "Counter",
    "Notebook",
    "Planner",
    "Refunds",
    "Researcher",
    "Reviewer",
]
