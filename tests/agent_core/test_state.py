"""The immutable state: changes return new objects; accessors read step results."""

from __future__ import annotations

import dataclasses

import pytest

from agent_core.continuation import ContinuationOutcome, StopReason
from agent_core.state import AgentState, AgentStatus, ExecutionDecision, ExecutionState
from agent_core.steps import StepExecution, StepResult
from tests.support.factories import T0, final_step, state_after, tool_step


def test_state_is_frozen_and_changes_return_new_states() -> None:
    state = AgentState(agent_id="a")
    changed = state.with_user_message("hi").with_metadata("k", 1)
    assert state.messages == ()
    assert dict(state.metadata) == {}
    assert changed.metadata["k"] == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        state.status = AgentStatus.FAILED  # type: ignore[misc]
    with pytest.raises(TypeError):
        changed.metadata["k"] = 2  # type: ignore[index]


def test_step_results_are_generic_step_results() -> None:
    state = state_after([tool_step("a"), final_step("b")])
    results = state.step_results()
    assert all(isinstance(r, StepResult) and isinstance(r, StepExecution) for r in results)
    assert state.last_step_result() is results[-1]
    assert [s.id for s in state.steps()] == ["a", "b"]
    assert state.continuation_outcome() == ContinuationOutcome(should_continue=True)
    assert state.stop_reason() is None


def test_stop_reason_prefers_the_stop_being_decided() -> None:
    state = state_after([final_step()]).begin_step(T0)
    stopping = state.with_stop_requested(StopReason.STEPS_LIMIT)
    assert stopping.stop_reason() is StopReason.STEPS_LIMIT
    assert stopping.decision() is ExecutionDecision.STOP
    prevented = stopping.with_stop_prevented("one more")
    assert prevented.is_stop_prevented()
    assert prevented.decision_reason() == "one more"


def test_tool_call_decisions_reset_with_each_pending_call() -> None:
    state = state_after([]).begin_step(T0)
    call = tool_step().tool_calls[0]
    blocked = state.with_pending_tool_call(call).with_tool_call_blocked("no")
    assert blocked.is_tool_call_blocked()
    assert not blocked.with_pending_tool_call(call).is_tool_call_blocked()


def test_transient_changes_need_an_execution() -> None:
    with pytest.raises(RuntimeError, match="no execution in progress"):
        AgentState().with_tool_call_blocked("x")


def test_record_step_counts_the_pending_step_until_its_result_is_stored() -> None:
    state = state_after([tool_step("a")]).begin_step(T0, "b")
    transition = state.record_step(final_step("b", tokens=5))
    assert transition.execution_step_count() == 2
    assert transition.step_count() == 1
    assert transition.usage.total == 15
    assert transition.current_step() == final_step("b", tokens=5)


def test_execution_time_accrues_only_while_running() -> None:
    from datetime import timedelta

    execution = ExecutionState().start(T0, "r1").end(T0 + timedelta(seconds=10))
    resumed = execution.start(T0 + timedelta(days=1), "r2")
    later = T0 + timedelta(days=1, seconds=5)
    assert resumed.cumulative_seconds_at(later) == 15
    assert (resumed.run_count, resumed.started_at, resumed.is_running) == (2, T0, True)
