"""Typed agent events and their dispatcher.

Every event carries ``agent_id``, ``execution_id`` and ``occurred_at`` so an adapter
can wrap it in an envelope ``{type, session_id, execution_id, timestamp, payload}``:
``type`` is the class's :attr:`AgentEvent.type` and ``payload`` is
:meth:`AgentEvent.payload`.

Observers only *record* events (:meth:`EventDispatcher.emit`); the loop delivers them
(:meth:`EventDispatcher.flush`) to sync and async listeners, in order. A listener that
raises is logged and skipped: it never breaks the run.
"""

from __future__ import annotations

import inspect
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, fields
from datetime import datetime
from enum import Enum
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel

from agent_core._time import to_iso
from agent_core.continuation import ContinuationOutcome, StopReason
from agent_core.errors import ErrorType
from agent_core.messages import FinishReason, Usage
from agent_core.state import AgentState, AgentStatus

__all__ = [
    "AgentEvent",
    "ContinuationEvaluated",
    "EventDispatcher",
    "ExecutionCompleted",
    "ExecutionFailed",
    "ExecutionStarted",
    "HookExecuted",
    "Listener",
    "StateUpdated",
    "StepCompleted",
    "StepStarted",
    "StreamChunk",
    "TokenUsageReported",
    "ToolCallBlocked",
    "ToolCallCompleted",
    "ToolCallStarted",
]

logger = logging.getLogger(__name__)

E = TypeVar("E", bound="AgentEvent")
Listener = Callable[["AgentEvent"], Awaitable[None] | None]


def _plain(value: Any) -> Any:
    """JSON-friendly form of an event field."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, datetime):
        return to_iso(value)
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, ContinuationOutcome):
        return value.to_dict()
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentEvent:
    """Base of all agent events."""

    type: ClassVar[str] = "agent.event"

    agent_id: str
    execution_id: str | None
    occurred_at: datetime

    def payload(self) -> dict[str, Any]:
        """The event's own fields (not the envelope ones) as plain JSON data."""
        base = {"agent_id", "execution_id", "occurred_at"}
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self) if f.name not in base}


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutionStarted(AgentEvent):
    type: ClassVar[str] = "agent.execution.started"
    message_count: int
    available_tools: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutionCompleted(AgentEvent):
    type: ClassVar[str] = "agent.execution.completed"
    status: AgentStatus
    stop_reason: StopReason | None
    step_count: int
    usage: Usage
    final_response: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutionFailed(AgentEvent):
    type: ClassVar[str] = "agent.execution.failed"
    status: AgentStatus
    stop_reason: StopReason | None
    step_count: int
    usage: Usage
    error_type: ErrorType | None
    error_message: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class StepStarted(AgentEvent):
    type: ClassVar[str] = "agent.step.started"
    step_number: int
    message_count: int
    available_tools: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class StepCompleted(AgentEvent):
    type: ClassVar[str] = "agent.step.completed"
    step_number: int
    step_id: str
    step_type: str
    has_tool_calls: bool
    errors: int
    error_messages: tuple[str, ...]
    finish_reason: FinishReason | None
    usage: Usage
    duration_ms: float
    outcome: ContinuationOutcome


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenUsageReported(AgentEvent):
    type: ClassVar[str] = "agent.usage"
    step_number: int
    usage: Usage
    execution_usage: Usage
    total_usage: Usage


@dataclass(frozen=True, slots=True, kw_only=True)
class StateUpdated(AgentEvent):
    """The state after a step was recorded (listeners may snapshot it)."""

    type: ClassVar[str] = "agent.state.updated"
    state: AgentState

    def payload(self) -> dict[str, Any]:
        state = self.state
        return {
            "status": state.status.value,
            "step_count": state.step_count(),
            "message_count": len(state.messages),
            "usage": _plain(state.usage),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class ContinuationEvaluated(AgentEvent):
    type: ClassVar[str] = "agent.continuation"
    step_number: int
    outcome: ContinuationOutcome


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCallStarted(AgentEvent):
    type: ClassVar[str] = "agent.tool.started"
    step_number: int
    tool_call_id: str
    tool_name: str
    args: Mapping[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCallCompleted(AgentEvent):
    type: ClassVar[str] = "agent.tool.completed"
    step_number: int
    tool_call_id: str
    tool_name: str
    args: Mapping[str, Any]
    success: bool
    error: str | None
    duration_ms: float
    result: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCallBlocked(AgentEvent):
    type: ClassVar[str] = "agent.tool.blocked"
    step_number: int
    tool_call_id: str
    tool_name: str
    args: Mapping[str, Any]
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamChunk(AgentEvent):
    type: ClassVar[str] = "agent.stream.chunk"
    step_number: int
    text_delta: str
    chunk_index: int
    is_complete: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class HookExecuted(AgentEvent):
    type: ClassVar[str] = "agent.hook.executed"
    hook: str
    point: str
    priority: int
    success: bool
    error: str | None


class EventDispatcher:
    """Buffers emitted events and delivers them to listeners on :meth:`flush`."""

    def __init__(self) -> None:
        self._listeners: list[tuple[type[AgentEvent], Listener]] = []
        self._pending: deque[AgentEvent] = deque()

    def listen(self, listener: Listener) -> None:
        """Call ``listener`` (sync or async) with every event."""
        self._listeners.append((AgentEvent, listener))

    def on(self, event_type: type[E], listener: Callable[[E], Awaitable[None] | None]) -> None:
        """Call ``listener`` with events of ``event_type`` (and its subclasses)."""
        self._listeners.append((event_type, listener))  # type: ignore[arg-type]

    def emit(self, event: AgentEvent) -> None:
        """Record ``event`` for the next :meth:`flush` (no listener runs now)."""
        self._pending.append(event)

    @property
    def pending(self) -> int:
        return len(self._pending)

    async def flush(self) -> None:
        """Deliver recorded events in order; a raising listener is logged and skipped."""
        while self._pending:
            event = self._pending.popleft()
            for event_type, listener in tuple(self._listeners):
                if isinstance(event, event_type):
                    await _deliver(listener, event)


async def _deliver(listener: Listener, event: AgentEvent) -> None:
    try:
        result = listener(event)
        if result is not None and inspect.isawaitable(result):
            await result
    except Exception:
        logger.exception("event listener %r failed on %s; the run goes on", listener, event.type)
