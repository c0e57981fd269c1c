"""The chaos checker (tests/support/chaos_harness.py) finds what it is meant to find, on made-up histories.

No Ray: the checker only reads a history, the final States and the token samples.
"""

from __future__ import annotations

from pathlib import Path

import chaos_harness as ch


def _run(tmp_path: Path) -> ch.ChaosRun:
    profile = ch.Profile("unit", duration=1.0, identities=2, paused=0)
    return ch.ChaosRun(profile, storage=tmp_path / "store", log=lambda *_: None)


def _op(run: ch.ChaosRun, identity: str, key: str, *outcomes: tuple[str, object]) -> None:
    op = run.history.new_op()
    for kind, value in outcomes:
        run.history.record("invoke", "client-0", op, identity, key)
        run.history.record(kind, "client-0", op, identity, key, value)


def test_a_clean_history_has_no_violations(tmp_path: Path) -> None:
    run = _run(tmp_path)
    _op(run, "chaos/c/0", "k1", ("ok", 1))
    _op(run, "chaos/c/0", "k2", ("info", "DeadlineExceededError"), ("ok", 2))
    _op(run, "chaos/c/0", "k3", ("info", "ActorDiedError"))  # unknown outcome, applied once: allowed
    _op(run, "chaos/c/1", "k4", ("info", "ActorDiedError"))  # unknown outcome, never applied: allowed
    run._check_increments({"chaos/c/0": {"total": 3, "applied": ["k1", "k2", "k3"]},
                           "chaos/c/1": {"total": 0, "applied": []}})
    assert run.violations == []


def test_lost_duplicated_phantom_and_misordered_increments_are_violations(tmp_path: Path) -> None:
    run = _run(tmp_path)
    _op(run, "chaos/c/0", "lost", ("ok", 1))
    _op(run, "chaos/c/0", "twice", ("info", "DeadlineExceededError"))
    _op(run, "chaos/c/1", "first", ("ok", 2))   # was applied first: its reply must be 1
    _op(run, "chaos/c/1", "second", ("ok", 2))  # the same reply twice: two owners served one State
    run._check_increments({"chaos/c/0": {"total": 3, "applied": ["twice", "twice", "phantom"]},
                           "chaos/c/1": {"total": 2, "applied": ["first", "second"]}})
    found = "\n".join(run.violations)
    assert "acknowledged lost applied 0 times" in found
    assert "twice applied 2 times" in found
    assert "phantom applied but never sent" in found
    assert "first answered 2 but was applied as #1" in found
    assert "same reply" in found


def test_tokens_must_strictly_increase_when_the_owner_changes(tmp_path: Path) -> None:
    run = _run(tmp_path)
    run.tokens["a"] = [(0.0, 3, "rayfleet-host-0"), (1.0, 3, "rayfleet-host-0"), (2.0, 5, "rayfleet-host-1")]
    run.tokens["b"] = [(0.0, 4, "rayfleet-host-0"), (1.0, 2, "rayfleet-host-1")]
    run.tokens["c"] = [(0.0, 7, "rayfleet-host-0"), (1.0, 7, "rayfleet-host-1")]
    run._check_tokens()
    assert len(run.violations) == 2, run.violations
    assert "b: fencing token went back 4 -> 2" in run.violations[0]
    assert "c: token 7 held by rayfleet-host-0 and then rayfleet-host-1" in run.violations[1]


def test_unavailability_counts_only_identities_the_fault_hit(tmp_path: Path) -> None:
    run = _run(tmp_path)
    events = run.history.events
    events += [
        ch.Event("invoke", "client-0", 1, "chaos/c/0", "k1", 10.0), ch.Event("ok", "client-0", 1, "chaos/c/0", "k1", 16.0, 1),
        ch.Event("invoke", "client-1", 2, "chaos/c/1", "k2", 10.0), ch.Event("ok", "client-1", 2, "chaos/c/1", "k2", 30.0, 1),
    ]
    run.history.faults.append(ch.Fault("host_freeze", "rayfleet-host-0", start=11.0, end=15.0, hit=["chaos/c/0"]))
    assert run._unavailability() == {"host_freeze": 5.0}
