"""Session context and memory for capability routing (docs/agent_core.md).

A :class:`SessionContext` is what a session remembers: its earlier turns (input,
resolved input, capability, output, success). A :class:`SessionMemory` stores contexts
by session id (:class:`InMemorySessionMemory` keeps them in this process, bounded per
session). A :class:`ReferenceResolver` rewrites a follow-up ("and in Paris?") into a
standalone request using the context; :class:`ModelReferenceResolver` asks a model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from agent_core.drivers.base import ModelDriver, ModelRequest, complete
from agent_core.messages import Message, Usage

__all__ = [
    "InMemorySessionMemory",
    "ModelReferenceResolver",
    "ReferenceResolver",
    "Resolution",
    "SessionContext",
    "SessionMemory",
    "SessionTurn",
]


@dataclass(frozen=True, slots=True)
class SessionTurn:
    """One finished request of a session."""

    input: str
    output: str
    capability: str | None = None
    success: bool = True
    resolved_input: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "input": self.input,
            "output": self.output,
            "capability": self.capability,
            "success": self.success,
            "resolved_input": self.resolved_input,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SessionTurn:
        return cls(
            input=str(data["input"]),
            output=str(data["output"]),
            capability=data.get("capability"),
            success=bool(data.get("success", True)),
            resolved_input=data.get("resolved_input"),
        )


@dataclass(frozen=True, slots=True)
class SessionContext:
    """What a session remembers (oldest turn first)."""

    session_id: str
    turns: tuple[SessionTurn, ...] = ()

    def with_turn(self, turn: SessionTurn, max_turns: int | None = None) -> SessionContext:
        turns = (*self.turns, turn)
        if max_turns is not None:
            turns = turns[-max_turns:] if max_turns > 0 else ()
        return replace(self, turns=turns)

    def last_turn(self) -> SessionTurn | None:
        return self.turns[-1] if self.turns else None

    def messages(self) -> tuple[Message, ...]:
        """The turns as a conversation (user input, assistant output)."""
        out: list[Message] = []
        for turn in self.turns:
            out += [Message.user(turn.resolved_input or turn.input), Message.assistant(turn.output)]
        return tuple(out)

    def to_dict(self) -> dict[str, Any]:
        return {"session_id": self.session_id, "turns": [t.to_dict() for t in self.turns]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SessionContext:
        return cls(
            session_id=str(data["session_id"]),
            turns=tuple(SessionTurn.from_dict(t) for t in data.get("turns", ())),
        )


class SessionMemory(Protocol):
    """Stores session contexts."""

    async def load(self, session_id: str) -> SessionContext:
        """The session's context (empty for a new session)."""
        ...

    async def append(self, session_id: str, turn: SessionTurn) -> SessionContext:
        """Add a finished turn; return the updated context."""
        ...


@dataclass
class InMemorySessionMemory:
    """Session contexts in this process, the last ``max_turns`` turns per session."""

    max_turns: int = 50
    _contexts: dict[str, SessionContext] = field(default_factory=dict)

    async def load(self, session_id: str) -> SessionContext:
        return self._contexts.get(session_id) or SessionContext(session_id)

    async def append(self, session_id: str, turn: SessionTurn) -> SessionContext:
        context = (await self.load(session_id)).with_turn(turn, self.max_turns)
        self._contexts[session_id] = context
        return context


@dataclass(frozen=True, slots=True)
class Resolution:
    """A rewritten request and the tokens rewriting it cost."""

    text: str
    usage: Usage = field(default_factory=Usage)


class ReferenceResolver(Protocol):
    """Rewrites a follow-up request into a standalone one."""

    async def resolve(self, message: str, context: SessionContext) -> Resolution: ...


class ModelReferenceResolver:
    """Asks a model to rewrite the request using the session's earlier turns; an
    empty answer keeps the request as it was.

    Args:
        driver: the model.
        instructions: replaces the default instructions.
    """

    def __init__(self, driver: ModelDriver, *, instructions: str | None = None) -> None:
        self.driver = driver
        self.instructions = instructions or (
            "Rewrite the user's last request so that it can be understood without the "
            "conversation: replace pronouns and references with what they refer to. "
            "Answer with the rewritten request only."
        )

    async def resolve(self, message: str, context: SessionContext) -> Resolution:
        request = ModelRequest(
            messages=(
                Message.system(self.instructions),
                *context.messages(),
                Message.user(message),
            )
        )
        response = await complete(self.driver, request)
        return Resolution(response.content.strip() or message, response.usage)
