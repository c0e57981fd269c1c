"""The error tree: subsystem bases catch their leaves, fields survive pickling, messages name the fix."""

from __future__ import annotations

import pickle
import re

import pytest

import rayfleet as rf
from rayfleet import errors
from rayfleet.errors import is_retryable

URL = "http://127.0.0.1:8000/v1/chat/completions"

# One instance of every leaf, under the subsystem base that must catch it.
LEAVES: dict[type[rf.RayfleetError], list[rf.RayfleetError]] = {
    rf.UsageError: [
        rf.UsageError("fleet.run() blocks; use await fleet.run_async(wf)", api="fleet.run()"),
        rf.NotInAgentContextError(attribute="identity"),
    ],
    rf.IdentityError: [
        rf.UnknownIdentityError(identity="a"),
        rf.InvalidStateError(identity="a", state="BROKEN", operation="call"),
        rf.LeaseLostError(identity="a"),
        rf.StaleFencingTokenError(identity="a", presented=1, current=2),
        rf.StaleCheckpointVersionError(identity="a", presented=1, current=2),
        rf.SnapshotError(identity="a", location="f#0", detail="missing"),
    ],
    rf.DeliveryError: [
        rf.NotAddressableError(identity="a"),
        rf.NotWiredError(sender="a", target="b"),
        rf.PeerCycleError(cycle=("a", "b", "a"), method="m"),
        rf.UnknownHandlerError(identity="a", method="m", available=()),
        rf.InvalidArgumentsError(identity="a", method="m", detail="n: missing"),
        rf.HandlerError(identity="a", method="m", remote_type="builtins.ValueError", remote_message="no",
                        remote_traceback=""),
        rf.DeadlineExceededError(identity="a", method="m", timeout=1.0),
        rf.UnknownDeadLetterError(letter_id=3),
        rf.StaleSequenceError(identity="a", conversation="c", presented=1, current=2),
        rf.RetryableError("rate limited", retry_after=2.5),
        rf.RetryableError(),
    ],
    rf.TurnError: [
        rf.NonDeterminismError(identity="a", turn_id="t", position=2, journaled="step:fetch", requested="sleep:"),
        rf.StepOutcomeUnknownError(identity="a", turn_id="t", step="charge", step_key="a:t:1"),
        rf.StepValueError(identity="a", turn_id="t", step="charge", detail="cannot pickle a lock"),
        rf.TurnInterruptedError(identity="a", turn_id="t", by="cancel"),
        rf.AgentBusyError(identity="a", turn_id="t", status="SUSPENDED"),
        rf.WaitTimeoutError(identity="a", turn_id="t", waiting_for="signal:payment", timeout=600.0),
        rf.ApprovalConflictError(approval_id="x", status="APPROVED", decided_by="alice", version=2),
        rf.UnknownApprovalError(approval_id="x"),
        rf.UnknownTurnEventError(identity="a", turn_id="t", event_id="3.9", detail="it is an event of turn u"),
    ],
    rf.WorkflowError: [
        rf.StepFailedError(step="s1", detail="boom"),
        rf.BudgetExceededError(budget="tokens", ceiling=10, spent=12),
        rf.RunCancelledError(run_id="r"),
        rf.UnknownRunError(run_id="r"),
        rf.RunOwnedElsewhereError(run_id="r", owner="driver:x", expires_in=3.0),
        rf.StaleRunTokenError(run_id="r", presented=1, current=2),
    ],
    rf.ModelError: [
        rf.ModelRequestError(url=URL, status=401, body_excerpt="invalid api key"),
        rf.ModelResponseError(url=URL, detail="chat response is not JSON: '<html>'"),
        rf.ModelTimeoutError(url=URL, timeout=2.5),
        rf.ModelUnavailableError(url=URL, attempts=3, last_failure="HTTP 503: 'down'"),
    ],
    rf.LedgerError: [
        rf.LedgerUnavailableError(location="postgresql://u:***@db:5432/x", detail="connection refused"),
        rf.LedgerUnavailableError(location="postgresql://db/x", detail="reset", committed_unknown=True),
        rf.LedgerSchemaError(location="sqlite:///l.sqlite", found=9, known=2),
        rf.FleetMismatchError(ledger="sqlite:///l.sqlite", storage="/s", ledger_fleet=None, storage_fleet="f-1"),
        rf.FleetMismatchError(ledger="sqlite:///l.sqlite", storage="/s", ledger_fleet="f-2", storage_fleet="f-1"),
    ],
    rf.StorageError: [
        rf.StorageUnavailableError(root="/var/rayfleet", detail="[Errno 28] No space left on device"),
    ],
}
SUBSYSTEMS = tuple(LEAVES)
ROOT_LEAVES = [
    rf.InvalidSpecError("identity '' is empty", field="identity"),
    rf.FleetUnavailableError(detail="no hosts"),
    rf.FleetNotFoundError(missing="the storage /s holds no fleet (no fleet.json)", remedy="point it at the fleet's storage"),
    rf.InternalError(detail="a retry loop ended without an attempt"),
]
ALL_ERRORS = [error for leaves in LEAVES.values() for error in leaves] + ROOT_LEAVES


@pytest.mark.parametrize(("base", "error"), [(base, error) for base, leaves in LEAVES.items() for error in leaves])
def test_each_subsystem_base_catches_its_leaves_and_no_other_base_does(
    base: type[rf.RayfleetError], error: rf.RayfleetError
) -> None:
    with pytest.raises(base):
        raise error
    assert [other for other in SUBSYSTEMS if isinstance(error, other)] == [base]


@pytest.mark.parametrize("error", ROOT_LEAVES)
def test_root_leaves_belong_to_no_subsystem(error: rf.RayfleetError) -> None:
    assert isinstance(error, rf.RayfleetError)
    assert not isinstance(error, SUBSYSTEMS)


def test_every_error_class_is_in_the_tree_and_the_docstring() -> None:
    classes = {getattr(errors, name) for name in errors.__all__ if isinstance(getattr(errors, name), type)}
    assert classes == {type(error) for error in ALL_ERRORS} | set(SUBSYSTEMS) | {rf.RayfleetError}
    assert errors.__doc__ is not None
    for cls in classes:
        assert re.search(rf"\b{cls.__name__}\b", errors.__doc__), cls.__name__
        assert getattr(rf, cls.__name__) is cls  # exported at the top level too


@pytest.mark.parametrize("error", ALL_ERRORS, ids=lambda error: type(error).__name__)
def test_every_error_pickles_with_its_type_message_and_fields(error: rf.RayfleetError) -> None:
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error)
    assert str(copy) == str(error) == error.message
    assert copy._attributes == error._attributes
    for name, value in error._attributes.items():
        assert getattr(copy, name) == value


@pytest.mark.parametrize(
    ("error", "stdlib"),
    [
        (rf.UnknownIdentityError(identity="a"), KeyError),
        (rf.UnknownDeadLetterError(letter_id=3), KeyError),
        (rf.UnknownRunError(run_id="r"), KeyError),
        (rf.UnknownApprovalError(approval_id="x"), KeyError),
        (rf.UnknownTurnEventError(identity="a", turn_id="t", event_id="x", detail="not an id"), ValueError),
        (rf.InvalidSpecError("bad", field="x"), ValueError),
        (rf.ModelResponseError(url=URL, detail="bad"), ValueError),
        (rf.DeadlineExceededError(identity="a", method="m", timeout=1.0), TimeoutError),
        (rf.ModelTimeoutError(url=URL, timeout=1.0), TimeoutError),
        (rf.UsageError("no", api="x"), RuntimeError),
        (rf.NotInAgentContextError(attribute="fencing_token"), RuntimeError),
        (rf.UnknownHandlerError(identity="a", method="m", available=()), AttributeError),
        (rf.InvalidArgumentsError(identity="a", method="m", detail="d"), TypeError),
    ],
)
def test_stdlib_bases_keep_str_equal_to_the_message(error: rf.RayfleetError, stdlib: type[Exception]) -> None:
    assert isinstance(error, stdlib)
    # KeyError.__str__ would quote the message; the tree keeps it plain.
    assert str(error) == error.message and not str(error).startswith(("'", '"'))
    copy = pickle.loads(pickle.dumps(error))
    assert isinstance(copy, stdlib) and str(copy) == error.message


def test_new_errors_keep_their_typed_fields() -> None:
    assert rf.UnknownDeadLetterError(letter_id=7).letter_id == 7
    assert rf.UnknownRunError(run_id="r-1").run_id == "r-1"
    request = rf.ModelRequestError(url=URL, status=400, body_excerpt="bad param")
    assert (request.url, request.status, request.body_excerpt) == (URL, 400, "bad param")
    response = rf.ModelResponseError(url=URL, detail="no choices[0]")
    assert (response.url, response.detail) == (URL, "no choices[0]")
    timeout = rf.ModelTimeoutError(url=URL, timeout=2.5)
    assert (timeout.url, timeout.timeout) == (URL, 2.5)
    gave_up = rf.ModelUnavailableError(url=URL, attempts=3, last_failure="HTTP 503")
    assert (gave_up.url, gave_up.attempts, gave_up.last_failure) == (URL, 3, "HTTP 503")
    assert rf.UsageError("m", api="fleet.run()").api == "fleet.run()"
    context = rf.NotInAgentContextError(attribute="identity")
    assert (context.api, context.attribute) == ("self.identity", "identity")
    assert rf.InternalError(detail="d").detail == "d"


def test_invalid_spec_error_names_its_field() -> None:
    error = rf.InvalidSpecError("timeout must be positive", field="timeout")
    assert error.field == "timeout" and error._attributes == {"field": "timeout"}
    assert pickle.loads(pickle.dumps(error)).field == "timeout"


@pytest.mark.parametrize(
    ("error", "fix"),
    [
        (rf.UnknownDeadLetterError(letter_id=7), "fleet.dead_letters()"),
        (rf.UnknownRunError(run_id="r-1"), "fleet.runs.list_runs()"),
        (rf.ModelRequestError(url=URL, status=401, body_excerpt="x"), "Check the api key"),
        (rf.ModelResponseError(url=URL, detail="x"), "OpenAI chat completions API"),
        (rf.ModelTimeoutError(url=URL, timeout=1.0), "timeout="),
        (rf.ModelUnavailableError(url=URL, attempts=2, last_failure="x"), "raise max_retries"),
        (rf.InternalError(detail="x"), "please report it"),
        (rf.FleetNotFoundError(missing="no cluster", remedy="start one with ray start"), "start one with ray start"),
        (rf.NotInAgentContextError(attribute="identity"), "fleet.spawn()"),
    ],
)
def test_messages_say_what_was_wrong_and_name_the_fix(error: rf.RayfleetError, fix: str) -> None:
    assert fix in str(error)


def test_model_errors_name_the_url_not_an_identity() -> None:
    for error in LEAVES[rf.ModelError]:
        assert URL in str(error)
        assert "fleet.status" not in str(error)


@pytest.mark.parametrize(
    ("error", "direct", "through_fleet"),
    [
        (rf.RetryableError("busy"), True, True),
        (TimeoutError(), True, True),
        (rf.DeadlineExceededError(identity="a", method="m", timeout=1.0), True, True),
        (rf.ModelTimeoutError(url=URL, timeout=1.0), True, True),
        (ConnectionRefusedError(), True, True),
        (rf.StorageUnavailableError(root="/s", detail="[Errno 30] Read-only file system"), True, True),
        (rf.LedgerUnavailableError(location="sqlite:///l.sqlite", detail="database is locked"), True, True),
        (ValueError("no"), False, False),
        (rf.StepFailedError(step="s", detail="d"), False, False),
        (rf.HandlerError(identity="a", method="m", remote_type="rayfleet.errors.RetryableError", remote_message="",
                         remote_traceback=""), False, True),
        (rf.HandlerError(identity="a", method="m", remote_type="builtins.ValueError", remote_message="",
                         remote_traceback=""), False, False),
    ],
)
def test_is_retryable(error: BaseException, direct: bool, through_fleet: bool) -> None:
    assert is_retryable(error) is direct
    assert is_retryable(error, handler_failures=True) is through_fleet
