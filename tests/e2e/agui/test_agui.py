"""AG-UI: POST /ag-ui runs the agent and streams AG-UI events built from the same
envelopes that reach agent.<session> over WebSocket; bad input gets clear errors."""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest
from ag_ui.core import Event, EventType, RunAgentInput
from pydantic import TypeAdapter

from agent_core.app.agui import (
    CONTINUATION_EVENT,
    ROUTING_EVENT,
    AguiMapper,
    InvalidInput,
    run_request,
)
from broadcaster import envelope as env
from tests.support.live import Client, LiveServer, StartServer, wait_for
from tests.support.runs import read_run, subscribe

JSON = {"content-type": "application/json"}  # run-start doors take only JSON (415)

EVENTS: TypeAdapter[Event] = TypeAdapter(Event)
Connect = Callable[..., Awaitable[Client]]


def agent_input(
    thread: str | None = None, text: str = "What is the weather in Oslo?", **extra: Any
) -> dict[str, Any]:
    return {
        "threadId": thread or str(uuid.uuid4()),
        "runId": str(uuid.uuid4()),
        "messages": [{"id": "m1", "role": "user", "content": text}],
        "tools": [],
        "context": [],
        "state": {},
        "forwardedProps": {},
        **extra,
    }


async def post_run(
    live: LiveServer, body: dict[str, Any], headers: dict[str, str] | None = None
) -> tuple[httpx.Response, list[Event]]:
    """POST the input; the response and, for a stream, its validated AG-UI events."""
    async with httpx.AsyncClient(timeout=20) as http:
        response = await http.post(f"{live.url}/ag-ui", json=body, headers=headers)
    if response.status_code != 200:
        return response, []
    assert response.headers["content-type"].startswith("text/event-stream")
    events = [
        EVENTS.validate_json(line.removeprefix("data: "))
        for line in response.text.splitlines()
        if line.startswith("data: ")
    ]
    return response, events


def kinds(events: list[Event]) -> list[str]:
    return [e.type.value for e in events]


def tool_calls(events: list[Event]) -> list[tuple[str, str]]:
    return [
        (e.tool_call_id, e.tool_call_name) for e in events if e.type is EventType.TOOL_CALL_START
    ]


def text(events: list[Event]) -> str:
    return "".join(e.delta for e in events if e.type is EventType.TEXT_MESSAGE_CONTENT)


@pytest.fixture
async def demo(start_server: StartServer) -> LiveServer:
    return await start_server(demo=True)


async def test_a_run_streams_ag_ui_events_matching_the_websocket_envelopes(
    demo: LiveServer, clients: Connect
) -> None:
    body = agent_input(forwardedProps={"trace": True})
    watcher = await clients(demo.app_url())
    await subscribe(watcher, f"agent.{body['threadId']}", None)
    response, events = await post_run(demo, body)
    envelopes = await read_run(watcher)

    assert response.status_code == 200
    assert kinds(events)[0] == "RUN_STARTED"
    assert kinds(events)[-2:] == ["STATE_SNAPSHOT", "RUN_FINISHED"]
    started, finished = events[0], events[-1]
    assert (started.thread_id, started.run_id) == (body["threadId"], body["runId"])
    assert (finished.thread_id, finished.run_id) == (body["threadId"], body["runId"])
    info = started.metadata["broadcaster"]
    assert info["execution_id"] == body["runId"], "runId is the envelopes' execution id"
    assert info["channel"] == f"agent.{body['threadId']}"
    epoch, offset = info["position"].rsplit(":", 1)
    assert envelopes[0][0] == f"{epoch}:{int(offset) + 1}", "the run starts after position"

    ws_calls = [
        (p["tool_call_id"], p["tool_name"]) for _, k, p in envelopes if k == "agent.tool.started"
    ]
    ws_text = "".join(p["chunk"] for _, k, p in envelopes if k == "agent.stream.chunk")
    ws_results = [p["result_summary"] for _, k, p in envelopes if k == "agent.tool.completed"]
    assert tool_calls(events) == ws_calls
    assert len(ws_calls) == 2
    assert text(events) == ws_text
    assert "Oslo" in ws_text
    assert [e.content for e in events if e.type is EventType.TOOL_CALL_RESULT] == ws_results
    steps = [p["step_number"] for _, k, p in envelopes if k == "agent.step.started"]
    assert [e.step_name for e in events if e.type is EventType.STEP_STARTED] == [
        f"step-{n}" for n in steps
    ]
    customs = [e for e in events if e.type is EventType.CUSTOM]
    assert [e.name for e in customs] == [CONTINUATION_EVENT] * len(steps)
    assert events[-2].snapshot["status"] == "completed"
    assert finished.result["status"] == "completed"


async def test_the_next_run_on_a_thread_continues_its_conversation(demo: LiveServer) -> None:
    first = agent_input()
    await post_run(demo, first)
    second = agent_input(first["threadId"], "And in Lima?")
    second["messages"].insert(0, first["messages"][0])
    _, events = await post_run(demo, second)
    users = [m["content"] for m in events[-2].snapshot["messages"] if m["role"] == "user"]
    assert users == ["What is the weather in Oslo?", "And in Lima?"]


async def test_the_path_is_configurable(
    start_server: StartServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENT_DEMO_AGUI_PATH", "/agents/weather")
    live = await start_server(demo=True)
    async with httpx.AsyncClient(timeout=20) as http:
        moved = await http.post(f"{live.url}/agents/weather", json=agent_input())
        gone = await http.post(f"{live.url}/ag-ui", json=agent_input())
    assert moved.status_code == 200
    assert '"type":"RUN_FINISHED"' in moved.text
    assert gone.status_code in (404, 405)


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"not json", "must be a JSON RunAgentInput"),
        (json.dumps({"runId": "r", "messages": []}).encode(), "threadId: Field required"),
        (json.dumps(agent_input(messages=[])).encode(), "no user message"),
        (json.dumps(agent_input(messages=[{"id": "a", "role": "user"}])).encode(), "content"),
        (json.dumps(agent_input("bad thread!")).encode(), "threadId"),
        (json.dumps(agent_input(forwardedProps={"pace_ms": 10**6})).encode(), "pace_ms"),
        (json.dumps(agent_input(text="x" * 20_001)).encode(), "messages"),
        (json.dumps(agent_input(runId="r" * 129)).encode(), "runId"),
    ],
)
async def test_invalid_input_is_refused_with_422(demo: LiveServer, body: bytes, says: str) -> None:
    async with httpx.AsyncClient() as http:
        response = await http.post(f"{demo.url}/ag-ui", content=body, headers=JSON)
    assert response.status_code == 422, response.text
    assert says in response.json()["error"]


async def test_a_busy_thread_is_refused_with_409(demo: LiveServer) -> None:
    body = agent_input(forwardedProps={"pace_ms": 30})
    async with (
        httpx.AsyncClient(timeout=20) as http,
        http.stream("POST", f"{demo.url}/ag-ui", json=body) as running,
    ):
        assert running.status_code == 200
        again = await http.post(f"{demo.url}/ag-ui", json=agent_input(body["threadId"]))
    assert again.status_code == 409
    assert "already has a run in progress" in again.json()["error"]


async def test_a_retry_of_a_run_in_progress_follows_it_and_of_an_ended_one_is_refused(
    demo: LiveServer, clients: Connect
) -> None:
    """A client whose stream dropped POSTs the same input again (same runId): while the
    run goes it gets that run from its start, not 409 busy; once it ended, 409, not a
    second run of the agent under the same id (tools run twice, one id for two runs)."""
    body = agent_input(forwardedProps={"pace_ms": 30})
    watcher = await clients(demo.app_url())
    await subscribe(watcher, f"agent.{body['threadId']}", None)
    async with (
        httpx.AsyncClient(timeout=20) as http,
        http.stream("POST", f"{demo.url}/ag-ui", json=body) as dropped,
    ):
        lines = dropped.aiter_lines()
        while "TEXT_MESSAGE_CONTENT" not in await anext(lines):
            pass
    retried, events = await post_run(demo, body)
    envelopes = await read_run(watcher)
    assert retried.status_code == 200, retried.text
    assert "x-session-token" not in retried.headers
    assert kinds(events)[0] == "RUN_STARTED"
    assert kinds(events)[-1] == "RUN_FINISHED"
    assert events[0].run_id == body["runId"]
    assert text(events) == "".join(p["chunk"] for _, k, p in envelopes if k == "agent.stream.chunk")
    statuses = [p["status"] for _, k, p in envelopes if k == "agent.status"]
    assert statuses == ["in_progress", "completed"]  # one run
    again, _ = await post_run(demo, body)
    assert again.status_code == 409
    assert f"run {body['runId']!r} of thread {body['threadId']!r} has ended" in again.text


async def test_a_client_that_leaves_does_not_stop_the_run(
    demo: LiveServer, clients: Connect
) -> None:
    body = agent_input(forwardedProps={"pace_ms": 10})
    watcher = await clients(demo.app_url())
    channel = f"agent.{body['threadId']}"
    await subscribe(watcher, channel, None)
    async with (
        httpx.AsyncClient(timeout=20) as http,
        http.stream("POST", f"{demo.url}/ag-ui", json=body) as response,
    ):
        lines = response.aiter_lines()
        while "RUN_STARTED" not in await anext(lines):
            pass
    envelopes = await read_run(watcher)
    assert envelopes[-1][2]["status"] == "completed"
    await wait_for(lambda: demo.node.hub.subscriber_count("1", channel) == 1, "the stream to leave")


async def test_a_private_thread_needs_its_session_token(
    start_server: StartServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENT_DEMO_PRIVATE_SESSIONS", "true")
    live = await start_server(demo=True)
    first = agent_input()
    response, events = await post_run(live, first)  # a new thread needs no token
    token = response.headers["x-session-token"]
    assert events[0].metadata["broadcaster"]["session_token"] == token
    assert events[0].metadata["broadcaster"]["channel"] == f"private-agent.{first['threadId']}"

    again = agent_input(first["threadId"], "And in Lima?")
    refused, _ = await post_run(live, again)
    forged, _ = await post_run(live, again, {"Authorization": "Bearer " + "0" * 64})
    assert refused.status_code == forged.status_code == 403
    assert "private session" in refused.json()["error"]
    allowed, events = await post_run(live, again, {"Authorization": f"Bearer {token}"})
    assert allowed.status_code == 200
    assert kinds(events)[-1] == "RUN_FINISHED"


# -- the mapping, envelope by envelope ------------------------------------------------


def envelopes(*items: tuple[type[Any], dict[str, Any]]) -> list[env.Envelope]:
    ids = {"session_id": "s", "execution_id": "x"}
    return [kind(**ids, payload=payload) for kind, payload in items]


def test_text_before_a_tool_call_is_closed_and_parents_the_call() -> None:
    mapper = AguiMapper("s", "r")
    out: list[Any] = []
    for envelope in envelopes(
        (env.AgentStatus, {"status": "in_progress"}),
        (env.StepStarted, {"step_number": 1}),
        (env.StreamChunk, {"chunk": "Let me check", "step_number": 1}),
        (
            env.ToolStarted,
            {
                "tool_name": "t",
                "tool_call_id": "c1",
                "args_summary": "a: 1",
                "arguments": {"a": 1},
                "step_number": 1,
            },
        ),
        (
            env.ToolCompleted,
            {
                "tool_name": "t",
                "tool_call_id": "c1",
                "success": False,
                "error": "boom",
                "duration_ms": 1,
                "step_number": 1,
            },
        ),
        (env.StepCompleted, {"step_number": 1, "has_tool_calls": True, "duration_ms": 2}),
    ):
        out += mapper.feed(envelope)
    assert kinds(out) == [
        "RUN_STARTED",
        "STEP_STARTED",
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
        "TOOL_CALL_START",
        "TOOL_CALL_ARGS",
        "TOOL_CALL_END",
        "TOOL_CALL_RESULT",
        "STEP_FINISHED",
    ]
    assert out[5].parent_message_id == out[2].message_id
    assert out[6].delta == '{"a":1}', "the arguments as JSON, not the summary"
    assert out[8].content == "error: boom"
    assert out[8].metadata == {"success": False, "duration_ms": 1.0, "error": "boom"}


def test_redacted_arguments_send_no_tool_call_args() -> None:
    mapper = AguiMapper("s", "r")
    out: list[Any] = []
    for envelope in envelopes(
        (env.AgentStatus, {"status": "in_progress"}),
        (env.StepStarted, {"step_number": 1}),
        (
            env.ToolStarted,
            {"tool_name": "t", "tool_call_id": "c1", "args_summary": "a: [redacted]"},
        ),
    ):
        out += mapper.feed(envelope)
    assert kinds(out)[-2:] == ["TOOL_CALL_START", "TOOL_CALL_END"]


def test_a_finished_run_closes_what_is_open_before_run_finished() -> None:
    mapper = AguiMapper("s", "r")
    out: list[Any] = []
    for envelope in envelopes(
        (env.StepStarted, {"step_number": 1}),
        (env.StreamChunk, {"chunk": "Hi", "step_number": 1}),
        (env.AgentStatus, {"status": "completed", "step_count": 1}),
    ):
        out += mapper.feed(envelope, snapshot={"status": "completed"})
    assert kinds(out) == [
        "RUN_STARTED",
        "STEP_STARTED",
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
        "STEP_FINISHED",
        "STATE_SNAPSHOT",
        "RUN_FINISHED",
    ]
    assert mapper.done
    assert mapper.feed(envelopes((env.StepStarted, {"step_number": 2}))[0]) == []


def test_a_failed_run_ends_with_run_error() -> None:
    mapper = AguiMapper("s", "r")
    [failed] = envelopes(
        (env.AgentStatus, {"status": "failed", "error_message": "no model", "stop_reason": "error"})
    )
    out = mapper.feed(failed)
    assert kinds(out) == ["RUN_STARTED", "RUN_ERROR"]
    assert (out[1].message, out[1].code) == ("no model", "error")


def test_an_unreadable_run_ends_with_run_error_once() -> None:
    mapper = AguiMapper("s", "r")
    assert kinds(mapper.error("lost")) == ["RUN_STARTED", "RUN_ERROR"]
    assert mapper.error("again") == []


def test_the_input_is_the_last_user_message_and_props_pass_through() -> None:
    agent = RunAgentInput.model_validate(
        agent_input(
            "t-1",
            messages=[
                {"id": "1", "role": "user", "content": "first"},
                {"id": "2", "role": "assistant", "content": "answer"},
                {"id": "3", "role": "user", "content": [{"type": "text", "text": "second"}]},
            ],
            forwardedProps={
                "pace_ms": 5,
                "trace": False,
                "mode": "route",
                "max_steps": 2,
                "other": 1,
            },
        )
    )
    wanted = run_request(agent)
    assert (wanted.input, wanted.session_id, wanted.pace_ms, wanted.trace) == (
        "second",
        "t-1",
        5,
        False,
    )
    assert (wanted.mode, wanted.max_steps) == ("route", 2)
    assert wanted.execution_id == agent.run_id
    with pytest.raises(InvalidInput, match="threadId"):
        run_request(RunAgentInput.model_validate(agent_input("no spaces allowed")))


async def test_a_routed_run_streams_through_ag_ui(demo: LiveServer) -> None:
    """forwardedProps.mode picks the capability router, as POST /run's mode does."""
    body = agent_input(text="summarize: agents publish envelopes", forwardedProps={"mode": "route"})
    response, events = await post_run(demo, body)

    assert response.status_code == 200
    assert kinds(events)[0] == "RUN_STARTED"
    assert kinds(events)[-1] == "RUN_FINISHED"
    # The capability is the run's tool call; the routing phases are phases, not calls.
    assert [name for _, name in tool_calls(events)] == ["summarize"]
    phases = [
        (e.value["tool_name"], e.value["state"])
        for e in events
        if e.type == EventType.CUSTOM and e.name == ROUTING_EVENT
    ]
    assert phases == [
        ("intent_classifier", "running"),
        ("intent_classifier", "done"),
        ("continuation_decider", "running"),
        ("continuation_decider", "done"),
        ("session_memory", "running"),
        ("session_memory", "done"),
    ]
    # Its answer (the capability's) is a text message, so a chat shows a reply.
    text = "".join(e.delta for e in events if e.type == EventType.TEXT_MESSAGE_CONTENT)
    assert text
    assert text == events[-1].result["last_response"]
