"""Seed 002 over HTTP: ``POST /run {"mode": "route"}`` runs the capability router and
every phase reaches ``agent.<session>`` (resolution and classification as tool pairs,
the capability as the step's actor and a tool pair, the decider's verdict as a tool
pair, the final status naming the stored state)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import orjson
import pytest

from agent_core.app.demo_routing import demo_parts
from agent_core.app.demo_tools import demo_driver
from agent_core.app.runs import RunManager, RunRequest
from agent_core.orchestrators.routing.capabilities import CapabilityResult
from agent_core.orchestrators.routing.classifier import RuleBasedClassifier
from agent_core.orchestrators.routing.decider import ContinuationResult
from agent_core.orchestrators.routing.memory import SessionMemory
from agent_core.orchestrators.routing.router import CapabilityRouter
from broadcaster.envelope import Envelope
from broadcaster.publishers import RecordingPublisher
from tests.support.live import Client
from tests.support.openai_api import API_KEY, FakeChatAPI, Reply, sse, text, usage
from tests.support.orchestration import valid
from tests.support.processes import ServerFactory
from tests.support.runs import (
    ROUTED_RUN,
    phases,
    read_run,
    routed,
    start_run,
    tool,
)

Connect = Callable[..., Awaitable[Client]]


async def test_a_routed_run_shows_each_phase_in_order(
    server_factory: ServerFactory, clients: Connect
) -> None:
    server = server_factory("--demo")
    client = await clients(f"{server.ws_url}/app/agent-key?protocol=7")
    run, channel = await routed(server.url, client, mode="route", trace=True)
    # The capability's inner agent is published as a run nested under its call.
    events = [e for e in channel if "parent_execution_id" not in e[2]]
    inner = [e for e in channel if "parent_execution_id" in e[2]]

    assert phases(events) == ROUTED_RUN
    assert events[0][2]["status"] == "in_progress"
    classified = tool(events, "agent.tool.completed", "intent_classifier")
    assert classified["result_summary"] == (
        "weather_agent · confidence 0.90 · the request is about the weather"
    )
    assert classified["step_number"] == 1
    started = next(p for _, k, p in events if k == "agent.step.started")
    assert (started["actor"], started["available_tools"]) == (
        "weather_agent",
        ["weather_agent", "chat", "summarize"],
    )
    call = tool(events, "agent.tool.started", "weather_agent")
    assert call["arguments"] == {"text": "What is the weather in Oslo?"}
    assert {(p["parent_execution_id"], p["parent_tool_call_id"]) for _, _, p in inner} == {
        (run["execution_id"], call["tool_call_id"])
    }
    assert phases(inner)[:2] == [("agent.status", None), ("agent.step.started", None)]
    assert ("agent.tool.started", "get_weather") in phases(inner)
    assert (inner[0][2]["status"], inner[-1][2]["status"]) == ("in_progress", "completed")
    # Between the capability's call and its result, on the same channel.
    order = [p for _, k, p in channel]
    started_at = order.index(call)
    completed_at = order.index(tool(events, "agent.tool.completed", "weather_agent"))
    assert all(started_at < order.index(p) < completed_at for _, _, p in inner)
    decider = tool(events, "agent.tool.started", "continuation_decider")
    assert decider["arguments"]["session_id"] == run["session_id"]
    assert decider["arguments"]["duration_ms"] > 0
    verdict = tool(events, "agent.tool.completed", "continuation_decider")
    assert (verdict["success"], verdict["result_summary"]) == (True, "done")
    trace = next(p for _, k, p in events if k == "agent.continuation")
    assert "ContinuationDecider" in [e["criterion"] for e in trace["evaluations"]]
    final = events[-1][2]
    assert final["status"] == "completed"
    assert final["last_response"].startswith("In Oslo it is")
    assert final["state_url"] == run["state_url"]

    async with httpx.AsyncClient() as http:
        snapshot = (await http.get(f"{server.url}{final['state_url']}")).json()
    assert (snapshot["process"], snapshot["status"], snapshot["step_count"]) == (
        "routing",
        "completed",
        1,
    )
    assert snapshot["steps"][0]["actor"] == "weather_agent"
    assert snapshot["last_continuation"]["should_continue"] is False
    assert snapshot["routing"]["intent"]["capability"] == "weather_agent"
    assert snapshot["routing"]["intent"]["confidence"] == 0.9
    assert snapshot["messages"][-1]["content"] == final["last_response"]
    assert snapshot["usage"] == final["usage"]
    assert final["usage"]["total"] > 0  # the capability's own model calls count

    # The session remembers the turn: a follow-up is resolved against it.
    await start_run(server.url, mode="route", session_id=run["session_id"], input="And in Lima?")
    again = await read_run(client)  # still subscribed to the session's channel
    assert phases(again)[1:3] == [
        ("agent.tool.started", "reference_resolver"),
        ("agent.tool.completed", "reference_resolver"),
    ]
    resolved = tool(again, "agent.tool.completed", "reference_resolver")
    assert resolved["result_summary"] == "What is the weather in Lima?"
    assert again[-1][2]["last_response"].startswith("In Lima it is")


async def test_the_other_capabilities_are_chosen_by_intent(
    server_factory: ServerFactory, clients: Connect
) -> None:
    server = server_factory("--demo")
    client = await clients(f"{server.ws_url}/app/agent-key?protocol=7")
    _, chat = await routed(server.url, client, mode="route", input="Hello there")
    client = await clients(f"{server.ws_url}/app/agent-key?protocol=7")
    _, summary = await routed(
        server.url, client, mode="route", input="summarize: one two three four"
    )
    actors = [
        next(p["actor"] for _, k, p in events if k == "agent.step.started")
        for events in (chat, summary)
    ]
    assert actors == ["chat", "summarize"]
    assert tool(chat, "agent.tool.completed", "intent_classifier")["result_summary"] == (
        "chat · confidence 0.40 · no rule matched; default capability"
    )
    assert summary[-1][2]["last_response"] == "Summary (4 words): one two three four"


async def test_the_default_mode_setting_routes_runs_that_name_no_mode(
    server_factory: ServerFactory, clients: Connect
) -> None:
    server = server_factory("--demo", env={"AGENT_DEMO_RUN_DEFAULT_MODE": "route"})
    client = await clients(f"{server.ws_url}/app/agent-key?protocol=7")
    _, default = await routed(server.url, client)
    assert phases(default)[1] == ("agent.tool.started", "intent_classifier")
    client = await clients(f"{server.ws_url}/app/agent-key?protocol=7")
    _, agent = await routed(server.url, client, mode="agent")
    assert [kind for _, kind, _ in agent].count("agent.step.completed") == 3
    assert "intent_classifier" not in [name for _, name in phases(agent)]


async def test_a_bad_mode_is_refused_with_a_clear_error(server_factory: ServerFactory) -> None:
    server = server_factory("--demo")
    async with httpx.AsyncClient() as http:
        response = await http.post(f"{server.url}/run", json={"input": "x", "mode": "teleport"})
    assert response.status_code == 422
    assert "mode" in response.json()["error"]


# --- RunManager in process (decider failure, crash) ------------------------------------


class MemoryStore:
    def __init__(self) -> None:
        self.saved: dict[str, bytes] = {}

    async def save(self, channel: str, snapshot: bytes) -> None:
        self.saved[channel] = snapshot

    async def load(self, channel: str) -> bytes | None:
        return self.saved.get(channel)


class BrokenDecider:
    name = "broken"

    async def decide(
        self, user_input: str, capability: str, result: CapabilityResult, history: object = ()
    ) -> ContinuationResult:
        raise TimeoutError("the decider's model timed out")


def manager(store: MemoryStore, publisher: RecordingPublisher, **options: Any) -> RunManager:
    parts = demo_parts("scripted")
    options.setdefault("router_factory", parts.router_factory)
    return RunManager(
        publisher=publisher,
        state_store=store,
        driver_factory=parts.driver_factory,
        tools=parts.tools,
        load_snapshot=store.load,
        **options,
    )


async def run_to_end(runs: RunManager, request: RunRequest) -> list[Envelope]:
    handle = await runs.start(request)
    await runs.wait(handle.session_id)
    publisher = runs.publisher
    assert isinstance(publisher, RecordingPublisher)
    return [valid(e) for e in publisher.envelopes()]


async def test_a_failing_decider_keeps_the_capabilitys_output_over_http_runs() -> None:
    def broken(request: RunRequest, memory: SessionMemory) -> CapabilityRouter:
        router = demo_parts("scripted").router_factory(request, memory)
        router.decider = BrokenDecider()
        return router

    store, publisher = MemoryStore(), RecordingPublisher()
    runs = manager(store, publisher, router_factory=broken)
    envelopes = await run_to_end(runs, RunRequest(input="weather in Oslo", mode="route"))
    final = envelopes[-1].payload
    assert (final.status, final.stop_reason) == ("completed", "completed")  # type: ignore[union-attr]
    assert final.last_response.startswith("In Oslo it is")  # type: ignore[union-attr]
    verdict = next(
        e.payload
        for e in envelopes
        if e.type == "agent.tool.completed" and e.payload.tool_name == "continuation_decider"  # type: ignore[union-attr]
    )
    assert (verdict.success, verdict.error) == (
        False,
        "TimeoutError: the decider's model timed out",
    )  # type: ignore[union-attr]
    snapshot = orjson.loads(next(iter(store.saved.values())))
    assert snapshot["routing"]["decider_errors"] == ["TimeoutError: the decider's model timed out"]
    assert snapshot["status"] == "completed"


async def test_the_managers_default_mode_and_a_missing_router() -> None:
    store, publisher = MemoryStore(), RecordingPublisher()
    routed_by_default = manager(store, publisher, default_mode="route")
    envelopes = await run_to_end(routed_by_default, RunRequest(input="hi"))
    assert [e.payload.actor for e in envelopes if e.type == "agent.step.started"] == ["chat"]  # type: ignore[union-attr]

    publisher = RecordingPublisher()
    no_router = RunManager(publisher=publisher, state_store=store, driver_factory=demo_driver)
    envelopes = await run_to_end(no_router, RunRequest(input="hi", mode="route"))
    final = envelopes[-1].payload
    assert final.status == "failed"  # type: ignore[union-attr]
    assert "no capability router" in (final.error_message or "")  # type: ignore[union-attr]


@pytest.mark.parametrize("first_mode", ["agent", "route"])
async def test_modes_can_alternate_on_one_session(first_mode: str) -> None:
    """An agent run continues a routed session's conversation and a routed run
    remembers an agent run's turns."""
    store, publisher = MemoryStore(), RecordingPublisher()
    runs = manager(store, publisher)
    second = "route" if first_mode == "agent" else "agent"
    await run_to_end(runs, RunRequest(input="weather in Oslo", session_id="s", mode=first_mode))  # type: ignore[arg-type]
    envelopes = await run_to_end(
        runs,
        RunRequest(input="what about in Lima?", session_id="s", mode=second),  # type: ignore[arg-type]
    )
    final = envelopes[-1].payload
    assert final.status == "completed"  # type: ignore[union-attr]
    users = [
        m["content"]
        for m in orjson.loads(store.saved["agent.s"])["messages"]
        if m["role"] == "user"
    ]
    assert users[-1] == "what about in Lima?"


async def test_with_the_openai_driver_the_model_classifies_and_answers(
    api: FakeChatAPI,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """AGENT_DEMO_DRIVER=openai: the classifier and the capability call the
    OpenAI-compatible API (here a fake one that answers every request alike)."""
    answer = {
        "capability": "chat",
        "arguments": {"text": "hi"},
        "confidence": 0.8,
        "reason": "a greeting",
    }
    script = api.script(Reply(sse(text(json.dumps(answer)), usage(5, 7))))
    monkeypatch.setenv("AGENT_OPENAI_BASE_URL", script.base_url)
    monkeypatch.setenv("AGENT_OPENAI_API_KEY", API_KEY)
    monkeypatch.setenv("AGENT_OPENAI_MODEL", "fake-model")
    store, publisher = MemoryStore(), RecordingPublisher()
    parts = demo_parts("openai")
    runs = RunManager(
        publisher=publisher,
        state_store=store,
        driver_factory=parts.driver_factory,
        tools=parts.tools,
        router_factory=parts.router_factory,
    )
    envelopes = await run_to_end(runs, RunRequest(input="hi", mode="route"))
    classified = next(
        e.payload
        for e in envelopes
        if e.type == "agent.tool.completed" and e.payload.tool_name == "intent_classifier"  # type: ignore[union-attr]
    )
    assert classified.result_summary == "chat · confidence 0.80 · a greeting"  # type: ignore[union-attr]
    final = envelopes[-1].payload
    assert final.status == "completed"  # type: ignore[union-attr]
    assert final.usage.total == 24  # type: ignore[union-attr]  # classifier + chat answer
    assert len(script.requests) == 2
    assert "Capabilities:" in script.requests[0].body["messages"][0]["content"]


@pytest.mark.timeout(30)  # a hang guard: the old pattern took about 7 s for 20,000 characters
async def test_the_demo_classifier_reads_a_long_message_in_one_pass() -> None:
    """The weather rule once searched ".*\\bweather\\b.*" from every position: O(n²) on
    the event loop, so one long request froze the server. 200,000 characters now."""
    from agent_core.app.demo_routing import demo_classifier

    classifier = demo_classifier()
    long = "a " * 100_000
    chat = await classifier.classify(long, None)
    assert chat.capability == "chat"
    message = long + "\nis it cold in Oslo?"
    weather = await classifier.classify(message, None)
    assert weather.capability == "weather_agent"
    assert weather.arguments["text"] == message.strip()


async def test_the_stored_capability_results_are_bounded() -> None:
    """A capability's output and metadata are its own: the snapshot keeps at most
    2,000 characters of each value."""

    def big(text: str) -> CapabilityResult:
        """Answer at length."""
        metadata = {"note": "n" * 10_000, "items": list(range(5_000)), "small": [1, 2]}
        return CapabilityResult(capability="big", output="o" * 10_000, metadata=metadata)

    def factory(request: RunRequest, memory: SessionMemory) -> CapabilityRouter:
        return CapabilityRouter([big], RuleBasedClassifier([], default="big"), memory=memory)

    store, publisher = MemoryStore(), RecordingPublisher()
    runs = manager(store, publisher, router_factory=factory)
    await run_to_end(runs, RunRequest(input="go", mode="route"))
    snapshot = orjson.loads(next(iter(store.saved.values())))
    (result,) = snapshot["routing"]["results"]
    assert len(result["output"]) == 2000
    assert len(result["metadata"]["note"]) == 2000
    assert isinstance(result["metadata"]["items"], str)
    assert len(result["metadata"]["items"]) == 2000
    assert result["metadata"]["small"] == [1, 2]
    assert len(snapshot["routing"]["result"]["output"]) == 2000
