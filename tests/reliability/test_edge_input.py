"""Edge input on real sockets: numbers thousands of digits long (Python's int() refuses
more than 4,300 digits) and sign-ins without data get their documented answer, on the
fast path and on the plain ASGI path alike, and no error echoes the whole input."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest
import websockets

from broadcaster.app import create_app
from broadcaster.codes import ErrorCode
from broadcaster.node import Node
from broadcaster.settings import load_settings
from tests.support.live import APP_ID, KEY, Client, LiveServer, StartServer
from tests.support.reliability import signed_query

Connect = Callable[..., Awaitable[Client]]
DIGITS = "7" * 5000
PATHS = ["fast", "asgi"]


async def server(start_server: StartServer, path: str) -> LiveServer:
    """The fast path (native handlers) or uvicorn's plain ASGI WebSocket path."""
    return await start_server() if path == "fast" else await start_server(ws="websockets-sansio")


async def refusal(url: str) -> tuple[dict[str, Any], int | None]:
    """The pusher:error data and the close code of a refused connection."""
    async with websockets.connect(url) as ws:
        first = json.loads(await asyncio.wait_for(ws.recv(), 5))
        assert first["event"] == "pusher:error", first
        with contextlib.suppress(websockets.ConnectionClosed):
            await asyncio.wait_for(ws.recv(), 5)
        return json.loads(first["data"]), ws.close_code


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    ("version", "code"),
    [
        (DIGITS, ErrorCode.UNSUPPORTED_PROTOCOL),
        ("0" * 4999 + "6", ErrorCode.UNSUPPORTED_PROTOCOL),
        ("x" * 5000, ErrorCode.INVALID_VERSION),
        ("7" * 4999 + "x", ErrorCode.INVALID_VERSION),
    ],
)
async def test_a_protocol_version_of_5000_characters_is_refused_with_its_code(
    start_server: StartServer, path: str, version: str, code: ErrorCode
) -> None:
    """It used to complete the handshake and drop the connection with no close code."""
    live = await server(start_server, path)
    error, closed = await refusal(live.app_url(query=f"protocol={version}"))
    assert (error["code"], closed) == (code, code)
    assert "(5000 characters)" in error["message"]
    assert len(error["message"]) < 200


@pytest.mark.parametrize("path", PATHS)
async def test_protocol_7_with_leading_zeros_is_still_protocol_7(
    start_server: StartServer, clients: Connect, path: str
) -> None:
    live = await server(start_server, path)
    client = await clients(live.app_url(query="protocol=0007"))
    assert (await client.subscribe("agent.a"))["event"].endswith("subscription_succeeded")


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    "message",
    [
        {"event": "pusher:signin"},
        {"event": "pusher:signin", "data": None},
        {"event": "pusher:signin", "data": [1]},
        {"event": "pusher:signin", "data": "{not json"},
        {"event": "pusher:signin", "data": {}},
        {"event": "pusher:signin", "data": {"auth": f"{KEY}:{'0' * 64}", "user_data": "{}"}},
    ],
)
async def test_any_failed_signin_closes_with_4009(
    start_server: StartServer, clients: Connect, path: str, message: dict[str, Any]
) -> None:
    """As Pusher does and the README says; without data it used to be a 4300 that left
    the connection open."""
    live = await server(start_server, path)
    client = await clients(live.app_url())
    await client.ws.send(json.dumps(message))
    error = await client.expect("pusher:error")
    assert error["data"]["code"] == ErrorCode.UNAUTHORIZED
    assert len(error["data"]["message"]) < 300
    assert await client.closed_with() == ErrorCode.UNAUTHORIZED


async def test_a_5000_digit_auth_timestamp_is_a_401(start_server: StartServer) -> None:
    """It used to be a 500 (int() of more than 4,300 digits raises)."""
    live = await start_server()
    path = f"/apps/{APP_ID}/events"
    body = json.dumps({"name": "e", "channel": "agent.a", "data": "{}"}).encode()
    query = {**signed_query("POST", path, body), "auth_timestamp": DIGITS}
    async with httpx.AsyncClient() as http:
        response = await http.post(f"{live.url}{path}", params=query, content=body)
    assert response.status_code == 401
    error = response.json()["error"]
    assert "auth_timestamp" in error
    assert "is not whole seconds since the epoch" in error
    assert len(error) < 300


async def test_a_5000_digit_content_length_through_asgi_is_a_413() -> None:
    """uvicorn's HTTP parsers refuse such a header before the app sees it (the test
    below); another ASGI server might pass it on, so the app refuses it without int()."""
    settings = load_settings(port=0, log_level="warning")
    app = create_app(settings, Node(settings))
    path = f"/apps/{APP_ID}/events"
    scope: dict[str, Any] = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"host", b"x"), (b"content-length", DIGITS.encode())],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    assert sent[0]["status"] == 413
    assert b"the limit is" in sent[1]["body"]


async def test_a_5000_digit_content_length_is_not_a_server_error(
    start_server: StartServer,
) -> None:
    live = await start_server()
    path = f"/apps/{APP_ID}/events"
    reader, writer = await asyncio.open_connection("127.0.0.1", int(live.url.rsplit(":", 1)[1]))
    try:
        writer.write(
            f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {DIGITS}\r\n\r\n".encode()
        )
        await writer.drain()
        status_line = await asyncio.wait_for(reader.readline(), 5)
    finally:
        writer.close()
    assert status_line.split()[1] in (b"400", b"413"), status_line


@pytest.mark.parametrize("path", PATHS)
async def test_a_subscribe_position_with_a_5000_digit_offset_is_a_4300(
    start_server: StartServer, clients: Connect, path: str
) -> None:
    live = await server(start_server, path)
    client = await clients(live.app_url())
    for position in (f"ep:{DIGITS}", f"{'e' * 5000}:1", "ep:" + "1" * 19):
        answer = await client.subscribe("agent.a", position=position)
        assert answer["event"] == "pusher:subscription_error", answer
        assert answer["data"]["code"] == ErrorCode.INVALID_MESSAGE
        assert "invalid position" in answer["data"]["error"]
        assert len(answer["data"]["error"]) < 300
    ok = await client.subscribe("agent.a", position="ep:" + "1" * 18)
    assert ok["event"] == "pusher_internal:subscription_succeeded"


@pytest.mark.parametrize("where", ["since", "last-event-id"])
async def test_an_sse_position_with_a_5000_digit_offset_is_a_400(
    start_server: StartServer, where: str
) -> None:
    live = await start_server()
    url = f"{live.url}/api/channels/agent.a/events"
    position = f"ep:{DIGITS}"
    async with httpx.AsyncClient() as http:
        if where == "since":
            response = await http.get(url, params={"since": position})
        else:
            response = await http.get(url, headers={"Last-Event-ID": position})
    assert response.status_code == 400
    error = response.json()["error"]
    assert "invalid position" in error
    assert len(error) < 300
