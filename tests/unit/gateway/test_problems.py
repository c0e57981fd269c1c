"""How rayfleet errors and validation failures read over HTTP."""

from __future__ import annotations

import json

import pydantic
import pytest

import rayfleet as rf
from rayfleet.gateway._models import ListAgentsQuery
from rayfleet.gateway._problems import HttpProblem, problem_for, validation_problem
from rayfleet.roster import RosterFile


@pytest.mark.parametrize(("error", "status", "field"), [
    (rf.UnknownIdentityError(identity="a/b"), 404, "identity"),
    (rf.UnknownRunError(run_id="r-1"), 404, "run_id"),
    (rf.UnknownDeadLetterError(letter_id=7), 404, "letter_id"),
    (rf.UnknownHandlerError(identity="a", method="nope", available=("add",)), 404, "method"),
    (rf.InvalidArgumentsError(identity="a", method="add", detail="n is missing"), 400, "body"),
    (rf.InvalidSpecError("bad labels", field="labels"), 400, "labels"),
    (rf.NotAddressableError(identity="a"), 403, "identity"),
    (rf.DeadlineExceededError(identity="a", method="add", timeout=1.0), 504, "timeout"),
    (rf.RunOwnedElsewhereError(run_id="r", owner="driver:x", expires_in=3.0), 409, "run_id"),
    (rf.FleetUnavailableError(detail="no host"), 503, None),
    (rf.LedgerUnavailableError(location="pg", detail="down"), 503, None),
    (rf.InternalError(detail="broken invariant"), 500, None),
])
def test_rayfleet_errors_map_to_statuses(error: rf.RayfleetError, status: int, field: str | None) -> None:
    problem = problem_for(error)
    assert (problem.status, problem.field) == (status, field)
    assert problem.body() == {"error": {"type": type(error).__name__, "message": error.message, "field": field}}


def test_retryable_failures_say_when_to_retry() -> None:
    for error in (rf.FleetUnavailableError(detail="no host"), rf.StorageUnavailableError(root="/s", detail="full"),
                  rf.DeadlineExceededError(identity="a", method="m", timeout=2.0)):
        assert problem_for(error).headers["Retry-After"] == "1"
    assert "Retry-After" not in problem_for(rf.UnknownIdentityError(identity="a")).headers


def test_a_handler_error_leaves_without_its_traceback() -> None:
    error = rf.HandlerError(identity="bank/main", method="charge", remote_type="builtins.ValueError",
                            remote_message="card declined", remote_traceback='Traceback (most recent call last):\n'
                            '  File "/secret/path/agents.py", line 3\nValueError: card declined')
    problem = problem_for(error)
    assert problem.status == 502
    text = json.dumps(problem.body())
    assert "card declined" in text and "ValueError" in text
    assert "Traceback" not in text and "/secret/path" not in text


def test_validation_errors_name_the_field() -> None:
    with pytest.raises(pydantic.ValidationError) as caught:
        RosterFile.model_validate({"agents": [{"identity": "a", "agent": "x:Y"}, {"identity": 5, "agent": "x:Y"}]})
    problem = validation_problem(caught.value)
    assert (problem.status, problem.type, problem.field) == (400, "ValidationError", "agents.1.identity")
    assert "agents.1.identity" in problem.message


def test_validation_lists_at_most_five_problems() -> None:
    with pytest.raises(pydantic.ValidationError) as caught:
        RosterFile.model_validate({"agents": [{"identity": i} for i in range(10)]})
    problem = validation_problem(caught.value)
    assert "more problem(s)" in problem.message
    assert problem.field == "agents.0.identity"


def test_unknown_query_parameters_are_refused_by_the_models() -> None:
    with pytest.raises(pydantic.ValidationError) as caught:
        ListAgentsQuery.model_validate({"limt": "5"})
    assert validation_problem(caught.value).field == "limt"


def test_problem_is_an_exception_with_the_json_body() -> None:
    problem = HttpProblem(415, "UnsupportedMediaType", "send JSON", field="Content-Type")
    assert problem.body() == {"error": {"type": "UnsupportedMediaType", "message": "send JSON",
                                        "field": "Content-Type"}}
