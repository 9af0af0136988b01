"""Bounded input: every request body is capped while it is read (413, answered small),
error answers quote at most a short excerpt of the input, and WebSocket frames are
refused from their header once over the app's frame limit (issue 13, points 3 and 5)."""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from tests.support.live import APP_ID, Client, StartServer, write_apps
from tests.support.rawws import RawClient, masked_text_frame
from tests.support.reliability import WS_PATH, signed_query

LIMIT = 256 << 10  # max_request_bytes by default
SMALL = 2048  # what a refusal may weigh, headers aside

FORM = "application/x-www-form-urlencoded"
JSON = "application/json"
API = f"/apps/{APP_ID}/events"
# Each endpoint that reads a body, with a body over the limit that it would otherwise
# reject only after reading it all.
ENDPOINTS = [
    (API, JSON),
    ("/run", JSON),
    ("/ag-ui", JSON),
    ("/broadcasting/auth", FORM),
]


def oversized(content_type: str, size: int) -> bytes:
    if content_type == FORM:
        return b"socket_id=1.1&channel_name=private-agent." + b"x" * size
    return json.dumps({"input": "x" * size, "threadId": "t"}).encode()


async def chunks(body: bytes, size: int = 64 << 10) -> AsyncIterator[bytes]:
    for start in range(0, len(body), size):
        yield body[start : start + size]


@pytest.mark.parametrize(("path", "content_type"), ENDPOINTS)
@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
async def test_a_body_over_the_limit_is_refused_with_413(
    start_server: StartServer, path: str, content_type: str, declared: bool
) -> None:
    """Whether its size is declared up front or only seen while streaming, a body over
    max_request_bytes gets a small 413 that names the limit and its setting."""
    live = await start_server(demo=True)
    body = oversized(content_type, 4 * LIMIT)
    content = body if declared else chunks(body)
    async with httpx.AsyncClient(base_url=live.url, timeout=30) as http:
        response = await http.post(path, content=content, headers={"content-type": content_type})
    assert response.status_code == 413, response.text[:200]
    assert len(response.content) < SMALL
    assert f"the limit is {LIMIT} bytes (max_request_bytes)" in response.json()["error"]


async def test_a_body_within_the_limit_still_works(start_server: StartServer) -> None:
    """The cap does not get in the way: a run request and a form auth request are read."""
    live = await start_server(demo=True)
    async with httpx.AsyncClient(base_url=live.url, timeout=30) as http:
        run = await http.post("/run", json={"input": "hello", "pace_ms": 0})
        auth = await http.post(
            "/broadcasting/auth",
            content=b"socket_id=1.1&channel_name=agent.x",
            headers={"content-type": FORM},
        )
    assert run.status_code == 202, run.text
    assert auth.status_code == 403  # read and judged: not a private session channel


async def test_huge_invalid_bodies_get_small_422_answers(start_server: StartServer) -> None:
    """With the limit raised to 16 MiB, 8 MiB invalid bodies are answered with a few
    hundred bytes: pydantic's input is not echoed, client-chosen field names are cut,
    and at most 10 errors are listed (before: the whole input, once per error)."""
    live = await start_server(demo=True, max_request_bytes=16 << 20)
    big = "x" * (8 << 20)
    many_keys = {f"k{n}": n for n in range(20_000)}
    cases = [
        ("/run", {"input": big}),
        ("/run", {"input": "hi", big[:5000]: 1}),
        ("/run", {"input": "hi", **many_keys}),
        ("/ag-ui", {"threadId": big}),
        ("/ag-ui", {"threadId": "t", "runId": "r", "state": {}, "messages": [big[: 3 << 20]] * 2}),
    ]
    async with httpx.AsyncClient(base_url=live.url, timeout=60) as http:
        for path, payload in cases:
            response = await http.post(
                path, content=json.dumps(payload).encode(), headers={"content-type": JSON}
            )
            assert response.status_code == 422, (path, response.text[:300])
            assert len(response.content) < SMALL, (path, len(response.content))
            answer = response.json()
            assert answer["error"].startswith("invalid ")
            assert len(answer["details"]) <= 11
            assert all("input" not in detail for detail in answer["details"])


async def test_http_api_errors_quote_only_an_excerpt(start_server: StartServer) -> None:
    """An unknown app id of 50,000 characters is named by its first 100."""
    live = await start_server()
    path = f"/apps/{'9' * 50_000}/events"
    body = b'{"name": "e", "channel": "c", "data": "d"}'
    async with httpx.AsyncClient(base_url=live.url, timeout=30) as http:
        response = await http.post(path, content=body, params=signed_query("POST", path, body))
    assert response.status_code == 404
    assert len(response.content) < 400
    assert "(50000 characters)" in response.json()["error"]


# -- WebSocket frames (point 5) -----------------------------------------------------------


def announce(size: int) -> bytes:
    """The header (and mask) of a masked text frame announcing ``size`` payload bytes."""
    return struct.pack("!BBQ", 0x81, 0x80 | 127, size) + b"mask"


async def closed_with(url: str, frame: bytes) -> int | None:
    """Send ``frame`` on a new connection and read until the close: its code (None if
    the server did not close within the client's 10 s socket timeout)."""
    raw = await asyncio.to_thread(RawClient, url)
    try:
        await asyncio.to_thread(raw.sock.sendall, frame)
        _, code = await asyncio.to_thread(raw.read_until_close)
        return code
    finally:
        raw.close()


@pytest.mark.parametrize("ws", [None, "websockets-sansio"], ids=["native", "asgi"])
async def test_a_frame_announcing_900_kb_is_refused_from_its_header(
    start_server: StartServer, ws: str | None
) -> None:
    """The frame limit follows max_message_size (10 KiB -> 20 KiB frames): a frame
    announcing 900 KB is closed with 1009 at once, not held until 1 MiB arrives; on
    the fast path and under uvicorn's own protocol (the ASGI endpoint) alike."""
    live = await start_server(ws=ws)
    code = await closed_with(live.ws_url + WS_PATH, announce(900_000) + b"x" * 1000)
    assert code == 1009


async def test_frame_limits_follow_each_apps_message_limit(
    start_server: StartServer, tmp_path: Path
) -> None:
    """With a 10 KiB app and a 64 KiB app on one server, a connection is held to its
    own app's limit: 30 KB is refused (1009) for the small app and read for the big one;
    a message a little over the small app's limit still gets pusher:error 4302 and the
    connection stays usable."""
    apps = write_apps(
        tmp_path / "apps.json",
        {"id": "1", "key": "small", "secret": "s1"},
        {"id": "2", "key": "big", "secret": "s2", "max_message_size": 65_536},
    )
    live = await start_server(apps_file=str(apps))
    padded = json.dumps({"event": "pusher:ping", "data": "x" * 30_000}).encode()
    assert await closed_with(live.app_url("small"), masked_text_frame(padded)) == 1009

    big = await Client.connect(live.app_url("big"))
    await big.ws.send(padded.decode())
    assert (await big.recv())["event"] == "pusher:pong"
    await big.close()

    small = await Client.connect(live.app_url("small"))
    await small.ws.send(json.dumps({"event": "pusher:ping", "data": "x" * 12_000}))
    error = await small.recv()
    assert (error["event"], error["data"]["code"]) == ("pusher:error", 4302)
    await small.send("pusher:ping")
    assert (await small.recv())["event"] == "pusher:pong"
    await small.close()
