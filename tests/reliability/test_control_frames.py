"""What a client's WebSocket control and continuation frames may cost the server: a
client that sends PINGs and never reads our PONGs is no longer read either, so the
PONGs cannot pile up; a message in many small fragments weighs about its size, not one
object per fragment. Both are unauthenticated: one connection is all it takes."""

from __future__ import annotations

import asyncio
import base64
import os
import socket

import pytest

from broadcaster._uvicorn import FastWebSocketProtocol
from tests.support.live import KEY, Client, LiveServer, StartServer, wait_for
from tests.support.rawws import masked_frame

pytestmark = pytest.mark.timeout(60)

PING = 0x9
CONT = 0x0
TEXT = 0x1


def client_frame(opcode: int, payload: bytes, *, fin: bool = True) -> bytes:
    """A masked client frame; ``fin=False`` leaves a message unfinished."""
    frame = masked_frame(opcode, payload)
    return bytes(((0x80 if fin else 0) | opcode,)) + frame[1:]


async def raw_connect(live: LiveServer) -> socket.socket:
    """A WebSocket on a non-blocking socket with small buffers, past the handshake; it
    reads nothing afterwards."""
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 65536)
    sock.setblocking(False)
    host, port = live.url.removeprefix("http://").split(":")
    await loop.sock_connect(sock, (host, int(port)))
    key = base64.b64encode(os.urandom(16)).decode()
    request = (
        f"GET /app/{KEY}?protocol=7 HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    await loop.sock_sendall(sock, request.encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += await asyncio.wait_for(loop.sock_recv(sock, 1), 5)
    assert head.startswith(b"HTTP/1.1 101"), head
    return sock


def websockets_of(live: LiveServer) -> list[FastWebSocketProtocol]:
    return [c for c in live.server.server_state.connections if isinstance(c, FastWebSocketProtocol)]


async def send_until_stalled(sock: socket.socket, data: bytes, limit: int) -> int:
    """Send ``data`` over and over until ``limit`` bytes are out or a send has made no
    progress for a second; the bytes sent."""
    loop = asyncio.get_running_loop()
    sent = 0
    while sent < limit:
        try:
            await asyncio.wait_for(loop.sock_sendall(sock, data), 1)
        except TimeoutError:
            return sent
        sent += len(data)
    return sent


async def test_a_client_that_pings_and_never_reads_is_no_longer_read(
    start_server: StartServer,
) -> None:
    """64 MB of PINGs from a client that reads nothing: the server stops reading it once
    its PONGs fill the outgoing buffer, so the sends stall after a few MB (kernel
    buffers) and the server holds well under its 1 MiB per-connection budget. Other
    clients are served meanwhile, and the connection still closes cleanly."""
    live = await start_server()
    sock = await raw_connect(live)
    try:
        (flooder,) = websockets_of(live)
        pings = client_frame(PING, b"p" * 125) * 2000  # 262 KB
        sent = await send_until_stalled(sock, pings, 64 << 20)
        assert sent < 32 << 20, f"the server read all {sent} bytes of PINGs"
        assert flooder.buffered() < 1 << 20
        other = await Client.connect(live.app_url())
        await other.send("pusher:ping")
        assert (await other.recv())["event"] == "pusher:pong"
        await other.close()
    finally:
        sock.close()
    await wait_for(lambda: not websockets_of(live), "the flooding connection to go")


async def test_pings_are_still_answered_while_the_client_reads(
    start_server: StartServer,
) -> None:
    """The pause is only for a client that does not read: one that reads gets a PONG
    for each of many PINGs."""
    live = await start_server()
    client = await Client.connect(live.app_url())
    for _ in range(200):
        latency = await asyncio.wait_for(await client.ws.ping(b"x" * 100), 5)
        assert latency >= 0
    await client.close()


async def test_a_message_in_many_small_fragments_is_kept_as_one_buffer(
    start_server: StartServer,
) -> None:
    """10,000 one-byte fragments of an unfinished message are held in one buffer of
    about 10 KB (before, one bytes object each: about 57 bytes per byte). Finished, the
    message is read as if it came in one frame."""
    live = await start_server()
    loop = asyncio.get_running_loop()
    sock = await raw_connect(live)
    try:
        (conn,) = websockets_of(live)
        fragments = client_frame(TEXT, b"{", fin=False) + b"".join(
            client_frame(CONT, b" ", fin=False) for _ in range(10_000)
        )
        await loop.sock_sendall(sock, fragments)
        await wait_for(
            lambda: sum(len(f) for f in conn.frames) == 10_001, "the fragments to be read"
        )
        assert len(conn.frames) == 1
        body = b'"event":"pusher:ping","data":{}}'
        await loop.sock_sendall(sock, client_frame(CONT, body))
        sock.setblocking(True)
        sock.settimeout(5)
        received = b""
        while b"pusher:pong" not in received:
            chunk = await asyncio.to_thread(sock.recv, 65536)
            assert chunk, f"closed before the pong: {received!r}"
            received += chunk
    finally:
        sock.close()


@pytest.mark.parametrize(
    "extra",
    ["".join(f"X-{i}: a\r\n" for i in range(200)), "X-Long: " + "a" * 9000 + "\r\n"],
    ids=["200-headers", "a-9000-byte-line"],
)
async def test_an_upgrade_the_websocket_parser_refuses_is_answered_400_and_closed(
    start_server: StartServer, extra: str
) -> None:
    """Within the 64 KiB head limit but past the WebSocket parser's own (128 headers, 8
    KiB a line): answered 400 with the reason, then closed. Before, it got no answer and
    the connection stayed open for good (an fd and about 86 KB each)."""
    live = await start_server()
    host, port = live.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    key = base64.b64encode(os.urandom(16)).decode()
    head = (
        f"GET /app/{KEY}?protocol=7 HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
    )
    writer.write((head + extra + "\r\n").encode())
    try:
        answer = await asyncio.wait_for(reader.read(), 10)  # until the server closes
    finally:
        writer.close()
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]
    assert b"invalid WebSocket upgrade request" in answer
    await wait_for(lambda: not websockets_of(live), "the connection to go")
