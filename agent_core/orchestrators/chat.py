"""Chat: participants take turns on the step-by-step base (docs/agent_core.md).

A selector (:class:`~agent_core.orchestrators.turns.RoundRobinSelector` by default, or
:class:`~agent_core.orchestrators.turns.ModelSelector`) chooses the participant of each step; the
participant answers and the answer is recorded as a :class:`ChatStep` in a
:class:`~agent_core.orchestrators.process.StepRecord`. Participants: :class:`ScriptedParticipant`,
:class:`CallableParticipant` (external), :class:`ModelParticipant` (a model, with or
without tools). Events: ``chat.participant.selected`` plus the process events.

Defaults (docs/agent_core.md): finish reasons stop/length/content_filter end the chat,
16 steps, 4096 tokens, an error check that retries a failed turn twice.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent_core.orchestrators.orchestration_events import ParticipantSelected
from agent_core.orchestrators.process import ProcessState
from agent_core.orchestrators.turns import (
    Actor,
    CallableActor,
    ModelActor,
    ScriptedActor,
    TurnOrchestrator,
    TurnStep,
)

__all__ = [
    "CallableParticipant",
    "Chat",
    "ChatState",
    "ChatStep",
    "ModelParticipant",
    "Participant",
    "ScriptedParticipant",
]

Participant = Actor
"""A chat participant (anything with ``name``, ``role``, ``description``, ``act``)."""


class ScriptedParticipant(ScriptedActor):
    """A participant playing scripted replies (see
    :class:`~agent_core.orchestrators.turns.ScriptedActor`)."""


class CallableParticipant(CallableActor):
    """An external participant (see :class:`~agent_core.orchestrators.turns.CallableActor`)."""


class ModelParticipant(ModelActor):
    """A model-backed participant, with or without tools
    (see :class:`~agent_core.orchestrators.turns.ModelActor`)."""


@dataclass(frozen=True, slots=True)
class ChatStep(TurnStep):
    """One participant's turn."""

    @property
    def participant(self) -> str:
        return self.actor


@dataclass(frozen=True, slots=True)
class ChatState(ProcessState[ChatStep]):
    """The state of a chat."""

    kind = "chat"

    @classmethod
    def decode_step(cls, data: Mapping[str, Any]) -> ChatStep:
        return ChatStep.from_dict(data)


class Chat(TurnOrchestrator[ChatState, ChatStep]):
    """Participants take turns (see the module docstring and
    :class:`~agent_core.orchestrators.turns.TurnOrchestrator` for the arguments)."""

    process = "chat"
    state_class = ChatState
    step_class = ChatStep
    role_name = "participant"
    selected_event = ParticipantSelected

    @property
    def participants(self) -> tuple[Participant, ...]:
        return tuple(self.roster.values())
