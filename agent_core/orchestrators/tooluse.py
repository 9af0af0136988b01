"""ToolUse: the plain tool-calling loop on the step-by-step base.

Each step asks the model (streaming its text), runs the tools it calls and records an
:class:`~agent_core.steps.AgentStep` (a tool-use step has the agent step's shape) as a
:class:`~agent_core.orchestrators.process.StepRecord`. Unlike the :class:`~agent_core.agent.Agent`
it has no lifecycle hooks: customise it with criteria and state processors.

Default criteria: ``StepsLimit(20)``, ``TokenUsageLimit(32768)``,
``ErrorPolicyCriterion`` (stop on any error) and ``ToolCallPresenceCheck`` (go on while
the model calls tools).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from agent_core._time import Clock, utc_now
from agent_core.continuation import ContinuationCriteria
from agent_core.criteria import StepsLimit, TokenUsageLimit, ToolCallPresenceCheck
from agent_core.drivers.base import ModelDriver, ModelRequest
from agent_core.error_policy import ErrorPolicy, ErrorPolicyCriterion
from agent_core.errors import AgentError
from agent_core.events import EventDispatcher
from agent_core.messages import Message
from agent_core.orchestrators.process import ProcessState
from agent_core.orchestrators.stepbystep import (
    ProcessorLike,
    StepByStep,
    StepContext,
    infer,
    run_tool_calls,
)
from agent_core.steps import AgentStep
from agent_core.tools import Tool, ToolRegistry

__all__ = ["TOOL_USE_MAX_STEPS", "TOOL_USE_MAX_TOKENS", "ToolUse", "ToolUseState"]

TOOL_USE_MAX_STEPS = 20
TOOL_USE_MAX_TOKENS = 32768


@dataclass(frozen=True, slots=True)
class ToolUseState(ProcessState[AgentStep]):
    """The state of a tool-use process; its steps are agent steps."""

    kind = "tool_use"

    @classmethod
    def decode_step(cls, data: Mapping[str, Any]) -> AgentStep:
        return AgentStep.from_dict(data)


class ToolUse(StepByStep[ToolUseState, AgentStep]):
    """Calls a model with tools, step by step.

    Args:
        driver: the model.
        tools: ``Tool`` objects or typed functions.
        criteria: replaces the default criteria (see :meth:`default_criteria`).
        max_steps, max_tokens: limits of the default criteria.
        error_policy: how errors are judged (default: stop on any error).
        system_prompt: sent before the conversation.
        request_options: model request fields (``model``, ``temperature``, ...).
        processors, events, clock: see :class:`~agent_core.orchestrators.stepbystep.StepByStep`.
    """

    process = "tool_use"

    def __init__(
        self,
        driver: ModelDriver,
        tools: Iterable[Tool | Callable[..., Any]] = (),
        *,
        criteria: ContinuationCriteria[ToolUseState] | None = None,
        max_steps: int = TOOL_USE_MAX_STEPS,
        max_tokens: int = TOOL_USE_MAX_TOKENS,
        error_policy: ErrorPolicy | None = None,
        system_prompt: str | None = None,
        request_options: Mapping[str, Any] | None = None,
        processors: Iterable[ProcessorLike[ToolUseState]] | None = None,
        events: EventDispatcher | None = None,
        clock: Clock = utc_now,
    ) -> None:
        policy = error_policy or ErrorPolicy.stop_on_any_error()
        super().__init__(
            criteria or self.default_criteria(max_steps, max_tokens, policy),
            processors=processors,
            error_policy=policy,
            events=events,
            clock=clock,
        )
        self.driver = driver
        self.tools = tools if isinstance(tools, ToolRegistry) else ToolRegistry(tools)
        self.system_prompt = system_prompt
        self.request_options = dict(request_options or {})

    @staticmethod
    def default_criteria(
        max_steps: int = TOOL_USE_MAX_STEPS,
        max_tokens: int = TOOL_USE_MAX_TOKENS,
        error_policy: ErrorPolicy | None = None,
    ) -> ContinuationCriteria[ToolUseState]:
        """Steps and token limits, the error policy, and "go on while tools are
        called"."""
        return ContinuationCriteria(
            StepsLimit(max_steps),
            TokenUsageLimit(max_tokens),
            ErrorPolicyCriterion(error_policy),
            ToolCallPresenceCheck(),
        )

    def new_state(
        self, user_message: str | None = None, *, metadata: Mapping[str, Any] | None = None
    ) -> ToolUseState:
        """A fresh state, optionally with a first user message."""
        state = ToolUseState(metadata=metadata or {})
        return state if user_message is None else state.with_user_message(user_message)

    async def run(
        self, start: str | ToolUseState, *, execution_id: str | None = None
    ) -> ToolUseState:
        """Run one execution from a user message or a state; return the final state."""
        state = self.new_state(start) if isinstance(start, str) else start
        return await self.final_step(state, execution_id=execution_id)

    def available_tools(self, state: ToolUseState) -> tuple[str, ...]:
        return self.tools.names()

    async def make_next_step(self, state: ToolUseState, context: StepContext) -> AgentStep:
        system = () if not self.system_prompt else (Message.system(self.system_prompt),)
        request = ModelRequest(
            messages=(*system, *state.messages),
            tools=self.tools.schemas(),
            **self.request_options,
        )
        response = await infer(self.driver, request, context)
        executions = await run_tool_calls(self.tools, response.tool_calls, context)
        current = state.current
        assert current is not None, "a step is in progress"
        return AgentStep.from_response(current.id, response, executions)

    def failure_step(self, state: ToolUseState, error: AgentError) -> AgentStep:
        current = state.current
        return AgentStep.failure("" if current is None else current.id, error)
