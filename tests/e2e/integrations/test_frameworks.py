"""Framework adapters: a pydantic-ai, an OpenAI Agents SDK and a LangGraph run become
the same ordered, schema-valid envelopes as an agent_core run, and reach a real
server's channel with their final snapshot stored for the state endpoint."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import jsonschema
import orjson
import pytest
from agents.exceptions import MaxTurnsExceeded
from pydantic_ai import Agent
from pydantic_ai.models.function import FunctionModel

from agent_core.adapters.broadcasting import AdapterOptions
from agent_core.integrations.openai_agents import broadcast_openai_agents
from agent_core.integrations.pydantic_ai import broadcast_pydantic_ai
from broadcaster.envelope import Envelope, channel_for, json_schema
from broadcaster.publishers import BackendStateStore, PusherHTTPPublisher, RecordingPublisher
from tests.support.framework_runs import (
    ANSWER,
    CALL_IDS,
    QUESTION,
    RUNS,
    envelopes_on,
    openai_agent,
)
from tests.support.live import APP_ID, KEY, SECRET, Client, StartServer

FRAMEWORKS = sorted(RUNS)
EXPECTED = {
    "pydantic-ai": ["tool", "text"],
    "openai-agents": ["tool", "tool", "text"],  # the second tool call is the handoff
    # graph nodes: agent (asks for the tool) and tools (runs it) are one step, then agent
    "langgraph": ["tool", "text"],
}
STEP_BODY = {
    "tool": ["agent.tool.started", "agent.tool.completed"],
    "text": ["agent.stream.chunk"],
}


def expected_types(framework: str) -> list[str]:
    types = ["agent.status"]
    for step in EXPECTED[framework]:
        types += ["agent.step.started", *STEP_BODY[step], "agent.step.completed"]
    return [*types, "agent.status"]


def step_shape(types: list[str]) -> list[str]:
    """The types with each run of stream chunks as one: streamed text is coalesced every
    16 deltas or 50 ms, so a loaded machine may split a step's text into more chunks."""
    return [t for i, t in enumerate(types) if t != "agent.stream.chunk" or types[i - 1] != t]


async def recorded(framework: str, **kw: Any) -> list[Envelope]:
    publisher = RecordingPublisher()
    await RUNS[framework](publisher, "fw-1", execution_id="x-1", **kw)
    return publisher.envelopes()


def payloads(envelopes: list[Envelope], kind: str) -> list[Any]:
    return [e.payload for e in envelopes if e.type == kind]


@pytest.mark.parametrize("framework", FRAMEWORKS)
async def test_a_run_becomes_the_ordered_envelopes_of_an_agent_core_run(framework: str) -> None:
    envelopes = await recorded(framework)
    assert step_shape([e.type for e in envelopes]) == expected_types(framework)
    schema = json_schema()
    for envelope in envelopes:
        jsonschema.validate(orjson.loads(envelope.to_json()), schema)
        assert (envelope.session_id, envelope.execution_id) == ("fw-1", "x-1")
    first, last = payloads(envelopes, "agent.status")
    assert first.status == "in_progress"
    assert (last.status, last.stop_reason, last.last_response) == ("completed", "completed", ANSWER)
    steps = payloads(envelopes, "agent.step.completed")
    assert last.step_count == len(steps)
    assert last.usage.prompt == sum(s.usage.prompt for s in steps) > 0
    assert last.usage.completion == sum(s.usage.completion for s in steps) > 0
    assert steps[-1].finish_reason == "stop"
    assert steps[-1].continuation.should_continue is False


@pytest.mark.parametrize("framework", FRAMEWORKS)
async def test_tool_envelopes_carry_the_frameworks_call_ids_and_arguments(framework: str) -> None:
    envelopes = await recorded(framework)
    started = payloads(envelopes, "agent.tool.started")[0]
    completed = payloads(envelopes, "agent.tool.completed")[0]
    call_id = CALL_IDS[framework]
    assert (started.tool_call_id, started.arguments) == (call_id, {"city": "Oslo"})
    assert started.args_summary == "city: 'Oslo'"
    assert (completed.tool_call_id, completed.success) == (call_id, True)
    assert completed.result_summary == "sunny in Oslo"
    step = next(p for p in payloads(envelopes, "agent.step.completed") if p.tool_calls)
    assert [c.id for c in step.tool_calls] == [call_id]
    assert step.step_number == started.step_number == completed.step_number


@pytest.mark.parametrize("framework", FRAMEWORKS)
async def test_streamed_text_is_coalesced_and_complete(framework: str) -> None:
    envelopes = await recorded(framework, options=AdapterOptions(coalesce_deltas=4))
    chunks = payloads(envelopes, "agent.stream.chunk")
    assert "".join(c.chunk for c in chunks) == ANSWER
    assert 1 < len(chunks) < sum(c.tokens_delta for c in chunks), "deltas are grouped"
    assert [c.chunk_index for c in chunks] == list(range(len(chunks)))
    assert [c.is_complete for c in chunks] == [False] * (len(chunks) - 1) + [True]


@pytest.mark.parametrize("framework", FRAMEWORKS)
async def test_continuation_trace_precedes_each_step_completed(framework: str) -> None:
    envelopes = await recorded(framework, options=AdapterOptions(include_continuation_trace=True))
    types = [e.type for e in envelopes]
    traces = payloads(envelopes, "agent.continuation")
    assert len(traces) == len(payloads(envelopes, "agent.step.completed"))
    for index, kind in enumerate(types):
        if kind == "agent.step.completed":
            assert types[index - 1] == "agent.continuation"
    assert traces[-1].evaluations[0].decision == "stop"
    assert traces[-1].resolved_by == framework


async def test_openai_handoffs_show_as_the_steps_actor() -> None:
    envelopes = await recorded("openai-agents")
    actors = [p.actor for p in payloads(envelopes, "agent.step.started")]
    assert actors == ["Assistant", "Assistant", "Forecaster"]
    handoff = payloads(envelopes, "agent.tool.completed")[1]
    assert (handoff.tool_call_id, handoff.result_summary) == ("call_o2", "handed off to Forecaster")


async def test_langgraph_nodes_are_steps_and_a_tool_node_runs_in_the_step_that_asked() -> None:
    envelopes = await recorded("langgraph")
    actors = [p.actor for p in payloads(envelopes, "agent.step.started")]
    assert actors == ["agent", "agent"]
    first = payloads(envelopes, "agent.step.completed")[0]
    assert (first.finish_reason, first.has_tool_calls) == ("tool_calls", True)
    assert [c.id for c in first.tool_calls] == ["call_w1"]


async def test_a_failing_pydantic_ai_run_ends_failed_and_raises() -> None:
    def broken(messages: Any, info: Any) -> Any:
        raise RuntimeError("the model is down")

    publisher = RecordingPublisher()
    agent = Agent(FunctionModel(broken), name="broken")
    with pytest.raises(RuntimeError, match="the model is down"):
        await broadcast_pydantic_ai(agent, QUESTION, publisher, "fw-1", stream=False)
    envelopes = publisher.envelopes()
    assert [e.type for e in envelopes] == [
        "agent.status",
        "agent.step.started",
        "agent.step.completed",
        "agent.status",
    ]
    final = envelopes[-1].payload
    assert (final.status, final.stop_reason) == ("failed", "error")  # type: ignore[union-attr]
    assert "the model is down" in (final.error_message or "")  # type: ignore[union-attr]


async def test_an_openai_run_over_its_turn_limit_stops_like_agent_cores_step_limit() -> None:
    publisher = RecordingPublisher()
    with pytest.raises(MaxTurnsExceeded):
        await broadcast_openai_agents(openai_agent(), QUESTION, publisher, "fw-1", max_turns=1)
    final = publisher.envelopes()[-1]
    assert final.type == "agent.status"
    assert (final.payload.status, final.payload.stop_reason) == ("completed", "steps_limit")  # type: ignore[union-attr]


async def test_a_run_without_streaming_publishes_the_whole_text() -> None:
    from tests.support.framework_runs import _pydantic_reply

    publisher = RecordingPublisher()
    agent = Agent(FunctionModel(_pydantic_reply), name="plain")
    await broadcast_pydantic_ai(agent, QUESTION, publisher, "fw-1", stream=False)
    chunks = payloads(publisher.envelopes(), "agent.stream.chunk")
    assert "".join(c.chunk for c in chunks) == ANSWER


@pytest.mark.parametrize("framework", FRAMEWORKS)
async def test_a_run_reaches_a_real_servers_channel_and_its_state_endpoint(
    framework: str,
    start_server: StartServer,
    clients: Callable[..., Awaitable[Client]],
) -> None:
    live = await start_server()
    session = f"fw-{framework}"
    watcher = await clients(live.app_url())
    answer = await watcher.subscribe(channel_for(session))
    assert answer["event"] == "pusher_internal:subscription_succeeded"
    publisher = PusherHTTPPublisher(live.url, APP_ID, KEY, SECRET)
    store = BackendStateStore(live.node.backend, APP_ID)
    recording = RecordingPublisher()

    class Both:
        stats = publisher.stats

        async def broadcast(self, channel: str, envelope: Envelope) -> None:
            await recording.broadcast(channel, envelope)
            await publisher.broadcast(channel, envelope)

        async def aclose(self) -> None:
            await publisher.aclose()

    await RUNS[framework](Both(), session, execution_id="x-live", state_store=store)
    assert await publisher.flush(10)
    seen = await envelopes_on(watcher)
    assert seen == [orjson.loads(e.to_json()) for e in recording.envelopes()]
    assert step_shape([e["type"] for e in seen]) == expected_types(framework)
    final = seen[-1]["payload"]
    assert final["state_url"] == f"/api/sessions/{session}/state"
    async with httpx.AsyncClient(base_url=live.url) as http:
        state = (await http.get(final["state_url"])).json()
        [run] = (await http.get(f"/api/sessions/{session}/runs")).json()["runs"]
    # The adapter indexed its run where it stored the state (the run index).
    assert (run["execution_id"], run["status"]) == ("x-live", "completed")
    assert run["input_preview"] == QUESTION[:200]
    assert run["tool_calls"] >= 1
    assert run["ended_at"] >= run["started_at"]
    assert (state["status"], state["step_count"]) == ("completed", final["step_count"])
    assert state["metadata"] == {"framework": framework, "execution_id": "x-live"}
    assert state["messages"][0] == {"role": "user", "content": QUESTION, "metadata": {}}
    assert state["messages"][-1]["content"] == ANSWER
    calls = [c["id"] for s in state["steps"] for c in s["tool_calls"]]
    assert CALL_IDS[framework] in calls
    await publisher.aclose()


def test_importing_agent_core_imports_no_framework() -> None:
    code = (
        "import sys, agent_core, agent_core.integrations, agent_core.integrations._base\n"
        "bad = [m for m in ('agents', 'pydantic_ai', 'langgraph', 'langchain_core',"
        " 'opentelemetry') if m in sys.modules]\n"
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


async def test_a_state_store_that_fails_leaves_the_final_status_without_a_url(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Unreachable:
        async def save(self, channel: str, snapshot: bytes) -> None:
            raise ConnectionError("the store is down")

    publisher = RecordingPublisher()
    await RUNS["pydantic-ai"](publisher, "fw-1", state_store=Unreachable())
    final = publisher.envelopes()[-1].payload
    assert (final.status, final.state_url) == ("completed", None)  # type: ignore[union-attr]
    assert "could not store the final state of session fw-1" in caplog.text
