"""Bad input, end to end: a sweep of malformed WebSocket frames, refused handshakes and
bad HTTP API requests against one server process, while a bystander client keeps
receiving a steady stream. Every case gets its documented answer (codes in
broadcaster/codes.py, statuses in broadcaster/http_api.py), the server never exits, the
bystander misses nothing, and the server's connection and subscription counts return to
the bystander's alone afterwards."""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets

from broadcaster.codes import ErrorCode
from broadcaster.signing import channel_auth, user_auth
from tests.support.live import APP_ID, KEY, SECRET, Client, write_apps
from tests.support.processes import ServerFactory, ServerProcess
from tests.support.rawws import RawClient, masked_frame
from tests.support.reliability import WS_PATH, eventually, metrics, publish, report, signed_query

pytestmark = pytest.mark.slow

CHATTY_KEY, CHATTY_SECRET = "chatty-key", "chatty-secret"
APPS = (
    {"id": APP_ID, "key": KEY, "secret": SECRET},  # the defaults: client events off
    {"id": "2", "key": CHATTY_KEY, "secret": CHATTY_SECRET, "enable_client_messages": True},
)
C = ErrorCode


def msg(event: Any, data: Any = None, channel: Any = None, **extra: Any) -> str:
    message: dict[str, Any] = {"event": event, **extra}
    if data is not None:
        message["data"] = data
    if channel is not None:
        message["channel"] = channel
    return json.dumps(message)


def sub(channel: Any, **fields: Any) -> str:
    return msg("pusher:subscribe", {"channel": channel, **fields})


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@dataclass(frozen=True)
class Case:
    """Frames sent on a fresh connection and the answer expected: ``error`` (a
    pusher:error with ``code``), ``sub_error`` (pusher:subscription_error with
    ``code``), ``close`` (a close frame with ``code``) or ``reply`` (an event)."""

    name: str
    frames: tuple[str | bytes, ...]
    expect: str
    code: int | str
    key: str = KEY


def ws_cases() -> list[Case]:
    private = "private-secret"
    member = json.dumps({"user_id": "7"})
    other_member = json.dumps({"user_id": "8"})
    return [
        Case("invalid UTF-8 in a binary frame", (b"\xff\xfe\xfd",), "error", C.INVALID_MESSAGE),
        Case(
            "binary frame of valid JSON", (msg("pusher:ping", {}).encode(),), "reply", "pusher:pong"
        ),
        Case("not JSON", ("hello",), "error", C.INVALID_MESSAGE),
        Case("empty message", ("",), "error", C.INVALID_MESSAGE),
        Case("JSON array", ("[1, 2]",), "error", C.INVALID_MESSAGE),
        Case("JSON string", ('"pusher:ping"',), "error", C.INVALID_MESSAGE),
        Case("JSON null", ("null",), "error", C.INVALID_MESSAGE),
        Case(
            "over max_message_size",
            (msg("client-x", "x" * 20_000, "private-a"),),
            "error",
            C.MESSAGE_TOO_LARGE,
        ),
        Case(
            "deeply nested message",
            ('{"event":"pusher:ping","data":' + nested(2000) + "}",),
            "error",
            C.INVALID_MESSAGE,
        ),
        Case(
            "deeply nested data string",
            (msg("pusher:subscribe", nested(1500)),),
            "error",
            C.INVALID_MESSAGE,
        ),
        Case(
            "client event data nested 300 deep",
            ('{"event":"client-x","channel":"private-a","data":' + nested(300) + "}",),
            "error",
            C.INVALID_MESSAGE,
        ),
        Case(
            "presence user_info nested 100 deep",
            (sub("presence-a", channel_data='{"user_id":"1","user_info":' + nested(100) + "}"),),
            "sub_error",
            C.INVALID_CHANNEL_DATA,
        ),
        Case("event is a number", (msg(5, {}),), "error", C.INVALID_MESSAGE),
        Case("event missing", ('{"data": {}}',), "error", C.INVALID_MESSAGE),
        Case(
            "subscribe data is a list", (msg("pusher:subscribe", [1]),), "error", C.INVALID_MESSAGE
        ),
        Case(
            "subscribe data is bad JSON text",
            (msg("pusher:subscribe", "{oops"),),
            "error",
            C.INVALID_MESSAGE,
        ),
        Case(
            "subscribe without channel", (msg("pusher:subscribe", {}),), "error", C.INVALID_CHANNEL
        ),
        Case("channel is a number", (sub(5),), "error", C.INVALID_CHANNEL),
        Case("auth is a number", (sub(private, auth=5),), "sub_error", C.INVALID_MESSAGE),
        Case("position is a number", (sub("agent.a", position=5),), "sub_error", C.INVALID_MESSAGE),
        Case(
            "position malformed",
            (sub("agent.a", position="yesterday"),),
            "sub_error",
            C.INVALID_MESSAGE,
        ),
        Case("unknown pusher event", (msg("pusher:launch", {}),), "error", C.UNKNOWN_EVENT),
        Case(
            "server-only event from a client",
            (msg("pusher_internal:member_added", {}),),
            "error",
            C.UNKNOWN_EVENT,
        ),
        Case("event neither pusher:* nor client-*", (msg("hello", {}),), "error", C.UNKNOWN_EVENT),
        Case("empty channel name", (sub(""),), "error", C.INVALID_CHANNEL),
        Case("space in channel name", (sub("a b"),), "error", C.INVALID_CHANNEL),
        Case("channel name of 165 characters", (sub("x" * 165),), "error", C.INVALID_CHANNEL),
        Case("non-ASCII channel name", (sub("agent.é"),), "error", C.INVALID_CHANNEL),
        Case("user channel without a user", (sub("#server-to-user-"),), "error", C.INVALID_CHANNEL),
        Case(
            "unsubscribe from an invalid channel",
            (msg("pusher:unsubscribe", {"channel": "a b"}),),
            "error",
            C.INVALID_CHANNEL,
        ),
        Case(
            "private channel without auth",
            (sub(private),),
            "sub_error",
            C.SUBSCRIPTION_UNAUTHORIZED,
        ),
        Case(
            "forged auth signature",
            (sub(private, auth=f"{KEY}:{'0' * 64}"),),
            "sub_error",
            C.SUBSCRIPTION_UNAUTHORIZED,
        ),
        Case(
            "auth replayed from another socket",
            (sub(private, auth=channel_auth(KEY, SECRET, "1.2", private)),),
            "sub_error",
            C.SUBSCRIPTION_UNAUTHORIZED,
        ),
        Case(
            "auth signed for another channel",
            (sub(private, auth="{auth:private-other}"),),
            "sub_error",
            C.SUBSCRIPTION_UNAUTHORIZED,
        ),
        Case(
            "auth with another app's key",
            (sub(private, auth="{auth-key:chatty}"),),
            "sub_error",
            C.SUBSCRIPTION_UNAUTHORIZED,
        ),
        Case(
            "auth signed with another secret",
            (sub(private, auth="{auth-secret:wrong}"),),
            "sub_error",
            C.SUBSCRIPTION_UNAUTHORIZED,
        ),
        Case(
            "presence auth over other channel_data",
            (sub("presence-a", channel_data=other_member, auth="{auth-presence:" + member + "}"),),
            "sub_error",
            C.SUBSCRIPTION_UNAUTHORIZED,
        ),
        Case(
            "presence without channel_data",
            (sub("presence-a"),),
            "sub_error",
            C.INVALID_CHANNEL_DATA,
        ),
        Case(
            "presence channel_data not an object",
            (sub("presence-a", channel_data="[1]"),),
            "sub_error",
            C.INVALID_CHANNEL_DATA,
        ),
        Case(
            "presence channel_data over 2 kB",
            (
                sub(
                    "presence-a", channel_data=json.dumps({"user_id": "1", "user_info": "x" * 3000})
                ),
            ),
            "sub_error",
            C.INVALID_CHANNEL_DATA,
        ),
        Case(
            "another user's channel",
            (sub("#server-to-user-7"),),
            "sub_error",
            C.SUBSCRIPTION_UNAUTHORIZED,
        ),
        Case(
            "forged sign-in",
            (msg("pusher:signin", {"auth": f"{KEY}:{'0' * 64}", "user_data": '{"id":"7"}'}),),
            "close",
            C.UNAUTHORIZED,
        ),
        Case("sign-in without data", (msg("pusher:signin"),), "close", C.UNAUTHORIZED),
        Case("sign-in data not an object", (msg("pusher:signin", [1]),), "close", C.UNAUTHORIZED),
        Case(
            "channel_data on a private channel, signed with it",
            (sub(private, channel_data="private-mine", auth="{auth-presence:private-mine}"),),
            "sub_error",
            C.SUBSCRIPTION_UNAUTHORIZED,
        ),
        Case(
            "position offset of 5000 digits",
            (sub("agent.a", position="e:" + "7" * 5000),),
            "sub_error",
            C.INVALID_MESSAGE,
        ),
        Case(
            "sign-in with bad user_data",
            (msg("pusher:signin", {"auth": "x", "user_data": "nope"}),),
            "close",
            C.UNAUTHORIZED,
        ),
        Case(
            "sign-in replayed from another socket",
            (
                msg(
                    "pusher:signin",
                    {
                        "auth": user_auth(KEY, SECRET, "1.2", '{"id":"7"}'),
                        "user_data": '{"id":"7"}',
                    },
                ),
            ),
            "close",
            C.UNAUTHORIZED,
        ),
        Case(
            "client event with client events off (default)",
            (msg("client-x", {}, private),),
            "error",
            C.CLIENT_EVENT_REJECTED,
        ),
        Case(
            "client event on a public channel",
            (msg("client-x", {}, "agent.a"),),
            "error",
            C.CLIENT_EVENT_REJECTED,
            CHATTY_KEY,
        ),
        Case(
            "client event on an unjoined channel",
            (msg("client-x", {}, "private-a"),),
            "error",
            C.CLIENT_EVENT_REJECTED,
            CHATTY_KEY,
        ),
        Case(
            "client event without channel",
            (msg("client-x", {}),),
            "error",
            C.INVALID_CHANNEL,
            CHATTY_KEY,
        ),
        Case(
            "client event name over 200 characters",
            (msg("client-" + "x" * 200, {}, "private-a"),),
            "error",
            C.INVALID_MESSAGE,
            CHATTY_KEY,
        ),
    ]


def resolve(frame: str | bytes, socket_id: str) -> str | bytes:
    """Fill the auth placeholders, which need the connection's socket id."""
    if isinstance(frame, bytes) or "{auth" not in frame:
        return frame
    message = json.loads(frame)
    data = message["data"]
    placeholder = data["auth"]
    channel = data["channel"]
    kind, _, arg = placeholder.strip("{}").partition(":")
    if kind == "auth":
        data["auth"] = channel_auth(KEY, SECRET, socket_id, arg)
    elif kind == "auth-key":
        data["auth"] = channel_auth(CHATTY_KEY, SECRET, socket_id, channel)
    elif kind == "auth-secret":
        data["auth"] = channel_auth(KEY, arg, socket_id, channel)
    elif kind == "auth-presence":
        data["auth"] = channel_auth(KEY, SECRET, socket_id, channel, arg)
    return json.dumps(message)


async def answer_to(client: Client, case: Case) -> Any:
    """The answer of the kind the case expects (other messages are skipped)."""
    try:
        while True:
            message = await client.recv(within=5)
            event, data = message["event"], message.get("data") or {}
            if case.expect == "reply" and event == case.code:
                return event
            if case.expect == "error" and event == "pusher:error":
                return data["code"]
            if case.expect == "sub_error" and event == "pusher:subscription_error":
                return data["code"]
    except websockets.ConnectionClosed as exc:
        return exc.rcvd.code if exc.rcvd is not None else None


async def run_ws_case(server: ServerProcess, case: Case) -> None:
    client = await Client.connect(f"{server.ws_url}/app/{case.key}?protocol=7")
    try:
        for frame in case.frames:
            await client.ws.send(resolve(frame, client.socket_id))
        got = await answer_to(client, case)
        if case.expect == "close" and got != case.code:
            got = await client.closed_with()
        assert got == case.code, f"{case.name}: expected {case.code}, got {got}"
    finally:
        await client.close()


HANDSHAKES = [
    ("unknown app key", "/app/nobody?protocol=7", C.APP_NOT_FOUND),
    ("no protocol version", f"/app/{KEY}", C.NO_PROTOCOL_VERSION),
    ("protocol version not a number", f"/app/{KEY}?protocol=seven", C.INVALID_VERSION),
    ("unsupported protocol version", f"/app/{KEY}?protocol=6", C.UNSUPPORTED_PROTOCOL),
    (
        "protocol version of 5000 digits",
        f"/app/{KEY}?protocol={'7' * 5000}",
        C.UNSUPPORTED_PROTOCOL,
    ),
    ("path not found", "/socket?protocol=7", C.PATH_NOT_FOUND),
]


async def refused_with(url: str) -> tuple[int | None, int | None]:
    """The pusher:error code and the close code of a refused connection."""
    async with websockets.connect(url) as ws:
        first = json.loads(await asyncio.wait_for(ws.recv(), 5))
        error = json.loads(first["data"])["code"]
        with contextlib.suppress(websockets.ConnectionClosed):
            await asyncio.wait_for(ws.recv(), 5)
        return error, ws.close_code


async def raw_cases(server: ServerProcess) -> int:
    """Frames the WebSocket layer refuses before the app sees them: invalid UTF-8 in a
    text frame (1007) and a frame announcing 2 MiB, over the server's frame limit
    (1009: refused from the header, before the payload is read)."""
    huge = struct.pack("!BBQ", 0x81, 0x80 | 127, 2 << 20) + b"mask" + b"x" * 1000
    cases = [(masked_frame(0x1, b'{"event": "\xff"}'), 1007), (huge, 1009)]
    for frame, expected in cases:
        raw = await asyncio.to_thread(RawClient, server.ws_url + WS_PATH)
        try:
            await asyncio.to_thread(raw.sock.sendall, frame)
            _, code = await asyncio.to_thread(raw.read_until_close)
        finally:
            raw.close()
        assert code == expected, f"expected close {expected}, got {code}"
    return len(cases)


async def client_event_flood(server: ServerProcess) -> int:
    """15 client events in a burst on an app allowing 10 per second: some get 4301."""
    client = await Client.connect(f"{server.ws_url}/app/{CHATTY_KEY}?protocol=7")
    channel = "private-chat"
    auth = channel_auth(CHATTY_KEY, CHATTY_SECRET, client.socket_id, channel)
    assert (await client.subscribe(channel, auth=auth))["event"].endswith("succeeded")
    for n in range(15):
        await client.send("client-burst", {"n": n}, channel)
    codes = []
    with contextlib.suppress(TimeoutError):
        while True:
            message = await client.recv(within=1)
            if message["event"] == "pusher:error":
                codes.append(message["data"]["code"])
    await client.close()
    assert codes, "no client event was refused"
    assert set(codes) == {C.CLIENT_EVENT_RATE_LIMIT}
    return 15


async def subscribe_flood(server: ServerProcess, channels: int = 500) -> int:
    """Hundreds of subscriptions sent at once from one connection: each answered, the
    first ``max_channels_per_connection`` (128) accepted and the rest refused with 4308
    (too many channels), then 4309 once past the subscribe burst (138)."""
    limit = 128
    client = await Client.connect(server.ws_url + WS_PATH)
    for n in range(channels):
        await client.send("pusher:subscribe", {"channel": f"flood.{n}"})
    answers = [await client.recv(within=10) for _ in range(channels)]
    accepted = [a for a in answers if a["event"] == "pusher_internal:subscription_succeeded"]
    refused = [a for a in answers if a["event"] == "pusher:subscription_error"]
    assert len(accepted) == limit, answers[limit - 1 : limit + 1]
    assert len(refused) == channels - limit
    codes = [a["data"]["code"] for a in refused]
    assert codes[:10] == [4308] * 10  # the burst is used up (its refill is 10 a second)
    assert set(codes) == {4308, 4309}
    await client.close()
    return channels


def http_cases(now: int) -> list[tuple[str, str, dict[str, str] | None, bytes, int]]:
    """(name, path, query or None for a correctly signed one, body, expected status)."""
    events = f"/apps/{APP_ID}/events"
    batch = f"/apps/{APP_ID}/batch_events"
    good = json.dumps({"name": "e", "channel": "agent.a", "data": "{}"}).encode()

    def signed(body: bytes, path: str = events, **kw: Any) -> dict[str, str]:
        return signed_query("POST", path, body, **kw)

    def tampered(query: dict[str, str], **changes: str) -> dict[str, str]:
        return {**query, **changes}

    def body(**fields: Any) -> bytes:
        return json.dumps({"name": "e", "channel": "agent.a", "data": "{}", **fields}).encode()

    sig = signed(good)
    return [
        ("bad signature", events, tampered(sig, auth_signature="0" * 64), good, 401),
        ("signature by another secret", events, signed(good, secret="wrong"), good, 401),
        ("stale timestamp (-700 s)", events, signed(good, timestamp=now - 700), good, 401),
        ("future timestamp (+700 s)", events, signed(good, timestamp=now + 700), good, 401),
        ("timestamp not a number", events, tampered(sig, auth_timestamp="soon"), good, 401),
        ("timestamp of 5000 digits", events, tampered(sig, auth_timestamp="9" * 5000), good, 401),
        ("wrong body_md5", events, tampered(sig, body_md5="0" * 32), good, 401),
        ("body replayed under another body's signature", events, sig, body(data="[]"), 401),
        ("missing body_md5", events, {k: v for k, v in sig.items() if k != "body_md5"}, good, 401),
        ("missing auth parameters", events, {}, good, 401),
        ("unknown auth_key", events, signed(good, key="nobody"), good, 401),
        ("wrong auth_version", events, tampered(sig, auth_version="2.0"), good, 401),
        ("unknown app id", "/apps/999/events", None, good, 404),
        ("body over max_request_bytes", events, None, b"x" * (300 << 10), 413),
        ("data over 10 kB", events, None, body(data="x" * 11_000), 413),
        (
            "101 channels",
            events,
            None,
            body(channel=None, channels=[f"c{i}" for i in range(101)]),
            400,
        ),
        (
            "11 events in a batch",
            batch,
            None,
            json.dumps({"batch": [json.loads(good)] * 11}).encode(),
            400,
        ),
        ("empty batch", batch, None, b'{"batch": []}', 400),
        ("batch is not a list", batch, None, b'{"batch": 5}', 400),
        ("invalid channel name", events, None, body(channel="a b"), 400),
        ("no channel", events, None, b'{"name": "e", "data": "{}"}', 400),
        ("not JSON", events, None, b"name=e", 400),
        ("JSON array body", events, None, b"[1]", 400),
        ("name is a number", events, None, body(name=5), 400),
        ("data is an object", events, None, body(data={"a": 1}), 400),
        ("reserved event name", events, None, body(name="pusher:subscribe"), 400),
        ("event name over 200 characters", events, None, body(name="e" * 201), 400),
        ("invalid socket_id", events, None, body(socket_id="me"), 400),
        ("unknown info attribute", events, None, body(info="everything"), 400),
        ("deeply nested body", events, None, nested(5000).encode(), 400),
    ]


async def run_http_cases(server: ServerProcess) -> int:
    cases = http_cases(int(time.time()))
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
        for name, path, query, body, expected in cases:
            params = signed_query("POST", path, body) if query is None else query
            response = await http.post(path, params=params, content=body)
            assert response.status_code == expected, (
                f"{name}: {response.status_code} {response.text}"
            )
            assert response.json()["error"], name
    return len(cases)


async def test_bad_input_gets_documented_errors_and_harms_no_one(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    apps = write_apps(tmp_path / "apps.json", *APPS)
    server = server_factory("--apps-file", str(apps), "--log-level", "warning")
    bystander = await Client.connect(server.ws_url + WS_PATH)
    await bystander.subscribe("agent.bystander")
    ticks: list[int] = []

    async def watch() -> None:
        with contextlib.suppress(Exception):
            while True:
                message = await bystander.recv(within=30)
                if message["event"] == "tick":
                    ticks.append(message["data"])

    sent = 0
    stop = asyncio.Event()

    async def tick() -> None:
        nonlocal sent
        async with httpx.AsyncClient(timeout=10) as http:
            while not stop.is_set():
                response = await publish(http, server.url, "agent.bystander", "tick", str(sent))
                assert response.status_code == 200
                sent += 1
                await asyncio.sleep(0.01)

    watcher = asyncio.create_task(watch())
    ticker = asyncio.create_task(tick())
    tried: dict[str, int] = {}
    try:
        cases = ws_cases()
        for case in cases:
            await run_ws_case(server, case)
        tried["websocket_frames"] = len(cases)
        for name, path, code in HANDSHAKES:
            error, close = await refused_with(server.ws_url + path)
            assert error == close == code, f"{name}: error {error}, close {close}"
        tried["handshakes"] = len(HANDSHAKES)
        tried["websocket_layer"] = await raw_cases(server)
        frames = await client_event_flood(server) + await subscribe_flood(server)
        tried["floods"] = 2
        tried["http_requests"] = await run_http_cases(server)
    finally:
        stop.set()
        await ticker
    await eventually(lambda: len(ticks) == sent, "the bystander to get every tick")
    assert ticks == list(range(sent)), "the bystander missed or reordered ticks"
    assert server.proc is not None
    assert server.proc.poll() is None, "the server exited"

    async def only_the_bystander() -> bool:
        m = await metrics(server.url)
        return (m["broadcaster_connections"], m["broadcaster_subscriptions"]) == (1, 1)

    await eventually(only_the_bystander, "the attackers' connections and subscriptions to go")
    await bystander.close()
    watcher.cancel()
    total = sum(tried.values())
    report(
        "bad_input",
        bad_input_cases=total,
        flood_frames=frames,
        bystander_ticks=sent,
        bystander_lost=0,
        **tried,
    )
    print(f"bad inputs tried: {total} cases (+{frames} flood frames)")
