"""Built-in criteria: each one's decision on both sides of its boundary."""

from __future__ import annotations

import pytest

from agent_core.continuation import ContinuationDecision, StopReason
from agent_core.criteria import (
    CumulativeExecutionTimeLimit,
    ErrorPresenceCheck,
    ExecutionTimeLimit,
    FinishReasonCheck,
    ResponseContentCheck,
    RetryLimit,
    StepsLimit,
    TokenUsageLimit,
    ToolCallPresenceCheck,
)
from agent_core.errors import ErrorType
from agent_core.messages import FinishReason
from agent_core.state import AgentState
from tests.support.factories import (
    T0,
    ManualClock,
    error_step,
    final_step,
    judged,
    state_after,
    tool_step,
)

F, A, R, S = (
    ContinuationDecision.FORBID,
    ContinuationDecision.ALLOW,
    ContinuationDecision.REQUEST,
    ContinuationDecision.STOP,
)


def steps(n: int) -> AgentState:
    """A transition state judging step ``n`` (``n - 1`` recorded, one pending)."""
    return judged([tool_step(f"s{i}") for i in range(1, n)], tool_step(f"s{n}"))


@pytest.mark.parametrize(("step", "decision"), [(1, A), (19, A), (20, F), (21, F)])
def test_steps_limit_boundary(step: int, decision: ContinuationDecision) -> None:
    evaluation = StepsLimit(20).evaluate(steps(step))
    assert evaluation.decision is decision
    if decision is F:
        assert evaluation.stop_reason is StopReason.STEPS_LIMIT
        assert evaluation.reason == (
            f"StepsLimit forbade continuation: step {step} reached limit 20"
        )


def test_steps_limit_counts_only_the_current_execution() -> None:
    """A resumed conversation gets a fresh step budget."""
    earlier = state_after([tool_step(f"s{i}") for i in range(5)], execution_id="run-1")
    resumed = earlier.start_execution(T0, "run-2").begin_step(T0).record_step(tool_step("n"))
    assert resumed.execution_step_count() == 1
    assert StepsLimit(2).evaluate(resumed).decision is A


def test_steps_limit_rejects_a_non_positive_limit() -> None:
    with pytest.raises(ValueError, match="max_steps must be positive, got 0"):
        StepsLimit(0)


@pytest.mark.parametrize(("tokens", "decision"), [(99, A), (100, F), (101, F)])
def test_token_usage_limit_boundary(tokens: int, decision: ContinuationDecision) -> None:
    state = judged([tool_step("a", tokens=50)], tool_step("b", tokens=tokens - 50))
    evaluation = TokenUsageLimit(100).evaluate(state)
    assert evaluation.decision is decision
    assert evaluation.stop_reason is (StopReason.TOKEN_LIMIT if decision is F else None)


@pytest.mark.parametrize(("seconds", "decision"), [(0, A), (299.9, A), (300, F), (301, F)])
def test_execution_time_limit_boundary(seconds: float, decision: ContinuationDecision) -> None:
    clock = ManualClock()
    limit = ExecutionTimeLimit(300, clock=clock)
    limit.execution_started(clock())
    clock.advance(seconds)
    evaluation = limit.evaluate(steps(1))
    assert evaluation.decision is decision
    assert evaluation.stop_reason is (StopReason.TIME_LIMIT if decision is F else None)


def test_execution_time_limit_allows_before_it_is_started() -> None:
    assert ExecutionTimeLimit(1, clock=ManualClock()).evaluate(steps(1)).decision is A


@pytest.mark.parametrize(("run2", "decision"), [(4.9, A), (5, F)])
def test_cumulative_time_limit_adds_earlier_runs(
    run2: float, decision: ContinuationDecision
) -> None:
    """10 s in a finished run plus the running one, against a 15 s limit."""
    clock = ManualClock()
    state = AgentState().start_execution(clock(), "r1")
    clock.advance(10)
    state = state.end_execution(clock(), state.status)
    clock.advance(3600)  # paused time does not count
    state = state.start_execution(clock(), "r2")
    clock.advance(run2)
    evaluation = CumulativeExecutionTimeLimit(15, clock=clock).evaluate(state)
    assert evaluation.decision is decision


@pytest.mark.parametrize(("failures", "decision"), [(0, A), (1, A), (2, A), (3, F)])
def test_retry_limit_counts_trailing_failed_steps(
    failures: int, decision: ContinuationDecision
) -> None:
    previous = [error_step("e0"), final_step("ok")] + [
        error_step(f"e{i}") for i in range(1, failures)
    ]
    pending = error_step("last") if failures else final_step("last")
    state = judged(previous, pending)
    assert state.trailing_failed_steps() == failures
    evaluation = RetryLimit(2).evaluate(state)
    assert evaluation.decision is decision
    assert evaluation.stop_reason is (StopReason.RETRY_LIMIT if decision is F else None)


def test_error_presence_check() -> None:
    assert ErrorPresenceCheck().evaluate(judged([], final_step())).decision is A
    evaluation = ErrorPresenceCheck().evaluate(judged([], error_step(error_type=ErrorType.MODEL)))
    assert (evaluation.decision, evaluation.stop_reason) == (F, StopReason.ERROR)
    assert "model error: model went wrong" in evaluation.reason


@pytest.mark.parametrize(
    ("finish", "decision"),
    [(FinishReason.STOP, F), (FinishReason.LENGTH, F), (FinishReason.TOOL_CALLS, A)],
)
def test_finish_reason_check(finish: FinishReason, decision: ContinuationDecision) -> None:
    step = final_step()
    step = type(step)(id="x", content="hi", finish_reason=finish)
    evaluation = FinishReasonCheck(["stop", FinishReason.LENGTH]).evaluate(judged([], step))
    assert evaluation.decision is decision
    assert evaluation.stop_reason is (StopReason.FINISH_REASON if decision is F else None)


def test_finish_reason_check_needs_reasons() -> None:
    with pytest.raises(ValueError, match="at least one finish reason"):
        FinishReasonCheck([])


def test_tool_call_presence_check() -> None:
    check = ToolCallPresenceCheck()
    assert check.evaluate(AgentState().start_execution(T0)).decision is A
    assert check.evaluate(judged([], tool_step())).decision is R
    assert check.evaluate(judged([tool_step()], final_step())).decision is S


def test_response_content_check() -> None:
    check = ResponseContentCheck(lambda text: text.endswith("..."))
    assert check.evaluate(AgentState().start_execution(T0)).decision is A
    assert check.evaluate(judged([], final_step(content="more..."))).decision is R
    assert check.evaluate(judged([], final_step(content="the end"))).decision is S


def test_work_drivers_judge_only_the_current_execution() -> None:
    """After a finished run, the next run's first check is not a stale stop."""
    finished = state_after([final_step()], execution_id="run-1")
    resumed = finished.start_execution(T0, "run-2")
    assert ToolCallPresenceCheck().evaluate(resumed).decision is A
