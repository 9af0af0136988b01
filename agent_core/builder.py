"""AgentBuilder: an immutable, fluent way to configure an :class:`~agent_core.agent.Agent`.

Defaults (docs/agent_core.md): 20 steps, 32768 tokens, 300 s per execution, stop on any
error. The default criteria are ``StepsLimit``, ``TokenUsageLimit``,
``ExecutionTimeLimit``, ``ErrorPolicyCriterion`` and ``ToolCallPresenceCheck`` (plus
``CumulativeExecutionTimeLimit`` when asked for, plus any extra criteria).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from agent_core._time import Clock, utc_now
from agent_core.agent import Agent
from agent_core.continuation import ContinuationCriteria, ContinuationCriterion, CriterionResult
from agent_core.criteria import (
    CumulativeExecutionTimeLimit,
    ExecutionTimeLimit,
    StepsLimit,
    TokenUsageLimit,
    ToolCallPresenceCheck,
)
from agent_core.drivers.base import ModelDriver
from agent_core.error_policy import ErrorHandler, ErrorPolicy, ErrorPolicyCriterion
from agent_core.events import EventDispatcher, Listener
from agent_core.hooks import HookFunction, HookPoint, HookStack, HookStackObserver
from agent_core.lifecycle import CompositeObserver, CoreLifecycleObserver
from agent_core.loop import DEFAULT_MAX_TOOL_CALLS, AgentLoop
from agent_core.state import AgentState
from agent_core.tools import Tool, ToolRegistry

__all__ = [
    "DEFAULT_MAX_SECONDS",
    "DEFAULT_MAX_STEPS",
    "DEFAULT_MAX_TOKENS",
    "AgentBuilder",
]

DEFAULT_MAX_STEPS = 20
DEFAULT_MAX_TOKENS = 32768
DEFAULT_MAX_SECONDS = 300.0

CriterionLike = ContinuationCriterion[AgentState] | Callable[[AgentState], CriterionResult]


@dataclass(frozen=True)
class AgentBuilder:
    """Every ``with_*`` returns a new builder; :meth:`build` makes the agent."""

    driver: ModelDriver | None = None
    tools: tuple[Tool | Callable[..., Any], ...] = ()
    system_prompt: str | None = None
    request_options: dict[str, Any] = field(default_factory=dict)
    max_steps: int = DEFAULT_MAX_STEPS
    max_tokens: int = DEFAULT_MAX_TOKENS
    max_seconds: float = DEFAULT_MAX_SECONDS
    max_cumulative_seconds: float | None = None
    max_tool_calls_per_step: int = DEFAULT_MAX_TOOL_CALLS
    error_policy: ErrorPolicy = field(default_factory=ErrorPolicy.stop_on_any_error)
    extra_criteria: tuple[CriterionLike, ...] = ()
    hooks: HookStack = field(default_factory=HookStack)
    listeners: tuple[Listener, ...] = ()
    clock: Clock = utc_now

    def with_driver(self, driver: ModelDriver) -> AgentBuilder:
        return replace(self, driver=driver)

    def with_tools(self, *tools: Tool | Callable[..., Any]) -> AgentBuilder:
        """Add tools (``Tool`` objects or typed functions)."""
        return replace(self, tools=(*self.tools, *tools))

    def with_system_prompt(self, prompt: str) -> AgentBuilder:
        return replace(self, system_prompt=prompt)

    def with_request_options(self, **options: Any) -> AgentBuilder:
        """Model request fields: ``model``, ``temperature``, ``max_tokens``."""
        return replace(self, request_options={**self.request_options, **options})

    def with_max_steps(self, max_steps: int) -> AgentBuilder:
        return replace(self, max_steps=max_steps)

    def with_max_tokens(self, max_tokens: int) -> AgentBuilder:
        return replace(self, max_tokens=max_tokens)

    def with_max_tool_calls_per_step(self, max_calls: int) -> AgentBuilder:
        """Tool calls one model response may ask for; a response asking for more is a
        model error (the step runs none of them)."""
        return replace(self, max_tool_calls_per_step=max_calls)

    def with_time_limit(self, max_seconds: float) -> AgentBuilder:
        """Seconds per execution."""
        return replace(self, max_seconds=max_seconds)

    def with_cumulative_time_limit(self, max_seconds: float) -> AgentBuilder:
        """Seconds over all executions of a state (survives pause/resume)."""
        return replace(self, max_cumulative_seconds=max_seconds)

    def with_error_policy(self, policy: ErrorPolicy) -> AgentBuilder:
        return replace(self, error_policy=policy)

    def with_criteria(self, *criteria: CriterionLike) -> AgentBuilder:
        """Add criteria (objects or plain callables) to the defaults."""
        return replace(self, extra_criteria=(*self.extra_criteria, *criteria))

    def with_hook(
        self,
        point: HookPoint | str,
        function: HookFunction,
        *,
        priority: int = 0,
        name: str | None = None,
    ) -> AgentBuilder:
        """Add a hook at a lifecycle point (higher priority runs first)."""
        stack = self.hooks.with_hook(point, function, priority=priority, name=name)
        return replace(self, hooks=stack)

    def with_listener(self, listener: Listener) -> AgentBuilder:
        """Add an event listener (sync or async) receiving every event."""
        return replace(self, listeners=(*self.listeners, listener))

    def with_clock(self, clock: Clock) -> AgentBuilder:
        return replace(self, clock=clock)

    def criteria(self) -> ContinuationCriteria[AgentState]:
        """The criteria :meth:`build` will use (fresh objects on every call)."""
        items: list[CriterionLike] = [
            StepsLimit(self.max_steps),
            TokenUsageLimit(self.max_tokens),
            ExecutionTimeLimit(self.max_seconds, clock=self.clock),
        ]
        if self.max_cumulative_seconds is not None:
            items.append(CumulativeExecutionTimeLimit(self.max_cumulative_seconds, self.clock))
        items += [ErrorPolicyCriterion(self.error_policy), ToolCallPresenceCheck()]
        return ContinuationCriteria(*items, *self.extra_criteria)

    def build(self) -> Agent:
        """Make the agent.

        Raises:
            ValueError: no driver was given, or a limit or tool is invalid.
        """
        if self.driver is None:
            raise ValueError(
                "AgentBuilder needs a model driver: call with_driver(...) (ScriptedDriver "
                "for offline runs and tests, or the OpenAI-compatible driver)"
            )
        tools, criteria, events = ToolRegistry(self.tools), self.criteria(), EventDispatcher()
        for listener in self.listeners:
            events.listen(listener)
        core = CoreLifecycleObserver(
            criteria, events, ErrorHandler(criteria, self.error_policy), tools.names(), self.clock
        )
        hooks = HookStackObserver(self.hooks, events, self.clock)
        loop = AgentLoop(
            self.driver,
            tools,
            CompositeObserver([core, hooks]),
            criteria,
            events,
            clock=self.clock,
            system_prompt=self.system_prompt,
            request_options=self.request_options,
            max_tool_calls=self.max_tool_calls_per_step,
        )
        return Agent(loop, events, tools)
