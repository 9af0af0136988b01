"""Private sessions: a run's events go to private-agent.<session>, which only the
holder of that session's token can be authorised for; other sessions' channels are
refused with 4009."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest

from tests.support.live import Client, LiveServer, StartServer
from tests.support.runs import (
    authorise,
    read_run,
    start_run,
)

Connect = Callable[..., Awaitable[Client]]


@pytest.fixture
async def private_demo(start_server: StartServer, monkeypatch: pytest.MonkeyPatch) -> LiveServer:
    monkeypatch.setenv("AGENT_DEMO_PRIVATE_SESSIONS", "true")
    return await start_server(demo=True)


async def finished_private_run(live: LiveServer, clients: Connect) -> dict[str, Any]:
    """Start a private run and follow it, authorised with its token, to its end."""
    run = await start_run(live.url)
    client = await clients(live.app_url())
    granted = await authorise(live, client.socket_id, run["channel"], run["auth"]["token"])
    await client.subscribe(run["channel"], auth=granted.json()["auth"], position=run["position"])
    await read_run(client)
    # Closed now: a later run on the session would fill its unread queue, and a client
    # that stops reading cannot finish its closing handshake (10 s at teardown).
    await client.close()
    return run


async def test_config_announces_private_sessions(private_demo: LiveServer) -> None:
    async with httpx.AsyncClient() as http:
        config = (await http.get(f"{private_demo.url}/api/demo/config")).json()
    assert config == {
        "app_key": "agent-key",
        "private_sessions": True,
        "auth_endpoint": "/broadcasting/auth",
        "run_default_mode": "agent",
        "driver": "scripted",
        "default_max_steps": {"agent": 20, "route": 5},
    }


async def test_the_token_holder_follows_its_private_session(
    private_demo: LiveServer, clients: Connect
) -> None:
    run = await start_run(private_demo.url)
    assert run["channel"] == f"private-agent.{run['session_id']}"
    client = await clients(private_demo.app_url())
    answer = await authorise(private_demo, client.socket_id, run["channel"], run["auth"]["token"])
    assert answer.status_code == 200
    subscribed = await client.subscribe(
        run["channel"], auth=answer.json()["auth"], position=run["position"]
    )
    assert subscribed["event"] == "pusher_internal:subscription_succeeded"
    events = await read_run(client)
    assert events[-1][2]["status"] == "completed"


async def test_another_sessions_channel_is_refused(
    private_demo: LiveServer, clients: Connect
) -> None:
    mine = await start_run(private_demo.url)
    theirs = await start_run(private_demo.url)
    client = await clients(private_demo.app_url())

    refused = await authorise(
        private_demo, client.socket_id, theirs["channel"], mine["auth"]["token"]
    )
    assert refused.status_code == 403
    assert "does not grant" in refused.json()["error"]

    # Replaying the auth granted for one's own channel does not open another one.
    own = await authorise(private_demo, client.socket_id, mine["channel"], mine["auth"]["token"])
    answer: dict[str, Any] = await client.subscribe(theirs["channel"], auth=own.json()["auth"])
    assert answer["event"] == "pusher:subscription_error"
    assert answer["data"]["code"] == 4009
    # ... nor without any auth
    bare = await client.subscribe(theirs["channel"])
    assert bare["data"]["code"] == 4009
    # and the connection is still usable
    ok = await client.subscribe(mine["channel"], auth=own.json()["auth"])
    assert ok["event"] == "pusher_internal:subscription_succeeded"


@pytest.mark.parametrize(
    ("fields", "status"),
    [
        ({"channel_name": "private-agent.s1", "session_token": "x"}, 400),
        ({"socket_id": "1.2", "channel_name": "private-other", "session_token": "x"}, 403),
        ({"socket_id": "1.2", "channel_name": "private-agent.s1"}, 403),
        # Only a real socket id is signed (no signing oracle), checked before the token.
        ({"socket_id": "1.2:private-agent.s2", "channel_name": "private-agent.s1"}, 400),
        ({"socket_id": "GET\n/apps/1/channels\n", "channel_name": "private-agent.s1"}, 400),
        ({"socket_id": "1.2", "channel_name": "private-agent.s1:x", "session_token": "x"}, 403),
    ],
)
async def test_auth_endpoint_rejects_bad_requests(
    private_demo: LiveServer, fields: dict[str, str], status: int
) -> None:
    async with httpx.AsyncClient() as http:
        response = await http.post(f"{private_demo.url}/broadcasting/auth", data=fields)
    assert response.status_code == status
    assert response.json()["error"]


async def test_a_private_sessions_state_needs_its_token(
    private_demo: LiveServer, clients: Connect
) -> None:
    run = await finished_private_run(private_demo, clients)
    url = f"{private_demo.url}{run['state_url']}"
    async with httpx.AsyncClient() as http:
        anonymous = await http.get(url)
        forged = await http.get(url, headers={"Authorization": "Bearer " + "0" * 64})
        owner = await http.get(url, headers={"Authorization": f"Bearer {run['auth']['token']}"})
    assert anonymous.status_code == 403
    assert "is private" in anonymous.json()["error"]
    assert forged.status_code == 403
    assert owner.status_code == 200
    assert owner.json()["status"] == "completed"


async def test_a_run_on_someone_elses_private_session_needs_its_token(
    private_demo: LiveServer, clients: Connect
) -> None:
    """Otherwise the 202 answer would hand out that session's token."""
    run = await finished_private_run(private_demo, clients)
    body = {"input": "mine now?", "session_id": run["session_id"]}
    async with httpx.AsyncClient() as http:
        stranger = await http.post(f"{private_demo.url}/run", json=body)
        owner = await http.post(
            f"{private_demo.url}/run",
            json=body,
            headers={"Authorization": f"Bearer {run['auth']['token']}"},
        )
    assert stranger.status_code == 403
    assert "token" not in stranger.json()
    assert owner.status_code == 202


async def test_probing_unknown_sessions_leaves_nothing_behind(private_demo: LiveServer) -> None:
    """Asking about a session that does not exist (state, SSE, a token check) must not
    make the backend create a channel for it: anyone can send such requests."""
    async with httpx.AsyncClient() as http:
        for n in range(5):
            state = await http.get(f"{private_demo.url}/api/sessions/probe-{n}/state")
            events = await http.get(f"{private_demo.url}/api/sessions/probe-{n}/events")
            assert (state.status_code, events.status_code) == (404, 404)
    backend = private_demo.node.backend
    for n in range(5):
        for channel in (f"agent.probe-{n}", f"private-agent.probe-{n}"):
            assert await backend.latest("1", channel) is None
