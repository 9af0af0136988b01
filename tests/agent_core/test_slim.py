"""Slim snapshots: the schema (docs/agent_core.md), truncation, omission, redaction, presets, timing
across pause/resume, and continuing a run from a restored snapshot."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from agent_core.agent import Agent
from agent_core.app.demo_tools import calculator, get_weather
from agent_core.builder import AgentBuilder
from agent_core.continuation import StopReason
from agent_core.drivers.scripted import ScriptedDriver, ScriptedResponse, ScriptedTurn, call
from agent_core.messages import Message, Role
from agent_core.serialization import SerializationError
from agent_core.slim import OMITTED_TOOL_RESULT, SlimAgentStateSerializer, SlimSerializationConfig
from agent_core.state import AgentState, AgentStatus
from tests.support.factories import TickingClock

WEATHER = call("get_weather", "call_w", city="Oslo")
MATH = call("calculator", "call_m", expression="6 * 7")


def agent(
    turns: Sequence[ScriptedTurn], clock: TickingClock, builder: AgentBuilder | None = None
) -> Agent:
    return (
        (builder or AgentBuilder())
        .with_driver(ScriptedDriver(turns))
        .with_tools(get_weather, calculator)
        .with_clock(clock)
        .build()
    )


async def finished_run() -> AgentState:
    turns = [ScriptedResponse(tool_calls=(WEATHER, MATH)), ScriptedResponse(text="All done.")]
    return await agent(turns, TickingClock()).run("Weather in Oslo and 6*7?")


async def test_snapshot_has_exactly_the_seed_schema() -> None:
    state = await finished_run()
    snap = SlimAgentStateSerializer(SlimSerializationConfig.full()).serialize(state)
    json.dumps(snap)
    assert list(snap) == [
        "agent_id",
        "parent_agent_id",
        "status",
        "step_count",
        "usage",
        "execution",
        "messages",
        "steps",
        "last_continuation",
        "metadata",
    ]
    assert (snap["agent_id"], snap["status"], snap["step_count"]) == (
        state.agent_id,
        "completed",
        2,
    )
    assert set(snap["usage"]) == {"prompt", "completion", "total"}
    assert snap["execution"]["started_at"] == "2026-01-16T10:00:00Z"
    assert snap["execution"]["updated_at"].endswith("Z")
    assert snap["execution"]["cumulative_seconds"] == state.execution.cumulative_seconds
    user, assistant, _weather, math, final = snap["messages"]
    assert user == {"role": "user", "content": "Weather in Oslo and 6*7?", "metadata": {}}
    assert assistant["metadata"]["tool_calls"] == [
        {"id": "call_w", "name": "get_weather", "arguments": {"city": "Oslo"}},
        {"id": "call_m", "name": "calculator", "arguments": {"expression": "6 * 7"}},
    ]
    assert math == {
        "role": "tool",
        "content": "42",
        "metadata": {"tool_call_id": "call_m", "tool_name": "calculator"},
    }
    assert final["content"] == "All done."
    first_step, last_step = snap["steps"]
    assert first_step == {
        "step_number": 1,
        "type": "tool_execution",
        "has_tool_calls": True,
        "finish_reason": "tool_calls",
        "errors": 0,
        "usage": {"total": state.steps()[0].usage.total},
        "duration_ms": first_step["duration_ms"],
        "tool_calls": [
            {"id": "call_w", "name": "get_weather"},
            {"id": "call_m", "name": "calculator"},
        ],
    }
    assert first_step["duration_ms"] > 0
    assert (last_step["type"], last_step["finish_reason"]) == ("final", "stop")
    assert snap["last_continuation"] == {
        "should_continue": False,
        "stop_reason": "completed",
        "resolved_by": "ToolCallPresenceCheck",
    }


@pytest.mark.parametrize(("length", "expected"), [(10, "x" * 10), (11, "x" * 10 + "...")])
def test_content_is_truncated_with_an_ellipsis(length: int, expected: str) -> None:
    state = AgentState().with_user_message("x" * length)
    config = SlimSerializationConfig(max_content_length=10)
    assert SlimAgentStateSerializer(config).serialize(state)["messages"][0]["content"] == expected


async def test_minimal_preset_omits_tool_results_steps_and_trace() -> None:
    snap = SlimAgentStateSerializer(SlimSerializationConfig.minimal()).serialize(
        await finished_run()
    )
    tool_messages = [m for m in snap["messages"] if m["role"] == "tool"]
    assert [m["content"] for m in tool_messages] == [OMITTED_TOOL_RESULT] * 2
    assert snap["steps"] == []
    assert snap["last_continuation"] is None


async def test_standard_preset_has_steps_but_no_trace() -> None:
    snap = SlimAgentStateSerializer().serialize(await finished_run())
    assert len(snap["steps"]) == 2
    assert snap["last_continuation"] is None


async def test_tool_arguments_can_be_redacted() -> None:
    config = SlimSerializationConfig(redact_tool_args=True)
    snap = SlimAgentStateSerializer(config).serialize(await finished_run())
    assert snap["messages"][1]["metadata"]["tool_calls"] == [
        {"id": "call_w", "name": "get_weather"},
        {"id": "call_m", "name": "calculator"},
    ]


async def test_long_tool_arguments_keep_only_the_start_of_their_json() -> None:
    """A model can send megabytes of arguments (up to the driver's limit per call): the
    snapshot, stored for a day, keeps max_content_length of them; restored, the call
    goes on with empty arguments."""
    long = call("calculator", "call_l", expression="1+" * 5_000 + "1")
    turns = [ScriptedResponse(tool_calls=(WEATHER, long)), ScriptedResponse(text="ok")]
    state = await agent(turns, TickingClock()).run("Sum it")
    config = SlimSerializationConfig(max_content_length=100)
    serializer = SlimAgentStateSerializer(config)
    snap = serializer.serialize(state)
    kept, clipped = snap["messages"][1]["metadata"]["tool_calls"]
    assert kept == {"id": "call_w", "name": "get_weather", "arguments": {"city": "Oslo"}}
    assert clipped == {
        "id": "call_l",
        "name": "calculator",
        "arguments_clipped": '{"expression":"' + "1+" * 42 + "1...",
    }
    assert len(json.dumps(snap)) < 2_000
    restored = serializer.deserialize(snap).messages[1].tool_calls
    assert [(c.id, dict(c.arguments)) for c in restored] == [
        ("call_w", {"city": "Oslo"}),
        ("call_l", {}),
    ]


async def test_windows_keep_the_most_recent_messages_and_steps() -> None:
    config = SlimSerializationConfig(max_messages=2, max_steps=1)
    snap = SlimAgentStateSerializer(config).serialize(await finished_run())
    assert [m["role"] for m in snap["messages"]] == ["tool", "assistant"]
    assert [s["step_number"] for s in snap["steps"]] == [2]


async def test_restoring_a_cut_window_drops_orphan_tool_results() -> None:
    config = SlimSerializationConfig(max_messages=3)
    serializer = SlimAgentStateSerializer(config)
    restored = serializer.deserialize(serializer.serialize(await finished_run()))
    assert [m.role for m in restored.messages] == [Role.ASSISTANT]


def test_presets() -> None:
    minimal, standard, full = (
        SlimSerializationConfig.minimal(),
        SlimSerializationConfig.standard(),
        SlimSerializationConfig.full(),
    )
    assert (minimal.max_messages, minimal.max_steps, minimal.max_content_length) == (20, 0, 500)
    assert not minimal.include_tool_results
    assert not minimal.include_steps
    assert standard == SlimSerializationConfig(50, 20, 2000, True, True, False, False)
    assert (full.max_messages, full.max_steps, full.max_content_length) == (100, 50, 5000)
    assert full.include_continuation_trace
    with pytest.raises(ValueError, match="max_messages must be 0 or more"):
        SlimSerializationConfig(max_messages=-1)


async def test_run_snapshot_restore_and_continue() -> None:
    """A run paused by its step limit after a tool call is restored from its slim
    snapshot and continued by a new agent to completion."""
    clock = TickingClock()
    paused = await agent(
        [ScriptedResponse(tool_calls=(WEATHER,))], clock, AgentBuilder().with_max_steps(1)
    ).run("Weather in Oslo?")
    assert paused.stop_reason() is StopReason.STEPS_LIMIT
    serializer = SlimAgentStateSerializer()
    snapshot = json.loads(json.dumps(serializer.serialize(paused)))
    restored = serializer.deserialize(snapshot)
    assert restored.agent_id == paused.agent_id
    assert restored.messages == paused.messages
    assert restored.usage == paused.usage
    assert restored.step_results() == ()

    driver = ScriptedDriver([ScriptedResponse(text="It is lovely in Oslo.")])
    resumed_agent = (
        AgentBuilder().with_driver(driver).with_tools(get_weather).with_clock(clock).build()
    )
    final = await resumed_agent.run(restored)
    assert final.status is AgentStatus.COMPLETED
    assert final.final_response() == "It is lovely in Oslo."
    assert driver.requests[0].messages == paused.messages
    assert final.usage.total > paused.usage.total


async def test_cumulative_seconds_add_up_across_pause_and_resume() -> None:
    clock = TickingClock()
    first = await agent([ScriptedResponse(text="one")], clock).run("hi")
    serializer = SlimAgentStateSerializer()
    first_seconds = serializer.serialize(first)["execution"]["cumulative_seconds"]
    assert first_seconds > 0
    restored = serializer.deserialize(serializer.serialize(first))
    clock.now = clock.now.replace(year=2027)  # a long pause does not count
    second = await agent([ScriptedResponse(text="two")], clock).run(
        restored.with_user_message("again")
    )
    second_run = second.execution.cumulative_seconds - first_seconds
    assert 0 < second_run < 3600
    assert serializer.serialize(second)["execution"]["cumulative_seconds"] == pytest.approx(
        second.execution.cumulative_seconds
    )


async def test_cumulative_time_limit_survives_a_snapshot() -> None:
    clock = TickingClock()
    first = await agent([ScriptedResponse(text="one")], clock).run("hi")
    spent = first.execution.cumulative_seconds
    serializer = SlimAgentStateSerializer()
    restored = serializer.deserialize(serializer.serialize(first)).with_user_message("more")
    builder = AgentBuilder().with_cumulative_time_limit(spent)
    driver_turns = [ScriptedResponse(text="never")]
    final = await agent(driver_turns, clock, builder).run(restored)
    assert final.stop_reason() is StopReason.TIME_LIMIT
    assert final.final_response() == "one"


def test_restored_messages_keep_their_own_metadata() -> None:
    message = Message(role=Role.USER, content="hi", metadata={"lang": "en"})
    serializer = SlimAgentStateSerializer()
    restored = serializer.deserialize(serializer.serialize(AgentState().with_message(message)))
    assert restored.messages == (message,)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.pop("execution"), "slim agent snapshot is missing the field 'execution'"),
        (lambda d: d.update(status="dozing"), "invalid value: 'dozing'"),
        (lambda d: d["messages"].append({"role": "robot"}), "invalid value: 'robot'"),
    ],
)
def test_bad_snapshots_are_explained(
    mutate: Callable[[dict[str, Any]], object], message: str
) -> None:
    serializer = SlimAgentStateSerializer()
    data = serializer.serialize(AgentState().with_user_message("hi"))
    mutate(data)
    with pytest.raises(SerializationError, match=message):
        serializer.deserialize(data)
