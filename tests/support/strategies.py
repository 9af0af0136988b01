"""Hypothesis strategies for arbitrary agent states."""

from __future__ import annotations

from datetime import UTC
from typing import Any

from hypothesis import strategies as st

from agent_core.continuation import (
    ContinuationDecision,
    ContinuationEvaluation,
    ContinuationOutcome,
    StopReason,
)
from agent_core.errors import AgentError, ErrorType
from agent_core.messages import FinishReason, Message, Role, ToolCall, Usage
from agent_core.state import (
    AgentState,
    AgentStatus,
    CurrentExecution,
    ExecutionDecision,
    ExecutionState,
)
from agent_core.steps import AgentStep, StepError, StepExecution, ToolExecution

text = st.text(max_size=20)
ids = st.text(min_size=1, max_size=12)
moments = st.datetimes(timezones=st.just(UTC))
counts = st.integers(min_value=0, max_value=10**9)

json_values: st.SearchStrategy[Any] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53), max_value=2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | text,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(text, children, max_size=3),
    max_leaves=8,
)
json_objects = st.dictionaries(text, json_values, max_size=3)

usages = st.builds(Usage, prompt=counts, completion=counts, total=counts)
tool_calls = st.builds(ToolCall, id=ids, name=ids, arguments=json_objects)
messages = st.builds(
    Message,
    role=st.sampled_from(Role),
    content=text,
    tool_calls=st.lists(tool_calls, max_size=2).map(tuple),
    tool_call_id=st.none() | ids,
    name=st.none() | ids,
    metadata=json_objects,
)
step_errors = st.builds(
    StepError,
    error_type=st.sampled_from(ErrorType),
    message=text,
    tool_name=st.none() | ids,
    tool_call_id=st.none() | ids,
)
tool_executions = st.builds(
    ToolExecution,
    tool_call=tool_calls,
    output=text,
    started_at=moments,
    completed_at=moments,
    error=st.none() | step_errors,
    blocked=st.booleans(),
)
steps = st.builds(
    AgentStep,
    id=ids,
    content=text,
    tool_calls=st.lists(tool_calls, max_size=2).map(tuple),
    tool_executions=st.lists(tool_executions, max_size=2).map(tuple),
    errors=st.lists(step_errors, max_size=2).map(tuple),
    finish_reason=st.none() | st.sampled_from(FinishReason),
    usage=usages,
    messages=st.lists(messages, max_size=2).map(tuple),
)
evaluations = st.builds(
    ContinuationEvaluation,
    criterion=ids,
    decision=st.sampled_from(ContinuationDecision),
    reason=text,
    context=json_objects,
    stop_reason=st.none() | st.sampled_from(StopReason),
)
outcomes = st.builds(
    ContinuationOutcome,
    should_continue=st.booleans(),
    evaluations=st.lists(evaluations, max_size=3).map(tuple),
)
step_executions = st.builds(
    StepExecution,
    step=steps,
    outcome=outcomes,
    step_number=st.integers(min_value=1, max_value=100),
    started_at=moments,
    completed_at=moments,
    id=ids,
    execution_id=st.none() | ids,
)
execution_states = st.builds(
    ExecutionState,
    execution_id=st.none() | ids,
    started_at=st.none() | moments,
    updated_at=st.none() | moments,
    run_started_at=st.none() | moments,
    cumulative_seconds=st.floats(min_value=0, max_value=1e9),
    run_count=st.integers(min_value=0, max_value=1000),
)
current_executions = st.builds(
    CurrentExecution,
    step_number=st.integers(min_value=1, max_value=100),
    started_at=moments,
    id=ids,
    pending_step=st.none() | steps,
    pending_tool_call=st.none() | tool_calls,
    pending_execution=st.none() | tool_executions,
    error=st.none() | st.builds(AgentError, text),
    stop_reason=st.none() | st.sampled_from(StopReason),
    decision=st.none() | st.sampled_from(ExecutionDecision),
    decision_reason=st.none() | text,
)
agent_states = st.builds(
    AgentState,
    agent_id=ids,
    parent_agent_id=st.none() | ids,
    messages=st.lists(messages, max_size=4).map(tuple),
    metadata=json_objects,
    usage=usages,
    status=st.sampled_from(AgentStatus),
    execution=execution_states,
    step_executions=st.lists(step_executions, max_size=3).map(tuple),
    current_execution=st.none() | current_executions,
    start_outcome=st.none() | outcomes,
    stopped_by=st.none() | st.sampled_from(StopReason),
    steps_not_kept=st.integers(min_value=0, max_value=1000),
)
