"""Helpers for the orchestrator tests: envelope validation and a recording listener."""

from __future__ import annotations

from typing import Any

import jsonschema
import orjson

from agent_core.events import AgentEvent
from broadcaster.envelope import Envelope, json_schema, parse_envelope

# Built once: jsonschema.validate() re-checks the schema itself on every call.
VALIDATOR = jsonschema.Draft202012Validator(json_schema())


def valid(data: dict[str, Any] | Envelope) -> Envelope:
    """``data`` checked against the published JSON Schema and the models."""
    raw = data if isinstance(data, dict) else orjson.loads(data.to_json())
    VALIDATOR.validate(raw)
    return parse_envelope(raw)


class Recorder:
    """Records every event an orchestrator emits."""

    def __init__(self) -> None:
        self.events: list[AgentEvent] = []

    def __call__(self, event: AgentEvent) -> None:
        self.events.append(event)

    def types(self) -> list[str]:
        """Event types, runs of stream chunks collapsed to one entry."""
        out: list[str] = []
        for event in self.events:
            if event.type == "agent.stream.chunk" and out[-1:] == ["agent.stream.chunk"]:
                continue
            out.append(event.type)
        return out

    def of(self, kind: type[AgentEvent]) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]
