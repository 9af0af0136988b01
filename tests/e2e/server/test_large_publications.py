"""A publication larger than a subscriber's buffer (``max_buffer_bytes``), from a raw
publisher (the HTTP API, a worker's Redis publisher): it reaches every viewer whole,
live and resumed, over WebSocket and SSE, and the stream goes on after it. A second
one while the first is still unsent closes the live viewer with 4100 and a reason
that says why, and a resume then delivers both. Never a silent stall, never a resume
answered ``recovered: false`` for a history that has every publication."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import websockets
from redis.asyncio import Redis
from websockets.frames import Close

from broadcaster import envelope as env
from broadcaster.publication import Position
from broadcaster.publishers import BufferedPublisher, PusherHTTPPublisher, RedisPublisher
from tests.support.live import APP_ID, KEY, SECRET, Client, LiveServer, StartServer, write_apps
from tests.support.processes import RedisServer
from tests.support.sse import SseReader, sse

Connect = Callable[..., Awaitable[Client]]

BUFFER = 64 * 1024  # max_buffer_bytes of the servers under test
# Larger than the buffer in every encoding (multibyte characters, quotes to escape).
TEXT = ('Ünïcödé "quoted" 😀 text\n' * 6000)[:150_000]
APP = {"id": APP_ID, "key": KEY, "secret": SECRET, "max_event_data_size": 1 << 20}


def chunk(text: str, index: int) -> env.StreamChunk:
    payload = env.StreamChunkPayload(chunk=text, chunk_index=index, step_number=1)
    return env.StreamChunk(session_id="big", execution_id="run-1", payload=payload)


FINAL = env.AgentStatus(
    session_id="big", execution_id="run-1", payload=env.StatusPayload(status="completed")
)


@dataclass
class Seen:
    """What a viewer received: the chunks' text, the event types, the resume answer."""

    text: list[str]
    types: list[str]
    resume: dict[str, Any] | None = None


def note(seen: Seen, kind: str, data: Any) -> bool:
    """Record one event; True at the final status."""
    seen.types.append(kind)
    if kind == "agent.stream.chunk":
        seen.text.append(data["payload"]["chunk"])
    return kind == "agent.status"


async def ws_viewer(client: Client, channel: str, resumed: bool) -> Seen:
    seen = Seen([], [])
    while True:
        message = await client.recv(within=15)
        if message.get("channel") != channel:
            continue
        if message["event"] == "broadcaster:resume":
            seen.resume = message["data"]
            return seen
        kind = message["event"]
        if kind.startswith("agent.") and note(seen, kind, message["data"]) and not resumed:
            return seen


async def sse_viewer(reader: SseReader, resumed: bool) -> Seen:
    seen = Seen([], [])
    while True:
        event = await reader.next(within=15)
        assert event.comment is None or not event.comment.startswith("ended"), event
        if event.comment is not None:
            continue
        if event.event == "broadcaster:resume":
            seen.resume = event.json
            return seen
        if event.event.startswith("agent.") and note(seen, event.event, event.json) and not resumed:
            return seen


async def close_of(client: Client) -> Close | None:
    """Read until the server closes: its close frame (None: closed without one)."""
    try:
        while True:
            await asyncio.wait_for(client.ws.recv(), 15)
    except websockets.ConnectionClosed as exc:
        return exc.rcvd


@contextlib.asynccontextmanager
async def publisher_for(
    kind: str, live: LiveServer, redis: RedisServer | None, prefix: str | None
) -> AsyncIterator[BufferedPublisher]:
    if kind == "http":
        publisher: BufferedPublisher = PusherHTTPPublisher(live.url, APP_ID, KEY, SECRET)
        try:
            yield publisher
        finally:
            await publisher.aclose()
        return
    assert redis is not None
    client = Redis.from_url(redis.url)
    publisher = RedisPublisher(client, APP_ID, prefix=prefix)
    try:
        yield publisher
    finally:
        await publisher.aclose()
        await client.aclose()


async def server_for(
    start_server: StartServer, tmp_path: Path, redis: RedisServer | None = None
) -> tuple[LiveServer, str | None]:
    """A server with a 64 KiB buffer whose app takes events up to 1 MiB, on the memory
    backend or (given ``redis``) on Redis under a fresh prefix (returned)."""
    settings = {
        "max_buffer_bytes": BUFFER,
        "max_request_bytes": 1 << 20,
        "apps_file": write_apps(tmp_path / "apps.json", APP),
    }
    if redis is None:
        return await start_server(**settings), None
    prefix = f"test-{secrets.token_hex(4)}"
    return await start_server(backend=redis.url, redis_prefix=prefix, **settings), prefix


@pytest.mark.parametrize("kind", ["http", pytest.param("redis", marks=pytest.mark.redis)])
async def test_a_publication_larger_than_the_buffer_reaches_every_viewer_whole(
    kind: str,
    start_server: StartServer,
    clients: Connect,
    request: pytest.FixtureRequest,
    tmp_path: Path,
) -> None:
    """150,000 characters (over 200 KB on the wire) with a 64 KiB buffer, and the final
    status right behind it (one HTTP batch / one Redis round trip): the live WebSocket
    and SSE viewers get both, and so do a WebSocket and an SSE viewer resuming from
    before it, told ``recovered: true``."""
    redis = request.getfixturevalue("redis_server") if kind == "redis" else None
    live, prefix = await server_for(start_server, tmp_path, redis)
    channel = "agent.big"
    start = await live.node.backend.position(APP_ID, channel)
    watcher = await clients(live.app_url())
    assert (await watcher.subscribe(channel))["event"] == "pusher_internal:subscription_succeeded"
    async with sse(f"{live.url}/api/channels/{channel}/events") as follower:
        assert (await follower.next()).comment == channel  # subscribed
        async with publisher_for(kind, live, redis, prefix) as publisher:
            await publisher.broadcast(channel, chunk(TEXT, 0))
            await publisher.broadcast(channel, FINAL)
            assert await publisher.flush(within=10)
            assert publisher.stats.dropped == 0
        live_views = [await ws_viewer(watcher, channel, False), await sse_viewer(follower, False)]

    resumer = await clients(live.app_url())
    answer = await resumer.subscribe(channel, position=str(start))
    assert answer["event"] == "pusher_internal:subscription_succeeded"
    resumed_ws = await ws_viewer(resumer, channel, True)
    async with sse(f"{live.url}/api/channels/{channel}/events?since={start}") as reader:
        resumed_sse = await sse_viewer(reader, True)

    for seen in [*live_views, resumed_ws, resumed_sse]:
        assert seen.types == ["agent.stream.chunk", "agent.status"]
        assert seen.text == [TEXT]
    for seen in (resumed_ws, resumed_sse):
        assert seen.resume is not None
        assert seen.resume["recovered"] is True
    # The live viewer stays connected: one more publication reaches it.
    await live.node.publish(APP_ID, [channel], "agent.status", FINAL.to_json().decode())
    assert (await watcher.recv())["event"] == "agent.status"


async def test_a_second_oversized_publication_right_behind_the_first_closes_with_a_reason(
    start_server: StartServer, clients: Connect, tmp_path: Path
) -> None:
    """Two publications over the buffer in one batch: the second cannot join the first
    in a live viewer's buffer, so the viewer is closed with 4100 and a reason naming
    the sizes (the SSE stream ends saying so); a resume from before them delivers
    both whole."""
    live, _ = await server_for(start_server, tmp_path)
    channel = "agent.bigger"
    start = await live.node.backend.position(APP_ID, channel)
    watcher = await clients(live.app_url())
    assert (await watcher.subscribe(channel))["event"] == "pusher_internal:subscription_succeeded"
    async with sse(f"{live.url}/api/channels/{channel}/events") as follower:
        assert (await follower.next()).comment == channel
        async with publisher_for("http", live, None, None) as publisher:
            await publisher.broadcast(channel, chunk(TEXT, 0))
            await publisher.broadcast(channel, chunk(TEXT[::-1], 1))
            await publisher.broadcast(channel, FINAL)
        close = await close_of(watcher)
        ended = None
        while ended is None:
            event = await follower.next(within=15)
            if event.comment is not None and event.comment.startswith("ended"):
                ended = event.comment
    assert close is not None
    assert close.code == 4100
    assert "bytes unsent ahead of a" in close.reason
    assert f"max_buffer_bytes {BUFFER}" in close.reason
    assert "bytes unsent ahead of a" in ended

    resumer = await clients(live.app_url())
    await resumer.subscribe(channel, position=str(start))
    resumed_ws = await ws_viewer(resumer, channel, True)
    async with sse(f"{live.url}/api/channels/{channel}/events?since={start}") as reader:
        resumed_sse = await sse_viewer(reader, True)
    for seen in (resumed_ws, resumed_sse):
        assert seen.types == ["agent.stream.chunk", "agent.stream.chunk", "agent.status"]
        assert seen.text == [TEXT, TEXT[::-1]]
        assert seen.resume is not None
        assert seen.resume["recovered"] is True
        assert Position.parse(seen.resume["position"]).offset == start.offset + 3
