"""Reconcile planning (specs/identity-runtime.md section 6, tests 38-44 adapted)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rayfleet.topology import Edge, ReconcileReport, plan_reconcile
from rayfleet.topology._reconcile import apply_plan_to

AB, AC, BC, CD = Edge.of("a", "b"), Edge.of("a", "c"), Edge.of("b", "c"), Edge.of("c", "d")
ALL = frozenset({"a", "b", "c", "d"})


def test_desired_edges_between_eligible_identities_are_wired_in_one_batch_and_managed() -> None:  # 38
    plan = plan_reconcile(desired={AB, BC}, live=set(), managed=set(), eligible=ALL)
    assert plan.wire == {AB, BC} and not plan.adopt and not plan.unwire and not plan.forget
    assert plan.managed_after == {AB, BC}
    assert apply_plan_to(set(), set(), plan) == ({AB, BC}, {AB, BC})


def test_live_unmanaged_desired_edge_is_adopted_without_wiring() -> None:  # 39
    plan = plan_reconcile(desired={AB}, live={AB}, managed=set(), eligible=ALL)
    assert plan.adopt == {AB} and not plan.wire
    assert plan.managed_after == {AB}


def test_managed_edge_missing_from_live_is_rewired() -> None:  # 40
    plan = plan_reconcile(desired={AB}, live=set(), managed={AB}, eligible=ALL)
    assert plan.wire == {AB} and plan.managed_after == {AB}


def test_managed_edge_removed_from_desired_is_unwired_if_live_else_forgotten() -> None:  # 41
    plan = plan_reconcile(desired=set(), live={AB}, managed={AB, AC}, eligible=ALL)
    assert plan.unwire == {AB} and plan.forget == {AC} and plan.managed_after == frozenset()
    assert apply_plan_to({AB}, {AB, AC}, plan) == (frozenset(), frozenset())


def test_stale_edge_with_inactive_endpoint_is_forgotten_without_unwiring() -> None:  # 41
    plan = plan_reconcile(desired=set(), live=set(), managed={CD}, eligible={"a", "b", "c"})
    assert plan.forget == {CD} and not plan.unwire


def test_managed_edge_with_ineligible_endpoint_is_unwired_if_live_and_waits() -> None:
    # Decision: a managed edge never lingers live with an ineligible endpoint.
    plan = plan_reconcile(desired={CD}, live={CD}, managed={CD}, eligible={"c"})
    assert plan.unwire == {CD} and plan.waiting == {CD} and plan.managed_after == frozenset()
    again = plan_reconcile(desired={CD}, live=set(), managed=set(), eligible=ALL)
    assert again.wire == {CD}


def test_unmanaged_live_edge_is_never_unwired() -> None:
    plan = plan_reconcile(desired=set(), live={AB, CD}, managed=set(), eligible=ALL)
    assert plan.is_empty


def test_desired_edge_with_ineligible_endpoint_waits() -> None:
    plan = plan_reconcile(desired={AB, CD}, live=set(), managed=set(), eligible=lambda identity: identity != "d")
    assert plan.wire == {AB} and plan.waiting == {CD}
    assert not plan_reconcile(desired={CD}, live=set(), managed=set(), eligible={"c"}).wire


def test_empty_desired_unwires_every_managed_live_edge() -> None:
    plan = plan_reconcile(desired=[], live={AB, BC, CD}, managed={AB, BC}, eligible=ALL)
    assert plan.unwire == {AB, BC} and CD not in plan.unwire
    live, managed = apply_plan_to({AB, BC, CD}, {AB, BC}, plan)
    assert live == {CD} and managed == frozenset()


def test_report_from_plan_is_sorted_and_reports_change() -> None:
    plan = plan_reconcile(desired={BC, AB}, live=set(), managed={CD}, eligible=ALL)
    report = ReconcileReport.from_plan(plan, failures=["unwire c -- d: boom"])
    assert report.wired == (AB, BC) and report.forgotten == (CD,) and report.failures == ("unwire c -- d: boom",)
    assert report.changed
    assert not ReconcileReport().changed


IDS = ["a", "b", "c", "d"]
EDGES = [Edge.of(x, y) for i, x in enumerate(IDS) for y in IDS[i + 1:]]
edge_sets = st.frozensets(st.sampled_from(EDGES))


@settings(max_examples=400, deadline=None)
@given(desired=edge_sets, live=edge_sets, managed=edge_sets, eligible=st.frozensets(st.sampled_from(IDS)))
def test_reconcile_is_idempotent_and_converges(
    desired: frozenset[Edge], live: frozenset[Edge], managed: frozenset[Edge], eligible: frozenset[str]
) -> None:
    plan = plan_reconcile(desired=desired, live=live, managed=managed, eligible=eligible)
    assert plan.unwire <= managed  # only managed edges are ever unwired
    live_after, managed_after = apply_plan_to(live, managed, plan)
    assert managed_after == plan.managed_after
    again = plan_reconcile(desired=desired, live=live_after, managed=managed_after, eligible=eligible)
    assert again.is_empty
    assert again.waiting == plan.waiting
    for edge in desired:
        if edge.a in eligible and edge.b in eligible:
            assert edge in live_after and edge in managed_after
    assert live - managed <= live_after  # no unmanaged edge was removed
    assert managed_after <= live_after
