"""A stream whose client stops reading (the server's write waits for a drain that never
comes) is unsubscribed as soon as it falls ``max_buffer_bytes`` behind, has its
connection reset after ``abort_after`` seconds, and does not hold a graceful shutdown
(:func:`broadcaster.sse.stream_feed`). Real sockets: the client is a TCP socket with a
4 KiB receive buffer that never reads."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import pytest

from broadcaster.signing import signed_params
from tests.support.live import APP_ID, KEY, SECRET, StartServer
from tests.support.processes import ServerProcess
from tests.support.reliability import eventually, metrics

pytestmark = pytest.mark.timeout(30)

CHANNEL = "stalled"
LIMIT = 64 * 1024  # max_buffer_bytes, where the limit is to be passed
ESTABLISHED = 1  # tcpi_state of a TCP connection that neither side has closed (Linux)
SLOW = "broadcaster_slow_consumer_disconnects_total"

OpenStream = Callable[[str], Awaitable[socket.socket]]


@pytest.fixture
async def stalled_stream() -> AsyncIterator[OpenStream]:
    """Open streams of ``CHANNEL`` from sockets that never read; closed afterwards."""
    opened: list[socket.socket] = []

    async def open_stream(base_url: str) -> socket.socket:
        url = httpx.URL(base_url)
        sock = socket.socket()
        opened.append(sock)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        loop = asyncio.get_running_loop()
        await loop.sock_connect(sock, (url.host, url.port))
        request = f"GET /api/channels/{CHANNEL}/events HTTP/1.1\r\nHost: {url.host}\r\n\r\n"
        await loop.sock_sendall(sock, request.encode())
        await eventually(lambda: subscribed(base_url, 1), "the stream to subscribe")
        return sock

    yield open_stream
    for sock in opened:
        sock.close()


def established(sock: socket.socket) -> bool:
    """Whether the server has neither closed nor reset the connection (read nothing)."""
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] == ESTABLISHED


async def subscribed(base_url: str, count: int) -> bool:
    """Whether the HTTP API counts ``count`` subscriptions to ``CHANNEL``."""
    path = f"/apps/{APP_ID}/channels/{CHANNEL}"
    params = signed_params(KEY, SECRET, "GET", path, extra={"info": "subscription_count"})
    async with httpx.AsyncClient() as http:
        response = await http.get(f"{base_url}{path}", params=params)
    response.raise_for_status()
    return bool(response.json().get("subscription_count", 0) == count)


async def publish(base_url: str, megabytes: int) -> None:
    """Publish ``megabytes`` MB on ``CHANNEL`` through the HTTP API, 10 kB per request:
    paced so that the stream writes what it can, and then waits in send."""
    path = f"/apps/{APP_ID}/events"
    body = json.dumps({"name": "bulk", "channel": CHANNEL, "data": "x" * 10_000}).encode()
    headers = {"content-type": "application/json"}
    async with httpx.AsyncClient() as http:
        for _ in range(megabytes * 100):
            params = signed_params(KEY, SECRET, "POST", path, body)
            response = await http.post(
                f"{base_url}{path}", content=body, params=params, headers=headers
            )
            assert response.status_code == 200, response.text


async def overflow(base_url: str) -> None:
    """Publish until the stream falls ``LIMIT`` behind (a slow consumer in /metrics);
    the kernel's buffers take a few MB first, 16 MB at most are sent."""
    for _ in range(16):
        await publish(base_url, 1)
        if (await metrics(base_url)).get(SLOW):
            return
    raise AssertionError("the stream did not fall behind after 16 MB")


async def test_a_stalled_stream_is_unsubscribed_as_soon_as_it_passes_its_limit(
    start_server: StartServer, stalled_stream: OpenStream
) -> None:
    """Unsubscribed while its connection is still open (abort_after is long here)."""
    live = await start_server(max_buffer_bytes=LIMIT, shutdown_timeout=120)
    live.node.delivery.abort_after = 60
    sock = await stalled_stream(live.url)
    await overflow(live.url)
    await eventually(lambda: subscribed(live.url, 0), "the stream to unsubscribe", 5)
    assert established(sock)


async def test_a_stalled_stream_is_reset_after_abort_after(
    start_server: StartServer, stalled_stream: OpenStream
) -> None:
    live = await start_server(max_buffer_bytes=LIMIT)
    live.node.delivery.abort_after = 0.5
    sock = await stalled_stream(live.url)
    await overflow(live.url)
    await eventually(lambda: not established(sock), "the server to drop the connection", 10)


async def test_shutdown_drops_a_stream_stalled_in_send_before_its_graceful_timeout(
    server_factory: Callable[..., ServerProcess], stalled_stream: OpenStream
) -> None:
    """Under its limit (still subscribed) but waiting in send: the shutdown ends the
    stream, resets its connection after half of shutdown_timeout, and finishes without
    reaching the graceful timeout."""
    timeout = 6
    server = server_factory("--shutdown-timeout", str(timeout), "--max-buffer-bytes", "33554432")
    await stalled_stream(server.url)
    await publish(server.url, 8)
    assert await subscribed(server.url, 1)  # stalled, not over its limit
    started = time.monotonic()
    code = await asyncio.to_thread(server.stop, 2 * timeout)
    took = time.monotonic() - started
    assert "graceful shutdown exceeded" not in server.log, server.log
    assert "Finished server process" in server.log, server.log
    assert code in (0, -signal.SIGTERM), server.log
    assert took < timeout, f"the shutdown took {took:.1f} s"
