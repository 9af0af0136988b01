"""Observers: the uniform interface, composition order and the core bookkeeping."""

from __future__ import annotations

import json

from agent_core.continuation import ContinuationCriteria, StopReason
from agent_core.criteria import StepsLimit, ToolCallPresenceCheck
from agent_core.error_policy import ErrorPolicyCriterion
from agent_core.errors import ModelError
from agent_core.events import AgentEvent, EventDispatcher
from agent_core.lifecycle import (
    LIFECYCLE_POINTS,
    AgentObserver,
    CompositeObserver,
    CoreLifecycleObserver,
    PassThroughObserver,
)
from agent_core.state import AgentState, AgentStatus
from tests.support.factories import TickingClock, final_step, tool_step


class Tagger(PassThroughObserver):
    def __init__(self, tag: str) -> None:
        self.tag = tag

    def on_step_end(self, state: AgentState) -> AgentState:
        seen = state.metadata.get("seen", ())
        return state.with_metadata("seen", (*seen, self.tag))


def core(events: EventDispatcher | None = None) -> CoreLifecycleObserver:
    criteria = ContinuationCriteria[AgentState](
        StepsLimit(2), ErrorPolicyCriterion(), ToolCallPresenceCheck()
    )
    return CoreLifecycleObserver(criteria, events or EventDispatcher(), clock=TickingClock())


def test_the_interface_has_eight_uniform_points() -> None:
    observer: AgentObserver = PassThroughObserver()
    state = AgentState()
    assert len(LIFECYCLE_POINTS) == 8
    for point in LIFECYCLE_POINTS:
        assert getattr(observer, point)(state) is state


def test_composite_threads_state_in_order() -> None:
    composite = CompositeObserver([Tagger("core"), Tagger("hook")])
    assert composite.on_step_end(AgentState()).metadata["seen"] == ("core", "hook")
    assert composite.on_step_start(AgentState()).metadata == {}


def test_core_records_the_pending_step_with_outcome_and_timing() -> None:
    observer = core()
    state = observer.on_execution_start(AgentState())
    state = state.begin_step(observer.clock()).with_pending_step(tool_step("a"))
    state = observer.on_step_end(state)
    result = state.last_step_result()
    assert result is not None
    assert (result.step_number, result.id, result.step.id) == (1, "a", "a")
    assert result.duration_ms > 0
    assert result.execution_id == state.execution_id()
    assert result.outcome.should_continue
    assert state.pending_step() is None
    assert len(state.messages) == 1
    assert state.usage.total == 10


def test_core_stops_at_the_limit_and_sets_the_final_status() -> None:
    observer = core()
    state = observer.on_execution_start(AgentState())
    for step_id in ("a", "b"):
        state = state.begin_step(observer.clock()).with_pending_step(tool_step(step_id))
        state = observer.on_step_end(state)
    assert state.stop_reason() is StopReason.STEPS_LIMIT
    state = observer.on_execution_end(state)
    assert state.status is AgentStatus.COMPLETED
    assert not state.execution.is_running
    assert state.execution.cumulative_seconds > 0


def test_core_records_failures_through_the_error_handler() -> None:
    observer = core()
    state = observer.on_execution_start(AgentState()).begin_step(observer.clock(), "f")
    state = observer.on_error(state.with_error(ModelError("down")))
    assert state.status is AgentStatus.FAILED
    result = state.last_step_result()
    assert result is not None
    assert result.step.errors[0].message == "down"
    assert observer.on_execution_end(state).status is AgentStatus.FAILED


def test_core_ignores_points_without_pending_data() -> None:
    observer = core()
    state = observer.on_execution_start(AgentState()).begin_step(observer.clock())
    assert observer.on_step_end(state) is state
    assert observer.on_error(state) is state


def test_observers_record_events_without_delivering_them() -> None:
    events = EventDispatcher()
    seen: list[AgentEvent] = []
    events.listen(seen.append)
    observer = core(events)
    state = observer.on_execution_start(AgentState(agent_id="a-1"))
    state = state.begin_step(observer.clock()).with_pending_step(final_step())
    observer.on_execution_end(observer.on_step_end(observer.on_step_start(state)))
    assert events.pending > 0
    assert seen == []  # observers only record; the loop delivers


async def test_recorded_events_are_delivered_on_flush() -> None:
    events = EventDispatcher()
    seen: list[AgentEvent] = []
    events.listen(seen.append)
    observer = core(events)
    state = observer.on_execution_start(AgentState(agent_id="a-1"))
    state = state.begin_step(observer.clock()).with_pending_step(final_step())
    observer.on_execution_end(observer.on_step_end(observer.on_step_start(state)))
    await events.flush()
    assert [e.type for e in seen] == [
        "agent.execution.started",
        "agent.step.started",
        "agent.continuation",
        "agent.usage",
        "agent.state.updated",
        "agent.step.completed",
        "agent.execution.completed",
    ]
    assert {e.agent_id for e in seen} == {"a-1"}
    for event in seen:
        json.dumps(event.payload())
