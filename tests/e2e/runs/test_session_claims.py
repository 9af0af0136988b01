"""A session token belongs to one claim (issue 29, point 3): once a private session's
claim and data have expired, whoever starts a run on its id gets a new token, and the
owner's old token is refused everywhere it was accepted (run start, channel auth, state,
SSE), on memory (a clock moved past the claim's lifetime) and on a real Redis (its keys
expired there)."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import httpx
import pytest
import redis.asyncio as redis

from agent_core.app.demo import _Demo
from broadcaster.backends.memory import MemoryBackend
from tests.support.factories import Seconds
from tests.support.live import Client, LiveServer, StartServer
from tests.support.processes import RedisServer
from tests.support.runs import authorise, read_run

Connect = Callable[..., Awaitable[Client]]
Expire = Callable[[str], Awaitable[None]]
DAY = 86_400.0


@dataclass
class Deployment:
    live: LiveServer
    expire: Expire  # makes everything of a session expire, as 24 h without activity do


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
async def deployment(
    request: pytest.FixtureRequest, start_server: StartServer, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Deployment]:
    monkeypatch.setenv("AGENT_DEMO_PRIVATE_SESSIONS", "true")
    if request.param == "memory":
        clock = Seconds(1_000.0)
        live = await start_server(demo=True, backend_object=MemoryBackend(clock=clock))

        async def forward(session_id: str) -> None:
            assert demo_of(live).claim_ttl < 2 * DAY
            clock.now += 2 * DAY

        yield Deployment(live, forward)
        return
    server: RedisServer = request.getfixturevalue("redis_server")
    prefix = f"reclaim-{secrets.token_hex(4)}"
    live = await start_server(demo=True, backend=server.url, redis_prefix=prefix)
    client = redis.from_url(server.url)

    async def expire(session_id: str) -> None:
        keys = [key async for key in client.scan_iter(match=f"{prefix}:*{session_id}*")]
        assert keys, f"nothing of {session_id} in Redis"
        for key in keys:
            await client.pexpire(key, 1)
        for _ in range(1000):  # Redis expires a key when read past its time
            if not await client.exists(*keys):
                return
            await asyncio.sleep(0.01)
        raise TimeoutError(f"keys of {session_id} did not expire: {keys}")

    yield Deployment(live, expire)
    await client.aclose()


def demo_of(live: LiveServer) -> _Demo:
    demo = live.server.config.app.state.extensions["demo"]
    assert isinstance(demo, _Demo)
    return demo


async def run_on(live: LiveServer, session_id: str, token: str | None = None) -> httpx.Response:
    headers = {} if token is None else {"authorization": f"Bearer {token}"}
    body = {"input": "What is the weather in Oslo?", "session_id": session_id}
    async with httpx.AsyncClient() as http:
        return await http.post(f"{live.url}/run", json=body, headers=headers)


async def followed_to_its_end(live: LiveServer, clients: Connect, run: dict[str, str]) -> None:
    client = await clients(live.app_url())
    granted = await authorise(live, client.socket_id, run["channel"], run["auth"]["token"])
    assert granted.status_code == 200, granted.text
    await client.subscribe(run["channel"], auth=granted.json()["auth"], position=run["position"])
    events = await read_run(client)
    assert events[-1][2]["status"] == "completed"
    await client.close()


async def test_a_reclaimed_session_gets_a_new_token_and_the_old_one_is_refused(
    deployment: Deployment, clients: Connect
) -> None:
    live, session = deployment.live, f"s-claim-{secrets.token_hex(4)}"
    owner = (await run_on(live, session)).json()
    await followed_to_its_end(live, clients, owner)
    old = owner["auth"]["token"]
    again = await run_on(live, session, old)  # the owner's token starts its next run
    assert again.status_code == 202, again.text
    assert again.json()["auth"]["token"] == old, "the same claim: the same token"
    await followed_to_its_end(live, clients, again.json())
    assert (await run_on(live, session)).status_code == 403, "not anyone's while claimed"

    await deployment.expire(session)

    stranger = await run_on(live, session)
    assert stranger.status_code == 202, stranger.text
    new = stranger.json()["auth"]["token"]
    assert new != old, "a new claim has a new token"
    await followed_to_its_end(live, clients, stranger.json())

    refused = await run_on(live, session, old)
    assert refused.status_code == 403
    assert "private session" in refused.json()["error"]
    client = await clients(live.app_url())
    assert (
        await authorise(live, client.socket_id, f"private-agent.{session}", old)
    ).status_code == 403
    async with httpx.AsyncClient(base_url=live.url) as http:
        for path in (f"/api/sessions/{session}/state", f"/api/sessions/{session}/events"):
            answer = await http.get(path, params={"token": old})
            assert answer.status_code == 403, (path, answer.text)
            assert "does not grant" in answer.json()["error"]
        state = await http.get(f"/api/sessions/{session}/state", params={"token": new})
        assert state.status_code == 200, "the new claimant reads its own run"
