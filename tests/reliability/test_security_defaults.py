"""Security defaults: client events are off unless enabled, the origin allow-list is
enforced when configured (4009), and secrets never reach a log, an error message or a
repr, even at debug level while authentication fails in every way."""

from __future__ import annotations

import json
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import pytest
import websockets

from broadcaster.codes import ErrorCode
from broadcaster.settings import AppConfig, Settings, SettingsError, load_settings
from broadcaster.signing import channel_auth
from tests.support.live import APP_ID, KEY, Client, StartServer, write_apps
from tests.support.processes import RedisServer, ServerFactory
from tests.support.reliability import WS_PATH, signed_query

Connect = Callable[..., Awaitable[Client]]


def test_client_events_are_off_and_every_origin_allowed_by_default() -> None:
    settings = Settings()
    (app,) = settings.apps()
    assert settings.enable_client_messages is False
    assert app.enable_client_messages is False
    assert AppConfig(id="1", key="k", secret="s").enable_client_messages is False
    assert app.allowed_origins == ("*",)  # as Reverb's default; restrict it per app


async def test_a_client_event_on_a_default_server_is_rejected(
    start_server: StartServer, clients: Connect
) -> None:
    live = await start_server()
    client = await clients(live.app_url())
    channel = "private-room"
    auth = channel_auth(KEY, "agent-secret", client.socket_id, channel)
    assert (await client.subscribe(channel, auth=auth))["event"].endswith("succeeded")
    await client.send("client-typing", {}, channel)
    error = await client.expect("pusher:error")
    assert error["data"]["code"] == ErrorCode.CLIENT_EVENT_REJECTED
    assert "client events are disabled" in error["data"]["message"]


@pytest.mark.parametrize(
    ("origin", "admitted"),
    [
        ("https://app.example", True),
        ("https://eu.trusted.example", True),
        ("https://evil.example", False),
        ("https://app.example.evil.example", False),
        (None, False),
    ],
)
async def test_the_origin_allow_list_admits_only_listed_origins(
    start_server: StartServer, tmp_path: Path, origin: str | None, admitted: bool
) -> None:
    app = {
        "id": APP_ID,
        "key": KEY,
        "secret": "agent-secret",
        "allowed_origins": ["https://app.example", "*.trusted.example"],
    }
    live = await start_server(apps_file=write_apps(tmp_path / "apps.json", app))
    headers = {} if origin is None else {"Origin": origin}
    async with websockets.connect(live.app_url(), additional_headers=headers) as ws:
        first = json.loads(await ws.recv())
        if admitted:
            assert first["event"] == "pusher:connection_established"
            return
        assert first["event"] == "pusher:error"
        assert json.loads(first["data"])["code"] == ErrorCode.UNAUTHORIZED
        with pytest.raises(websockets.ConnectionClosed):
            await ws.recv()
        assert ws.close_code == ErrorCode.UNAUTHORIZED


def test_secrets_stay_out_of_reprs_and_settings_errors(tmp_path: Path) -> None:
    secret = f"s3cret-{secrets.token_hex(8)}"
    settings = load_settings(app_secret=secret)
    assert secret not in repr(settings)
    assert secret not in repr(settings.apps())
    bad = write_apps(tmp_path / "apps.json", {"id": "bad id!", "key": "k", "secret": secret})
    with pytest.raises(SettingsError) as refused:
        load_settings(apps_file=bad)
    assert secret not in str(refused.value)
    assert "bad id!" in str(refused.value)  # the wrong value itself is named


@pytest.mark.redis
async def test_secrets_never_reach_the_logs_or_the_clients(
    server_factory: ServerFactory, redis_server: RedisServer
) -> None:
    secret = f"s3cret-{secrets.token_hex(8)}"
    server = server_factory(
        "--app-secret", secret, "--log-level", "debug", "--backend", redis_server.url
    )
    seen: list[str] = []
    client = await Client.connect(server.ws_url + WS_PATH)
    forged = [
        {"channel": "private-a"},
        {"channel": "private-a", "auth": f"{KEY}:{'0' * 64}"},
        {"channel": "private-a", "auth": channel_auth(KEY, "guess", client.socket_id, "private-a")},
        {"channel": "presence-a", "channel_data": '{"user_id":"1"}', "auth": "x"},
    ]
    for fields in forged:
        await client.send("pusher:subscribe", fields)
        seen.append(json.dumps(await client.recv()))
    good = {
        "channel": "private-b",
        "auth": channel_auth(KEY, secret, client.socket_id, "private-b"),
    }
    await client.send("pusher:subscribe", good)
    seen.append(json.dumps(await client.recv()))
    await client.send("pusher:signin", {"auth": f"{KEY}:{'0' * 64}", "user_data": '{"id":"1"}'})
    seen.append(json.dumps(await client.recv()))
    await client.close()

    path = f"/apps/{APP_ID}/events"
    body = b'{"name":"e","channel":"agent.a","data":"{}"}'
    async with httpx.AsyncClient(base_url=server.url) as http:
        for query in (
            signed_query("POST", path, body, secret="guess"),
            {**signed_query("POST", path, body, secret=secret), "body_md5": "0" * 32},
            signed_query("POST", path, body, secret=secret, timestamp=1),
            signed_query("POST", path, body, secret=secret),
        ):
            response = await http.post(path, params=query, content=body)
            seen.append(response.text)
    assert response.status_code == 200  # the last one was right
    server.stop()  # graceful: the log is complete
    assert server.log, "the server logged nothing at debug level"
    assert secret not in server.log
    for answer in seen:
        assert secret not in answer


@pytest.mark.redis
async def test_a_redis_password_is_not_printed_when_redis_refuses_it(
    server_factory: ServerFactory, redis_server: RedisServer
) -> None:
    password = f"pw-{secrets.token_hex(8)}"
    url = f"redis://:{password}@127.0.0.1:{redis_server.port}/0"
    with pytest.raises((RuntimeError, TimeoutError)) as failed:
        server_factory("--backend", url, "--log-level", "debug")
    assert "refused" in str(failed.value) or "AUTH" in str(failed.value)
    assert password not in str(failed.value)
