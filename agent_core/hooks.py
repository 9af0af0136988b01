"""User hooks: plain functions ``(state) -> state`` attached to lifecycle points.

A :class:`HookStack` orders hooks by priority (highest first, then registration
order); :class:`HookStackObserver` runs them as an observer. Hooks may block or change
a pending tool call, prevent a stop, add messages or metadata. They can never revive a
failed execution: a hook's change to a failed state's status, or a stop prevention on
it, is undone; and a stop prevention never overrides a forbid (the loop only honours
it for a stop that no guard forbade, e.g. a normal completion). A hook that raises (or
returns something else than a state) is logged, reported in a ``HookExecuted`` event
and skipped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from agent_core._time import Clock, utc_now
from agent_core.events import EventDispatcher, HookExecuted
from agent_core.state import AgentState, AgentStatus

__all__ = ["Hook", "HookFunction", "HookPoint", "HookStack", "HookStackObserver"]

logger = logging.getLogger(__name__)

HookFunction = Callable[[AgentState], AgentState]


class HookPoint(StrEnum):
    """The lifecycle points, named as the observer methods."""

    EXECUTION_START = "on_execution_start"
    EXECUTION_END = "on_execution_end"
    ERROR = "on_error"
    STEP_START = "on_step_start"
    STEP_END = "on_step_end"
    BEFORE_TOOL_USE = "on_before_tool_use"
    AFTER_TOOL_USE = "on_after_tool_use"
    BEFORE_STOP = "on_before_stop"


@dataclass(frozen=True, slots=True)
class Hook:
    point: HookPoint
    function: HookFunction
    priority: int = 0
    name: str = ""


class HookStack:
    """An immutable, priority-ordered set of hooks."""

    def __init__(self, hooks: tuple[Hook, ...] = ()) -> None:
        self.hooks = hooks

    def with_hook(
        self,
        point: HookPoint | str,
        function: HookFunction,
        *,
        priority: int = 0,
        name: str | None = None,
    ) -> HookStack:
        """A new stack with one more hook.

        Raises:
            ValueError: ``point`` is not a lifecycle point.
        """
        try:
            where = HookPoint(point)
        except ValueError:
            points = ", ".join(p.value for p in HookPoint)
            raise ValueError(f"unknown hook point {point!r}; use one of: {points}") from None
        label = name or getattr(function, "__name__", "") or "hook"
        return HookStack((*self.hooks, Hook(where, function, priority, label)))

    def hooks_for(self, point: HookPoint) -> tuple[Hook, ...]:
        """Hooks at ``point``: highest priority first, then registration order."""
        # sorted() is stable, so equal priorities keep their registration order
        return tuple(sorted((h for h in self.hooks if h.point is point), key=lambda h: -h.priority))

    def __len__(self) -> int:
        return len(self.hooks)


def _guard(before: AgentState, after: AgentState) -> AgentState:
    """Undo any attempt to revive a failed execution."""
    if before.status is not AgentStatus.FAILED:
        return after
    if after.status is not AgentStatus.FAILED:
        after = after.with_status(AgentStatus.FAILED)
    if after.is_stop_prevented() and after.current_execution is not None:
        restored = before.current_execution
        decision = None if restored is None else restored.decision
        reason = None if restored is None else restored.decision_reason
        current = replace(after.current_execution, decision=decision, decision_reason=reason)
        after = replace(after, current_execution=current)
    return after


class HookStackObserver:
    """Runs a :class:`HookStack` at every lifecycle point."""

    def __init__(self, stack: HookStack, events: EventDispatcher, clock: Clock = utc_now) -> None:
        self.stack = stack
        self.events = events
        self.clock = clock

    def _run(self, point: HookPoint, state: AgentState) -> AgentState:
        for hook in self.stack.hooks_for(point):
            state = self._apply(hook, state)
        return state

    def _apply(self, hook: Hook, state: AgentState) -> AgentState:
        error: str | None = None
        try:
            result: Any = hook.function(state)
            if not isinstance(result, AgentState):
                error = f"hook {hook.name} returned {type(result).__name__}, expected AgentState"
        except Exception as exc:
            error = f"hook {hook.name} raised {type(exc).__name__}: {exc}"
            logger.exception("hook %s failed at %s; skipped", hook.name, hook.point.value)
        self.events.emit(
            HookExecuted(
                agent_id=state.agent_id,
                execution_id=state.execution_id(),
                occurred_at=self.clock(),
                hook=hook.name,
                point=hook.point.value,
                priority=hook.priority,
                success=error is None,
                error=error,
            )
        )
        return state if error is not None else _guard(state, result)

    def on_execution_start(self, state: AgentState) -> AgentState:
        return self._run(HookPoint.EXECUTION_START, state)

    def on_execution_end(self, state: AgentState) -> AgentState:
        return self._run(HookPoint.EXECUTION_END, state)

    def on_error(self, state: AgentState) -> AgentState:
        return self._run(HookPoint.ERROR, state)

    def on_step_start(self, state: AgentState) -> AgentState:
        return self._run(HookPoint.STEP_START, state)

    def on_step_end(self, state: AgentState) -> AgentState:
        return self._run(HookPoint.STEP_END, state)

    def on_before_tool_use(self, state: AgentState) -> AgentState:
        return self._run(HookPoint.BEFORE_TOOL_USE, state)

    def on_after_tool_use(self, state: AgentState) -> AgentState:
        return self._run(HookPoint.AFTER_TOOL_USE, state)

    def on_before_stop(self, state: AgentState) -> AgentState:
        return self._run(HookPoint.BEFORE_STOP, state)
