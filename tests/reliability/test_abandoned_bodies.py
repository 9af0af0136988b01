"""A client that goes away in the middle of its request body, on real sockets: the
request ends quietly (no ERROR record, no traceback: one per request would let any
client flood the log) and the server goes on answering.

Every endpoint that reads a body through :func:`broadcaster.http_input.read_body` is
covered; the publish routes (:class:`broadcaster.http_api.PublishFastPath`) were
already quiet.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct

import httpx
import pytest

from tests.support.live import APP_ID, KEY, LiveServer, StartServer, wait_for

ENDPOINTS = [
    ("POST", "/run"),
    ("POST", "/broadcasting/auth"),
    ("POST", "/ag-ui"),
    ("POST", "/vercel-ai"),
    ("POST", f"/apps/{APP_ID}/users/u1/terminate_connections"),
    ("POST", f"/users/u1/terminate_connections?auth_key={KEY}"),
    ("GET", f"/apps/{APP_ID}/channels"),
]
PART = b'{"input": "hi"}'  # valid JSON on its own: only a truncated read could act on it
HEADS = {
    "content-length": b"Content-Length: 1000\r\n\r\n" + PART,
    "chunked": b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n" % (len(PART), PART),
}


def reset(sock: socket.socket) -> None:
    """Close ``sock`` with a TCP reset (SO_LINGER 0), as a client that crashed."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def in_flight(live: LiveServer) -> int:
    """Requests the server is still running the application for."""
    return len(live.server.server_state.tasks)


@pytest.mark.parametrize("framing", list(HEADS))
@pytest.mark.parametrize(("method", "path"), ENDPOINTS, ids=[p for _, p in ENDPOINTS])
async def test_a_body_cut_short_by_a_reset_ends_the_request_quietly(
    start_server: StartServer,
    caplog: pytest.LogCaptureFixture,
    method: str,
    path: str,
    framing: str,
) -> None:
    live = await start_server(demo=True)
    uvicorn_log = logging.getLogger("uvicorn")  # where "Exception in ASGI application" goes
    uvicorn_log.addHandler(caplog.handler)  # it does not propagate
    try:
        await abandon_a_body(live, method, path, framing)
    finally:
        uvicorn_log.removeHandler(caplog.handler)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert [r.getMessage() for r in errors] == []
    async with httpx.AsyncClient() as http:
        assert (await http.get(f"{live.url}/up")).status_code == 200


async def abandon_a_body(live: LiveServer, method: str, path: str, framing: str) -> None:
    """Send the head and part of the body, reset once the application is reading it,
    and wait for the request to end."""
    host, port = live.url.removeprefix("http://").rsplit(":", 1)
    sock = await asyncio.to_thread(socket.create_connection, (host, int(port)), 10)
    head = f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    await asyncio.to_thread(sock.sendall, head.encode() + HEADS[framing])
    await wait_for(lambda: in_flight(live) == 1, "the application to read the body")
    reset(sock)
    await wait_for(lambda: in_flight(live) == 0, "the request to end")
