"""Publishers against their real targets: the Pusher HTTP API of a running server and
the Redis path of the Redis backend, including an unreachable target (retries, a
bounded buffer, counted drops)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import pytest
from redis.asyncio import Redis

from broadcaster.backends.redis import channel_key
from broadcaster.envelope import StreamChunk, StreamChunkPayload
from broadcaster.publishers import PusherHTTPPublisher, RedisPublisher
from tests.support.live import Client, StartServer
from tests.support.processes import RedisServer, ServerFactory, free_port

Connect = Callable[..., Awaitable[Client]]
CHANNEL = "agent.pub-test"


def chunk(n: int) -> StreamChunk:
    return StreamChunk(
        session_id="pub-test", execution_id="x-1", payload=StreamChunkPayload(chunk=f"#{n}")
    )


async def received(client: Client, count: int) -> list[str]:
    texts: list[str] = []
    while len(texts) < count:
        message = await client.recv(within=10)
        if message["event"] == "agent.stream.chunk":
            texts.append(message["data"]["payload"]["chunk"])
    return texts


async def eventually(condition: Callable[[], bool], what: str, within: float = 10) -> None:
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


async def test_http_publisher_delivers_in_order_in_batches(
    start_server: StartServer, clients: Connect
) -> None:
    live = await start_server()
    client = await clients(live.app_url())
    await client.subscribe(CHANNEL)
    publisher = PusherHTTPPublisher(live.url, "1", "agent-key", "agent-secret")
    for n in range(25):
        await publisher.broadcast(CHANNEL, chunk(n))
    assert await publisher.flush(10)
    assert await received(client, 25) == [f"#{n}" for n in range(25)]
    assert (publisher.stats.published, publisher.stats.dropped) == (25, 0)
    await publisher.aclose()


async def test_http_publisher_drops_what_the_target_refuses_for_good(
    start_server: StartServer, caplog: pytest.LogCaptureFixture
) -> None:
    live = await start_server()
    publisher = PusherHTTPPublisher(live.url, "1", "agent-key", "not-the-secret")
    with caplog.at_level(logging.WARNING, logger="broadcaster.publishers"):
        await publisher.broadcast(CHANNEL, chunk(1))
        assert await publisher.flush(10)
    assert publisher.stats.dropped == 1
    assert publisher.stats.retries == 0, "a 401 is not retried"
    assert "401" in (publisher.stats.last_error or "")
    assert "not-the-secret" not in caplog.text
    await publisher.aclose()


async def test_unreachable_target_fills_a_bounded_buffer_and_counts_drops() -> None:
    publisher = PusherHTTPPublisher(
        f"http://127.0.0.1:{free_port()}", "1", "k", "s", max_buffer=3, close_timeout=0.3
    )
    for n in range(5):
        await publisher.broadcast(CHANNEL, chunk(n))
    assert publisher.stats.dropped == 2, "the buffer holds 3"
    await eventually(lambda: publisher.stats.retries >= 2, "retries")
    assert "cannot reach" in (publisher.stats.last_error or "")
    await publisher.aclose()
    assert publisher.stats.dropped == 5, "closing gives up on the 3 still buffered"
    with pytest.raises(RuntimeError, match="closed"):
        await publisher.broadcast(CHANNEL, chunk(9))


@pytest.mark.redis
@pytest.mark.slow
async def test_http_publisher_retries_until_the_server_is_up(
    start_server: StartServer,
    clients: Connect,
    server_factory: ServerFactory,
    redis_server: RedisServer,
) -> None:
    """Publications sent while the target node is down arrive, in order, once it is up
    (through Redis, to a client on another node)."""
    prefix = "pub-retry"
    reader = await start_server(backend=redis_server.url, redis_prefix=prefix)
    client = await clients(reader.app_url())
    await client.subscribe(CHANNEL)
    port = free_port()
    publisher = PusherHTTPPublisher(f"http://127.0.0.1:{port}", "1", "agent-key", "agent-secret")
    for n in range(3):
        await publisher.broadcast(CHANNEL, chunk(n))
    await eventually(lambda: publisher.stats.retries >= 1, "a failed attempt")
    server_factory("--port", str(port), "--backend", redis_server.url, "--redis-prefix", prefix)
    assert await publisher.flush(20)
    assert await received(client, 3) == ["#0", "#1", "#2"]
    assert publisher.stats.dropped == 0
    await publisher.aclose()


@pytest.mark.redis
async def test_redis_publisher_takes_the_backends_path(
    start_server: StartServer, clients: Connect, redis_server: RedisServer
) -> None:
    live = await start_server(backend=redis_server.url, redis_prefix="pub-redis")
    client = await clients(live.app_url())
    await client.subscribe(CHANNEL)
    redis = Redis.from_url(redis_server.url)
    publisher = RedisPublisher(redis, "1", prefix="pub-redis")
    for n in range(10):
        await publisher.broadcast(CHANNEL, chunk(n))
    assert await publisher.flush(10)
    messages = []
    while len(messages) < 10:
        message = await client.recv(within=10)
        if message["event"] == "agent.stream.chunk":
            messages.append(message)
    assert [m["data"]["payload"]["chunk"] for m in messages] == [f"#{n}" for n in range(10)]
    offsets = [int(m["position"].rsplit(":", 1)[1]) for m in messages]
    assert offsets == list(range(offsets[0], offsets[0] + 10))
    await publisher.aclose()
    await redis.aclose()


@pytest.mark.redis
async def test_redis_publisher_sends_what_waits_together_in_order(
    start_server: StartServer, clients: Connect, redis_server: RedisServer
) -> None:
    live = await start_server(backend=redis_server.url, redis_prefix="pub-batch")
    client = await clients(live.app_url())
    await client.subscribe(CHANNEL)
    redis = Redis.from_url(redis_server.url)
    publisher = RedisPublisher(redis, "1", prefix="pub-batch", max_batch=100)
    for n in range(250):  # buffered before the sender runs: three round trips
        await publisher.broadcast(CHANNEL, chunk(n))
    assert await publisher.flush(10)

    assert publisher.stats.published == 250
    assert publisher.stats.sends == 3
    chunks = []
    while len(chunks) < 250:
        message = await client.recv(within=10)
        if message["event"] == "agent.stream.chunk":
            chunks.append(message)
    assert [m["data"]["payload"]["chunk"] for m in chunks] == [f"#{n}" for n in range(250)]
    offsets = [int(m["position"].rsplit(":", 1)[1]) for m in chunks]
    assert offsets == list(range(offsets[0], offsets[0] + 250))
    await publisher.aclose()
    await redis.aclose()


@pytest.mark.redis
async def test_redis_publisher_buffers_through_a_redis_outage(
    redis_factory: Callable[[], RedisServer],
) -> None:
    server = redis_factory()
    redis = Redis.from_url(server.url, socket_timeout=1, socket_connect_timeout=1)
    publisher = RedisPublisher(redis, "1", prefix="pub-outage")
    await publisher.broadcast(CHANNEL, chunk(0))
    assert await publisher.flush(10)
    server.kill()
    for n in (1, 2, 3):
        await publisher.broadcast(CHANNEL, chunk(n))
    await eventually(lambda: publisher.stats.retries >= 1, "a failed attempt")
    server.start()
    assert await publisher.flush(20)
    stream = await redis.xrange(channel_key("pub-outage", "1", CHANNEL, "stream"))
    assert [orjson_chunk(entry) for _, entry in stream] == ["#1", "#2", "#3"]
    assert publisher.stats.dropped == 0
    await publisher.aclose()
    await redis.aclose()


def orjson_chunk(entry: dict[bytes, bytes]) -> str:
    """The envelope chunk text in a stream entry of the Redis backend."""
    from broadcaster.backends.redis import decode_publication
    from broadcaster.envelope import parse_envelope

    (payload,) = entry.values()
    envelope = parse_envelope(decode_publication(payload).data)
    assert isinstance(envelope, StreamChunk)
    return envelope.payload.chunk
