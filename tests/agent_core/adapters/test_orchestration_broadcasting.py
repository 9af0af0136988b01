"""Every orchestrator's events become valid envelopes of the agent's types, in order,
on the session's channel: recorded, and through a real server to a Pusher client."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from agent_core.adapters.broadcasting import AdapterOptions
from agent_core.adapters.orchestration_broadcasting import OrchestrationEventAdapter
from agent_core.app.demo_tools import calculator, demo_driver, demo_tools, get_weather
from agent_core.drivers.scripted import ScriptedDriver, ScriptedFailure, ScriptedResponse, call
from agent_core.errors import ModelError
from agent_core.messages import Role
from agent_core.orchestrators.chat import Chat, ModelParticipant, ScriptedParticipant
from agent_core.orchestrators.collaboration import (
    Collaboration,
    ModelCollaborator,
    ScriptedCollaborator,
)
from agent_core.orchestrators.routing.classifier import Rule, RuleBasedClassifier
from agent_core.orchestrators.routing.decider import ModelContinuationDecider
from agent_core.orchestrators.routing.memory import ModelReferenceResolver
from agent_core.orchestrators.routing.router import CapabilityRouter
from agent_core.orchestrators.stepbystep import StepByStep
from agent_core.orchestrators.tooluse import ToolUse
from broadcaster.envelope import Envelope
from broadcaster.publishers import InProcessPublisher, PusherHTTPPublisher, RecordingPublisher
from tests.support.factories import TickingClock
from tests.support.live import APP_ID, KEY, SECRET, Client, StartServer
from tests.support.orchestration import valid

TRACE = AdapterOptions(include_continuation_trace=True)


@dataclass
class Scenario:
    orchestrator: StepByStep[Any, Any]
    run: Callable[[str], Awaitable[Any]]
    """Runs the scenario with the given execution id."""


def tool_use() -> Scenario:
    orchestrator = ToolUse(demo_driver("weather in Oslo"), demo_tools(), clock=TickingClock())
    return Scenario(
        orchestrator, lambda run: orchestrator.run("Weather in Oslo?", execution_id=run)
    )


def chat() -> Scenario:
    bot = ModelParticipant(
        "bot",
        ScriptedDriver(
            [
                ScriptedResponse(tool_calls=(call("calculator", "c1", expression="6*7"),)),
                ScriptedResponse(text="Six times seven is 42."),
            ]
        ),
        tools=demo_tools(),
    )
    ann = ScriptedParticipant("ann", ["What is 6 x 7?"], role=Role.USER)
    orchestrator = Chat([ann, bot], clock=TickingClock())
    return Scenario(
        orchestrator, lambda run: orchestrator.run(orchestrator.new_state(), execution_id=run)
    )


def collaboration() -> Scenario:
    writer = ScriptedCollaborator("writer", ["Draft."])
    reviewer = ModelCollaborator("reviewer", ScriptedDriver([ScriptedResponse(text="Done.")]))
    orchestrator = Collaboration([writer, reviewer], clock=TickingClock())
    return Scenario(orchestrator, lambda run: orchestrator.run("Write.", execution_id=run))


def routing() -> Scenario:
    decider = ModelContinuationDecider(
        ScriptedDriver(
            [
                ScriptedResponse(
                    text=json.dumps(
                        {
                            "done": False,
                            "next_capability": "calculator",
                            "arguments": {"expression": "10*9/5+32"},
                        }
                    )
                ),
                ScriptedResponse(text=json.dumps({"done": True, "final_output": "50 °F"})),
            ]
        )
    )
    orchestrator = CapabilityRouter(
        [get_weather, calculator],
        RuleBasedClassifier([Rule("get_weather", r"weather in (?P<city>[A-Z]\w+)")]),
        decider=decider,
        resolver=ModelReferenceResolver(ScriptedDriver([ScriptedResponse(text="weather in Oslo")])),
        clock=TickingClock(),
    )

    async def run(execution_id: str) -> Any:
        await orchestrator.memory.append("s1", __import__("agent_core").SessionTurn("hi", "hello"))
        return await orchestrator.handle("and the weather there?", "s1", execution_id=execution_id)

    return Scenario(orchestrator, run)


SCENARIOS = {
    "tool_use": tool_use,
    "chat": chat,
    "collaboration": collaboration,
    "routing": routing,
}


async def recorded(make: Callable[[], Scenario]) -> list[Envelope]:
    scenario = make()
    publisher = RecordingPublisher()
    adapter = OrchestrationEventAdapter(publisher, "s1", options=TRACE)
    adapter.install(scenario.orchestrator)
    await scenario.run("run-1")
    await adapter.aclose()
    assert adapter.failures == 0
    assert {channel for channel, _ in publisher.records} == {"agent.s1"}
    return [valid(envelope) for envelope in publisher.envelopes()]


def collapsed(envelopes: list[Envelope]) -> list[str]:
    out: list[str] = []
    for envelope in envelopes:
        if envelope.type == "agent.stream.chunk" and out[-1:] == ["agent.stream.chunk"]:
            continue
        out.append(envelope.type)
    return out


@pytest.mark.parametrize("name", SCENARIOS)
async def test_envelopes_validate_and_frame_the_run(name: str) -> None:
    envelopes = await recorded(SCENARIOS[name])
    first, last = envelopes[0], envelopes[-1]
    assert first.type == "agent.status"
    assert first.payload.status == "in_progress"  # type: ignore[union-attr]
    assert last.type == "agent.status"
    assert last.payload.status == "completed"  # type: ignore[union-attr]
    assert last.payload.stop_reason is not None  # type: ignore[union-attr]
    assert {e.execution_id for e in envelopes} == {"run-1"}
    assert {e.session_id for e in envelopes} == {"s1"}
    started = [e.payload.step_number for e in envelopes if e.type == "agent.step.started"]  # type: ignore[union-attr]
    completed = [e.payload.step_number for e in envelopes if e.type == "agent.step.completed"]  # type: ignore[union-attr]
    assert started == completed == list(range(1, len(started) + 1))
    tools = [e for e in envelopes if e.type.startswith("agent.tool.")]
    assert len(tools) % 2 == 0
    assert [e.payload.tool_call_id for e in tools[::2]] == [
        e.payload.tool_call_id for e in tools[1::2]
    ]  # type: ignore[union-attr]


async def test_tool_use_maps_tools_text_and_continuation() -> None:
    envelopes = await recorded(tool_use)
    assert collapsed(envelopes) == [
        "agent.status",
        "agent.step.started",
        "agent.stream.chunk",
        "agent.tool.started",
        "agent.tool.completed",
        "agent.continuation",
        "agent.step.completed",
        "agent.step.started",
        "agent.tool.started",
        "agent.tool.completed",
        "agent.continuation",
        "agent.step.completed",
        "agent.step.started",
        "agent.stream.chunk",
        "agent.continuation",
        "agent.step.completed",
        "agent.status",
    ]
    text = "".join(e.payload.chunk for e in envelopes if e.type == "agent.stream.chunk")  # type: ignore[union-attr]
    assert "Oslo" in text
    steps = [e.payload for e in envelopes if e.type == "agent.step.completed"]
    assert [s.tool_calls[0].name for s in steps[:2]] == ["get_weather", "calculator"]  # type: ignore[union-attr]
    assert [s.continuation.resolved_by for s in steps] == [  # type: ignore[union-attr]
        "ToolCallPresenceCheck",
        "ToolCallPresenceCheck",
        "ToolCallPresenceCheck",
    ]


async def test_chat_steps_name_their_participant() -> None:
    envelopes = await recorded(chat)
    actors = [e.payload.actor for e in envelopes if e.type == "agent.step.started"]  # type: ignore[union-attr]
    assert actors == ["ann", "bot"]
    tool = next(e.payload for e in envelopes if e.type == "agent.tool.completed")
    assert (tool.tool_name, tool.step_number, tool.result_summary) == ("calculator", 2, "42")  # type: ignore[union-attr]
    final = envelopes[-1].payload
    assert (final.stop_reason, final.last_response) == ("finish_reason", "Six times seven is 42.")  # type: ignore[union-attr]


async def test_routing_stages_and_the_decider_are_visible() -> None:
    envelopes = await recorded(routing)
    tools = [e.payload for e in envelopes if e.type == "agent.tool.started"]
    assert [t.tool_name for t in tools] == [  # type: ignore[union-attr]
        "reference_resolver",
        "intent_classifier",
        "get_weather",
        "continuation_decider",
        "calculator",
        "continuation_decider",
        "session_memory",
    ]
    assert [t.step_number for t in tools] == [1, 1, 1, 1, 2, 2, 2]  # type: ignore[union-attr]
    assert all(t.tool_call_id for t in tools)  # type: ignore[union-attr]
    completed = [e.payload for e in envelopes if e.type == "agent.tool.completed"]
    assert completed[1].result_summary.startswith(  # type: ignore[union-attr]
        "get_weather · confidence 1.00 · matched rule 'weather in"
    )
    assert tools[2].arguments == {"city": "Oslo"}  # type: ignore[union-attr]
    verdicts = [c.result_summary for c in completed if c.tool_name == "continuation_decider"]  # type: ignore[union-attr]
    assert verdicts == [
        "continue → calculator(expression: '10*9/5+32')",
        "done · final output: 50 °F",
    ]
    decider_args = tools[3].arguments  # type: ignore[union-attr]
    assert (decider_args["capability"], decider_args["session_id"]) == ("get_weather", "s1")
    actors = [e.payload.actor for e in envelopes if e.type == "agent.step.started"]  # type: ignore[union-attr]
    assert actors == ["get_weather", "calculator"]
    traces = [e.payload for e in envelopes if e.type == "agent.continuation"]
    decider = [
        next(v for v in t.evaluations if v.criterion == "ContinuationDecider")  # type: ignore[union-attr]
        for t in traces
    ]
    assert [d.decision for d in decider] == ["request", "stop"]
    assert "run calculator" in decider[0].reason
    assert envelopes[-1].payload.last_response == "50 °F"  # type: ignore[union-attr]
    # The memory append is on the channel, before the final status.
    assert [e.type for e in envelopes[-3:]] == [
        "agent.tool.started",
        "agent.tool.completed",
        "agent.status",
    ]
    assert tools[-1].arguments == {  # type: ignore[union-attr]
        "session_id": "s1",
        "capability": "calculator",
        "success": True,
    }
    assert completed[-1].result_summary.startswith("turn remembered · ")  # type: ignore[union-attr]


async def test_a_failed_run_ends_with_a_failed_status() -> None:
    orchestrator = Chat(
        [ModelParticipant("bot", ScriptedDriver([ScriptedFailure(ModelError("down"))] * 3))],
        clock=TickingClock(),
    )
    publisher = RecordingPublisher()
    OrchestrationEventAdapter(publisher, "s2", "run-2").install(orchestrator)
    await orchestrator.run("hello")
    envelopes = [valid(e) for e in publisher.envelopes()]
    final = envelopes[-1].payload
    assert (final.status, final.stop_reason, final.error_message) == (  # type: ignore[union-attr]
        "failed",
        "error",
        "down",
    )
    errors = [e.payload.errors for e in envelopes if e.type == "agent.step.completed"]  # type: ignore[union-attr]
    assert errors == [1, 1, 1]


async def test_an_unreachable_audience_does_not_break_the_run() -> None:
    class Broken(RecordingPublisher):
        async def broadcast(self, channel: str, envelope: Envelope) -> None:
            raise ConnectionError("gone")

    scenario = collaboration()
    adapter = OrchestrationEventAdapter(Broken(), "s3")
    adapter.install(scenario.orchestrator)
    state = await scenario.run("run-3")
    assert state.final_response() == "Done."
    assert adapter.failures > 0


async def read_until_final(client: Client) -> list[dict[str, Any]]:
    received: list[dict[str, Any]] = []
    while True:
        message = await client.recv(within=10)
        if not message["event"].startswith("agent."):
            continue
        envelope = message["data"]
        assert envelope["type"] == message["event"]
        valid(envelope)
        received.append(envelope)
        if envelope["type"] == "agent.status" and envelope["payload"]["status"] != "in_progress":
            return received


@pytest.mark.io
@pytest.mark.parametrize("name", SCENARIOS)
async def test_envelopes_arrive_valid_on_the_channel_of_a_real_server(
    name: str, start_server: StartServer, clients: Callable[..., Awaitable[Client]]
) -> None:
    live = await start_server()
    client = await clients(live.app_url())
    answer = await client.subscribe("agent.s1")
    assert answer["event"] == "pusher_internal:subscription_succeeded", answer
    scenario = SCENARIOS[name]()
    adapter = OrchestrationEventAdapter(InProcessPublisher(live.node, APP_ID), "s1", options=TRACE)
    adapter.install(scenario.orchestrator)
    await scenario.run(f"run-{name}")
    await adapter.aclose()
    received = await read_until_final(client)
    assert [e["type"] for e in received] == [e.type for e in await recorded(SCENARIOS[name])]
    assert {e["execution_id"] for e in received} == {f"run-{name}"}
    assert received[-1]["payload"]["status"] == "completed"


@pytest.mark.io
async def test_the_http_publisher_delivers_routing_envelopes(
    start_server: StartServer, clients: Callable[..., Awaitable[Client]]
) -> None:
    live = await start_server()
    client = await clients(live.app_url())
    await client.subscribe("agent.s1")
    scenario = routing()
    publisher = PusherHTTPPublisher(live.url, APP_ID, KEY, SECRET)
    adapter = OrchestrationEventAdapter(publisher, "s1", options=TRACE)
    adapter.install(scenario.orchestrator)
    await scenario.run("run-http")
    await publisher.aclose()
    received = await read_until_final(client)
    assert publisher.stats.dropped == 0
    assert received[-1]["payload"]["last_response"] == "50 °F"
    steps = [e["payload"]["actor"] for e in received if e["type"] == "agent.step.started"]
    assert steps == ["get_weather", "calculator"]


async def test_a_held_final_status_says_failed_when_the_state_was_stored_failed() -> None:
    """A routed run's final state JSON cannot carry is stored ``failed``
    (:func:`~agent_core.adapters.broadcasting.encode_final_state`): its held final
    status then says so, with where the state is."""
    publisher = RecordingPublisher()
    scenario = tool_use()
    adapter = OrchestrationEventAdapter(publisher, "s-1", "x-1", defer_final=True)
    adapter.install(scenario.orchestrator)
    await scenario.run("x-1")
    statuses = [e.payload.status for e in publisher.envelopes() if e.type == "agent.status"]  # type: ignore[union-attr]
    assert statuses == ["in_progress"], "the final status is held"
    assert await adapter.publish_final("/api/sessions/s-1/state", failure="it held 10**20")
    final = publisher.envelopes()[-1].payload
    assert (final.status, final.stop_reason) == ("failed", "error")  # type: ignore[union-attr]
    assert final.error_message == "it held 10**20"  # type: ignore[union-attr]
    assert final.state_url == "/api/sessions/s-1/state"  # type: ignore[union-attr]
    assert not await adapter.publish_final(), "published once"
