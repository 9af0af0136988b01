"""Serializing process states (tool use, chat, collaboration, routing).

:class:`FullProcessStateSerializer` is the lossless round trip of
:meth:`ProcessState.to_dict` / :meth:`ProcessState.from_dict`.
:class:`SlimProcessStateSerializer` writes the slim snapshot (docs/agent_core.md) with the same
:class:`~agent_core.slim.SlimSerializationConfig` and message/usage/execution form as
the agent's (it delegates those to :class:`~agent_core.slim.SlimAgentStateSerializer`),
with ``id`` and ``process`` in place of ``agent_id`` and each step summary naming its
``actor``::

    {id, process, status, [error_message,] step_count, usage, execution, messages,
     steps: [{step_number, actor, has_tool_calls, finish_reason, errors,
              usage: {total}, duration_ms, tool_calls: [{id, name}]}],
     last_continuation, metadata}

Deserializing a slim snapshot gives a state a process can continue from (messages,
usage, status, metadata, cumulative time); steps are diagnostic only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Generic, TypeVar

from agent_core.orchestrators.process import ProcessState, StepRecord
from agent_core.orchestrators.stepbystep import step_tool_calls
from agent_core.serialization import SerializationError, rebuild
from agent_core.slim import SlimAgentStateSerializer, SlimSerializationConfig
from agent_core.state import AgentState

__all__ = ["FullProcessStateSerializer", "SlimProcessStateSerializer"]

StateT = TypeVar("StateT", bound="ProcessState[Any]")


def _load(kind: str, state_class: type[StateT], build: Any, data: Mapping[str, Any]) -> StateT:
    state = rebuild(kind, data, build)
    if not isinstance(state, state_class):
        raise SerializationError(f"{kind} did not give a {state_class.__name__}")
    return state


class FullProcessStateSerializer(Generic[StateT]):
    """The lossless serializer of one state class (e.g. ``ChatState``)."""

    def __init__(self, state_class: type[StateT]) -> None:
        self.state_class = state_class

    def serialize(self, state: StateT) -> dict[str, Any]:
        return state.to_dict()

    def deserialize(self, data: Mapping[str, Any]) -> StateT:
        """Raises:
        SerializationError: ``data`` is not a serialized state of this class."""
        kind = f"serialized {self.state_class.kind} state"
        return _load(kind, self.state_class, self.state_class.from_dict, data)

    def dumps(self, state: StateT) -> str:
        return json.dumps(self.serialize(state), ensure_ascii=False)

    def loads(self, text: str) -> StateT:
        """Raises:
        SerializationError: ``text`` is not JSON of a serialized state."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SerializationError(
                f"serialized {self.state_class.kind} state is not valid JSON: {exc}"
            ) from exc
        return self.deserialize(data)


class SlimProcessStateSerializer(Generic[StateT]):
    """The slim snapshot of one state class (see the module docstring)."""

    def __init__(
        self, state_class: type[StateT], config: SlimSerializationConfig | None = None
    ) -> None:
        self.state_class = state_class
        self.config = config or SlimSerializationConfig()
        self._agent = SlimAgentStateSerializer(self.config)

    def serialize(self, state: StateT) -> dict[str, Any]:
        as_agent = AgentState(
            agent_id=state.id,
            messages=state.messages,
            metadata=state.metadata,
            usage=state.usage,
            status=state.status,
            execution=state.execution,
        )
        data = self._agent.serialize(as_agent)
        data.pop("parent_agent_id", None)
        slim = {"id": data.pop("agent_id"), "process": state.kind, **data}
        slim["step_count"] = state.step_count()
        if "error_message" in slim:  # a failed state: say why, as the agent's snapshot does
            slim["error_message"] = state.error_message()
        slim["steps"] = self._steps(state) if self.config.include_steps else []
        slim["last_continuation"] = (
            self._continuation(state) if self.config.include_continuation_trace else None
        )
        return slim

    def _steps(self, state: StateT) -> list[dict[str, Any]]:
        limit = self.config.max_steps
        recent = state.step_results()[-limit:] if limit > 0 else ()
        return [self._step(r) for r in recent]

    def _step(self, result: StepRecord[Any]) -> dict[str, Any]:
        step = result.step
        return {
            "step_number": result.step_number,
            "actor": result.actor,
            "has_tool_calls": step.has_tool_calls(),
            "finish_reason": None if step.finish_reason is None else step.finish_reason.value,
            "errors": len(step.errors),
            "usage": {"total": step.usage.total},
            "duration_ms": round(result.duration_ms, 1),
            "tool_calls": [{"id": c.id, "name": c.name} for c in step_tool_calls(step)],
        }

    def _continuation(self, state: StateT) -> dict[str, Any] | None:
        outcome = state.continuation_outcome()
        return None if outcome is None else outcome.summary()

    def deserialize(self, data: Mapping[str, Any]) -> StateT:
        """A state to continue from (steps are not restored).

        Raises:
            SerializationError: ``data`` is not a slim snapshot of this class.
        """
        kind = f"slim {self.state_class.kind} snapshot"
        return _load(kind, self.state_class, self._restore, data)

    def _restore(self, data: Mapping[str, Any]) -> StateT:
        process = data.get("process")
        if process != self.state_class.kind:
            raise ValueError(f"it is a snapshot of a {process} process")
        agent = self._agent.deserialize({**data, "agent_id": data["id"]})
        return self.state_class(
            id=agent.agent_id,
            messages=agent.messages,
            metadata=agent.metadata,
            usage=agent.usage,
            status=agent.status,
            execution=agent.execution,
            steps_not_kept=agent.steps_not_kept,
        )
