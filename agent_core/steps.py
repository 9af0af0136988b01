"""Steps and step results.

A step is created once and never modified. Its continuation outcome is not stored on
it: a :class:`StepResult` bundles a step with the outcome judged after it. That generic
result serves any step-by-step orchestrator; the agent's :class:`StepExecution` adds the
step number, timing, id and execution id.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, Generic, Protocol, TypeVar

from agent_core._time import elapsed_ms, from_iso, to_iso
from agent_core.continuation import ContinuationOutcome, StopReason
from agent_core.drivers.base import ModelResponse
from agent_core.errors import (
    AgentError,
    ErrorType,
    ModelError,
    ModelTimeoutError,
    RateLimitError,
    ToolError,
    ValidationError,
)
from agent_core.messages import FinishReason, Message, ToolCall, Usage

__all__ = [
    "AgentStep",
    "ExecutionSteps",
    "StepError",
    "StepExecution",
    "StepResult",
    "StepType",
    "ToolExecution",
]

StepT = TypeVar("StepT")

_ERROR_CLASSES: dict[ErrorType, type[AgentError]] = {
    ErrorType.TOOL: ToolError,
    ErrorType.VALIDATION: ValidationError,
    ErrorType.MODEL: ModelError,
    ErrorType.RATE_LIMIT: RateLimitError,
    ErrorType.TIMEOUT: ModelTimeoutError,
}


@dataclass(frozen=True, slots=True)
class StepResult(Generic[StepT]):
    """A step and the continuation outcome judged after it."""

    step: StepT
    outcome: ContinuationOutcome

    def should_continue(self) -> bool:
        return self.outcome.should_continue

    def stop_reason(self) -> StopReason | None:
        """Why the process stops after this step, or ``None`` if it continues."""
        return None if self.outcome.should_continue else self.outcome.stop_reason


@dataclass(frozen=True, slots=True)
class StepError:
    """An error recorded on a step (the data of an :class:`AgentError`)."""

    error_type: ErrorType
    message: str
    tool_name: str | None = None
    tool_call_id: str | None = None

    @classmethod
    def from_error(cls, error: AgentError) -> StepError:
        return cls(
            error_type=error.error_type,
            message=error.message,
            tool_name=getattr(error, "tool_name", None) or None,
            tool_call_id=getattr(error, "tool_call_id", None) or None,
        )

    def to_error(self) -> AgentError:
        """An exception equivalent to this record (class chosen by error type)."""
        if self.error_type is ErrorType.TOOL:
            return ToolError(
                self.message, tool_name=self.tool_name or "", tool_call_id=self.tool_call_id or ""
            )
        kind = _ERROR_CLASSES.get(self.error_type, AgentError)
        error = kind(self.message)
        error.error_type = self.error_type
        return error

    def to_dict(self) -> dict[str, Any]:
        return {
            "error_type": self.error_type.value,
            "message": self.message,
            "tool_name": self.tool_name,
            "tool_call_id": self.tool_call_id,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StepError:
        return cls(
            error_type=ErrorType(data["error_type"]),
            message=str(data["message"]),
            tool_name=data.get("tool_name"),
            tool_call_id=data.get("tool_call_id"),
        )


@dataclass(frozen=True, slots=True)
class ToolExecution:
    """One tool call and what came of it: its output text, or an error."""

    tool_call: ToolCall
    output: str
    started_at: datetime
    completed_at: datetime
    error: StepError | None = None
    blocked: bool = False

    @property
    def success(self) -> bool:
        return self.error is None

    @property
    def duration_ms(self) -> float:
        return elapsed_ms(self.started_at, self.completed_at)

    def message(self) -> Message:
        """The tool-result message the model sees (an error reads ``Error: ...``)."""
        content = self.output if self.error is None else f"Error: {self.error.message}"
        return Message.tool(content, self.tool_call.id, self.tool_call.name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "tool_call": self.tool_call.model_dump(mode="json"),
            "output": self.output,
            "started_at": to_iso(self.started_at),
            "completed_at": to_iso(self.completed_at),
            "error": None if self.error is None else self.error.to_dict(),
            "blocked": self.blocked,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ToolExecution:
        error = data.get("error")
        return cls(
            tool_call=ToolCall.model_validate(data["tool_call"]),
            output=str(data["output"]),
            started_at=from_iso(data["started_at"]),
            completed_at=from_iso(data["completed_at"]),
            error=None if error is None else StepError.from_dict(error),
            blocked=bool(data.get("blocked", False)),
        )


class StepType(StrEnum):
    TOOL_EXECUTION = "tool_execution"
    FINAL = "final"
    ERROR = "error"


@dataclass(frozen=True, slots=True)
class AgentStep:
    """One agent step: the model's answer, the tools it ran and any errors.

    ``messages`` are the messages this step adds to the conversation (the assistant
    message and one tool-result message per call).
    """

    id: str
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_executions: tuple[ToolExecution, ...] = ()
    errors: tuple[StepError, ...] = ()
    finish_reason: FinishReason | None = None
    usage: Usage = field(default_factory=Usage)
    messages: tuple[Message, ...] = ()

    @classmethod
    def from_response(
        cls, step_id: str, response: ModelResponse, executions: Sequence[ToolExecution] = ()
    ) -> AgentStep:
        """The step of one model response and the tool executions it caused."""
        return cls(
            id=step_id,
            content=response.content,
            tool_calls=response.tool_calls,
            tool_executions=tuple(executions),
            errors=tuple(e.error for e in executions if e.error is not None),
            finish_reason=response.finish_reason,
            usage=response.usage,
            messages=(response.message(), *(e.message() for e in executions)),
        )

    @classmethod
    def failure(cls, step_id: str, error: AgentError) -> AgentStep:
        """A step that failed before producing an answer (e.g. the model errored)."""
        return cls(
            id=step_id, errors=(StepError.from_error(error),), finish_reason=FinishReason.ERROR
        )

    @property
    def step_type(self) -> StepType:
        if self.errors:
            return StepType.ERROR
        return StepType.TOOL_EXECUTION if self.tool_calls else StepType.FINAL

    def has_tool_calls(self) -> bool:
        return bool(self.tool_calls)

    def has_errors(self) -> bool:
        return bool(self.errors)

    def error_count(self) -> int:
        return len(self.errors)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": self.step_type.value,
            "content": self.content,
            "tool_calls": [c.model_dump(mode="json") for c in self.tool_calls],
            "tool_executions": [e.to_dict() for e in self.tool_executions],
            "errors": [e.to_dict() for e in self.errors],
            "finish_reason": None if self.finish_reason is None else self.finish_reason.value,
            "usage": self.usage.model_dump(mode="json"),
            "messages": [m.model_dump(mode="json") for m in self.messages],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AgentStep:
        finish = data.get("finish_reason")
        return cls(
            id=str(data["id"]),
            content=str(data.get("content", "")),
            tool_calls=tuple(ToolCall.model_validate(c) for c in data.get("tool_calls", ())),
            tool_executions=tuple(
                ToolExecution.from_dict(e) for e in data.get("tool_executions", ())
            ),
            errors=tuple(StepError.from_dict(e) for e in data.get("errors", ())),
            finish_reason=None if finish is None else FinishReason(finish),
            usage=Usage.model_validate(data.get("usage") or {}),
            messages=tuple(Message.model_validate(m) for m in data.get("messages", ())),
        )


@dataclass(frozen=True, slots=True)
class StepExecution(StepResult[AgentStep]):
    """An agent step result with its number, timing, id and the execution it ran in."""

    step_number: int
    started_at: datetime
    completed_at: datetime
    id: str
    execution_id: str | None = None

    @property
    def duration_ms(self) -> float:
        return elapsed_ms(self.started_at, self.completed_at)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "step_number": self.step_number,
            "execution_id": self.execution_id,
            "started_at": to_iso(self.started_at),
            "completed_at": to_iso(self.completed_at),
            "step": self.step.to_dict(),
            "outcome": self.outcome.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StepExecution:
        return cls(
            step=AgentStep.from_dict(data["step"]),
            outcome=ContinuationOutcome.from_dict(data["outcome"]),
            step_number=int(data["step_number"]),
            started_at=from_iso(data["started_at"]),
            completed_at=from_iso(data["completed_at"]),
            id=str(data["id"]),
            execution_id=data.get("execution_id"),
        )


class _CountedStep(Protocol):
    @property
    def usage(self) -> Usage: ...

    @property
    def errors(self) -> Sequence[Any]: ...


CountedStepT = TypeVar("CountedStepT", bound=_CountedStep)


class ExecutionSteps(Generic[CountedStepT]):
    """What the built-in criteria read of a state (see :mod:`agent_core.criteria`),
    computed from the current execution's steps, recorded and pending. A state class
    provides :meth:`_execution_steps`; the agent's and the orchestrators' share the rest.
    """

    __slots__ = ()

    def _execution_steps(self) -> list[CountedStepT]:
        raise NotImplementedError

    def current_step(self) -> CountedStepT | None:
        """The step being judged: the pending one, else this run's last recorded one."""
        steps = self._execution_steps()
        return steps[-1] if steps else None

    def execution_step_count(self) -> int:
        return len(self._execution_steps())

    def execution_usage(self) -> Usage:
        total = Usage()
        for step in self._execution_steps():
            total = total + step.usage
        return total

    def trailing_failed_steps(self) -> int:
        count = 0
        for step in reversed(self._execution_steps()):
            if not step.errors:
                break
            count += 1
        return count
