"""The HTTP API, driven by the official ``pusher`` Python SDK and by raw requests for
the refusals (400/401/403/404/413)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pusher
import pytest

from broadcaster.signing import channel_auth, signed_params, user_auth
from tests.support.live import APP_ID, KEY, SECRET, Client, LiveServer, StartServer, write_apps

Connect = Callable[..., Awaitable[Client]]


def sdk(live: LiveServer, app_id: str = APP_ID, key: str = KEY, secret: str = SECRET) -> Any:
    url = urlsplit(live.url)
    return pusher.Pusher(
        app_id=app_id, key=key, secret=secret, host=url.hostname, port=url.port, ssl=False
    )


async def call(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run a blocking SDK call off the event loop that serves it."""
    return await asyncio.to_thread(function, *args, **kwargs)


def signed(
    method: str,
    path: str,
    body: bytes = b"",
    *,
    secret: str = SECRET,
    key: str = KEY,
    timestamp: int | None = None,
    md5: str | None = None,
    extra: dict[str, str] | None = None,
) -> dict[str, str]:
    """The query parameters of a request signed as the SDKs do (overridable parts;
    ``md5`` replaces the body's real ``body_md5`` before signing)."""
    if md5 is not None:
        extra = {**(extra or {}), "body_md5": md5}
        body = b""  # signed as given, not computed from the body
    return signed_params(key, secret, method, path, body, timestamp=timestamp, extra=extra)


async def post(live: LiveServer, path: str, body: bytes, **options: Any) -> httpx.Response:
    async with httpx.AsyncClient(base_url=live.url) as http:
        return await http.post(path, content=body, params=signed("POST", path, body, **options))


async def subscribed(live: LiveServer, clients: Connect, channel: str) -> Client:
    client = await clients(live.app_url())
    fields: dict[str, str] = {}
    if channel.startswith("private-"):
        fields["auth"] = channel_auth(KEY, SECRET, client.socket_id, channel)
    answer = await client.subscribe(channel, **fields)
    assert answer["event"] == "pusher_internal:subscription_succeeded"
    return client


async def test_trigger_reaches_subscribers_of_every_channel(
    live: LiveServer, clients: Connect
) -> None:
    one = await subscribed(live, clients, "agent.1")
    two = await subscribed(live, clients, "private-agent.2")
    result = await call(sdk(live).trigger, ["agent.1", "private-agent.2"], "step", {"n": 1})
    assert result == {}
    for client, channel in ((one, "agent.1"), (two, "private-agent.2")):
        event = await client.expect("step")
        assert event["channel"] == channel
        assert event["data"] == {"n": 1}


async def test_trigger_excludes_the_socket_id(live: LiveServer, clients: Connect) -> None:
    publisher = await subscribed(live, clients, "agent.x")
    other = await subscribed(live, clients, "agent.x")
    await call(sdk(live).trigger, "agent.x", "mine", "1", socket_id=publisher.socket_id)
    await call(sdk(live).trigger, "agent.x", "after", "2")
    assert (await other.expect("mine"))["data"] == 1
    assert (await publisher.expect("after"))["data"] == 2  # "mine" was skipped


async def test_trigger_batch_publishes_each_event(live: LiveServer, clients: Connect) -> None:
    client = await subscribed(live, clients, "agent.b")
    batch = [{"channel": "agent.b", "name": f"e{n}", "data": str(n)} for n in range(3)]
    result = await call(sdk(live).trigger_batch, batch)
    assert result == {"batch": [{}, {}, {}]}
    assert [(await client.recv())["event"] for _ in range(3)] == ["e0", "e1", "e2"]


async def test_channel_queries(live: LiveServer, clients: Connect) -> None:
    await subscribed(live, clients, "agent.q")
    await subscribed(live, clients, "agent.q")
    member = await clients(live.app_url())
    channel_data = json.dumps({"user_id": "u1"})
    auth = channel_auth(KEY, SECRET, member.socket_id, "presence-q", channel_data)
    await member.subscribe("presence-q", auth=auth, channel_data=channel_data)
    client = sdk(live)

    everything = await call(client.channels_info)
    assert set(everything["channels"]) == {"agent.q", "presence-q"}
    presence = await call(client.channels_info, "presence-", ["user_count"])
    assert presence == {"channels": {"presence-q": {"user_count": 1}}}

    info = await call(client.channel_info, "agent.q", ["subscription_count"])
    assert info == {"occupied": True, "subscription_count": 2}
    assert await call(client.channel_info, "agent.empty") == {"occupied": False}
    users = await call(client.users_info, "presence-q")
    assert users == {"users": [{"id": "u1"}]}


async def test_terminate_user_connections_closes_them(live: LiveServer, clients: Connect) -> None:
    client = await clients(live.app_url())
    user_data = json.dumps({"id": "doomed"})
    auth = user_auth(KEY, SECRET, client.socket_id, user_data)
    await client.send("pusher:signin", {"auth": auth, "user_data": user_data})
    await client.expect("pusher:signin_success")
    bystander = await clients(live.app_url())
    assert await call(sdk(live).terminate_user_connections, "doomed") == {}
    assert await client.closed_with() == 4009
    await bystander.send("pusher:ping")
    await bystander.expect("pusher:pong")
    path = f"/apps/{APP_ID}/users/doomed/terminate_connections"
    assert (await post(live, path, b"{}")).status_code == 200  # the documented path too


EVENT = b'{"name":"e","channel":"agent.1","data":"{}"}'
EVENTS = f"/apps/{APP_ID}/events"


@pytest.mark.parametrize(
    ("options", "status", "mentions"),
    [
        ({"secret": "wrong"}, 401, "auth_signature"),
        ({"key": "other-key"}, 401, "auth_key"),
        ({"timestamp": int(time.time()) - 601}, 401, "auth_timestamp"),
        ({"timestamp": int(time.time()) + 3600}, 401, "auth_timestamp"),
        ({"md5": "0" * 32}, 401, "body_md5"),
    ],
)
async def test_badly_signed_requests_are_refused(
    live: LiveServer, options: dict[str, Any], status: int, mentions: str
) -> None:
    response = await post(live, EVENTS, EVENT, **options)
    assert response.status_code == status
    assert mentions in response.json()["error"]


async def test_unsigned_request_says_what_is_missing(live: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=live.url) as http:
        response = await http.post(EVENTS, content=EVENT)
    assert response.status_code == 401
    assert "auth_signature" in response.json()["error"]


@pytest.mark.parametrize(
    ("body", "status", "mentions"),
    [
        (b"not json", 400, "JSON"),
        (b'{"name":"e","data":"{}"}', 400, "channel"),
        (b'{"name":"e","channel":"bad name!","data":"x"}', 400, "channel"),
        (
            json.dumps({"name": "e", "channels": [f"c{n}" for n in range(101)], "data": "x"}),
            400,
            "100",
        ),
        (json.dumps({"batch": [{"name": "e", "channel": "c", "data": "x"}] * 11}), 400, "10"),
        (json.dumps({"name": "e", "channel": "c", "data": "x" * 11_000}), 413, "limit"),
        (json.dumps({"name": "e", "channel": "c", "data": "x" * 300_000}), 413, "limit"),
    ],
)
async def test_invalid_bodies_are_refused(
    live: LiveServer, body: bytes | str, status: int, mentions: str
) -> None:
    raw = body.encode() if isinstance(body, str) else body
    path = f"/apps/{APP_ID}/batch_events" if b'"batch"' in raw else EVENTS
    response = await post(live, path, raw)
    assert response.status_code == status, response.text
    assert mentions in response.json()["error"]


async def test_disabled_app_is_forbidden_and_unknown_app_not_found(
    start_server: StartServer, tmp_path: Path
) -> None:
    apps = write_apps(
        tmp_path / "apps.json",
        {"id": APP_ID, "key": KEY, "secret": SECRET},
        {"id": "off", "key": "off-key", "secret": "off-secret", "enabled": False},
    )
    live = await start_server(apps_file=apps)
    off = await post(live, "/apps/off/events", EVENT, key="off-key", secret="off-secret")
    assert off.status_code == 403
    missing = await post(live, "/apps/nope/events", EVENT)
    assert missing.status_code == 404


async def test_presence_only_queries_refuse_other_channels(live: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=live.url) as http:
        path = f"/apps/{APP_ID}/channels/agent.1/users"
        response = await http.get(path, params=signed("GET", path))
        assert response.status_code == 400
        path = f"/apps/{APP_ID}/channels"
        response = await http.get(path, params=signed("GET", path, extra={"info": "user_count"}))
        assert response.status_code == 400
        assert "presence" in response.json()["error"]
