"""Delivery: the slow-consumer policy, one encode per publication, and /metrics."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

import httpx

from broadcaster._frames import PreparedMessage, text_frame
from tests.support.live import APP_ID, Client, LiveServer, StartServer, wait_for

Connect = Callable[..., Awaitable[Client]]


def small_socket(url: str) -> socket.socket:
    """A connected socket with a small receive buffer, so a client that stops reading
    backs up into the server quickly."""
    parts = urlsplit(url)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((parts.hostname, parts.port))
    sock.setblocking(False)
    return sock


def sample(live: LiveServer, name: str, **labels: str) -> float:
    value = live.node.metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


async def test_slow_consumer_is_closed_with_4100_and_others_keep_receiving(
    start_server: StartServer, clients: Connect
) -> None:
    live = await start_server(max_buffer_bytes=64 * 1024)
    url = live.app_url()
    slow = await clients(url, sock=small_socket(url), max_queue=1)
    fast = await clients(url)
    for client in (slow, fast):
        await client.subscribe("agent.flood")
    received = 0

    async def read_fast() -> None:
        nonlocal received
        while (await fast.recv())["event"] != "done":
            received += 1

    reader = asyncio.create_task(read_fast())
    published = 0
    payload = "x" * 8192
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    while sample(live, "broadcaster_slow_consumer_disconnects_total") == 0:
        assert loop.time() < deadline, "the slow consumer was never disconnected"
        for _ in range(4):
            await live.node.publish(APP_ID, ["agent.flood"], "chunk", payload)
            published += 1
        await asyncio.sleep(0.002)
    await live.node.publish(APP_ID, ["agent.flood"], "done", "{}")
    await asyncio.wait_for(reader, 10)
    assert received == published  # the fast client lost nothing
    assert await slow.closed_with() == 4100


async def test_close_frame_follows_everything_already_queued(
    live: LiveServer, clients: Connect
) -> None:
    client = await clients(live.app_url())
    await client.subscribe("agent.c")
    await live.node.publish(APP_ID, ["agent.c"], "last", "1")
    conn = live.node.connections[client.socket_id]
    conn.close(4200, "bye")  # queued frames are flushed before the close frame
    assert (await client.expect("last"))["data"] == 1
    assert await client.closed_with() == 4200


def test_frames_are_built_once_with_the_right_header() -> None:
    small, medium, large = b"a" * 125, b"b" * 126, b"c" * 70_000
    assert text_frame(small)[:2] == bytes([0x81, 125])
    assert text_frame(medium)[:4] == bytes([0x81, 126, 0, 126])
    assert text_frame(large)[:2] == bytes([0x81, 127])
    assert int.from_bytes(text_frame(large)[2:10], "big") == 70_000
    message = PreparedMessage(b"{}")
    assert message.frame is message.frame  # built once, shared by every subscriber


async def test_metrics_count_connections_subscriptions_and_messages(
    live: LiveServer, clients: Connect
) -> None:
    client = await clients(live.app_url())
    await client.subscribe("agent.m")
    await live.node.publish(APP_ID, ["agent.m"], "e", "1")
    await client.expect("e")
    async with httpx.AsyncClient(base_url=live.url) as http:
        text = (await http.get("/metrics")).text
    for name in (
        "broadcaster_connections",
        "broadcaster_subscriptions",
        "broadcaster_messages_in_total",
        "broadcaster_messages_out_total",
        "broadcaster_publish_send_seconds_bucket",
        "broadcaster_slow_consumer_disconnects_total",
        "broadcaster_backend_reconnects",
        "broadcaster_asyncio_tasks",
    ):
        assert name in text, name
    assert sample(live, "broadcaster_connections", app_id=APP_ID) == 1
    assert sample(live, "broadcaster_subscriptions") == 1
    assert sample(live, "broadcaster_messages_out_total") == 1
    assert sample(live, "broadcaster_publish_send_seconds_count") == 1
    await client.close()
    await wait_for(lambda: sample(live, "broadcaster_connections", app_id=APP_ID) == 0, "close")
    assert sample(live, "broadcaster_subscriptions") == 0


async def test_two_servers_in_one_process_keep_separate_metrics(
    start_server: StartServer, clients: Connect
) -> None:
    first = await start_server()
    second = await start_server()
    await clients(first.app_url())
    assert sample(first, "broadcaster_connections", app_id=APP_ID) == 1
    assert sample(second, "broadcaster_connections", app_id=APP_ID) == 0


async def test_up_and_ready(live: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=live.url) as http:
        assert (await http.get("/up")).json() == {"status": "up"}
        assert (await http.get("/ready")).status_code == 200
