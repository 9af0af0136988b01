"""The official AG-UI client (@ag-ui/client's HttpAgent, in Node) runs the scripted
agent through POST /ag-ui: its own schema and sequence checks accept every event, and
the tool calls and text it builds are those of the WebSocket envelopes of the same run."""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from tests.support.live import Client, StartServer
from tests.support.node import run_node_script
from tests.support.runs import read_run, subscribe

pytestmark = pytest.mark.node

Connect = Callable[..., Awaitable[Client]]


async def run_node_client(url: str, thread: str, run: str, text: str) -> dict[str, Any]:
    result, err = await run_node_script(
        "agui_client.mjs", url, thread, run, text, "5", package="@ag-ui/client"
    )
    assert result["ok"], (result.get("error"), result["warnings"], err)
    return result


async def test_the_official_client_accepts_the_run_and_sees_the_websocket_run(
    start_server: StartServer, clients: Connect
) -> None:
    live = await start_server(demo=True)
    thread, run = str(uuid.uuid4()), str(uuid.uuid4())
    watcher = await clients(live.app_url())
    await subscribe(watcher, f"agent.{thread}", None)
    result = await run_node_client(f"{live.url}/ag-ui", thread, run, "What is the weather in Lima?")
    envelopes = await read_run(watcher)

    assert result["warnings"] == [], "the client removed or dropped something"
    types = [e["type"] for e in result["events"]]
    assert types[0] == "RUN_STARTED"
    assert types[-1] == "RUN_FINISHED"
    assert result["events"][0]["runId"] == run

    ws_calls = [
        (p["tool_call_id"], p["tool_name"]) for _, k, p in envelopes if k == "agent.tool.started"
    ]
    ws_text = "".join(p["chunk"] for _, k, p in envelopes if k == "agent.stream.chunk")
    calls = [
        (e["toolCallId"], e["toolCallName"])
        for e in result["events"]
        if e["type"] == "TOOL_CALL_START"
    ]
    text = "".join(e["delta"] for e in result["events"] if e["type"] == "TEXT_MESSAGE_CONTENT")
    assert calls == ws_calls
    assert len(calls) == 2
    assert text == ws_text
    assert "Lima" in text

    # What the client built from the events: the same calls, their results, the text.
    built = result["messages"]
    built_calls = [
        (c["id"], c["function"]["name"])
        for m in built
        if m["role"] == "assistant"
        for c in m.get("toolCalls", [])
    ]
    assert built_calls == ws_calls
    built_arguments = [
        json.loads(c["function"]["arguments"])
        for m in built
        if m["role"] == "assistant"
        for c in m.get("toolCalls", [])
    ]
    assert built_arguments == [p["arguments"] for _, k, p in envelopes if k == "agent.tool.started"]
    assert built_arguments[0] == {"city": "Lima"}
    results = {m["toolCallId"]: m["content"] for m in built if m["role"] == "tool"}
    assert results == {
        p["tool_call_id"]: p["result_summary"]
        for _, k, p in envelopes
        if k == "agent.tool.completed"
    }
    said = "".join(m["content"] for m in built if m["role"] == "assistant" and m.get("content"))
    assert said == ws_text
    assert result["state"]["status"] == "completed"
    assert result["state"]["step_count"] == envelopes[-1][2]["step_count"]
