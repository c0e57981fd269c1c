"""The public surface: pinned names, one error tree, pickle-safe errors, no Ray in the core."""

from __future__ import annotations

import pickle
import subprocess
import sys

import pytest

import rayfleet as rf

EXPECTED_NAMES = {
    "ApprovalInfo", "ApprovalsClient", "Decision", "TimerInfo", "TurnStatus", "TurnHandle", "TurnInfo", "TurnEvent",
    "Addressability", "Agent", "AgentRef", "AgentSpec", "BudgetExceededError", "ContinuityRecord",
    "DeadlineExceededError", "Durability", "EventKind", "Fleet", "FleetConfig", "FleetUnavailableError",
    "HandlerError", "IdentityEvent", "IdentityStatus", "InvalidArgumentsError", "InvalidSpecError",
    "InvalidStateError", "LeaseInfo", "LeaseLostError", "LifecycleState", "NotAddressableError",
    "NotInAgentContextError", "NotWiredError", "PeerCycleError", "RayfleetError", "Reply", "RunCancelledError", "SnapshotError",
    "StaleCheckpointVersionError", "StaleFencingTokenError", "StaleSequenceError", "State", "StepFailedError", "TopologyPolicy",
    "UnknownHandlerError", "UnknownIdentityError", "Usage", "connect", "handler",
    "DeadLetter", "DeadLetterReason", "Envelope", "ParkedMessage", "RetryPolicy", "RetryableError",
    "ChatAgent", "ChatClient", "ChatDelta", "ChatMessage", "ChatModel", "ChatReply", "ChatStream", "Model", "ToolCall",
    "handoff", "peer_tool", "reply_with_usage", "tool",
    "AgentFailure", "AllOf", "AnyOf", "Budget", "FirstOf", "Quorum", "RunInfo", "RunStatus", "Select", "StepContext", "Workflow",
    "WorkflowOutcome",
    "ApplyReport", "DeactivationReport", "DrainReport", "ExportReport", "HostInfo", "HostStatistics", "RunsClient", "StepHandle", "TopologyClient",
    "DeliveryError", "IdentityError", "InternalError", "ModelError", "ModelRequestError", "ModelResponseError",
    "ModelTimeoutError", "ModelUnavailableError", "UnknownDeadLetterError", "UnknownRunError", "UsageError",
    "WorkflowError", "RunOwnedElsewhereError", "StaleRunTokenError",
    "FleetMismatchError", "FleetNotFoundError", "LedgerError", "LedgerSchemaError", "LedgerUnavailableError",
    "StorageError", "StorageUnavailableError",
    "CallOptions",
    "TurnError", "NonDeterminismError", "StepOutcomeUnknownError", "StepValueError", "TurnInterruptedError", "AgentBusyError",
    "WaitTimeoutError", "ApprovalConflictError", "UnknownApprovalError", "UnknownTurnEventError",
}


def test_exports_are_pinned() -> None:
    assert set(rf.__all__) == EXPECTED_NAMES
    for name in rf.__all__:
        assert getattr(rf, name) is not None


def test_every_error_is_a_rayfleet_error() -> None:
    errors = [getattr(rf, name) for name in rf.__all__ if name.endswith("Error")]
    assert all(issubclass(error, rf.RayfleetError) for error in errors)
    assert issubclass(rf.InvalidSpecError, ValueError)
    assert issubclass(rf.DeadlineExceededError, TimeoutError)
    assert issubclass(rf.RetryableError, rf.RayfleetError)


@pytest.mark.parametrize(
    "error",
    [
        rf.StaleFencingTokenError(identity="a", presented=3, current=5),
        rf.StaleCheckpointVersionError(identity="a", presented=1, current=2),
        rf.UnknownIdentityError(identity="a"),
        rf.InvalidStateError(identity="a", state="BROKEN", operation="call"),
        rf.LeaseLostError(identity="a", detail="x"),
        rf.HandlerError(identity="a", method="m", remote_type="builtins.ValueError", remote_message="no",
                        remote_traceback="tb"),
        rf.InvalidArgumentsError(identity="a", method="m", detail="n: missing"),
        rf.UnknownHandlerError(identity="a", method="m", available=("add",)),
        rf.SnapshotError(identity="a", location="f#0", detail="missing"),
        rf.InvalidSpecError("bad", field="identity"),
        rf.DeadlineExceededError(identity="a", method="m", timeout=1.0),
        rf.BudgetExceededError(budget="tokens", ceiling=10, spent=12),
        rf.NotWiredError(sender="a", target="b"),
        rf.PeerCycleError(cycle=("a", "b", "a"), method="m"),
        rf.NotInAgentContextError(attribute="identity"),
        rf.UsageError("fleet.run() cannot run here", api="fleet.run()"),
        rf.UnknownDeadLetterError(letter_id=7),
        rf.UnknownRunError(run_id="r-1"),
        rf.RunOwnedElsewhereError(run_id="r-1", owner="runner:ns:1", expires_in=4.5, step="pay"),
        rf.StaleRunTokenError(run_id="r-1", presented=2, current=3),
        rf.ModelRequestError(url="http://h/v1/chat/completions", status=400, body_excerpt="bad"),
        rf.ModelResponseError(url="http://h/v1/chat/completions", detail="chat response is not JSON"),
        rf.ModelTimeoutError(url="http://h/v1/chat/completions", timeout=2.0),
        rf.ModelUnavailableError(url="http://h/v1/chat/completions", attempts=3, last_failure="HTTP 503"),
        rf.InternalError(detail="x"),
        rf.RetryableError("busy"),
    ],
)
def test_errors_round_trip_through_pickle(error: rf.RayfleetError) -> None:
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error)
    assert str(copy) == str(error)
    assert copy._attributes == error._attributes


def test_stale_token_message_says_what_and_what_to_do() -> None:
    error = rf.StaleFencingTokenError(identity="planner", presented=7, current=9)
    assert "7" in str(error) and "9" in str(error) and "planner" in str(error)
    assert error.presented == 7 and error.current == 9


RAY_FREE_PACKAGES = ("identity", "ledger", "checkpoints", "host", "topology", "roster", "workflow", "llm", "testing")


def test_ray_free_packages_never_import_ray() -> None:
    # rayfleet/__init__ imports platform (Ray); load every module of the Ray-free packages on their own.
    result = subprocess.run(
        [sys.executable, "-c",
         "import sys, importlib, importlib.util, pathlib, pkgutil, types\n"
         "sys.modules['ray'] = None\n"
         "root = pathlib.Path(importlib.util.find_spec('rayfleet').origin).parent\n"
         "package = types.ModuleType('rayfleet'); package.__path__ = [str(root)]; sys.modules['rayfleet'] = package\n"
         f"names = {RAY_FREE_PACKAGES!r}\n"
         "count = 0\n"
         "for name in names:\n"
         "    importlib.import_module(f'rayfleet.{name}')\n"
         "    for info in pkgutil.iter_modules([str(root / name)]):\n"
         "        importlib.import_module(f'rayfleet.{name}.{info.name}'); count += 1\n"
         "print('ok', count)\n"],
        capture_output=True, text=True, check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[0] == "ok" and int(result.stdout.split()[1]) >= 20
