"""The Vercel AI SDK UI message stream: the mapper (sans I/O), the endpoint's errors,
and following a session that a framework adapter publishes on."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import httpx
import orjson

from agent_core.app.vercel_ai import UIMessageStreamMapper, encode_chunk
from broadcaster import envelope as env
from broadcaster.publishers import BackendStateStore, PusherHTTPPublisher, RecordingPublisher
from tests.integrations.runs import ANSWER, RUNS
from tests.support.live import APP_ID, KEY, SECRET, StartServer


def ids() -> dict[str, str]:
    return {"session_id": "v-1", "execution_id": "x-1"}


def test_a_failed_run_ends_with_error_and_finish_and_closes_what_it_opened() -> None:
    mapper = UIMessageStreamMapper("x-1")
    chunks: list[dict[str, Any]] = []
    for envelope in [
        env.AgentStatus(**ids(), payload=env.StatusPayload(status="in_progress")),
        env.StepStarted(**ids(), payload=env.StepStartedPayload(step_number=1)),
        env.StreamChunk(**ids(), payload=env.StreamChunkPayload(chunk="Hel", step_number=1)),
        env.AgentStatus(
            **ids(), payload=env.StatusPayload(status="failed", error_message="model down")
        ),
    ]:
        chunks += mapper.feed(envelope)
    assert [c["type"] for c in chunks] == [
        "start",
        "start-step",
        "text-start",
        "text-delta",
        "text-end",
        "finish-step",
        "data-status",
        "error",
        "finish",
    ]
    assert chunks[-2] == {"type": "error", "errorText": "model down"}
    assert chunks[-1] == {"type": "finish", "finishReason": "error"}
    assert mapper.done
    assert (
        mapper.feed(env.AgentStatus(**ids(), payload=env.StatusPayload(status="completed"))) == []
    )


def test_a_failed_tool_is_a_tool_output_error_and_redacted_arguments_an_empty_input() -> None:
    mapper = UIMessageStreamMapper("x-1")
    started = env.ToolStarted(
        **ids(), payload=env.ToolStartedPayload(tool_name="t", tool_call_id="c1", arguments=None)
    )
    completed = env.ToolCompleted(
        **ids(),
        payload=env.ToolCompletedPayload(
            tool_name="t", tool_call_id="c1", success=False, error="boom", duration_ms=1
        ),
    )
    chunks = mapper.feed(started) + mapper.feed(completed)
    assert chunks[1:] == [
        {"type": "tool-input-start", "toolCallId": "c1", "toolName": "t", "dynamic": True},
        {
            "type": "tool-input-available",
            "toolCallId": "c1",
            "toolName": "t",
            "dynamic": True,
            "input": {},
        },
        {"type": "tool-output-error", "toolCallId": "c1", "errorText": "boom", "dynamic": True},
    ]


def test_chunks_are_sse_data_lines() -> None:
    assert encode_chunk({"type": "start"}) == b'data: {"type":"start"}\n\n'


async def test_bad_chat_requests_get_clear_errors(start_server: StartServer) -> None:
    live = await start_server(demo=True)
    async with httpx.AsyncClient(base_url=live.url) as http:
        not_json = await http.post("/vercel-ai", content=b"{nope")
        no_text = await http.post(
            "/vercel-ai",
            json={"id": "v-2", "messages": [{"id": "m", "role": "user", "parts": []}]},
        )
        no_id = await http.post("/vercel-ai", json={"messages": []})
        bad_session = await http.get("/vercel-ai/bad%20id/stream")
    assert not_json.status_code == 422
    assert "JSON" in not_json.json()["error"]
    assert no_text.status_code == 422
    assert "no user message with a text part" in no_text.json()["error"]
    assert no_id.status_code == 422
    assert "id" in no_id.json()["error"]
    assert bad_session.status_code == 400


async def test_following_a_session_streams_the_next_framework_run_on_it(
    start_server: StartServer,
) -> None:
    live = await start_server(demo=True)
    session = f"follow-{uuid.uuid4().hex[:8]}"
    publisher = PusherHTTPPublisher(live.url, APP_ID, KEY, SECRET)
    store = BackendStateStore(live.node.backend, APP_ID)
    recording = RecordingPublisher()

    class Both:
        stats = publisher.stats

        async def broadcast(self, channel: str, envelope: Any) -> None:
            await recording.broadcast(channel, envelope)
            await publisher.broadcast(channel, envelope)

        async def aclose(self) -> None:
            await publisher.aclose()

    async with (
        httpx.AsyncClient(base_url=live.url, timeout=20) as http,
        http.stream("GET", f"/vercel-ai/{session}/stream") as response,
    ):
        # The answer starts once the feed is subscribed: the run cannot be missed.
        assert response.headers["x-vercel-ai-ui-message-stream"] == "v1"
        run = asyncio.create_task(RUNS["langgraph"](Both(), session, state_store=store))
        body = b"".join([part async for part in response.aiter_bytes()])
        await run
    await publisher.aclose()
    events = [line[6:] for line in body.decode().split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [orjson.loads(e) for e in events[:-1]]
    execution = recording.envelopes()[0].execution_id
    assert chunks[0]["messageId"] == execution
    text = "".join(c["delta"] for c in chunks if c["type"] == "text-delta")
    assert text == ANSWER
    calls = [c["toolCallId"] for c in chunks if c["type"] == "tool-input-available"]
    assert calls == ["call_w1"]
    assert [c["type"] for c in chunks].count("start-step") == 3
    state = next(c["data"] for c in chunks if c["type"] == "data-state")
    assert state["metadata"]["framework"] == "langgraph"
    assert chunks[-1] == {"type": "finish", "finishReason": "stop"}
