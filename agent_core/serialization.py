"""Serializing agent states.

:class:`FullAgentStateSerializer` is the lossless round trip of
:meth:`AgentState.to_dict` / :meth:`AgentState.from_dict` (every step result, outcome
and transient field). :class:`~agent_core.slim.SlimAgentStateSerializer` is the compact
snapshot for storage and UIs. Both satisfy :class:`AgentStateSerializer`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Protocol

import pydantic

from agent_core.state import AgentState

__all__ = ["AgentStateSerializer", "FullAgentStateSerializer", "SerializationError"]


class SerializationError(ValueError):
    """Data that cannot be turned back into an agent state; the message says why."""


class AgentStateSerializer(Protocol):
    def serialize(self, state: AgentState) -> dict[str, Any]:
        """The state as plain JSON data."""
        ...

    def deserialize(self, data: Mapping[str, Any]) -> AgentState:
        """A state from :meth:`serialize` output.

        Raises:
            SerializationError: ``data`` is not such output.
        """
        ...


def rebuild(kind: str, data: Mapping[str, Any], build: Any) -> AgentState:
    """Run ``build(data)``, turning data errors into a :class:`SerializationError`."""
    if not isinstance(data, Mapping):
        raise SerializationError(f"a {kind} must be a JSON object, got {type(data).__name__}")
    try:
        state: AgentState = build(data)
    except KeyError as exc:
        raise SerializationError(f"{kind} is missing the field {exc.args[0]!r}") from exc
    except (TypeError, ValueError, pydantic.ValidationError) as exc:
        raise SerializationError(f"{kind} has an invalid value: {exc}") from exc
    return state


class FullAgentStateSerializer:
    """The lossless serializer."""

    def serialize(self, state: AgentState) -> dict[str, Any]:
        return state.to_dict()

    def deserialize(self, data: Mapping[str, Any]) -> AgentState:
        return rebuild("serialized agent state", data, AgentState.from_dict)

    def dumps(self, state: AgentState) -> str:
        """The state as JSON text."""
        return json.dumps(self.serialize(state), ensure_ascii=False)

    def loads(self, text: str) -> AgentState:
        """A state from :meth:`dumps` output.

        Raises:
            SerializationError: ``text`` is not JSON of a serialized state.
        """
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SerializationError(f"serialized agent state is not valid JSON: {exc}") from exc
        return self.deserialize(data)
