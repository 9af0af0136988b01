"""The agent loop: the one place that awaits (model, tools, listeners).

It only orchestrates. Each lifecycle point is one call to the observer followed by
delivery of the events recorded meanwhile; all bookkeeping lives in the observers
(:class:`~agent_core.lifecycle.CoreLifecycleObserver` first, then user hooks).

Whether to go on: before the execution's first step the criteria are asked (their
outcome is recorded in the state, so a run stopped there shows why); after that the
last step result is read. A failed execution never continues, and a hook's stop
prevention never overrides a forbid: only a stop that no guard forbade can be
prevented.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from agent_core._time import Clock, utc_now
from agent_core.continuation import ContinuationCriteria, ContinuationOutcome, StopReason
from agent_core.drivers.base import (
    ModelDriver,
    ModelRequest,
    ModelResponse,
    ResponseCompleted,
    TextDelta,
)
from agent_core.errors import AgentError, ModelError
from agent_core.events import (
    EventDispatcher,
    StreamChunk,
    ToolCallBlocked,
    ToolCallCompleted,
    ToolCallStarted,
)
from agent_core.lifecycle import AgentObserver
from agent_core.messages import Message, ToolCall
from agent_core.state import AgentState, AgentStatus
from agent_core.steps import AgentStep, ToolExecution
from agent_core.tools import ToolRegistry, blocked_execution

__all__ = ["DEFAULT_MAX_TOOL_CALLS", "AgentLoop"]

LifecyclePoint = Callable[[AgentState], AgentState]
DEFAULT_MAX_TOOL_CALLS = 64
"""Tool calls one model response may ask for, unless the agent says otherwise."""


class AgentLoop:
    """Runs executions of one agent.

    Args:
        driver: the model.
        tools: the tools the model may call.
        observer: the lifecycle observer (usually a ``CompositeObserver``).
        criteria: asked before the first step of each execution.
        events: the dispatcher whose recorded events the loop delivers.
        clock: the time source.
        system_prompt: prepended to every model request (not stored in the state).
        request_options: extra ``ModelRequest`` fields (model, temperature, max_tokens).
        max_tool_calls: tool calls one model response may ask for; a response asking
            for more fails its step with a :class:`ModelError` and runs none of them
            (each call costs a tool execution, events and a message in every later
            request).
    """

    def __init__(
        self,
        driver: ModelDriver,
        tools: ToolRegistry,
        observer: AgentObserver,
        criteria: ContinuationCriteria[AgentState],
        events: EventDispatcher,
        *,
        clock: Clock = utc_now,
        system_prompt: str | None = None,
        request_options: dict[str, Any] | None = None,
        max_tool_calls: int = DEFAULT_MAX_TOOL_CALLS,
    ) -> None:
        if max_tool_calls < 1:
            raise ValueError(f"max_tool_calls must be at least 1, got {max_tool_calls!r}")
        self.driver = driver
        self.tools = tools
        self.observer = observer
        self.criteria = criteria
        self.events = events
        self.clock = clock
        self.system_prompt = system_prompt
        self.request_options = request_options or {}
        self.max_tool_calls = max_tool_calls

    async def run(self, state: AgentState) -> AgentState:
        """Run one execution to its end and return the final state."""
        final = state
        async for final in self.iterate(state):  # noqa: B007 (the last one is wanted)
            pass
        return final

    async def iterate(self, state: AgentState) -> AsyncIterator[AgentState]:
        """Run one execution, yielding the state after each step and the final state."""
        state = await self._notify(self.observer.on_execution_start, state)
        first = True
        while True:
            if first:
                state = state.with_start_outcome(self.criteria.evaluate_all(state))
            outcome = state.continuation_outcome()
            reason = _stop_reason(state, outcome)
            if reason is not None:
                state = await self._notify(
                    self.observer.on_before_stop, state.with_stop_requested(reason)
                )
                if not (state.is_stop_prevented() and _preventable(state, outcome)):
                    break
            state = await self._step(state)
            first = False
            yield state
        yield await self._notify(self.observer.on_execution_end, state)

    async def _notify(self, point: LifecyclePoint, state: AgentState) -> AgentState:
        state = point(state)
        await self.events.flush()
        return state

    async def _step(self, state: AgentState) -> AgentState:
        state = await self._notify(self.observer.on_step_start, state.begin_step(self.clock()))
        try:
            state = await self._perform_step(state)
        except AgentError as error:
            return await self._notify(self.observer.on_error, state.with_error(error))
        except Exception as exc:  # a broken driver or observer must not kill the run
            wrapped = AgentError.from_exception(exc)
            return await self._notify(self.observer.on_error, state.with_error(wrapped))
        return await self._notify(self.observer.on_step_end, state)

    async def _perform_step(self, state: AgentState) -> AgentState:
        response = await self._infer(state)
        if len(response.tool_calls) > self.max_tool_calls:
            raise ModelError(
                f"the model asked for {len(response.tool_calls)} tool calls in one response; "
                f"at most {self.max_tool_calls} are run per step (max_tool_calls_per_step)"
            )
        executions: list[ToolExecution] = []
        for tool_call in response.tool_calls:
            state = await self._use_tool(state, tool_call)
            execution = state.pending_execution()
            assert execution is not None, "_use_tool leaves the execution pending"
            executions.append(execution)
        current = state.current_execution
        assert current is not None, "a step is in progress"
        return state.with_pending_step(AgentStep.from_response(current.id, response, executions))

    def _request(self, state: AgentState) -> ModelRequest:
        system = () if not self.system_prompt else (Message.system(self.system_prompt),)
        return ModelRequest(
            messages=(*system, *state.messages), tools=self.tools.schemas(), **self.request_options
        )

    def _meta(self, state: AgentState) -> dict[str, Any]:
        current = state.current_execution
        return {
            "agent_id": state.agent_id,
            "execution_id": state.execution_id(),
            "occurred_at": self.clock(),
            "step_number": 0 if current is None else current.step_number,
        }

    async def _chunk(self, state: AgentState, text: str, index: int, complete: bool) -> None:
        meta = self._meta(state)
        self.events.emit(
            StreamChunk(**meta, text_delta=text, chunk_index=index, is_complete=complete)
        )
        await self.events.flush()

    async def _infer(self, state: AgentState) -> ModelResponse:
        index = 0
        async for event in self.driver.stream(self._request(state)):
            if isinstance(event, TextDelta):
                await self._chunk(state, event.text, index, False)
                index += 1
            elif isinstance(event, ResponseCompleted):
                if index:
                    await self._chunk(state, "", index, True)
                return event.response
        raise ModelError("the model driver's stream ended without a ResponseCompleted event")

    async def _use_tool(self, state: AgentState, tool_call: ToolCall) -> AgentState:
        state = await self._notify(
            self.observer.on_before_tool_use, state.with_pending_tool_call(tool_call)
        )
        planned = _keep_id(state.pending_tool_call() or tool_call, tool_call.id)
        if state.is_tool_call_blocked():
            execution = self._block(state, planned)
        else:
            execution = await self._execute(state, planned)
        return await self._notify(
            self.observer.on_after_tool_use, state.with_pending_execution(execution)
        )

    def _block(self, state: AgentState, tool_call: ToolCall) -> ToolExecution:
        reason = state.decision_reason() or "blocked by a hook"
        self.events.emit(
            ToolCallBlocked(
                **self._meta(state),
                tool_call_id=tool_call.id,
                tool_name=tool_call.name,
                args=tool_call.arguments,
                reason=reason,
            )
        )
        return blocked_execution(tool_call, reason, self.clock)

    async def _execute(self, state: AgentState, tool_call: ToolCall) -> ToolExecution:
        call_fields: dict[str, Any] = {
            "tool_call_id": tool_call.id,
            "tool_name": tool_call.name,
            "args": tool_call.arguments,
        }
        self.events.emit(ToolCallStarted(**self._meta(state), **call_fields))
        await self.events.flush()
        execution = await self.tools.execute(tool_call, self.clock)
        self.events.emit(
            ToolCallCompleted(
                **self._meta(state),
                **call_fields,
                success=execution.success,
                error=None if execution.error is None else execution.error.message,
                duration_ms=execution.duration_ms,
                result=execution.output,
            )
        )
        return execution


def _stop_reason(state: AgentState, outcome: ContinuationOutcome | None) -> StopReason | None:
    """Why to stop now (``None``: take another step)."""
    if state.status is AgentStatus.FAILED:
        return StopReason.ERROR
    if outcome is None or outcome.should_continue:
        return None
    return outcome.stop_reason


def _preventable(state: AgentState, outcome: ContinuationOutcome | None) -> bool:
    """A hook may prevent a stop that no guard forbade, and never revive a failure."""
    forbidden = outcome is not None and outcome.is_forbidden
    return state.status is not AgentStatus.FAILED and not forbidden


def _keep_id(tool_call: ToolCall, call_id: str) -> ToolCall:
    """A hook may change a call, but not its id: the tool result must answer the
    model's call."""
    if tool_call.id == call_id:
        return tool_call
    return tool_call.model_copy(update={"id": call_id})
