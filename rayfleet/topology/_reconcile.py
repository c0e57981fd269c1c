"""Reconcile arithmetic: from desired, live and managed edges to a wiring plan."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

from ._graph import Edge


@dataclass(frozen=True, slots=True, kw_only=True)
class ReconcilePlan:
    """What one reconcile pass must do; computed by :func:`plan_reconcile`.

    The sets are disjoint, except that an edge in ``waiting`` may also be in
    ``unwire`` or ``forget`` (a desired edge that loses an eligible endpoint stops
    being managed until both endpoints are eligible again).
    """

    adopt: frozenset[Edge]
    """Desired, live, not yet managed, both endpoints eligible: start managing, no wiring."""
    wire: frozenset[Edge]
    """Desired, not live, both endpoints eligible: wire (in one batch) and manage.

    Includes managed edges that went missing from the live graph (the self-heal re-wire)."""
    unwire: frozenset[Edge]
    """Managed and live, but not desired or with an ineligible endpoint: unwire and stop managing."""
    forget: frozenset[Edge]
    """Managed, not live, and not desired or with an ineligible endpoint: stop managing, no unwiring."""
    waiting: frozenset[Edge]
    """Desired, but an endpoint is not eligible: left until it is (informational)."""
    managed_after: frozenset[Edge]
    """The managed set once every step of the plan has succeeded."""

    @property
    def is_empty(self) -> bool:
        """True when the plan changes nothing (``waiting`` edges do not count)."""
        return not (self.adopt or self.wire or self.unwire or self.forget)


def plan_reconcile(
    *,
    desired: Iterable[Edge],
    live: Iterable[Edge],
    managed: Iterable[Edge],
    eligible: Callable[[str], bool] | Collection[str],
) -> ReconcilePlan:
    """Plan the wiring that makes the live graph match the desired one.

    Pure set arithmetic. For each edge:

    * desired, both endpoints eligible, live, unmanaged → ``adopt``;
    * desired, both endpoints eligible, not live → ``wire`` (managed or not, so a
      managed edge that vanished from the live graph is re-wired);
    * desired, an endpoint ineligible → ``waiting`` (never wired now);
    * managed and not desired → ``unwire`` if live, else ``forget``;
    * managed with an ineligible endpoint → ``unwire`` if live, else ``forget``.

    Guarantees: only managed edges are ever unwired, so an edge someone else wired
    is left alone unless it was adopted because it was desired. Applying the plan
    and planning again with the same inputs yields an empty plan.

    Two cases are decided on purpose:

    * An empty ``desired`` is planned like any other: every managed live edge is
      unwired, so shrinking the topology to nothing leaves no old wires behind.
    * A managed edge with an ineligible endpoint is unwired if it is still live,
      even when it is desired, rather than lingering unmanaged-by-intent; it is
      wired again (and managed again) once both endpoints are eligible. If it is no
      longer live it is simply forgotten.

    Args:
        desired: Canonical edges that should exist.
        live: Edges currently wired, as the wiring layer reports them.
        managed: Edges this runtime wired or adopted earlier.
        eligible: Which identities may be wired now (e.g. the ACTIVE ones), as a
            predicate or a collection of identities.

    Returns:
        The plan; execute ``wire`` first, then ``unwire``, and record
        ``managed_after`` only for the steps that succeeded.
    """
    is_eligible = eligible if callable(eligible) else frozenset(eligible).__contains__
    desired_set, live_set, managed_set = frozenset(desired), frozenset(live), frozenset(managed)

    def both_eligible(edge: Edge) -> bool:
        return bool(is_eligible(edge.a)) and bool(is_eligible(edge.b))

    ready = frozenset(edge for edge in desired_set if both_eligible(edge))
    waiting = desired_set - ready
    adopt = (ready & live_set) - managed_set
    wire = ready - live_set
    # Managed edges that should no longer be managed: not desired, or not wirable now.
    released = managed_set - ready
    unwire = released & live_set
    forget = released - live_set
    managed_after = (managed_set | adopt | wire) - released
    return ReconcilePlan(adopt=adopt, wire=wire, unwire=unwire, forget=forget, waiting=waiting,
                         managed_after=managed_after)


def apply_plan_to(
    live: Iterable[Edge], managed: Iterable[Edge], plan: ReconcilePlan
) -> tuple[frozenset[Edge], frozenset[Edge]]:
    """The ``(live, managed)`` sets after every step of ``plan`` succeeded.

    Used by tests and by the platform to update its model after a clean pass; after a
    partial failure, apply only the steps that succeeded.
    """
    live_after = (frozenset(live) | plan.wire) - plan.unwire
    managed_after = (frozenset(managed) | plan.adopt | plan.wire) - plan.unwire - plan.forget
    return live_after, managed_after


def _sorted(edges: Iterable[Edge]) -> tuple[Edge, ...]:
    return tuple(sorted(edges))


@dataclass(frozen=True, slots=True, kw_only=True)
class ReconcileReport:
    """What a reconcile pass did, for ``fleet.topology.reconcile()`` and logs.

    Edge tuples are sorted, so two reports of the same pass compare equal.
    """

    adopted: tuple[Edge, ...] = ()
    wired: tuple[Edge, ...] = ()
    unwired: tuple[Edge, ...] = ()
    forgotten: tuple[Edge, ...] = ()
    waiting: tuple[Edge, ...] = ()
    failures: tuple[str, ...] = ()
    """Human-readable descriptions of steps that failed (after their retries)."""

    @property
    def changed(self) -> bool:
        """True when the pass adopted, wired, unwired or forgot at least one edge."""
        return bool(self.adopted or self.wired or self.unwired or self.forgotten)

    @classmethod
    def from_plan(cls, plan: ReconcilePlan, failures: Iterable[str] = ()) -> ReconcileReport:
        """The report of ``plan`` executed in full, with any ``failures`` attached."""
        return cls(adopted=_sorted(plan.adopt), wired=_sorted(plan.wire), unwired=_sorted(plan.unwire),
                   forgotten=_sorted(plan.forget), waiting=_sorted(plan.waiting), failures=tuple(failures))
