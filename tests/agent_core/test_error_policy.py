"""Error policies: presets, the policy criterion and the error handler."""

from __future__ import annotations

import pytest

from agent_core.continuation import ContinuationCriteria, ContinuationDecision, StopReason
from agent_core.criteria import StepsLimit, ToolCallPresenceCheck
from agent_core.error_policy import (
    ErrorAction,
    ErrorHandler,
    ErrorPolicy,
    ErrorPolicyCriterion,
)
from agent_core.errors import ErrorType, ModelError, RateLimitError
from agent_core.state import AgentState, AgentStatus
from tests.support.factories import T0, error_step, final_step, judged, state_after, tool_step

F, A, R = ContinuationDecision.FORBID, ContinuationDecision.ALLOW, ContinuationDecision.REQUEST


@pytest.mark.parametrize(
    ("policy", "error_type", "decision"),
    [
        (ErrorPolicy.stop_on_any_error(), ErrorType.TOOL, F),
        (ErrorPolicy.stop_on_any_error(), ErrorType.RATE_LIMIT, F),
        (ErrorPolicy.retry_tool_errors(2), ErrorType.TOOL, R),
        (ErrorPolicy.retry_tool_errors(2), ErrorType.VALIDATION, R),
        (ErrorPolicy.retry_tool_errors(2), ErrorType.MODEL, F),
        (ErrorPolicy.ignore_tool_errors(), ErrorType.TOOL, A),
        (ErrorPolicy.ignore_tool_errors(), ErrorType.VALIDATION, A),
        (ErrorPolicy.ignore_tool_errors(), ErrorType.TIMEOUT, F),
        (ErrorPolicy.retry_all(2), ErrorType.UNKNOWN, R),
        (ErrorPolicy.retry_all(2), ErrorType.RATE_LIMIT, R),
    ],
)
def test_presets_per_error_type(
    policy: ErrorPolicy, error_type: ErrorType, decision: ContinuationDecision
) -> None:
    evaluation = ErrorPolicyCriterion(policy).evaluate(
        judged([], error_step(error_type=error_type))
    )
    assert evaluation.decision is decision
    # a stop, and a retry that a guard may forbid, both stop the run for the error
    assert evaluation.stop_reason is (StopReason.ERROR if decision in (F, R) else None)


def test_no_errors_allows() -> None:
    evaluation = ErrorPolicyCriterion().evaluate(judged([], final_step()))
    assert evaluation.decision is A


@pytest.mark.parametrize(("failures", "decision"), [(1, R), (2, R), (3, F)])
def test_retries_are_bounded_by_consecutive_failures(
    failures: int, decision: ContinuationDecision
) -> None:
    previous = [error_step(f"e{i}", ErrorType.MODEL) for i in range(failures - 1)]
    state = judged(previous, error_step("last", ErrorType.MODEL))
    evaluation = ErrorPolicyCriterion(ErrorPolicy.retry_all(2)).evaluate(state)
    assert evaluation.decision is decision
    if decision is F:
        assert (
            "3 failed steps in a row exhaust the 2 retries of policy retry_all" in evaluation.reason
        )


def test_strictest_action_wins_across_a_steps_errors() -> None:
    step = error_step("x", ErrorType.TOOL)
    step = type(step)(id="x", errors=(*step.errors, *error_step("y", ErrorType.MODEL).errors))
    evaluation = ErrorPolicyCriterion(ErrorPolicy.ignore_tool_errors()).evaluate(judged([], step))
    assert evaluation.decision is F


def test_invalid_action_is_rejected() -> None:
    with pytest.raises(
        ValueError, match="action for tool errors must be one of ignore, retry, stop"
    ):
        ErrorPolicy("bad", tool="explode")  # type: ignore[arg-type]
    assert ErrorPolicy.retry_all(1).action_for(ErrorType.MODEL) is ErrorAction.RETRY


def test_handler_builds_a_failure_step_that_fails_the_run() -> None:
    criteria = ContinuationCriteria[AgentState](
        StepsLimit(20), ErrorPolicyCriterion(), ToolCallPresenceCheck()
    )
    state = state_after([tool_step("a")]).begin_step(T0, "b")
    handler = ErrorHandler(criteria)
    handling = handler.handle(ModelError("upstream 500"), state)
    assert handling.final_status is AgentStatus.FAILED
    assert handling.outcome.stop_reason is StopReason.ERROR
    assert handling.outcome.resolved_by == "ErrorPolicyCriterion"
    assert handling.failure_step.id == "b"
    assert handling.failure_step.errors[0].message == "upstream 500"


def test_handler_retries_under_a_retry_policy() -> None:
    criteria = ContinuationCriteria[AgentState](
        ErrorPolicyCriterion(ErrorPolicy.retry_all(1)), ToolCallPresenceCheck()
    )
    state = state_after([]).begin_step(T0)
    handling = ErrorHandler(criteria).handle(RateLimitError("slow down"), state)
    assert handling.outcome.should_continue
    assert handling.final_status is AgentStatus.IN_PROGRESS


def test_handler_applies_its_policy_when_criteria_ignore_errors() -> None:
    """An error can never end a run as completed just because no criterion judged it."""
    criteria = ContinuationCriteria[AgentState](StepsLimit(20), ToolCallPresenceCheck())
    state = state_after([]).begin_step(T0)
    handling = ErrorHandler(criteria).handle(ModelError("boom"), state)
    assert handling.final_status is AgentStatus.FAILED
    assert handling.outcome.evaluations[-1].criterion == "ErrorPolicyCriterion"
