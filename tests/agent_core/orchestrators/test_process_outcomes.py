"""Orchestrator outcomes follow the agent's rules (issue 14): an error on the last
allowed step fails the run, a stop before step 1 is recorded, and a failed run says
why; transient data is not serialized."""

from __future__ import annotations

from typing import Any

import pytest

from agent_core.continuation import ContinuationCriteria, StopReason
from agent_core.criteria import StepsLimit
from agent_core.drivers.scripted import ScriptedDriver, ScriptedFailure, ScriptedResponse
from agent_core.errors import ModelError
from agent_core.orchestrators.chat import Chat, ModelParticipant
from agent_core.orchestrators.collaboration import Collaboration, ModelCollaborator
from agent_core.orchestrators.orchestration_events import (
    ProcessCompleted,
    ProcessContinuationEvaluated,
)
from agent_core.orchestrators.process import ProcessState
from agent_core.orchestrators.process_serialization import SlimProcessStateSerializer
from agent_core.orchestrators.stepbystep import StepByStep
from agent_core.orchestrators.tooluse import ToolUse, ToolUseState
from agent_core.state import AgentStatus
from tests.support.factories import TickingClock
from tests.support.orchestration import Recorder


def failing() -> ScriptedDriver:
    return ScriptedDriver([ScriptedFailure(ModelError("the model is down"))] * 3)


def tool_use() -> StepByStep[Any, Any]:
    return ToolUse(failing(), max_steps=1, clock=TickingClock())


def chat() -> StepByStep[Any, Any]:
    return Chat([ModelParticipant("bot", failing())], max_steps=1, clock=TickingClock())


def collaboration() -> StepByStep[Any, Any]:
    return Collaboration([ModelCollaborator("bot", failing())], max_steps=1, clock=TickingClock())


@pytest.mark.parametrize("make", [tool_use, chat, collaboration])
async def test_an_error_on_the_last_allowed_step_fails_the_run(make: Any) -> None:
    """ToolUse stops on the error; Chat and Collaboration would retry it, but the step
    budget forbids the retry, so the error stands."""
    orchestrator = make()
    recorder = Recorder()
    orchestrator.listen(recorder)
    state: ProcessState[Any] = await orchestrator.run("hello")
    assert (state.status, state.stop_reason()) == (AgentStatus.FAILED, StopReason.ERROR)
    outcome = state.continuation_outcome()
    assert outcome is not None
    assert outcome.resolved_by == "ErrorPolicyCriterion"
    assert "StepsLimit" in [e.criterion for e in outcome.evaluations if e.decision == "forbid"]
    (completed,) = recorder.of(ProcessCompleted)
    assert isinstance(completed, ProcessCompleted)
    assert (completed.status, completed.stop_reason) == (AgentStatus.FAILED, StopReason.ERROR)
    assert completed.error_message == "the model is down"
    snapshot = SlimProcessStateSerializer(type(state)).serialize(state)
    assert (snapshot["status"], snapshot["error_message"]) == ("failed", "the model is down")


async def test_a_stop_before_step_one_is_recorded_with_its_error() -> None:
    def broken(state: ToolUseState) -> bool:
        raise RuntimeError("bad criterion")

    criteria = ContinuationCriteria[ToolUseState](StepsLimit(3), broken)
    orchestrator = ToolUse(failing(), criteria=criteria, clock=TickingClock())
    recorder = Recorder()
    orchestrator.listen(recorder)
    state = await orchestrator.run("hello")
    outcome = state.continuation_outcome()
    assert outcome is not None
    assert outcome.resolved_by == "broken"
    assert (state.status, state.stop_reason()) == (AgentStatus.FAILED, StopReason.ERROR)
    assert state.error_message() == "broken raised RuntimeError: bad criterion"
    steps = [e.step_number for e in recorder.of(ProcessContinuationEvaluated)]  # type: ignore[attr-defined]
    assert steps == [0]
    (completed,) = recorder.of(ProcessCompleted)
    assert completed.error_message == "broken raised RuntimeError: bad criterion"  # type: ignore[attr-defined]


async def test_the_current_step_is_transient_and_selection_read_only() -> None:
    orchestrator = ToolUse(ScriptedDriver([ScriptedResponse(text="hi")]), clock=TickingClock())
    state = orchestrator.new_state("hello").begin_step(orchestrator.clock())
    state = state.with_actor("model", {"reason": "only one", "tags": ["a"]})
    assert "current" not in state.to_dict()
    assert ToolUseState.from_dict(state.to_dict()).current is None
    current = state.current
    assert current is not None
    with pytest.raises(TypeError, match="read-only"):
        current.selection["tags"].append("b")
    final = await orchestrator.run("hello")
    assert final.current is None
