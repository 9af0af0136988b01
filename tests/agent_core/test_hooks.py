"""The hook stack: ordering, validation and the failed-execution guard."""

from __future__ import annotations

import pytest

from agent_core.events import AgentEvent, EventDispatcher, HookExecuted
from agent_core.hooks import HookPoint, HookStack, HookStackObserver
from agent_core.state import AgentState, AgentStatus
from tests.support.factories import T0, TickingClock


def noop(state: AgentState) -> AgentState:
    return state


def test_unknown_point_is_rejected_with_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="unknown hook point 'on_lunch'; use one of: on_execution"):
        HookStack().with_hook("on_lunch", noop)


def test_stack_is_immutable_and_ordered() -> None:
    empty = HookStack()
    stack = empty.with_hook("on_step_end", noop, name="a").with_hook(
        HookPoint.STEP_END, noop, priority=5, name="b"
    )
    assert len(empty) == 0
    assert [h.name for h in stack.hooks_for(HookPoint.STEP_END)] == ["b", "a"]
    assert stack.hooks_for(HookPoint.STEP_START) == ()


async def test_hook_returning_a_non_state_is_reported_and_skipped() -> None:
    events = EventDispatcher()
    seen: list[AgentEvent] = []
    events.listen(seen.append)
    stack = HookStack().with_hook("on_step_start", lambda s: None, name="lazy")  # type: ignore[arg-type, return-value]
    state = AgentState()
    assert HookStackObserver(stack, events, TickingClock()).on_step_start(state) is state
    await events.flush()
    report = seen[0]
    assert isinstance(report, HookExecuted)
    assert report.error == "hook lazy returned NoneType, expected AgentState"


def test_guard_undoes_a_revival_of_a_failed_state() -> None:
    def revive(state: AgentState) -> AgentState:
        return state.with_status(AgentStatus.COMPLETED).with_stop_prevented("again")

    stack = HookStack().with_hook("on_before_stop", revive)
    observer = HookStackObserver(stack, EventDispatcher(), TickingClock())
    failed = AgentState().start_execution(T0).with_status(AgentStatus.FAILED)
    result = observer.on_before_stop(failed)
    assert result.status is AgentStatus.FAILED
    assert not result.is_stop_prevented()
    running = AgentState().start_execution(T0)
    assert observer.on_before_stop(running).is_stop_prevented()
