"""Workflow definition: builders, validation, ordering, gather decisions and code versions."""

from __future__ import annotations

import ast
import pickle
import threading
from pathlib import Path

import pytest

from rayfleet.errors import BudgetExceededError, InvalidSpecError, StepFailedError
from rayfleet.retry import RetryPolicy
from rayfleet.workflow._definition import (
    AllOf,
    AnyOf,
    Budget,
    FirstOf,
    Quorum,
    RunStatus,
    Select,
    Step,
    StepHandle,
    Workflow,
    WorkflowOutcome,
)

WORK = Select({"skill": "work"})


def test_duplicate_label_is_refused_at_once() -> None:
    wf = Workflow("wf")
    wf.step("fetch", to="a1", call="work")
    with pytest.raises(InvalidSpecError, match="fetch"):
        wf.step("fetch", to="a2", call="work")


@pytest.mark.parametrize("targets", [{}, {"to": "a1", "select": WORK}, {"select": WORK, "scatter": WORK}])
def test_exactly_one_target(targets: dict) -> None:
    with pytest.raises(InvalidSpecError, match="exactly one of"):
        Workflow("wf").step("s", call="work", **targets)


def test_invalid_to_identity_names_the_step() -> None:
    with pytest.raises(InvalidSpecError, match="'s'.*invalid to="):
        Workflow("wf").step("s", to="/bad..name", call="work")


def test_bad_call_and_timeout_are_refused() -> None:
    with pytest.raises(InvalidSpecError, match="handler name"):
        Workflow("wf").step("s", to="a1", call="not a name")
    with pytest.raises(InvalidSpecError, match="timeout"):
        Workflow("wf").step("s", to="a1", call="work", timeout=0)
    with pytest.raises(InvalidSpecError, match="on_timeout"):
        Workflow("wf").step("s", to="a1", call="work").on_timeout("retry")  # type: ignore[arg-type]


def test_unknown_dependency() -> None:
    wf = Workflow("wf")
    wf.step("b", to="a1", call="work", after=["ghost"])
    with pytest.raises(InvalidSpecError, match="'b' depends on unknown step 'ghost'"):
        wf.validate()


def test_cycle_names_its_steps() -> None:
    wf = Workflow("wf")
    wf.step("root", to="a1", call="work")
    wf.step("a", to="a1", call="work", after=["root", "c"])
    wf.step("b", to="a1", call="work", after=["a"])
    wf.step("c", to="a1", call="work", after=["b"])
    with pytest.raises(InvalidSpecError) as caught:
        wf.validate()
    message = str(caught.value)
    assert "cycle" in message and "a -> b -> c -> a" in message
    assert "root" not in message.split("cycle")[1]


def test_exclusive_scatter_is_refused() -> None:
    wf = Workflow("wf")
    wf.step("panel", scatter=WORK, call="work").exclusive()
    with pytest.raises(InvalidSpecError, match="'panel' is exclusive"):
        wf.validate()


def test_reassign_needs_exclusive() -> None:
    wf = Workflow("wf")
    handle = wf.step("s", select=WORK, call="work").on_timeout("reassign")
    with pytest.raises(InvalidSpecError, match=r"'s'.*\.exclusive\(\)"):
        wf.validate()
    handle.exclusive()
    wf.validate()


def test_unpicklable_builder_fails_only_for_submit() -> None:
    lock = threading.Lock()
    wf = Workflow("wf")
    wf.step("s", to="a1", call="work", payload=lambda ctx: {"locked": lock.locked()})
    wf.validate()
    with pytest.raises(InvalidSpecError, match="'s'.*payload builder cannot be pickled"):
        wf.validate(for_submit=True)


def test_unpicklable_verifier_and_compensation_payload_for_submit() -> None:
    lock = threading.Lock()
    wf = Workflow("wf")
    wf.step("v", to="a1", call="work").verify(lambda out: lock is not None)
    with pytest.raises(InvalidSpecError, match="'v'.*verifier"):
        wf.validate(for_submit=True)
    wf2 = Workflow("wf2")
    wf2.step("c", to="a1", call="work").compensate("undo", lambda ctx: {"l": lock})
    with pytest.raises(InvalidSpecError, match="'c'.*compensation payload"):
        wf2.validate(for_submit=True)


def test_picklable_closures_pass_submit_validation() -> None:
    factor = 3
    wf = Workflow("wf")
    wf.step("s", to="a1", call="work", payload=lambda ctx: {"n": factor}).verify(bool)
    wf.validate(for_submit=True)


def test_order_is_deterministic_kahn_by_insertion() -> None:
    wf = Workflow("wf")
    wf.step("d", to="a1", call="work", after=["b", "c"])
    wf.step("c", to="a1", call="work", after=["a"])
    wf.step("b", to="a1", call="work", after=["a"])
    wf.step("a", to="a1", call="work")
    wf.step("e", to="a1", call="work")
    assert wf.order() == ["a", "e", "c", "b", "d"]  # FIFO: breadth-first, authored order
    assert all(wf.order() == ["a", "e", "c", "b", "d"] for _ in range(5))


def test_handle_chains_and_replaces_immutable_steps() -> None:
    wf = Workflow("wf")
    handle = wf.step("s", select=WORK, call="work")
    before = handle.step
    policy = RetryPolicy(max_attempts=3, base_delay=0.01)
    result = (handle.compensate("undo").exclusive().verify(bool).retry(policy).timeout(5)
              .on_timeout("reassign"))
    assert isinstance(result, StepHandle) and result is handle
    after = wf.steps["s"]
    assert after is not before and before.exclusive is False
    assert (after.compensation, after.exclusive, after.retry, after.timeout, after.on_timeout) == (
        "undo", True, policy, 5, "reassign")
    with pytest.raises(AttributeError):
        after.label = "x"  # type: ignore[misc]


def test_code_version_is_stable_and_tracks_the_definition() -> None:
    def build(call: str) -> Workflow:
        wf = Workflow("wf", budget=Budget(invocations=3))
        wf.step("a", to="a1", call=call, payload={"x": 1})
        wf.step("b", scatter=WORK, call="work", after=["a"], gather=Quorum(2)).compensate("undo")
        return wf

    one = build("work")
    assert one.code_version() == one.code_version() == build("work").code_version()
    assert build("other").code_version() != one.code_version()
    changed = build("work")
    changed.step("c", to="a1", call="work")
    assert changed.code_version() != one.code_version()


def test_code_version_survives_unpicklable_callables() -> None:
    lock = threading.Lock()
    wf = Workflow("wf")
    wf.step("s", to="a1", call="work", payload=lambda ctx: {"l": lock})
    assert wf.code_version() == wf.code_version()


@pytest.mark.parametrize(
    ("policy", "cases"),
    [
        (AllOf(), [((0, 0, 3), "wait"), ((2, 0, 3), "wait"), ((3, 0, 3), "done"), ((2, 1, 3), "failed")]),
        (AnyOf(), [((0, 0, 3), "wait"), ((0, 2, 3), "wait"), ((1, 2, 3), "done"), ((0, 3, 3), "failed")]),
        (FirstOf(), [((0, 0, 3), "wait"), ((1, 0, 3), "done"), ((0, 1, 3), "failed")]),
        (Quorum(2), [((1, 0, 3), "wait"), ((1, 1, 3), "wait"), ((2, 1, 3), "done"), ((1, 2, 3), "failed"),
                     ((0, 0, 1), "failed")]),
    ],
)
def test_gather_decisions(policy, cases) -> None:
    for args, expected in cases:
        assert policy.decide(*args) == expected, (policy, args)


def test_value_validation() -> None:
    with pytest.raises(InvalidSpecError):
        Quorum(0)
    with pytest.raises(InvalidSpecError):
        Select({})
    for bad in ({"invocations": 0}, {"tokens": -1}, {"wall_clock": 0.0}, {"invocations": True}):
        with pytest.raises(InvalidSpecError):
            Budget(**bad)
    with pytest.raises(InvalidSpecError):
        Workflow("wf", parallelism=0)
    with pytest.raises(InvalidSpecError):
        Workflow("not a valid name")


def test_select_is_a_hashable_picklable_value() -> None:
    labels = {"skill": "work"}
    select = Select(labels)
    labels["skill"] = "other"
    assert select.labels["skill"] == "work"
    assert pickle.loads(pickle.dumps(select)) == select
    assert hash(select) == hash(Select({"skill": "work"}))


def test_run_status_values_and_outcome_raise() -> None:
    assert all(status.value == status.name for status in RunStatus)
    ok = WorkflowOutcome(run_id="r", status=RunStatus.COMPLETED)
    ok.raise_error()
    failed = WorkflowOutcome(run_id="r", status=RunStatus.COMPENSATED,
                             error=StepFailedError(step="s", detail="boom"))
    with pytest.raises(StepFailedError, match="'s'"):
        failed.raise_error()


def test_step_can_be_built_directly() -> None:
    step = Step(label="s", to="a1", call="work")
    assert step.after == () and isinstance(step.gather, AllOf) and step.retry.max_attempts == 1


def test_budget_exceeded_error_shape() -> None:
    error = BudgetExceededError(budget="tokens", ceiling=10, spent=11)
    assert error.budget == "tokens" and error.spent == 11


ALLOWED_IMPORTS = ("__future__", "asyncio", "collections", "dataclasses", "enum", "hashlib", "heapq",
                   "importlib", "inspect", "logging", "math", "random", "time", "types", "typing", "cloudpickle",
                   "pydantic", "pyarrow")
# ledger._run_rules: the run-lease and run-fencing rules, which the in-memory journal applies as the ledger does;
# ledger._values: the plain values a journal answers with (RunRequests, StepJournaled), no store;
# _version: the installed rayfleet's version, which a workflow's code version includes;
# identity._agent: a waiting step runs on a platform agent (workflow/_waits.py), which is an rf.Agent;
# turns._values: the rf.Decision an approval step answers.
ALLOWED_RELATIVE = ("errors", "retry", "_deadlines", "_version", "identity._agent", "identity._handlers",
                    "identity._names", "ledger._run_rules", "ledger._values", "turns._values")


def test_package_imports_only_allowed_modules() -> None:
    package = Path(__file__).resolve().parents[3] / "rayfleet" / "workflow"
    for source in package.glob("*.py"):
        tree = ast.parse(source.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    assert alias.name.split(".")[0] in ALLOWED_IMPORTS, (source.name, alias.name)
            elif isinstance(node, ast.ImportFrom):
                if node.level == 0:
                    assert node.module.split(".")[0] in ALLOWED_IMPORTS, (source.name, node.module)
                elif node.level == 2:
                    assert node.module in ALLOWED_RELATIVE, (source.name, node.module)
