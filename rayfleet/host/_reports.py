"""What a host reports about itself: its counters, and what a drain or a fleet-wide deactivation did.

Plain frozen values, so they cross Ray as they are and compare by value in tests; the
runtime builds them and the platform passes them on (``rf.HostStatistics``,
``rf.DrainReport``, ``rf.DeactivationReport``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class HostStatistics:
    """A snapshot of one host's counters."""

    host: str
    active_agents: int
    turns: int
    handler_errors: int
    activations: int
    deactivations: int
    checkpoints: int
    commit_batches: int
    lease_renewals: int
    leases_lost: int
    stale_refusals: int
    duplicates: int
    """Messages answered from the dedup window without running the handler."""
    dead_letters: int
    parked: int
    draining: bool
    ledger_route: str = "direct"
    """How this host reaches the ledger: ``"direct"`` (its own database connection) or ``"ledger actor"``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DrainReport:
    """What a drain did with the agents of one host.

    Every agent the host had when the drain began is off it when the drain returns:
    checkpointed and released, or, past the deadline, released without its unsaved State.
    """

    host: str
    checkpointed: int
    """Agents deactivated normally: unsaved State committed, ``on_deactivate`` run, lease released."""
    released_unsaved: int
    """Agents still busy (a turn running, a checkpoint failing) at the deadline: their
    handlers were stopped and their leases released, so the next owner starts from the
    last committed State at once instead of after a lease TTL."""
    timed_out: bool
    """True when the deadline passed before every agent was deactivated normally."""
    seconds: float = 0.0
    """How long the drain took."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DeactivationReport:
    """What deactivating every agent of a fleet did (``fleet.deactivate_all()``, ``fleet.shutdown()``)."""

    hosts: int
    """Hosts asked to deactivate their agents."""
    deactivated: int
    """Agents checkpointed and released."""
    remaining: int
    """Agents still hosted when it ended: busy past the deadline, or their checkpoint failed (see the host logs)."""
    seconds: float
    """How long it took."""
