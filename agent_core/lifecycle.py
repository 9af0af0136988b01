"""The lifecycle: one uniform observer interface, every method ``(state) -> state``.

Decisions travel in the state (``with_tool_call_blocked``, ``with_stop_prevented``),
not in side objects. :class:`CoreLifecycleObserver` does the bookkeeping (timing,
step recording, failure recording, final status, events); :class:`CompositeObserver`
threads the state through several observers in order (core first, then user hooks).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

from agent_core._time import Clock, utc_now
from agent_core.continuation import ContinuationCriteria, ContinuationOutcome, StopReason
from agent_core.error_policy import ErrorHandler
from agent_core.events import (
    ContinuationEvaluated,
    EventDispatcher,
    ExecutionCompleted,
    ExecutionFailed,
    ExecutionStarted,
    StateUpdated,
    StepCompleted,
    StepStarted,
    TokenUsageReported,
)
from agent_core.state import AgentState, AgentStatus
from agent_core.steps import StepExecution

__all__ = [
    "LIFECYCLE_POINTS",
    "AgentObserver",
    "CompositeObserver",
    "CoreLifecycleObserver",
    "PassThroughObserver",
]

LIFECYCLE_POINTS = (
    "on_execution_start",
    "on_execution_end",
    "on_error",
    "on_step_start",
    "on_step_end",
    "on_before_tool_use",
    "on_after_tool_use",
    "on_before_stop",
)
"""The names of the eight observer methods."""


class AgentObserver(Protocol):
    """Observes the agent lifecycle; each method returns the (possibly changed) state."""

    def on_execution_start(self, state: AgentState) -> AgentState: ...
    def on_execution_end(self, state: AgentState) -> AgentState: ...
    def on_error(self, state: AgentState) -> AgentState:
        """``state.current_error()`` holds the error."""
        ...

    def on_step_start(self, state: AgentState) -> AgentState: ...
    def on_step_end(self, state: AgentState) -> AgentState:
        """``state.pending_step()`` holds the finished step."""
        ...

    def on_before_tool_use(self, state: AgentState) -> AgentState:
        """``state.pending_tool_call()`` is about to run; block or change it here."""
        ...

    def on_after_tool_use(self, state: AgentState) -> AgentState:
        """``state.pending_execution()`` holds the result."""
        ...

    def on_before_stop(self, state: AgentState) -> AgentState:
        """``state.stop_reason()`` says why; ``with_stop_prevented`` takes another step
        (only if no guard forbade the stop and the run has not failed)."""
        ...


class PassThroughObserver:
    """An observer that changes nothing; subclass it and override what you need."""

    def on_execution_start(self, state: AgentState) -> AgentState:
        return state

    def on_execution_end(self, state: AgentState) -> AgentState:
        return state

    def on_error(self, state: AgentState) -> AgentState:
        return state

    def on_step_start(self, state: AgentState) -> AgentState:
        return state

    def on_step_end(self, state: AgentState) -> AgentState:
        return state

    def on_before_tool_use(self, state: AgentState) -> AgentState:
        return state

    def on_after_tool_use(self, state: AgentState) -> AgentState:
        return state

    def on_before_stop(self, state: AgentState) -> AgentState:
        return state


class CompositeObserver:
    """Threads the state through ``observers`` in order at every lifecycle point."""

    def __init__(self, observers: Iterable[AgentObserver]) -> None:
        self.observers = tuple(observers)

    def _thread(self, point: str, state: AgentState) -> AgentState:
        for observer in self.observers:
            method: Callable[[AgentState], AgentState] = getattr(observer, point)
            state = method(state)
        return state

    def on_execution_start(self, state: AgentState) -> AgentState:
        return self._thread("on_execution_start", state)

    def on_execution_end(self, state: AgentState) -> AgentState:
        return self._thread("on_execution_end", state)

    def on_error(self, state: AgentState) -> AgentState:
        return self._thread("on_error", state)

    def on_step_start(self, state: AgentState) -> AgentState:
        return self._thread("on_step_start", state)

    def on_step_end(self, state: AgentState) -> AgentState:
        return self._thread("on_step_end", state)

    def on_before_tool_use(self, state: AgentState) -> AgentState:
        return self._thread("on_before_tool_use", state)

    def on_after_tool_use(self, state: AgentState) -> AgentState:
        return self._thread("on_after_tool_use", state)

    def on_before_stop(self, state: AgentState) -> AgentState:
        return self._thread("on_before_stop", state)


class CoreLifecycleObserver(PassThroughObserver):
    """Bookkeeping: starts the run and its time limits, records each finished step
    (criteria judged on the transition state) and each failure (through the error
    handler), sets the final status, and emits the matching events.

    Args:
        criteria: the continuation criteria.
        events: where events are recorded.
        error_handler: judges errors raised during a step.
        tool_names: the available tools (reported in events).
        clock: the time source.
    """

    def __init__(
        self,
        criteria: ContinuationCriteria[AgentState],
        events: EventDispatcher,
        error_handler: ErrorHandler | None = None,
        tool_names: Iterable[str] = (),
        clock: Clock = utc_now,
    ) -> None:
        self.criteria = criteria
        self.events = events
        self.error_handler = error_handler or ErrorHandler(criteria)
        self.tool_names = tuple(tool_names)
        self.clock = clock

    def _meta(self, state: AgentState) -> dict[str, Any]:
        return {
            "agent_id": state.agent_id,
            "execution_id": state.execution_id(),
            "occurred_at": self.clock(),
        }

    def on_execution_start(self, state: AgentState) -> AgentState:
        now = self.clock()
        state = state.start_execution(now)
        self.criteria.execution_started(now)
        self.events.emit(
            ExecutionStarted(
                **self._meta(state),
                message_count=len(state.messages),
                available_tools=self.tool_names,
            )
        )
        return state

    def on_step_start(self, state: AgentState) -> AgentState:
        current = state.current_execution
        assert current is not None, "the loop begins a step before on_step_start"
        self.events.emit(
            StepStarted(
                **self._meta(state),
                step_number=current.step_number,
                message_count=len(state.messages),
                available_tools=self.tool_names,
            )
        )
        return state

    def on_step_end(self, state: AgentState) -> AgentState:
        step = state.pending_step()
        if step is None:
            return state
        transition = state.record_step(step)
        outcome = self.criteria.evaluate_all(transition)
        failed = not outcome.should_continue and outcome.stop_reason is StopReason.ERROR
        return self._record(transition, outcome, AgentStatus.FAILED if failed else state.status)

    def on_error(self, state: AgentState) -> AgentState:
        error = state.current_error()
        if error is None:
            return state
        handling = self.error_handler.handle(error, state)
        transition = state.record_step(handling.failure_step)
        return self._record(transition, handling.outcome, handling.final_status)

    def _record(
        self, transition: AgentState, outcome: ContinuationOutcome, status: AgentStatus
    ) -> AgentState:
        current, step = transition.current_execution, transition.pending_step()
        assert current is not None, "record_step() needs a step in progress"
        assert step is not None, "record_step() leaves the step pending"
        self.events.emit(
            ContinuationEvaluated(
                **self._meta(transition), step_number=current.step_number, outcome=outcome
            )
        )
        result = StepExecution(
            step=step,
            outcome=outcome,
            step_number=current.step_number,
            started_at=current.started_at,
            completed_at=self.clock(),
            id=step.id,
            execution_id=transition.execution_id(),
        )
        state = transition.with_status(status).record_step_execution(result)
        self._emit_recorded(state, result)
        return state

    def _emit_recorded(self, state: AgentState, result: StepExecution) -> None:
        meta, step = self._meta(state), result.step
        self.events.emit(
            TokenUsageReported(
                **meta,
                step_number=result.step_number,
                usage=step.usage,
                execution_usage=state.execution_usage(),
                total_usage=state.usage,
            )
        )
        self.events.emit(StateUpdated(**meta, state=state))
        self.events.emit(
            StepCompleted(
                **meta,
                step_number=result.step_number,
                step_id=step.id,
                step_type=step.step_type.value,
                has_tool_calls=step.has_tool_calls(),
                errors=step.error_count(),
                error_messages=tuple(e.message for e in step.errors),
                finish_reason=step.finish_reason,
                usage=step.usage,
                duration_ms=result.duration_ms,
                outcome=result.outcome,
            )
        )

    def on_before_stop(self, state: AgentState) -> AgentState:
        """A stop before the run's first step: emit its outcome (as step 0) and fail
        the run if an error decided it."""
        outcome = state.start_outcome
        if outcome is None or outcome.should_continue:
            return state
        self.events.emit(ContinuationEvaluated(**self._meta(state), step_number=0, outcome=outcome))
        if outcome.stop_reason is StopReason.ERROR:
            return state.with_status(AgentStatus.FAILED)
        return state

    def on_execution_end(self, state: AgentState) -> AgentState:
        stop_reason = state.stop_reason()
        failed = state.status is AgentStatus.FAILED or stop_reason is StopReason.ERROR
        status = AgentStatus.FAILED if failed else AgentStatus.COMPLETED
        if failed:
            # One rule everywhere: a run is failed exactly when it stops for an error.
            stop_reason = StopReason.ERROR
        state = state.end_execution(self.clock(), status, stop_reason)
        self.events.emit(self._end_event(state))
        return state

    def _end_event(self, state: AgentState) -> ExecutionCompleted | ExecutionFailed:
        common = {
            **self._meta(state),
            "status": state.status,
            "stop_reason": state.stop_reason(),
            "step_count": state.step_count(),
            "usage": state.usage,
        }
        if state.status is not AgentStatus.FAILED:
            return ExecutionCompleted(**common, final_response=state.final_response())
        run = [r for r in state.step_results() if r.execution_id == state.execution_id()]
        error = run[-1].step.errors[0] if run and run[-1].step.errors else None
        return ExecutionFailed(
            **common,
            error_type=None if error is None else error.error_type,
            error_message=state.error_message(),
        )
