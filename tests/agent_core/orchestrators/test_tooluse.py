"""ToolUse end to end on the scripted driver: events, stop reasons, serialization."""

from __future__ import annotations

import pytest

from agent_core.app.demo_tools import calculator, demo_driver, demo_tools, get_weather
from agent_core.continuation import StopReason
from agent_core.drivers.scripted import ScriptedDriver, ScriptedFailure, ScriptedResponse, call
from agent_core.error_policy import ErrorPolicy
from agent_core.errors import ErrorType, ModelError
from agent_core.orchestrators.process_serialization import (
    FullProcessStateSerializer,
    SlimProcessStateSerializer,
)
from agent_core.orchestrators.tooluse import ToolUse, ToolUseState
from agent_core.serialization import SerializationError
from agent_core.slim import SlimSerializationConfig
from agent_core.state import AgentStatus
from tests.support.factories import TickingClock
from tests.support.orchestration import Recorder


def tool_use(driver: ScriptedDriver, **options: object) -> tuple[ToolUse, Recorder]:
    recorder = Recorder()
    orchestrator = ToolUse(driver, demo_tools(), clock=TickingClock(), **options)  # type: ignore[arg-type]
    orchestrator.listen(recorder)
    return orchestrator, recorder


async def test_weather_demo_runs_to_completion_with_its_events() -> None:
    orchestrator, recorder = tool_use(demo_driver("weather in Oslo"))
    state = await orchestrator.run("What is the weather in Oslo?")
    assert state.status is AgentStatus.COMPLETED
    assert state.stop_reason() is StopReason.COMPLETED
    assert "Oslo" in state.final_response()
    assert [len(r.step.tool_calls) for r in state.step_results()] == [1, 1, 0]
    assert [r.outcome.resolved_by for r in state.step_results()] == [
        "ToolCallPresenceCheck",
        "ToolCallPresenceCheck",
        "ToolCallPresenceCheck",
    ]
    step = ["process.step.started"]
    recorded = ["process.continuation", "process.state.updated", "process.step.completed"]
    tools = ["agent.tool.started", "agent.tool.completed"]
    assert recorder.types() == [
        "process.started",
        *step,
        "agent.stream.chunk",
        *tools,
        *recorded,
        *step,
        *tools,
        *recorded,
        *step,
        "agent.stream.chunk",
        *recorded,
        "process.completed",
    ]
    assert all(getattr(e, "process", "tool_use") == "tool_use" for e in recorder.events)


async def test_steps_limit_stops_a_model_that_keeps_calling_tools() -> None:
    again = ScriptedResponse(tool_calls=(call("calculator", "c", expression="1+1"),))
    orchestrator, _ = tool_use(ScriptedDriver([again] * 5), max_steps=2)
    state = await orchestrator.run("add")
    assert state.step_count() == 2
    assert state.stop_reason() is StopReason.STEPS_LIMIT
    assert state.status is AgentStatus.COMPLETED


async def test_token_limit_stops_with_its_reason() -> None:
    again = ScriptedResponse(tool_calls=(call("calculator", "c", expression="1+1"),))
    orchestrator, _ = tool_use(ScriptedDriver([again] * 5), max_tokens=30)
    state = await orchestrator.run("add these numbers please, again and again")
    assert state.stop_reason() is StopReason.TOKEN_LIMIT


async def test_a_model_failure_fails_the_run() -> None:
    driver = ScriptedDriver([ScriptedFailure(ModelError("upstream 500"))])
    orchestrator, _ = tool_use(driver)
    state = await orchestrator.run("hello")
    assert state.status is AgentStatus.FAILED
    assert state.stop_reason() is StopReason.ERROR
    (error,) = state.steps()[0].errors
    assert (error.error_type, error.message) == (ErrorType.MODEL, "upstream 500")


async def test_tool_errors_go_back_to_the_model_under_a_retry_policy() -> None:
    bad = ScriptedResponse(tool_calls=(call("calculator", "c1", expression="2 +"),))
    answer = ScriptedResponse(text="Sorry, that was not arithmetic.")
    orchestrator, _ = tool_use(
        ScriptedDriver([bad, answer]), error_policy=ErrorPolicy.retry_tool_errors(1)
    )
    state = await orchestrator.run("compute 2 +")
    assert state.status is AgentStatus.COMPLETED
    assert state.steps()[0].errors[0].error_type is ErrorType.TOOL
    assert state.messages[2].content.startswith("Error: ")


async def test_full_serialization_round_trips_and_the_run_can_continue() -> None:
    orchestrator, _ = tool_use(demo_driver("weather in Oslo"))
    state = await orchestrator.run("What is the weather in Oslo?")
    serializer = FullProcessStateSerializer(ToolUseState)
    again = serializer.loads(serializer.dumps(state))
    assert again == state
    assert again.continuation_outcome() == state.continuation_outcome()
    follow_up, _ = tool_use(ScriptedDriver([ScriptedResponse(text="You are welcome.")]))
    resumed = await follow_up.run(again.with_user_message("thanks"))
    assert resumed.step_count() == 4
    assert resumed.final_response() == "You are welcome."


async def test_slim_snapshot_keeps_steps_and_restores_a_continuable_state() -> None:
    orchestrator, _ = tool_use(demo_driver("weather in Oslo"))
    state = await orchestrator.run("What is the weather in Oslo?")
    slim = SlimProcessStateSerializer(ToolUseState, SlimSerializationConfig.full())
    data = slim.serialize(state)
    assert (data["id"], data["process"], data["status"]) == (state.id, "tool_use", "completed")
    assert [s["tool_calls"] for s in data["steps"]] == [
        [{"id": "call_weather_1", "name": "get_weather"}],
        [{"id": "call_calc_1", "name": "calculator"}],
        [],
    ]
    assert data["last_continuation"]["stop_reason"] == "completed"
    restored = slim.deserialize(data)
    assert restored.messages == state.messages
    assert (restored.usage, restored.status) == (state.usage, state.status)


def test_deserializing_bad_data_says_what_is_wrong() -> None:
    serializer = FullProcessStateSerializer(ToolUseState)
    with pytest.raises(SerializationError, match="missing the field 'id'"):
        serializer.deserialize({"kind": "tool_use"})
    with pytest.raises(SerializationError, match="not valid JSON"):
        serializer.loads("{")
    slim = SlimProcessStateSerializer(ToolUseState)
    with pytest.raises(SerializationError, match="snapshot of a chat process"):
        slim.deserialize({"process": "chat", "id": "x"})


def test_tools_can_be_given_as_functions() -> None:
    orchestrator = ToolUse(ScriptedDriver([]), [get_weather, calculator])
    assert orchestrator.tools.names() == ("get_weather", "calculator")
