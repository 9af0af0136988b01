"""Agent outcomes that never mislead (issue 14): errors win the final status, a stop
prevention never overrides a forbid, every stop names who decided it, a stop before
step 1 is visible, step numbers keep counting, transient data is transient and state
data is read-only."""

from __future__ import annotations

from datetime import timedelta

import pytest

from agent_core.builder import AgentBuilder
from agent_core.continuation import (
    ContinuationDecision,
    ContinuationEvaluation,
    ContinuationOutcome,
    StopReason,
)
from agent_core.drivers.scripted import ScriptedFailure, call
from agent_core.error_policy import ErrorPolicy
from agent_core.errors import ModelError
from agent_core.events import ContinuationEvaluated, ExecutionCompleted, ExecutionFailed
from agent_core.hooks import HookPoint
from agent_core.messages import Message, ToolCall
from agent_core.slim import SlimAgentStateSerializer
from agent_core.state import AgentState, AgentStatus, ExecutionState
from tests.support.factories import MATH, T0, Run, calls, say

F, A, R, S = (
    ContinuationDecision.FORBID,
    ContinuationDecision.ALLOW,
    ContinuationDecision.REQUEST,
    ContinuationDecision.STOP,
)


def forbids(state: AgentState) -> list[tuple[str, StopReason | None]]:
    outcome = state.continuation_outcome()
    assert outcome is not None
    return [(e.criterion, e.stop_reason) for e in outcome.evaluations if e.decision is F]


def failed_event(run: Run) -> ExecutionFailed:
    (event,) = run.of(ExecutionFailed)
    assert isinstance(event, ExecutionFailed)
    return event


# --- 1. errors win the final status ----------------------------------------------


async def test_a_model_error_on_the_last_allowed_step_fails_the_run() -> None:
    run = Run([ScriptedFailure(ModelError("the model is down"))], AgentBuilder().with_max_steps(1))
    state = await run()
    assert (state.status, state.stop_reason()) == (AgentStatus.FAILED, StopReason.ERROR)
    assert forbids(state) == [
        ("StepsLimit", StopReason.STEPS_LIMIT),
        ("ErrorPolicyCriterion", StopReason.ERROR),
    ]
    outcome = state.continuation_outcome()
    assert outcome is not None
    assert (outcome.stop_reason, outcome.resolved_by) == (StopReason.ERROR, "ErrorPolicyCriterion")
    assert failed_event(run).error_message == "the model is down"
    assert state.error_message() == "the model is down"


async def test_a_tool_error_on_the_last_allowed_step_fails_the_run() -> None:
    divide = calls(call("calculator", "c", expression="1/0"))
    run = Run([divide, say("never")], AgentBuilder().with_max_steps(1))
    state = await run()
    assert (state.status, state.stop_reason()) == (AgentStatus.FAILED, StopReason.ERROR)
    message = failed_event(run).error_message
    assert message is not None
    assert "calculator" in message
    assert "ZeroDivisionError" in message


async def test_a_retry_that_a_limit_forbids_leaves_the_error_standing() -> None:
    """The policy would retry, but the step budget is spent: the run fails."""
    builder = AgentBuilder().with_max_steps(1).with_error_policy(ErrorPolicy.retry_all(3))
    run = Run([ScriptedFailure(ModelError("blip")), say("never")], builder)
    state = await run()
    assert (state.status, state.stop_reason()) == (AgentStatus.FAILED, StopReason.ERROR)
    outcome = state.continuation_outcome()
    assert outcome is not None
    assert outcome.resolved_by == "ErrorPolicyCriterion"


async def test_an_ignored_error_on_the_last_step_does_not_fail_the_run() -> None:
    divide = calls(call("calculator", "c", expression="1/0"))
    builder = AgentBuilder().with_max_steps(1).with_error_policy(ErrorPolicy.ignore_tool_errors())
    state = await Run([divide, say("never")], builder)()
    assert (state.status, state.stop_reason()) == (AgentStatus.COMPLETED, StopReason.STEPS_LIMIT)


def test_errors_win_over_limits_in_one_evaluation() -> None:
    limit = ContinuationEvaluation("StepsLimit", F, "limit", stop_reason=StopReason.STEPS_LIMIT)
    tokens = ContinuationEvaluation("TokenUsageLimit", F, "tok", stop_reason=StopReason.TOKEN_LIMIT)
    error = ContinuationEvaluation("ErrorCheck", F, "boom", stop_reason=StopReason.ERROR)
    outcome = ContinuationOutcome.from_evaluations((limit, tokens, error))
    assert (outcome.stop_reason, outcome.resolved_by) == (StopReason.ERROR, "ErrorCheck")
    without = ContinuationOutcome.from_evaluations((limit, tokens))
    assert (without.stop_reason, without.resolved_by) == (StopReason.STEPS_LIMIT, "StepsLimit")


# --- 2. stop prevention never overrides a forbid ------------------------------------


async def test_a_hook_that_always_prevents_the_stop_cannot_pass_the_step_limit() -> None:
    def keep_going(state: AgentState) -> AgentState:
        return state.with_stop_prevented("more!").with_user_message("Go on.")

    builder = AgentBuilder().with_max_steps(3).with_hook(HookPoint.BEFORE_STOP, keep_going)
    run = Run([say(f"answer {n}") for n in range(60)], builder)
    state = await run()
    assert len(state.step_results()) == 3
    assert (state.status, state.stop_reason()) == (AgentStatus.COMPLETED, StopReason.STEPS_LIMIT)
    assert run.driver.remaining == 57


async def test_a_hook_cannot_prevent_a_stop_forbidden_before_the_first_step() -> None:
    def keep_going(state: AgentState) -> AgentState:
        return state.with_stop_prevented("more!")

    builder = (
        AgentBuilder()
        .with_criteria(lambda state: ContinuationDecision.FORBID)
        .with_hook(HookPoint.BEFORE_STOP, keep_going)
    )
    run = Run([say("never")], builder)
    state = await run()
    assert (state.step_count(), state.stop_reason()) == (0, StopReason.GUARD)
    assert run.driver.remaining == 1


# --- 3. every stop names who decided it ----------------------------------------------


async def test_a_normal_completion_is_resolved_by_the_tool_call_check() -> None:
    state = await Run([calls(MATH), say("42")])()
    outcome = state.continuation_outcome()
    assert outcome is not None
    assert outcome.summary() == {
        "should_continue": False,
        "stop_reason": "completed",
        "resolved_by": "ToolCallPresenceCheck",
    }


@pytest.mark.parametrize(
    ("decisions", "resolved_by"),
    [
        ((A, S, S), "C1"),
        ((S, A), "C0"),
        ((A, A), "aggregate"),
        ((), "aggregate"),
    ],
)
def test_aggregate_only_when_no_single_criterion_decided(
    decisions: tuple[ContinuationDecision, ...], resolved_by: str
) -> None:
    outcome = ContinuationOutcome.from_evaluations(
        ContinuationEvaluation(f"C{i}", d, "because") for i, d in enumerate(decisions)
    )
    assert outcome.resolved_by == resolved_by


# --- 4. a stop before step 1 is visible ----------------------------------------------


async def test_a_raising_criterion_before_step_one_is_recorded_and_emitted() -> None:
    def broken(state: AgentState) -> bool:
        raise RuntimeError("bad criterion")

    run = Run([say("never")], AgentBuilder().with_criteria(broken))
    state = await run()
    outcome = state.continuation_outcome()
    assert outcome is not None
    assert (outcome.stop_reason, outcome.resolved_by) == (StopReason.ERROR, "broken")
    (event,) = run.of(ContinuationEvaluated)
    assert isinstance(event, ContinuationEvaluated)
    assert (event.step_number, event.outcome) == (0, outcome)
    assert (state.status, state.stop_reason()) == (AgentStatus.FAILED, StopReason.ERROR)
    assert failed_event(run).error_message == "broken raised RuntimeError: bad criterion"


async def test_an_exhausted_cumulative_time_limit_stops_before_step_one_visibly() -> None:
    spent = AgentState(execution=ExecutionState(cumulative_seconds=11.0)).with_user_message("hi")
    run = Run([say("never")], AgentBuilder().with_cumulative_time_limit(10))
    final = await run(spent)
    outcome = final.continuation_outcome()
    assert outcome is not None
    assert (outcome.stop_reason, outcome.resolved_by) == (
        StopReason.TIME_LIMIT,
        "CumulativeExecutionTimeLimit",
    )
    events = [e for e in run.of(ContinuationEvaluated) if isinstance(e, ContinuationEvaluated)]
    assert [e.step_number for e in events] == [0]
    assert (final.status, final.stop_reason()) == (AgentStatus.COMPLETED, StopReason.TIME_LIMIT)
    completed = run.of(ExecutionCompleted)
    assert (len(completed), run.driver.remaining) == (1, 1)


# --- 5. step numbers keep counting across runs ----------------------------------------


async def test_step_numbers_continue_in_the_next_run_while_the_budget_is_fresh() -> None:
    run = Run([calls(MATH), say("42"), calls(MATH), say("Still 42.")], AgentBuilder())
    first = await run()
    second = await run(first.with_user_message("Again?"))
    assert [r.step_number for r in second.step_results()] == [1, 2, 3, 4]
    assert second.execution_step_count() == 2


async def test_step_numbers_continue_after_a_slim_snapshot() -> None:
    serializer = SlimAgentStateSerializer()
    first = await Run([calls(MATH), say("42")])()
    restored = serializer.deserialize(serializer.serialize(first))
    assert restored.step_count() == 2
    second = await Run([say("again")])(restored.with_user_message("Again?"))
    assert [r.step_number for r in second.step_results()] == [3]
    assert serializer.serialize(second)["step_count"] == 3


# --- 6. transient data is transient; state data is read-only ---------------------------


async def test_the_current_execution_is_cleared_when_a_run_ends() -> None:
    state = await Run([calls(MATH), say("42")])()
    assert state.current_execution is None
    assert "current_execution" not in state.to_dict()
    assert state.stop_reason() is StopReason.COMPLETED


def test_message_metadata_cannot_be_changed_in_place() -> None:
    message = Message(role="user", content="hi", metadata={"tags": ["a"], "extra": {"k": 1}})
    with pytest.raises(TypeError, match="read-only"):
        message.metadata["new"] = 1  # type: ignore[index]
    with pytest.raises(TypeError, match="read-only"):
        message.metadata["tags"].append("b")
    with pytest.raises(TypeError, match="read-only"):
        message.metadata["extra"]["k"] = 2
    assert message.model_dump(mode="json")["metadata"] == {"tags": ["a"], "extra": {"k": 1}}


def test_tool_call_arguments_cannot_be_changed_in_place() -> None:
    tool_call = ToolCall(id="c", name="calculator", arguments={"expression": "1+1", "xs": [1]})
    with pytest.raises(TypeError, match="read-only"):
        tool_call.arguments["expression"] = "2+2"  # type: ignore[index]
    with pytest.raises(TypeError, match="read-only"):
        tool_call.arguments["xs"].append(2)
    changed = tool_call.model_copy(update={"arguments": {"expression": "2+2"}})
    with pytest.raises(TypeError, match="read-only"):
        changed.arguments.clear()
    assert ToolCall.model_validate(tool_call.model_dump(mode="json")) == tool_call


def test_evaluation_context_cannot_be_changed_in_place() -> None:
    evaluation = ContinuationEvaluation("C", A, "ok", {"step": 1, "seen": [1]})
    with pytest.raises(TypeError, match="read-only"):
        evaluation.context["step"] = 2  # type: ignore[index]
    with pytest.raises(TypeError, match="read-only"):
        evaluation.context["seen"].append(2)
    assert ContinuationEvaluation.from_dict(evaluation.to_dict()) == evaluation


def test_state_metadata_values_cannot_be_changed_in_place() -> None:
    state = AgentState(metadata={"tags": ["a"]})
    with pytest.raises(TypeError, match="read-only"):
        state.metadata["tags"].append("b")
    assert state.with_metadata("tags", ["a", "b"]).metadata["tags"] == ["a", "b"]
    assert state.start_execution(T0 + timedelta(seconds=1)).metadata == {"tags": ["a"]}
