"""The Vercel AI SDK UI message stream: the mapper (sans I/O), the endpoint's errors,
and following a session that a framework adapter publishes on."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import orjson
import pytest

from agent_core.app.vercel_ai import UIMessageStreamMapper, encode_chunk
from broadcaster import envelope as env
from broadcaster.publishers import BackendStateStore, PusherHTTPPublisher, RecordingPublisher
from broadcaster.sessions import private_channel, stream_auth
from tests.support.framework_runs import ANSWER, RUNS
from tests.support.live import APP_ID, KEY, SECRET, Client, StartServer
from tests.support.runs import start_run, subscribe

JSON = {"content-type": "application/json"}  # run-start doors take only JSON (415)


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
        not_json = await http.post("/vercel-ai", content=b"{nope", headers=JSON)
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


async def test_reconnecting_to_a_framework_run_replays_it_from_its_start(
    start_server: StartServer,
) -> None:
    live = await start_server(demo=True)
    session = f"follow-{uuid.uuid4().hex[:8]}"
    publisher = PusherHTTPPublisher(live.url, APP_ID, KEY, SECRET)
    store = BackendStateStore(live.node.backend, APP_ID)
    recording = RecordingPublisher()
    started, gate = asyncio.Event(), asyncio.Event()

    class Held:
        """Publishes like the adapter, but holds the run after its first envelope."""

        stats = publisher.stats

        async def broadcast(self, channel: str, envelope: Any) -> None:
            await recording.broadcast(channel, envelope)
            await publisher.broadcast(channel, envelope)
            if not started.is_set():
                await publisher.flush()
                started.set()
                await gate.wait()

        async def aclose(self) -> None:
            await publisher.aclose()

    async with httpx.AsyncClient(base_url=live.url, timeout=20) as http:
        # No run on the session yet: nothing to resume (DefaultChatTransport: null).
        idle = await http.get(f"/vercel-ai/{session}/stream")
        assert (idle.status_code, idle.content) == (204, b"")
        run = asyncio.create_task(RUNS["langgraph"](Held(), session, state_store=store))
        await asyncio.wait_for(started.wait(), 10)
        async with http.stream("GET", f"/vercel-ai/{session}/stream") as response:
            assert response.status_code == 200
            assert response.headers["x-vercel-ai-ui-message-stream"] == "v1"
            gate.set()
            body = b"".join([part async for part in response.aiter_bytes()])
        await run
        # The run is over: nothing to resume any more.
        after = await http.get(f"/vercel-ai/{session}/stream")
        assert after.status_code == 204
    await publisher.aclose()
    chunks = data_chunks(body)
    execution = recording.envelopes()[0].execution_id
    assert chunks[0]["messageId"] == execution
    text = "".join(c["delta"] for c in chunks if c["type"] == "text-delta")
    assert text == ANSWER
    calls = [c["toolCallId"] for c in chunks if c["type"] == "tool-input-available"]
    assert calls == ["call_w1"]
    assert [c["type"] for c in chunks].count("start-step") == 2  # agent+tools, agent
    state = next(c["data"] for c in chunks if c["type"] == "data-state")
    assert state["metadata"]["framework"] == "langgraph"
    expected = translate(execution, chunks[0]["messageMetadata"], recording.envelopes(), state)
    assert chunks == expected
    assert chunks[-1] == {"type": "finish", "finishReason": "stop"}


def data_chunks(body: bytes) -> list[dict[str, Any]]:
    """The chunks of a UI message stream body (which must end with [DONE])."""
    events = [line[6:] for line in body.decode().split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [orjson.loads(e) for e in events[:-1]]


def translate(
    execution: str, metadata: dict[str, Any], envelopes: list[Any], state: Any = None
) -> list[dict[str, Any]]:
    mapper = UIMessageStreamMapper(execution, metadata)
    chunks: list[dict[str, Any]] = []
    for envelope in envelopes:
        if isinstance(envelope, dict):
            envelope = env.parse_envelope(orjson.dumps(envelope).decode())
        chunks += mapper.feed(envelope, state)
    return chunks


async def read_positioned(client: Client, count: int | None = None) -> list[tuple[str, Any]]:
    """(position, envelope) of the channel until the final status (or ``count`` of them)."""
    out: list[tuple[str, Any]] = []
    while count is None or len(out) < count:
        message = await client.recv(within=10)
        if not message["event"].startswith("agent."):
            continue
        out.append((message["position"], message["data"]))
        payload = message["data"]["payload"]
        if message["event"] == "agent.status" and payload["status"] in ("completed", "failed"):
            break
    return out


async def read_stream(http: httpx.AsyncClient, url: str, **kw: Any) -> list[dict[str, Any]]:
    async with http.stream("GET", url, **kw) as response:
        assert response.status_code == 200, await response.aread()
        return data_chunks(b"".join([part async for part in response.aiter_bytes()]))


async def test_reconnecting_mid_run_replays_the_whole_run_and_since_starts_after_it(
    start_server: StartServer, clients: Callable[..., Awaitable[Client]]
) -> None:
    live = await start_server(demo=True)
    run = await start_run(live.url, pace_ms=40, trace=True)
    watcher = await clients(live.app_url())
    await subscribe(watcher, run["channel"], run["position"])
    first = await read_positioned(watcher, 6)
    assert not any(e["type"] == "agent.status" and e["payload"]["status"] != "in_progress"
                   for _, e in first), "the run must still be going"  # fmt: skip
    url = f"/vercel-ai/{run['session_id']}/stream"
    async with httpx.AsyncClient(base_url=live.url, timeout=20) as http:
        whole, after, by_header = await asyncio.gather(
            read_stream(http, url),
            read_stream(http, f"{url}?since={first[3][0]}"),
            read_stream(http, url, headers={"Last-Event-ID": first[4][0]}),
        )
        rest = await read_positioned(watcher)
        assert (await http.get(url)).status_code == 204
        bad = await http.get(f"{url}?since=nope")
        assert bad.status_code == 400
        assert "since" in bad.json()["error"]
    envelopes = [e for _, e in first + rest]
    execution = envelopes[0]["execution_id"]
    assert whole[0]["messageId"] == execution
    state = next(c["data"] for c in whole if c["type"] == "data-state")
    metadata = whole[0]["messageMetadata"]
    # Nothing missing at the start, nothing twice at the seam of history and live.
    assert whole == translate(execution, metadata, envelopes, state)
    assert whole[-1] == {"type": "finish", "finishReason": "stop"}
    # since=: the chunks of the publications after that position, exactly as the whole
    # stream goes on there (no second "start"; parts opened before it are continued).
    assert after == whole[len(translate(execution, metadata, envelopes[:4], state)) :]
    assert by_header == whole[len(translate(execution, metadata, envelopes[:5], state)) :]
    assert after[0]["type"] != "start"


async def test_since_any_position_of_a_run_gives_the_rest_of_its_whole_stream(
    start_server: StartServer, clients: Callable[..., Awaitable[Client]]
) -> None:
    """At every position of a finished run, ?since= gives exactly what the whole stream
    sends after that position's chunks. It once started a new message there: a second
    "start", text parts reopened under used ids, and a tool's output with its input
    left out (readUIMessageStream: "No tool invocation found")."""
    live = await start_server(demo=True)
    run = await start_run(live.url, trace=True)
    watcher = await clients(live.app_url())
    await subscribe(watcher, run["channel"], run["position"])
    seen = await read_positioned(watcher)
    envelopes = [e for _, e in seen]
    url = f"/vercel-ai/{run['session_id']}/stream"
    async with httpx.AsyncClient(base_url=live.url, timeout=20) as http:
        whole = await read_stream(http, f"{url}?since={run['position']}")
        suffixes = [await read_stream(http, f"{url}?since={p}") for p, _ in seen[:-1]]
    execution = envelopes[0]["execution_id"]
    metadata = whole[0]["messageMetadata"]
    state = next(c["data"] for c in whole if c["type"] == "data-state")
    assert whole == translate(execution, metadata, envelopes, state)
    types = [e["type"] for e in envelopes]
    assert types.index("agent.tool.started") < types.index("agent.tool.completed")
    for i, suffix in enumerate(suffixes):
        done = len(translate(execution, metadata, envelopes[: i + 1], state))
        assert suffix == whole[done:], f"since the envelope #{i} ({types[i]})"


async def test_a_run_whose_start_left_the_history_ends_with_an_error_not_a_partial_message(
    start_server: StartServer, clients: Callable[..., Awaitable[Client]]
) -> None:
    live = await start_server(demo=True, history_size=3)
    run = await start_run(live.url, pace_ms=40, trace=True)
    watcher = await clients(live.app_url())
    await subscribe(watcher, run["channel"], None)
    seen = await read_positioned(watcher, 5)  # more than the history keeps
    async with httpx.AsyncClient(base_url=live.url, timeout=20) as http:
        chunks = await read_stream(http, f"/vercel-ai/{run['session_id']}/stream")
    assert [c["type"] for c in chunks] == ["start", "error", "finish"]
    assert chunks[0]["messageId"] == seen[-1][1]["execution_id"]
    assert "no longer in the channel history" in chunks[1]["errorText"]
    assert chunks[2] == {"type": "finish", "finishReason": "error"}


def chat(session: str, text: str = "What is the weather in Oslo?") -> dict[str, Any]:
    """The body useChat's DefaultChatTransport posts for ``text`` on ``session``."""
    message = {"id": uuid.uuid4().hex, "role": "user", "parts": [{"type": "text", "text": text}]}
    return {"id": session, "messages": [message], "trigger": "submit-message"}


async def follow_headers(http: httpx.AsyncClient, url: str, **params: str) -> httpx.Headers:
    async with http.stream("GET", url, params=params) as response:
        assert response.status_code == 200, await response.aread()
        return response.headers


async def test_following_a_private_session_never_hands_out_its_token(
    start_server: StartServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the POST that starts a run answers with the session token: a GET that
    follows a session nobody has started yet, or that holds only a stream auth (read one
    channel), gets none, and the token of the POST still grants the session."""
    monkeypatch.setenv("AGENT_DEMO_PRIVATE_SESSIONS", "true")
    live = await start_server(demo=True)
    session = f"private-{uuid.uuid4().hex[:8]}"
    url = f"/vercel-ai/{session}/stream"
    auth = stream_auth(KEY, SECRET, private_channel(session))
    async with httpx.AsyncClient(base_url=live.url, timeout=20) as http:
        before = await follow_headers(http, url, since="0:0")  # nobody started it yet
        started = await http.post("/vercel-ai", json=chat(session))
        viewer = await follow_headers(http, url, since="0:0", auth=auth)
        again = chat(session, "And in Lima?")
        refused = await http.post("/vercel-ai", json=again)
        bearer = {"Authorization": f"Bearer {started.headers['x-session-token']}"}
        allowed = await http.post("/vercel-ai", json=again, headers=bearer)
    assert "x-session-token" not in before
    assert "x-session-token" not in viewer
    assert started.status_code == 200
    assert data_chunks(started.content)[-1] == {"type": "finish", "finishReason": "stop"}
    assert refused.status_code == 403
    assert allowed.status_code == 200
    assert data_chunks(allowed.content)[-1] == {"type": "finish", "finishReason": "stop"}
