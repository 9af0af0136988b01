"""No signing oracle: the demo's ``/broadcasting/auth`` signs a subscription for the
holder of a session token, and nothing else.

The app secret also signs the HTTP API, so an endpoint that signed
``<caller's socket_id>:private-agent.<own session>`` for any ``socket_id`` text handed
out signatures for requests it was never meant to authorize. Both attacks below were
reproduced against a real server process (demo, private sessions): a forged HTTP API
publish into another session's channel, and a subscription to another session's private
channel. The endpoint now refuses any ``socket_id`` that is not ``<digits>.<digits>``
(400), and the WebSocket refuses ``channel_data`` on a private channel (4009), so even a
signature made elsewhere over such text opens nothing.
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest

from broadcaster.codes import ErrorCode
from broadcaster.signing import body_md5, sign
from tests.support.live import APP_ID, KEY, SECRET, Client
from tests.support.processes import ServerFactory, ServerProcess
from tests.support.reliability import WS_PATH
from tests.support.runs import read_run, start_run

pytestmark = pytest.mark.slow

PRIVATE = {"AGENT_DEMO_PRIVATE_SESSIONS": "true"}


@pytest.fixture
def private_demo(server_factory: ServerFactory) -> ServerProcess:
    return server_factory("--demo", "--log-level", "warning", env=PRIVATE)


async def ask_auth(
    server: ServerProcess, socket_id: str, channel: str, token: str
) -> httpx.Response:
    fields = {"socket_id": socket_id, "channel_name": channel, "session_token": token}
    async with httpx.AsyncClient() as http:
        return await http.post(f"{server.url}/broadcasting/auth", data=fields)


async def forged_publish(
    server: ServerProcess, granted: httpx.Response, query: dict[str, str], body: bytes
) -> int:
    """What the HTTP API answers to a publish signed by what the endpoint granted."""
    signature = granted.json()["auth"].partition(":")[2]
    async with httpx.AsyncClient() as http:
        response = await http.post(
            f"{server.url}/apps/{APP_ID}/events",
            params={**query, "auth_signature": signature},
            content=body,
            headers={"content-type": "application/json"},
        )
    return response.status_code


async def test_the_auth_endpoint_cannot_be_made_to_sign_an_http_api_request(
    private_demo: ServerProcess,
) -> None:
    mine = await start_run(private_demo.url)
    theirs = await start_run(private_demo.url)
    body = json.dumps(
        {"name": "agent.status", "channel": theirs["channel"], "data": '{"forged": true}'}
    ).encode()
    query = {
        "auth_key": KEY,
        "auth_timestamp": str(int(time.time())),
        "auth_version": "1.0",
        "body_md5": body_md5(body),
    }
    signed_prefix = "&".join(f"{k}={v}" for k, v in sorted(query.items()))
    # The endpoint appends ":private-agent.<own session>": an extra query parameter
    # zzz (sorted last) absorbs it, so the text is exactly a publish's string to sign.
    socket_id = f"POST\n/apps/{APP_ID}/events\n{signed_prefix}&zzz=x"
    query["zzz"] = f"x:{mine['channel']}"

    granted = await ask_auth(private_demo, socket_id, mine["channel"], mine["auth"]["token"])

    exploit = (
        await forged_publish(private_demo, granted, query, body) if granted.is_success else None
    )
    assert granted.status_code == 400, (
        f"signed caller-chosen text (the forged publish answered {exploit})"
    )
    assert "socket_id" in granted.json()["error"]
    assert "<digits>.<digits>" in granted.json()["error"]


async def test_another_sessions_private_channel_cannot_be_read_through_channel_data(
    private_demo: ServerProcess,
) -> None:
    mine = await start_run(private_demo.url)
    theirs = await start_run(private_demo.url)
    attacker = await Client.connect(private_demo.ws_url + WS_PATH)
    try:
        socket_id = f"{attacker.socket_id}:{theirs['channel']}"
        granted = await ask_auth(private_demo, socket_id, mine["channel"], mine["auth"]["token"])
        # Whoever signs such text (this endpoint before, or any other backend holding
        # the secret), the server refuses it: on a private channel, channel_data is not
        # part of what is signed.
        text = f"{attacker.socket_id}:{theirs['channel']}:{mine['channel']}"
        auth = granted.json()["auth"] if granted.is_success else f"{KEY}:{sign(SECRET, text)}"
        answer = await attacker.subscribe(
            theirs["channel"], auth=auth, channel_data=mine["channel"], position=theirs["position"]
        )
        subscribed = answer["event"] == "pusher_internal:subscription_succeeded"
        read = await read_run(attacker) if subscribed else []
        assert granted.status_code == 400, (
            f"signed a malformed socket_id; with it, read {len(read)} of the victim's envelopes"
        )
        assert answer["event"] == "pusher:subscription_error", f"read {len(read)} envelopes"
        assert answer["data"]["code"] == ErrorCode.SUBSCRIPTION_UNAUTHORIZED
        assert "channel_data" in answer["data"]["error"]
        # The connection stays usable: its own session is still open to it.
        own = await ask_auth(
            private_demo, attacker.socket_id, mine["channel"], mine["auth"]["token"]
        )
        ok = await attacker.subscribe(mine["channel"], auth=own.json()["auth"])
        assert ok["event"] == "pusher_internal:subscription_succeeded"
    finally:
        await attacker.close()


MALFORMED_SOCKET_IDS = [
    "1234.5678:private-agent.x",
    "1234",
    "1234.",
    ".5678",
    "12a4.5678",
    "1234.5678\n",
    "\u0661\u0662.\u0663\u0664",  # Arabic-Indic digits: digits to \d, not to Pusher
    "1" * 40 + "." + "1" * 40,  # over the 64-character bound
]


async def test_the_auth_endpoint_refuses_a_malformed_socket_id(
    private_demo: ServerProcess,
) -> None:
    run = await start_run(private_demo.url)
    for socket_id in MALFORMED_SOCKET_IDS:
        answer = await ask_auth(private_demo, socket_id, run["channel"], run["auth"]["token"])
        assert answer.status_code == 400, socket_id
        error: Any = answer.json()["error"]
        assert "socket_id" in error, error
        assert len(error) < 300, error  # an excerpt of the input at most
