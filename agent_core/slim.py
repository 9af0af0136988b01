"""The slim snapshot: a compact, bounded JSON form of an agent state (schema: docs/agent_core.md).

Schema::

    {agent_id, parent_agent_id, status, [error_message,] step_count,
     usage: {prompt, completion, total},
     execution: {started_at, updated_at, cumulative_seconds},
     messages: [{role, content, metadata}],
     steps: [{step_number, type, has_tool_calls, finish_reason, errors,
              usage: {total}, duration_ms, tool_calls: [{id, name}]}],
     last_continuation: {should_continue, stop_reason, resolved_by} | null,
     metadata: {...}}

``error_message`` (an addition to the original schema) is there only when the status is
``failed``: why the run failed (its last step's first error, or the reason of the
forbid that stopped it). ``step_count`` counts steps over all runs; a restored state
numbers its next step after them.

Assistant tool calls travel in a message's ``metadata.tool_calls`` (``id``, ``name``
and, unless redacted, ``arguments``); tool results carry ``metadata.tool_call_id`` and
``metadata.tool_name``. Deserializing gives a state an agent can continue from: the
bounded message history (tool results whose call was cut off are dropped), usage,
status, metadata and cumulative execution time; steps are diagnostic only and are not
restored.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from agent_core._frozen import thaw
from agent_core._time import from_iso
from agent_core.messages import Message, Role, ToolCall, Usage
from agent_core.serialization import rebuild
from agent_core.state import AgentState, AgentStatus, ExecutionState
from agent_core.steps import StepExecution

__all__ = ["OMITTED_TOOL_RESULT", "SlimAgentStateSerializer", "SlimSerializationConfig"]

OMITTED_TOOL_RESULT = "[tool result omitted]"


@dataclass(frozen=True, slots=True)
class SlimSerializationConfig:
    """What a slim snapshot keeps.

    Attributes:
        max_messages: most recent messages kept.
        max_steps: most recent step summaries kept.
        max_content_length: longer message text is cut and ends with ``...``; a tool
            call whose arguments are longer as JSON keeps only the start of that JSON,
            as ``arguments_clipped`` (and continues with empty arguments).
        include_tool_results: if false, tool results read ``[tool result omitted]``.
        include_steps: include step summaries.
        include_continuation_trace: include ``last_continuation``.
        redact_tool_args: keep only the id and name of tool calls.
    """

    max_messages: int = 50
    max_steps: int = 20
    max_content_length: int = 2000
    include_tool_results: bool = True
    include_steps: bool = True
    include_continuation_trace: bool = False
    redact_tool_args: bool = False

    def __post_init__(self) -> None:
        for name in ("max_messages", "max_steps", "max_content_length"):
            if getattr(self, name) < 0:
                raise ValueError(f"SlimSerializationConfig.{name} must be 0 or more")

    @classmethod
    def minimal(cls) -> SlimSerializationConfig:
        return cls(
            max_messages=20,
            max_steps=0,
            max_content_length=500,
            include_tool_results=False,
            include_steps=False,
        )

    @classmethod
    def standard(cls) -> SlimSerializationConfig:
        return cls()

    @classmethod
    def full(cls) -> SlimSerializationConfig:
        return cls(
            max_messages=100,
            max_steps=50,
            max_content_length=5000,
            include_tool_results=True,
            include_steps=True,
            include_continuation_trace=True,
        )


def _timestamp(moment: datetime | None) -> str | None:
    if moment is None:
        return None
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _recent(items: Sequence[Any], limit: int) -> list[Any]:
    return list(items[-limit:]) if limit > 0 else []


class SlimAgentStateSerializer:
    """Serializes to and from the slim snapshot schema."""

    def __init__(self, config: SlimSerializationConfig | None = None) -> None:
        self.config = config or SlimSerializationConfig()

    def serialize(self, state: AgentState) -> dict[str, Any]:
        """The snapshot of ``state`` (see the module docstring for the schema)."""
        config = self.config
        failure = {} if state.status is not AgentStatus.FAILED else self._failure(state)
        return {
            "agent_id": state.agent_id,
            "parent_agent_id": state.parent_agent_id,
            "status": state.status.value,
            **failure,
            "step_count": state.step_count(),
            "usage": state.usage.model_dump(mode="json"),
            "execution": self._execution(state.execution),
            "messages": [self._message(m) for m in _recent(state.messages, config.max_messages)],
            "steps": self._steps(state) if config.include_steps else [],
            "last_continuation": self._continuation(state)
            if config.include_continuation_trace
            else None,
            "metadata": thaw(state.metadata),
        }

    def _failure(self, state: AgentState) -> dict[str, Any]:
        message = state.error_message()
        return {"error_message": None if message is None else self._content(message)}

    def _execution(self, execution: ExecutionState) -> dict[str, Any]:
        moment = execution.updated_at or execution.run_started_at
        seconds = execution.cumulative_seconds
        if moment is not None:
            seconds = execution.cumulative_seconds_at(moment)
        return {
            "started_at": _timestamp(execution.started_at),
            "updated_at": _timestamp(execution.updated_at),
            "cumulative_seconds": round(seconds, 3),
        }

    def _content(self, text: str) -> str:
        limit = self.config.max_content_length
        return text if len(text) <= limit else text[:limit] + "..."

    def _message(self, message: Message) -> dict[str, Any]:
        metadata: dict[str, Any] = thaw(message.metadata)
        if message.tool_calls:
            metadata["tool_calls"] = [self._tool_call(c) for c in message.tool_calls]
        content = self._content(message.content)
        if message.role is Role.TOOL:
            metadata["tool_call_id"] = message.tool_call_id
            metadata["tool_name"] = message.name
            if not self.config.include_tool_results:
                content = OMITTED_TOOL_RESULT
        return {"role": message.role.value, "content": content, "metadata": metadata}

    def _tool_call(self, call: ToolCall) -> dict[str, Any]:
        if self.config.redact_tool_args:
            return {"id": call.id, "name": call.name}
        arguments = thaw(call.arguments)
        text = json.dumps(arguments, default=str, ensure_ascii=False, separators=(",", ":"))
        if len(text) > self.config.max_content_length:
            # A model can send megabytes of arguments: the snapshot stays slim.
            return {"id": call.id, "name": call.name, "arguments_clipped": self._content(text)}
        return {"id": call.id, "name": call.name, "arguments": arguments}

    def _steps(self, state: AgentState) -> list[dict[str, Any]]:
        return [self._step(r) for r in _recent(state.step_results(), self.config.max_steps)]

    def _step(self, result: StepExecution) -> dict[str, Any]:
        step = result.step
        return {
            "step_number": result.step_number,
            "type": step.step_type.value,
            "has_tool_calls": step.has_tool_calls(),
            "finish_reason": None if step.finish_reason is None else step.finish_reason.value,
            "errors": step.error_count(),
            "usage": {"total": step.usage.total},
            "duration_ms": round(result.duration_ms, 1),
            "tool_calls": [{"id": c.id, "name": c.name} for c in step.tool_calls],
        }

    def _continuation(self, state: AgentState) -> dict[str, Any] | None:
        outcome = state.continuation_outcome()
        return None if outcome is None else outcome.summary()

    def deserialize(self, data: Mapping[str, Any]) -> AgentState:
        """A state to continue from (steps are not restored).

        Raises:
            agent_core.serialization.SerializationError: ``data`` is not a slim snapshot.
        """
        return rebuild("slim agent snapshot", data, _restore)


def _restore(data: Mapping[str, Any]) -> AgentState:
    execution = data["execution"]
    started, updated = execution.get("started_at"), execution.get("updated_at")
    return AgentState(
        agent_id=str(data["agent_id"]),
        parent_agent_id=data.get("parent_agent_id"),
        status=AgentStatus(data["status"]),
        usage=Usage.model_validate(data["usage"]),
        execution=ExecutionState(
            started_at=None if started is None else from_iso(started),
            updated_at=None if updated is None else from_iso(updated),
            cumulative_seconds=float(execution.get("cumulative_seconds") or 0.0),
        ),
        messages=_answered(tuple(_restore_message(m) for m in data["messages"])),
        metadata=dict(data.get("metadata") or {}),
        steps_not_kept=int(data.get("step_count") or 0),
    )


def _restore_message(data: Mapping[str, Any]) -> Message:
    metadata = dict(data.get("metadata") or {})
    calls = metadata.pop("tool_calls", None) or ()
    call_id, tool_name = metadata.pop("tool_call_id", None), metadata.pop("tool_name", None)
    return Message(
        role=Role(data["role"]),
        content=str(data.get("content", "")),
        tool_calls=tuple(
            ToolCall(id=c["id"], name=c["name"], arguments=c.get("arguments") or {}) for c in calls
        ),
        tool_call_id=call_id,
        name=tool_name,
        metadata=metadata,
    )


def _answered(messages: tuple[Message, ...]) -> tuple[Message, ...]:
    """Drop tool results whose call was cut off by the message window (a model
    rejects a tool result it did not ask for)."""
    asked: set[str] = set()
    kept: list[Message] = []
    for message in messages:
        asked.update(c.id for c in message.tool_calls)
        if message.role is Role.TOOL and message.tool_call_id not in asked:
            continue
        kept.append(message)
    return tuple(kept)
