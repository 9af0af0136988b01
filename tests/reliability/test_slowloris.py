"""Slow and greedy clients, on real sockets (issue 13, points 4 and 8): a request head
or WebSocket handshake that never completes is closed after ``header_timeout``, a head
over 64 KiB gets 431, and one client address can hold at most
``max_connections_per_ip`` connections (WebSocket, SSE and plain HTTP together), the
next being answered 429 with Retry-After while other addresses are still served."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator

import httpx
import pytest
import websockets
from websockets.asyncio.client import ClientConnection

from tests.support.live import Client, LiveServer, StartServer
from tests.support.processes import ServerFactory
from tests.support.reliability import WS_PATH, eventually

OTHER_ADDRESS = "127.0.0.2"  # loopback too (127/8), but another client address
UPGRADE = (
    f"GET {WS_PATH} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
)


def connect(url: str, source: str = "127.0.0.1") -> socket.socket:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=20, source_address=(source, 0))


def read_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes (fails on the 20 s socket timeout:
    a server that never closes)."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


async def answer_to(url: str, *sends: bytes, source: str = "127.0.0.1") -> bytes:
    """Open a connection, send ``sends`` and read until the server closes it."""

    def run() -> bytes:
        with connect(url, source) as sock:
            for data in sends:
                sock.sendall(data)
            return read_all(sock)

    return await asyncio.to_thread(run)


# -- head and handshake deadlines ---------------------------------------------------------


@pytest.mark.parametrize(
    "sends",
    [
        (),
        (b"GET /up HTTP/1.1\r\nHost: x\r\n",),
        (UPGRADE.encode(),),
        (b"\r\n", b"\r\n"),
    ],
    ids=["nothing", "half a head", "half a websocket handshake", "blank lines"],
)
async def test_a_request_head_that_never_completes_is_closed(
    start_server: StartServer, sends: tuple[bytes, ...]
) -> None:
    live = await start_server(header_timeout=0.5)
    assert await answer_to(live.url, *sends) == b""


async def test_the_next_head_on_a_kept_alive_connection_has_a_deadline_too(
    start_server: StartServer,
) -> None:
    """A complete request is answered; half of the next one is then closed."""
    live = await start_server(header_timeout=0.5)
    first = b"GET /up HTTP/1.1\r\nHost: x\r\n\r\n"
    answer = await answer_to(live.url, first, b"GET /up HTTP/1.1\r\nHo")
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert answer.count(b"HTTP/1.1") == 1


async def test_an_idle_kept_alive_connection_is_closed_after_uvicorn_s_keep_alive(
    start_server: StartServer,
) -> None:
    """After an answer, a connection that sends nothing is closed at uvicorn's
    keep-alive timeout (5 s), well before a head deadline of 60 s (the connection's
    one timer moves to the earlier deadline); answer_to fails on its 20 s timeout if
    it stays open."""
    live = await start_server(header_timeout=60)
    answers = await answer_to(live.url, b"GET /up HTTP/1.1\r\nHost: x\r\n\r\n" * 2)
    assert answers.count(b"HTTP/1.1 200 ") == 2


async def test_streams_and_websockets_outlive_the_head_deadline(
    start_server: StartServer,
) -> None:
    """The deadline is on the head only: an SSE stream and a WebSocket connection stay
    open and keep working long after it."""
    live = await start_server(header_timeout=0.2, sse_heartbeat=0.1)
    client = await Client.connect(live.app_url())
    async with (
        httpx.AsyncClient(base_url=live.url, timeout=10) as http,
        http.stream("GET", "/api/channels/tick/events") as stream,
    ):
        lines = stream.aiter_lines()
        pings = 0
        while pings < 8:  # eight heartbeats at 0.1 s: past the 0.2 s deadline
            pings += (await anext(lines)) == ": ping"
    await client.send("pusher:ping")
    assert (await client.recv())["event"] == "pusher:pong"
    await client.close()


async def test_a_request_head_over_64_kib_gets_431(start_server: StartServer) -> None:
    live = await start_server()
    head = b"GET /up HTTP/1.1\r\n" + b"X-Filler: " + b"x" * (80 << 10) + b"\r\n"
    answer = await answer_to(live.url, head)
    assert answer.startswith(b"HTTP/1.1 431 ")


async def test_the_served_command_applies_the_limits(server_factory: ServerFactory) -> None:
    """``agent-broadcaster serve`` (a real process, on uvloop) takes the settings from
    its environment: a half-sent handshake is closed, a third WebSocket from one address
    is refused, and closed WebSockets give their slots back."""
    env = {"BROADCASTER_HEADER_TIMEOUT": "0.5", "BROADCASTER_MAX_CONNECTIONS_PER_IP": "2"}
    server = server_factory(env=env)
    assert await answer_to(server.url, UPGRADE.encode()) == b""
    url = server.ws_url + WS_PATH
    for _ in range(3):  # the slots of closed connections come back
        held = [await connect_when_free(url), await connect_when_free(url)]
        assert_refused(await answer_to(server.url, UPGRADE.encode() + b"\r\n"), 2)
        for client in held:
            await client.close()


async def connect_when_free(url: str) -> Client:
    """A Pusher client, retried while the address is at its limit (a closed
    connection's slot comes back when the server has seen it go)."""
    connected: list[Client] = []

    async def attempt() -> bool:
        with contextlib.suppress(websockets.InvalidStatus):
            connected.append(await Client.connect(url))
        return bool(connected)

    await eventually(attempt, "a free connection slot")
    return connected[0]


# -- connections per client address -------------------------------------------------------


async def websocket(live: LiveServer, source: str = "127.0.0.1") -> ClientConnection:
    ws = await websockets.connect(live.app_url(), local_addr=(source, 0))
    first = json.loads(await ws.recv())
    assert first["event"] == "pusher:connection_established"
    return ws


def assert_refused(answer: bytes, limit: int) -> None:
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 429 "), answer[:200]
    assert b"\r\nretry-after: 5" in head.lower()
    message = json.loads(body)["error"]
    assert f"the limit is {limit} open connections per client address" in message
    assert "max_connections_per_ip" in message


async def test_one_address_gets_at_most_its_limit_of_websockets(
    start_server: StartServer,
) -> None:
    """With a limit of 3: the fourth WebSocket from 127.0.0.1 is answered 429 and
    closed, while 127.0.0.2 still connects; closing one frees a slot."""
    live = await start_server(max_connections_per_ip=3)
    held = [await websocket(live) for _ in range(3)]
    assert_refused(await answer_to(live.url, UPGRADE.encode() + b"\r\n"), 3)
    with pytest.raises(websockets.InvalidStatus) as refused:
        await websocket(live)
    assert refused.value.response.status_code == 429

    other = await websocket(live, OTHER_ADDRESS)
    await other.close()

    await held.pop().close()

    async def reconnects() -> bool:
        with contextlib.suppress(websockets.InvalidStatus):
            held.append(await websocket(live))
            return True
        return False

    await eventually(reconnects, "a slot to free up")
    for ws in held:
        await ws.close()


@contextlib.asynccontextmanager
async def sse(url: str, source: str = "127.0.0.1") -> AsyncIterator[httpx.Response]:
    transport = httpx.AsyncHTTPTransport(local_address=source)
    async with (
        httpx.AsyncClient(base_url=url, timeout=10, transport=transport) as http,
        http.stream("GET", "/api/channels/news/events") as response,
    ):
        yield response


async def test_sse_streams_share_the_limit_and_get_429_with_retry_after(
    start_server: StartServer,
) -> None:
    """Two SSE streams and one WebSocket from one address fill a limit of 3: the next
    SSE stream is refused with 429, Retry-After and a message; another address is not."""
    live = await start_server(max_connections_per_ip=3)
    ws = await websocket(live)
    async with sse(live.url) as one, sse(live.url) as two:
        assert (one.status_code, two.status_code) == (200, 200)
        async with sse(live.url) as third:
            assert third.status_code == 429
            assert third.headers["retry-after"] == "5"
            assert "max_connections_per_ip" in json.loads(await third.aread())["error"]
        async with sse(live.url, OTHER_ADDRESS) as other:
            assert other.status_code == 200
    await ws.close()


async def test_no_limit_when_set_to_zero(start_server: StartServer) -> None:
    live = await start_server(max_connections_per_ip=0)
    held = [await websocket(live) for _ in range(20)]
    for ws in held:
        await ws.close()
