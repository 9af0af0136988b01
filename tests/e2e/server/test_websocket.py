"""The WebSocket endpoint: admission codes, bad input, pings and inactivity."""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import websockets

from tests.support.live import APP_ID, KEY, Client, LiveServer, StartServer, write_apps

Connect = Callable[..., Awaitable[Client]]


async def refused_with(url: str, **kwargs: object) -> tuple[int | None, int | None]:
    """Connect to a URL the server refuses: the pusher:error code and the close code."""
    async with websockets.connect(url, **kwargs) as ws:  # type: ignore[arg-type]
        error = json.loads(await ws.recv())
        assert error["event"] == "pusher:error", error
        code = json.loads(error["data"])["code"]
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await ws.recv()
    assert closed.value.rcvd is not None
    return code, closed.value.rcvd.code


async def test_connection_established_carries_socket_id_and_activity_timeout(
    start_server: StartServer, clients: Connect
) -> None:
    live = await start_server(activity_timeout=42)
    first = await clients(live.app_url())
    second = await clients(live.app_url())
    assert re.fullmatch(r"\d+\.\d+", first.socket_id)
    assert first.socket_id != second.socket_id
    assert first.activity_timeout == 42


@pytest.mark.parametrize(
    ("path", "code"),
    [
        (f"/app/{KEY}", 4008),  # no protocol version
        (f"/app/{KEY}?protocol=seven", 4006),  # not a number
        (f"/app/{KEY}?protocol=5", 4007),  # unsupported
        ("/app/no-such-key?protocol=7", 4001),  # unknown app
        ("/somewhere/else", 4005),  # bad path
    ],
)
async def test_refused_connections_get_an_error_and_a_close_with_its_code(
    start_server: StartServer, path: str, code: int
) -> None:
    live = await start_server()
    assert await refused_with(live.ws_url + path) == (code, code)


async def test_disabled_app_is_refused_with_4003(start_server: StartServer, tmp_path: Path) -> None:
    apps = write_apps(
        tmp_path / "apps.json", {"id": "a", "key": "ka", "secret": "s", "enabled": False}
    )
    live = await start_server(apps_file=apps)
    assert await refused_with(live.app_url("ka")) == (4003, 4003)


async def test_origin_not_allowed_is_refused_with_4009(
    start_server: StartServer, clients: Connect, tmp_path: Path
) -> None:
    app = {"id": "a", "key": "ka", "secret": "s", "allowed_origins": ["*.example.com"]}
    live = await start_server(apps_file=write_apps(tmp_path / "apps.json", app))
    url = live.app_url("ka")
    assert await refused_with(url, origin="https://evil.test") == (4009, 4009)
    assert await refused_with(url) == (4009, 4009)  # a restricted app needs an Origin
    allowed = await clients(url, origin="https://app.example.com")
    assert allowed.socket_id


async def test_connection_over_the_app_limit_is_refused_with_4004(
    start_server: StartServer, clients: Connect, tmp_path: Path
) -> None:
    app = {"id": "a", "key": "ka", "secret": "s", "max_connections": 1}
    live = await start_server(apps_file=write_apps(tmp_path / "apps.json", app))
    first = await clients(live.app_url("ka"))
    assert await refused_with(live.app_url("ka")) == (4004, 4004)
    await first.close()
    await clients(live.app_url("ka"))  # the slot is free again


@pytest.mark.parametrize(
    ("message", "code"),
    [
        ("not json", 4300),
        ("[1, 2]", 4300),
        ('{"event": 5}', 4300),
        ('{"event": "pusher:subscribe", "data": "[]"}', 4300),
        ('{"event": "pusher:nonsense", "data": {}}', 4303),
        ('{"event": "hello", "data": {}}', 4303),
        ('{"event": "pusher:subscribe", "data": {"channel": "bad channel!"}}', 4304),
        ('{"event": "pusher:subscribe", "data": {}}', 4304),
        ('{"event": "pusher:ping", "data": "' + "x" * 11_000 + '"}', 4302),
    ],
)
async def test_bad_messages_get_an_error_and_the_connection_stays_usable(
    start_server: StartServer, clients: Connect, message: str, code: int
) -> None:
    live = await start_server()
    client = await clients(live.app_url())
    await client.ws.send(message)
    error = await client.expect("pusher:error")
    assert error["data"]["code"] == code
    assert error["data"]["message"]
    await client.send("pusher:ping")
    await client.expect("pusher:pong")


async def test_binary_message_that_is_not_utf8_is_an_error(
    live: LiveServer, clients: Connect
) -> None:
    client = await clients(live.app_url())
    await client.ws.send(b"\xff\xfe")
    assert (await client.expect("pusher:error"))["data"]["code"] == 4300
    await client.send("pusher:ping")
    await client.expect("pusher:pong")


async def test_pusher_ping_and_protocol_ping_are_answered(
    start_server: StartServer, clients: Connect
) -> None:
    live = await start_server()
    client = await clients(live.app_url())
    await client.send("pusher:ping")
    await client.expect("pusher:pong")
    pong_waiter = await client.ws.ping(b"hello")
    await pong_waiter


async def test_silent_client_is_pinged_then_closed_with_4201(
    start_server: StartServer, clients: Connect
) -> None:
    live = await start_server(activity_timeout=1, pong_timeout=1)
    client = await clients(live.app_url())
    await client.expect("pusher:ping", within=10)
    assert await client.closed_with() == 4201


async def test_client_answering_pings_stays_connected(
    start_server: StartServer, clients: Connect
) -> None:
    live = await start_server(activity_timeout=1, pong_timeout=1)
    client = await clients(live.app_url())
    for _ in range(2):
        await client.expect("pusher:ping", within=10)
        await client.send("pusher:pong")
    await client.send("pusher:ping")
    await client.expect("pusher:pong")


async def test_unsubscribe_stops_delivery(start_server: StartServer, clients: Connect) -> None:
    live = await start_server()
    client = await clients(live.app_url())
    await client.subscribe("agent.1")
    await client.subscribe("agent.2")
    await live.node.publish(APP_ID, ["agent.1"], "one", "1")
    assert (await client.expect("one"))["channel"] == "agent.1"
    await client.send("pusher:unsubscribe", {"channel": "agent.1"})
    await client.send("pusher:ping")  # messages are handled in order: once the pong
    await client.expect("pusher:pong")  # is here, the unsubscribe is done
    await live.node.publish(APP_ID, ["agent.1"], "lost", "x")
    await live.node.publish(APP_ID, ["agent.2"], "two", "2")
    assert (await client.expect("two"))["channel"] == "agent.2"
