"""Events of the step-by-step orchestrators (tool use, chat, collaboration, routing).

They are :class:`~agent_core.events.AgentEvent`\\ s, so the same
:class:`~agent_core.events.EventDispatcher` delivers them and the same fields reach an
envelope adapter: ``agent_id`` is the emitting process's id (a chat's, a router's),
``execution_id`` its run. Each carries ``process`` (``tool_use``, ``chat``,
``collaboration`` or ``routing``). Tool calls, capability executions and streamed
text reuse the agent's :class:`~agent_core.events.ToolCallStarted`,
:class:`~agent_core.events.ToolCallCompleted` and
:class:`~agent_core.events.StreamChunk`.

See :mod:`agent_core.adapters.orchestration_broadcasting` for how they become envelopes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from agent_core.continuation import ContinuationOutcome, StopReason
from agent_core.errors import ErrorType
from agent_core.events import AgentEvent, _plain
from agent_core.messages import FinishReason, ToolCall, Usage
from agent_core.orchestrators.process import ProcessState
from agent_core.orchestrators.routing.decider import ContinuationResult
from agent_core.state import AgentStatus

__all__ = [
    "ActorSelected",
    "CapabilitySelected",
    "CollaboratorSelected",
    "ContinuationDecided",
    "IntentClassified",
    "ParticipantSelected",
    "ProcessCompleted",
    "ProcessContinuationEvaluated",
    "ProcessEvent",
    "ProcessStarted",
    "ProcessStateUpdated",
    "ProcessStepCompleted",
    "ProcessStepFailed",
    "ProcessStepStarted",
    "ReferencesResolved",
    "SessionMemoryAppended",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcessEvent(AgentEvent):
    """Base of orchestrator events; ``agent_id`` is the process's id."""

    type: ClassVar[str] = "process.event"
    process: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcessStarted(ProcessEvent):
    type: ClassVar[str] = "process.started"
    message_count: int
    actors: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcessStepStarted(ProcessEvent):
    """A step begins; ``actor`` is the participant / collaborator / capability."""

    type: ClassVar[str] = "process.step.started"
    step_number: int
    actor: str | None
    message_count: int
    available_tools: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class ActorSelected(ProcessEvent):
    """Who acts in the next step, who chose and why; ``fallback`` is true when the
    choice failed and a default was taken."""

    type: ClassVar[str] = "process.actor.selected"
    step_number: int
    actor: str
    selector: str
    reason: str
    fallback: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class ParticipantSelected(ActorSelected):
    type: ClassVar[str] = "chat.participant.selected"


@dataclass(frozen=True, slots=True, kw_only=True)
class CollaboratorSelected(ActorSelected):
    type: ClassVar[str] = "collaboration.collaborator.selected"


@dataclass(frozen=True, slots=True, kw_only=True)
class CapabilitySelected(ActorSelected):
    type: ClassVar[str] = "routing.capability.selected"
    arguments: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class ReferencesResolved(ProcessEvent):
    """The reference resolver rewrote the input using the session context."""

    type: ClassVar[str] = "routing.references.resolved"
    call_id: str
    original: str
    resolved: str
    duration_ms: float
    step_number: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class IntentClassified(ProcessEvent):
    """The intent classifier named a capability and its arguments (``confidence``:
    0..1, None when the classifier gives none)."""

    type: ClassVar[str] = "routing.intent.classified"
    call_id: str
    classifier: str
    message: str
    capability: str
    arguments: Mapping[str, Any]
    reason: str
    duration_ms: float
    confidence: float | None = None
    step_number: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ContinuationDecided(ProcessEvent):
    """The continuation decider judged a capability's result: ``decision`` is its
    answer, or None when it failed (``error``; the capability's output stands)."""

    type: ClassVar[str] = "routing.continuation.decided"
    call_id: str
    decider: str
    capability: str
    success: bool
    decision: ContinuationResult | None
    error: str | None
    duration_ms: float
    step_number: int


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionMemoryAppended(ProcessEvent):
    """The request's turn was remembered (``turns``: the session's turns now kept;
    ``capability``, ``success``: the turn's; ``step_number``: the request's last step)."""

    type: ClassVar[str] = "routing.memory.appended"
    session_id: str
    turns: int
    call_id: str = ""
    capability: str | None = None
    success: bool = True
    duration_ms: float = 0.0
    step_number: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcessContinuationEvaluated(ProcessEvent):
    """The outcome judged after a step (``step_number`` 0: before the first step)."""

    type: ClassVar[str] = "process.continuation"
    step_number: int
    outcome: ContinuationOutcome


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcessStepCompleted(ProcessEvent):
    type: ClassVar[str] = "process.step.completed"
    step_number: int
    step_id: str
    actor: str | None
    content: str
    tool_calls: tuple[ToolCall, ...]
    errors: int
    error_messages: tuple[str, ...]
    finish_reason: FinishReason | None
    usage: Usage
    duration_ms: float
    outcome: ContinuationOutcome


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcessStepFailed(ProcessStepCompleted):
    """A step that raised; recorded as a failure step with its outcome."""

    type: ClassVar[str] = "process.step.failed"
    error_type: ErrorType
    error_message: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcessStateUpdated(ProcessEvent):
    """The state after a step was recorded (listeners may snapshot it)."""

    type: ClassVar[str] = "process.state.updated"
    state: ProcessState[Any]

    def payload(self) -> dict[str, Any]:
        state = self.state
        return {
            "process": self.process,
            "status": state.status.value,
            "step_count": state.step_count(),
            "message_count": len(state.messages),
            "usage": _plain(state.usage),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcessCompleted(ProcessEvent):
    """The execution ended (completed or failed) and why."""

    type: ClassVar[str] = "process.completed"
    status: AgentStatus
    stop_reason: StopReason
    step_count: int
    usage: Usage
    final_response: str
    error_message: str | None = None
