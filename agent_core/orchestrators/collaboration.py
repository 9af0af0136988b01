"""Collaboration: collaborators take turns on a shared task (docs/agent_core.md).

The same shape as :mod:`agent_core.orchestrators.chat` with collaborators: a selector chooses the
collaborator of each step (round robin, or a model naming one with a fallback to the
first), the collaborator works on the shared conversation, and its contribution is
recorded as a :class:`CollaborationStep`. Events: ``collaboration.collaborator.selected``
plus the process events. Defaults as for Chat.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent_core.orchestrators.orchestration_events import CollaboratorSelected
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
    "CallableCollaborator",
    "Collaboration",
    "CollaborationState",
    "CollaborationStep",
    "Collaborator",
    "ModelCollaborator",
    "ScriptedCollaborator",
]

Collaborator = Actor
"""A collaborator (anything with ``name``, ``role``, ``description``, ``act``)."""


class ScriptedCollaborator(ScriptedActor):
    """A collaborator playing scripted contributions."""


class CallableCollaborator(CallableActor):
    """An external collaborator (a function of the turn)."""


class ModelCollaborator(ModelActor):
    """A model-backed collaborator, with or without tools."""


@dataclass(frozen=True, slots=True)
class CollaborationStep(TurnStep):
    """One collaborator's contribution."""

    @property
    def collaborator(self) -> str:
        return self.actor


@dataclass(frozen=True, slots=True)
class CollaborationState(ProcessState[CollaborationStep]):
    """The state of a collaboration."""

    kind = "collaboration"

    @classmethod
    def decode_step(cls, data: Mapping[str, Any]) -> CollaborationStep:
        return CollaborationStep.from_dict(data)


class Collaboration(TurnOrchestrator[CollaborationState, CollaborationStep]):
    """Collaborators take turns (see :class:`~agent_core.orchestrators.turns.TurnOrchestrator` for
    the arguments)."""

    process = "collaboration"
    state_class = CollaborationState
    step_class = CollaborationStep
    role_name = "collaborator"
    selected_event = CollaboratorSelected

    @property
    def collaborators(self) -> tuple[Collaborator, ...]:
        return tuple(self.roster.values())
