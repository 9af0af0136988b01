"""Resume over real sockets: reading creates nothing, a history far larger than the
send buffer streams as the client drains (WebSocket and SSE), and the presence limit
holds under concurrent joins on two nodes."""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from broadcaster.backends.base import BackendUnavailable, HistoryResult
from broadcaster.backends.memory import MemoryBackend
from broadcaster.publication import Position
from tests.support.live import (
    APP_ID,
    KEY,
    SECRET,
    Client,
    LiveServer,
    StartServer,
    presence_fields,
    wait_for,
    write_apps,
)
from tests.support.processes import RedisServer
from tests.support.reliability import report
from tests.support.sse import sse

Connect = Callable[..., Awaitable[Client]]

SMALL_BUFFER = 4096  # the smallest max_buffer_bytes allowed
EVENT_DATA = "x" * 1000
MISSED = 200  # publications missed: about 50 times the send buffer


# -- helpers ------------------------------------------------------------------------------


async def server_on(
    kind: str, start_server: StartServer, request: pytest.FixtureRequest, **settings: Any
) -> tuple[LiveServer, str | None]:
    """A server on the memory backend, or on the session's Redis under a fresh prefix
    (returned, to scan its keys)."""
    if kind == "memory":
        return await start_server(**settings), None
    redis: RedisServer = request.getfixturevalue("redis_server")
    prefix = f"test-{secrets.token_hex(4)}"
    return await start_server(backend=redis.url, redis_prefix=prefix, **settings), prefix


async def keys_under(redis: RedisServer, prefix: str) -> list[str]:
    client = Redis.from_url(redis.url, decode_responses=True)
    try:
        return [key async for key in client.scan_iter(match=f"{prefix}:*", count=1000)]
    finally:
        await client.aclose()


async def publish_many(live: LiveServer, channel: str, count: int, start: int = 0) -> None:
    for n in range(start, start + count):
        await live.node.publish(APP_ID, [channel], "seq", json.dumps({"n": n, "pad": EVENT_DATA}))


async def read_resume(client: Client, channel: str) -> tuple[list[int], dict[str, Any]]:
    """The seq numbers received on ``channel`` up to the resume answer, and the answer."""
    seqs: list[int] = []
    while True:
        message = await client.recv(within=15)
        if message.get("channel") != channel:
            continue
        if message["event"] == "broadcaster:resume":
            return seqs, message["data"]
        if message["event"] == "seq":
            seqs.append(message["data"]["n"])


backends = pytest.mark.parametrize(
    "kind", ["memory", pytest.param("redis", marks=pytest.mark.redis)]
)


# -- point 7: phantom channels ------------------------------------------------------------


@backends
async def test_resuming_never_used_channels_leaves_nothing_behind(
    kind: str, start_server: StartServer, clients: Connect, request: pytest.FixtureRequest
) -> None:
    """1,000 resumes (and a few SSE ``?since=``) on channel names nobody published to:
    once the clients leave, the backend holds nothing for any of them."""
    live, prefix = await server_on(kind, start_server, request)
    names = [f"phantom-{n}" for n in range(1000)]
    for batch in range(10):
        client = await clients(live.app_url())
        for name in names[batch * 100 : (batch + 1) * 100]:
            await client.send("pusher:subscribe", {"channel": name, "position": "made-up:5"})
        answers = 0
        while answers < 100:
            message = await client.recv()
            if message["event"] == "broadcaster:resume":
                assert message["data"]["recovered"] is False
                answers += 1
        await client.close()
    for n in range(10):
        async with sse(f"{live.url}/api/channels/phantom-sse-{n}/events?since=x:1") as reader:
            resume = await reader.events()
            assert resume.event == "broadcaster:resume"
    await wait_for(lambda: live.node.hub.channels() == 0, "every subscription to end")
    await wait_for(lambda: not live.node.connections, "every connection to be forgotten")

    if prefix is None:
        backend = live.node.backend
        assert isinstance(backend, MemoryBackend)
        assert backend._streams == {}
        assert backend._presence == {}
        assert backend._subscribed == set()
        assert backend._counts.get(APP_ID, {}) == {}
    else:
        left = await keys_under(request.getfixturevalue("redis_server"), prefix)
        assert [key for key in left if "phantom" in key] == []
        report("phantom_channels", backend=kind, resumes=1010, keys_left=len(left))


# -- point 9: a history larger than the send buffer ---------------------------------------


@backends
async def test_a_history_larger_than_the_buffer_streams_instead_of_closing(
    kind: str, start_server: StartServer, clients: Connect, request: pytest.FixtureRequest
) -> None:
    """A client that missed ~50 buffers' worth of publications gets every one of them
    in order, then the live ones published meanwhile, then ``recovered: true``: it is
    not closed with 4100 (which made every retry fail the same way)."""
    live, _ = await server_on(kind, start_server, request, max_buffer_bytes=SMALL_BUFFER)
    channel = "agent.long"
    start = await live.node.backend.position(APP_ID, channel)
    await publish_many(live, channel, MISSED)
    during = asyncio.create_task(publish_many(live, channel, 50, start=MISSED))

    client = await clients(live.app_url())
    began = time.perf_counter()
    answer = await client.subscribe(channel, position=str(start))
    assert answer["event"] == "pusher_internal:subscription_succeeded"
    seqs, resume = await read_resume(client, channel)
    await during
    while len(seqs) < MISSED + 50:  # the rest of the live ones
        message = await client.recv(within=15)
        if message["event"] == "seq":
            seqs.append(message["data"]["n"])

    assert resume["recovered"] is True
    assert seqs == list(range(MISSED + 50))
    assert live.node.connections, "the client is still connected"
    report(
        "resume_large_history",
        backend=kind,
        missed=MISSED,
        bytes_missed=MISSED * (len(EVENT_DATA) + 60),
        max_buffer_bytes=SMALL_BUFFER,
        delivered=len(seqs),
        seconds=round(time.perf_counter() - began, 3),
    )


async def test_a_history_larger_than_the_buffer_streams_over_sse(
    start_server: StartServer,
) -> None:
    """The same over SSE (``?since=``): every missed event, in order, then the resume
    answer, without the stream being ended."""
    live = await start_server(max_buffer_bytes=SMALL_BUFFER)
    channel = "agent.long-sse"
    start = await live.node.backend.position(APP_ID, channel)
    await publish_many(live, channel, MISSED)

    ids: list[int] = []
    async with sse(f"{live.url}/api/channels/{channel}/events?since={start}") as reader:
        while True:
            event = await reader.next()
            assert event.comment is None or not event.comment.startswith("ended"), event
            if event.event == "broadcaster:resume":
                assert json.loads(event.data)["recovered"] is True
                break
            if event.event == "seq":
                assert event.id is not None
                ids.append(Position.parse(event.id).offset)
                assert event.json["n"] == len(ids) - 1
    assert ids == list(range(start.offset + 1, start.offset + MISSED + 1))


async def test_a_missed_publication_larger_than_the_buffer_is_resumed_whole(
    start_server: StartServer, clients: Connect
) -> None:
    """A frame larger than the whole buffer is sent once nothing else is unsent (the
    limit counts what is queued beyond it), followed by the resume answer: the client
    gets it and ``recovered: true``, not a ``recovered: false`` for a history that has
    every publication (see tests/e2e/server/test_large_publications.py for live viewers)."""
    live = await start_server(max_buffer_bytes=SMALL_BUFFER)
    channel = "agent.huge"
    start = await live.node.backend.position(APP_ID, channel)
    await live.node.publish(APP_ID, [channel], "seq", json.dumps({"n": 0, "pad": "x" * 5000}))
    await live.node.publish(APP_ID, [channel], "seq", json.dumps({"n": 1}))
    client = await clients(live.app_url())
    answer = await client.subscribe(channel, position=str(start))
    assert answer["event"] == "pusher_internal:subscription_succeeded"
    seqs, resume = await read_resume(client, channel)
    assert (seqs, resume["recovered"]) == ([0, 1], True)
    await live.node.publish(APP_ID, [channel], "seq", json.dumps({"n": 2}))
    assert (await client.expect("seq"))["data"]["n"] == 2


# -- point 10: a history read that fails ---------------------------------------------------


class FailingHistory(MemoryBackend):
    """A backend whose history cannot be read (as when Redis stalls)."""

    async def history(
        self, app_id: str, channel: str, since: Position, limit: int | None = None
    ) -> HistoryResult:
        raise BackendUnavailable("the history cannot be read now (test)")


async def test_a_failed_history_read_closes_with_a_reconnect_code(
    start_server: StartServer, clients: Connect
) -> None:
    """Not a bare pusher:error after subscription_succeeded (pusher-js ignores it and
    believes it is subscribed): the connection is closed with 4100, so the client
    reconnects after a back-off and resumes again."""
    live = await start_server(backend_object=FailingHistory())
    client = await clients(live.app_url())
    answer = await client.subscribe("agent.stalled", position="e:1")
    assert answer["event"] == "pusher_internal:subscription_succeeded"
    error = await client.expect("pusher:error")
    assert error["data"]["code"] == 4100
    assert "agent.stalled" in error["data"]["message"]
    assert await client.closed_with() == 4100
    await wait_for(lambda: live.node.hub.channels() == 0, "the subscription to be dropped")


async def test_a_failed_history_read_ends_the_sse_stream(start_server: StartServer) -> None:
    """Over SSE the stream ends (after 200) with a comment saying so: EventSource then
    reconnects by itself with Last-Event-ID (a 503 would stop it for good)."""
    live = await start_server(backend_object=FailingHistory())
    async with sse(f"{live.url}/api/channels/stalled/events?since=e:1") as reader:
        assert (await reader.next()).comment == "stalled"
        ended = await reader.next()
    assert ended.comment is not None
    assert ended.comment.startswith("ended: history not read")


# -- point 13: presence limit across nodes ------------------------------------------------


@pytest.mark.redis
async def test_the_presence_limit_holds_for_concurrent_joins_on_two_nodes(
    start_server: StartServer, redis_server: RedisServer, clients: Connect, tmp_path: Path
) -> None:
    """150 users join one presence channel at once, half through each node, with
    max_presence_members = 100: exactly 100 get in, 50 are refused with 4307."""
    apps = write_apps(
        tmp_path / "apps.json",
        {"id": APP_ID, "key": KEY, "secret": SECRET, "max_presence_members": 100},
    )
    prefix = f"test-{secrets.token_hex(4)}"
    nodes = [
        await start_server(backend=redis_server.url, redis_prefix=prefix, apps_file=apps)
        for _ in range(2)
    ]
    channel = "presence-crowd"
    members = [await clients(nodes[n % 2].app_url()) for n in range(150)]

    async def join(n: int, client: Client) -> dict[str, Any]:
        await client.send(
            "pusher:subscribe",
            {"channel": channel, **presence_fields(client, channel, f"user-{n}")},
        )
        while True:
            message = await client.recv(within=15)
            if message["event"] in (
                "pusher_internal:subscription_succeeded",
                "pusher:subscription_error",
            ):
                return message

    answers = await asyncio.gather(*(join(n, c) for n, c in enumerate(members)))
    joined = [a for a in answers if a["event"] == "pusher_internal:subscription_succeeded"]
    refused = [a for a in answers if a["event"] == "pusher:subscription_error"]
    assert len(joined) == 100
    assert len(refused) == 50
    assert {a["data"]["code"] for a in refused} == {4307}
    report("presence_limit", joins=150, limit=100, joined=len(joined), refused=len(refused))
    for client in members:  # (a close handshake of many presence members at once
        client.ws.transport.abort()  # waits for close_timeout: seen on main as well)
