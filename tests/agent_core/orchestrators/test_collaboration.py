"""Collaboration: collaborators take turns on a shared task."""

from __future__ import annotations

import pytest

from agent_core.app.demo_tools import demo_tools
from agent_core.continuation import StopReason
from agent_core.drivers.scripted import ScriptedDriver, ScriptedFailure, ScriptedResponse, call
from agent_core.errors import ModelTimeoutError
from agent_core.messages import FinishReason
from agent_core.orchestrators.chat import ChatState
from agent_core.orchestrators.collaboration import (
    CallableCollaborator,
    Collaboration,
    CollaborationState,
    CollaborationStep,
    ModelCollaborator,
    ScriptedCollaborator,
)
from agent_core.orchestrators.orchestration_events import CollaboratorSelected, ProcessCompleted
from agent_core.orchestrators.process_serialization import (
    FullProcessStateSerializer,
    SlimProcessStateSerializer,
)
from agent_core.orchestrators.turns import ActorReply, ModelSelector
from agent_core.serialization import SerializationError
from agent_core.state import AgentStatus
from tests.support.factories import TickingClock
from tests.support.orchestration import Recorder


def collaboration(*collaborators: object, **options: object) -> tuple[Collaboration, Recorder]:
    recorder = Recorder()
    orchestrator = Collaboration(collaborators, clock=TickingClock(), **options)  # type: ignore[arg-type]
    orchestrator.listen(recorder)
    return orchestrator, recorder


def writer_and_reviewer() -> tuple[ScriptedCollaborator, ModelCollaborator]:
    writer = ScriptedCollaborator("writer", ["Draft: the sky is green."])
    reviewer = ModelCollaborator(
        "reviewer",
        ScriptedDriver(
            [
                ScriptedResponse(tool_calls=(call("calculator", "c1", expression="2+2"),)),
                ScriptedResponse(text="Fixed: the sky is blue; 2+2=4."),
            ]
        ),
        tools=demo_tools(),
        description="checks facts",
    )
    return writer, reviewer


async def test_writer_then_reviewer_with_tools_finishes_the_task() -> None:
    orchestrator, recorder = collaboration(*writer_and_reviewer())
    state = await orchestrator.run("Write one true sentence.")
    assert [r.step.collaborator for r in state.step_results()] == ["writer", "reviewer"]
    assert all(isinstance(s, CollaborationStep) for s in state.steps())
    assert state.steps()[1].tool_calls[0].name == "calculator"
    assert state.stop_reason() is StopReason.FINISH_REASON
    assert state.final_response() == "Fixed: the sky is blue; 2+2=4."
    selected = recorder.of(CollaboratorSelected)
    assert [(e.type, e.actor) for e in selected] == [
        ("collaboration.collaborator.selected", "writer"),
        ("collaboration.collaborator.selected", "reviewer"),
    ]
    (done,) = recorder.of(ProcessCompleted)
    assert (done.process, done.stop_reason, done.status) == (
        "collaboration",
        StopReason.FINISH_REASON,
        AgentStatus.COMPLETED,
    )


async def test_model_selector_picks_a_collaborator_by_name() -> None:
    selector = ModelSelector(ScriptedDriver([ScriptedResponse(text="reviewer")]))
    writer, reviewer = writer_and_reviewer()
    orchestrator, _ = collaboration(writer, reviewer, selector=selector)
    state = await orchestrator.run("Check: 2+2")
    assert [r.actor for r in state.step_results()] == ["reviewer"]


async def test_stop_reasons_steps_limit_and_exhausted_retries() -> None:
    loop = CallableCollaborator("loop", lambda turn: "again")
    orchestrator, _ = collaboration(loop, max_steps=4)
    state = await orchestrator.run("go")
    assert (state.step_count(), state.stop_reason()) == (4, StopReason.STEPS_LIMIT)

    slow = ModelCollaborator("slow", ScriptedDriver([ScriptedFailure(ModelTimeoutError("t"))] * 2))
    orchestrator, _ = collaboration(slow, max_retries=1)
    failed = await orchestrator.run("go")
    assert (failed.step_count(), failed.stop_reason()) == (2, StopReason.ERROR)
    assert failed.status is AgentStatus.FAILED


async def test_a_collaborator_can_end_with_its_own_finish_reason() -> None:
    done = ScriptedCollaborator("done", [ActorReply("final", FinishReason.LENGTH)])
    orchestrator, _ = collaboration(done)
    state = await orchestrator.run("go")
    assert state.stop_reason() is StopReason.FINISH_REASON


async def test_serialization_round_trips_and_kinds_are_checked() -> None:
    orchestrator, _ = collaboration(*writer_and_reviewer())
    state = await orchestrator.run("Write one true sentence.")
    full = FullProcessStateSerializer(CollaborationState)
    again = full.deserialize(full.serialize(state))
    assert again == state
    assert again.steps()[1].tool_executions == state.steps()[1].tool_executions
    with pytest.raises(SerializationError, match="collaboration state, not a chat state"):
        FullProcessStateSerializer(ChatState).deserialize(full.serialize(state))
    slim = SlimProcessStateSerializer(CollaborationState)
    data = slim.serialize(state)
    assert data["process"] == "collaboration"
    assert data["steps"][1]["tool_calls"] == [{"id": "c1", "name": "calculator"}]
    assert slim.deserialize(data).messages == state.messages
