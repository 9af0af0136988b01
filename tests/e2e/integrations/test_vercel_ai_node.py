"""The Vercel AI SDK UI message stream (POST /vercel-ai): the `ai` package's own
reader (parseJsonEventStream + uiMessageChunkSchema, readUIMessageStream, in Node)
accepts every chunk, and its parts are the WebSocket envelopes of the same run."""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from agent_core.app.vercel_ai import UIMessageStreamMapper
from broadcaster.envelope import parse_envelope
from tests.support.live import Client, StartServer
from tests.support.node import run_node_script
from tests.support.runs import start_run, subscribe

pytestmark = pytest.mark.node

Connect = Callable[..., Awaitable[Client]]


async def run_node_client(*args: str) -> dict[str, Any]:
    result, _ = await run_node_script(
        "vercel_ai_client.mjs", *args, package="ai", what="the ai package"
    )
    assert result["ok"], (result.get("error"), result.get("invalid"), result.get("errors"))
    return result


async def read_envelopes(client: Client) -> list[dict[str, Any]]:
    envelopes: list[dict[str, Any]] = []
    while True:
        message = await client.recv(within=10)
        if not message["event"].startswith("agent."):
            continue
        envelopes.append(message["data"])
        payload = message["data"]["payload"]
        if message["event"] == "agent.status" and payload["status"] in ("completed", "failed"):
            return envelopes


async def test_the_ai_packages_reader_accepts_the_stream_and_it_is_the_websocket_run(
    start_server: StartServer, clients: Connect
) -> None:
    live = await start_server(demo=True)
    chat = str(uuid.uuid4())
    watcher = await clients(live.app_url())
    await subscribe(watcher, f"agent.{chat}", None)
    result = await run_node_client("post", f"{live.url}/vercel-ai", chat, "Weather in Lima?", "5")
    envelopes = await read_envelopes(watcher)

    assert result["headers"]["x-vercel-ai-ui-message-stream"] == "v1"
    assert result["headers"]["content-type"].startswith("text/event-stream")
    assert result["endsWithDone"]
    chunks = result["chunks"]
    execution = envelopes[0]["execution_id"]
    assert chunks[0]["type"] == "start"
    assert chunks[0]["messageId"] == execution
    assert chunks[-1] == {"type": "finish", "finishReason": "stop"}

    # The chunks are the WebSocket envelopes, translated one by one.
    state = next(c["data"] for c in chunks if c["type"] == "data-state")
    mapper = UIMessageStreamMapper(execution, chunks[0]["messageMetadata"])
    expected: list[dict[str, Any]] = []
    for envelope in envelopes:
        expected += mapper.feed(parse_envelope(envelope), state)
    assert [c["type"] for c in chunks] == [c["type"] for c in expected]
    assert chunks == expected

    # ... and, independently of the mapper, what the AI SDK built is what the run did.
    def ws(kind: str) -> list[dict[str, Any]]:
        return [e["payload"] for e in envelopes if e["type"] == kind]

    parts = result["message"]["parts"]
    tools = [p for p in parts if p["type"] == "dynamic-tool"]
    assert [(t["toolCallId"], t["toolName"], t["input"]) for t in tools] == [
        (p["tool_call_id"], p["tool_name"], p["arguments"]) for p in ws("agent.tool.started")
    ]
    assert [(t["state"], t["output"]) for t in tools] == [
        ("output-available", p["result_summary"]) for p in ws("agent.tool.completed")
    ]
    assert tools[0]["input"] == {"city": "Lima"}
    text = "".join(p["text"] for p in parts if p["type"] == "text")
    assert text == "".join(p["chunk"] for p in ws("agent.stream.chunk"))
    assert "Lima" in text
    steps = ws("agent.step.started")
    assert sum(p["type"] == "step-start" for p in parts) == len(steps) == 3
    decisions = [p["data"] for p in parts if p["type"] == "data-continuation"]
    assert [d["step_number"] for d in decisions] == [s["step_number"] for s in steps]
    assert decisions[-1]["should_continue"] is False
    final = ws("agent.status")[-1]
    status = next(p["data"] for p in parts if p["type"] == "data-status")
    assert status == {k: v for k, v in final.items() if v is not None}
    assert (state["status"], state["step_count"]) == ("completed", final["step_count"])
    assert result["message"]["id"] == execution
    assert result["message"]["role"] == "assistant"


async def test_the_transports_reconnect_replays_a_run_mid_way_and_is_null_after_it(
    start_server: StartServer, clients: Connect
) -> None:
    live = await start_server(demo=True)
    # Paced to last several seconds: the Node client below must find it still running,
    # also on a loaded machine where starting node takes a second or two.
    run = await start_run(live.url, pace_ms=200, trace=True)
    watcher = await clients(live.app_url())
    await subscribe(watcher, run["channel"], run["position"])
    first: list[dict[str, Any]] = []
    while len(first) < 5:
        message = await watcher.recv(within=10)
        if message["event"].startswith("agent."):
            first.append(message)
    assert not any(m["event"] == "agent.status" and m["data"]["payload"]["status"] != "in_progress"
                   for m in first), "the run must still be going"  # fmt: skip
    # DefaultChatTransport.reconnectToStream (useChat's resumeStream) after a page reload.
    result = await run_node_client("reconnect", f"{live.url}/vercel-ai", run["session_id"])
    envelopes = [m["data"] for m in first] + await read_envelopes(watcher)

    assert result["none"] is False
    chunks = result["chunks"]
    execution = envelopes[0]["execution_id"]
    assert chunks[0]["type"] == "start"
    assert chunks[0]["messageId"] == execution
    state = next(c["data"] for c in chunks if c["type"] == "data-state")
    mapper = UIMessageStreamMapper(execution, chunks[0]["messageMetadata"])
    expected: list[dict[str, Any]] = []
    for envelope in envelopes:
        expected += mapper.feed(parse_envelope(json.dumps(envelope)), state)
    assert chunks == expected  # from the run's very start: nothing missing, nothing twice
    parts = result["message"]["parts"]
    text = "".join(p["text"] for p in parts if p["type"] == "text")
    assert text == "".join(e["payload"]["chunk"] for e in envelopes
                           if e["type"] == "agent.stream.chunk")  # fmt: skip
    assert result["message"]["id"] == execution

    # The run is over: the transport reads "no active stream" (null).
    after = await run_node_client("reconnect", f"{live.url}/vercel-ai", run["session_id"])
    assert after == {"ok": True, "none": True}
