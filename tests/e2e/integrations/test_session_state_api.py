"""An outside agent stores its final state on the server it publishes to: ``PUT
/apps/{app_id}/channels/{channel}/state``, signed like a publication by the same
``PusherHTTPPublisher``, so ``GET /api/sessions/{id}/state`` answers on any backend
(the in-memory default included); anything else is refused and nothing is stored."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlencode

import httpx
import orjson
import pytest
from redis.asyncio import Redis

from broadcaster.envelope import channel_for
from broadcaster.publishers import InProcessPublisher, PusherHTTPPublisher, RedisPublisher
from broadcaster.signing import signed_params
from tests.support.framework_runs import ANSWER, CALL_IDS, QUESTION, RUNS, envelopes_on
from tests.support.live import APP_ID, KEY, SECRET, Client, LiveServer, StartServer
from tests.support.processes import RedisServer, ServerFactory, ServerProcess

SNAPSHOT: dict[str, Any] = {
    "agent_id": "outside",
    "parent_agent_id": None,
    "status": "completed",
    "step_count": 1,
    "usage": {"prompt": 3, "completion": 2, "total": 5},
    "execution": {
        "started_at": None,
        "updated_at": "2026-01-16T10:05:00.123Z",
        "cumulative_seconds": 0.1,
    },
    "messages": [{"role": "user", "content": "hi", "metadata": {}}],
    "steps": [],
    "last_continuation": None,
    "metadata": {},
}


USAGE = SNAPSHOT["usage"]


def state_path(channel: str) -> str:
    return f"/apps/{APP_ID}/channels/{channel}/state"


async def put(
    server: LiveServer | ServerProcess,
    channel: str,
    body: bytes,
    *,
    key: str = KEY,
    secret: str = SECRET,
) -> httpx.Response:
    path = state_path(channel)
    query = urlencode(signed_params(key, secret, "PUT", path, body))
    async with httpx.AsyncClient(base_url=server.url) as http:
        return await http.put(f"{path}?{query}", content=body)


async def state_of(live: LiveServer, session: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=live.url) as http:
        return await http.get(f"/api/sessions/{session}/state")


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
async def server(request: pytest.FixtureRequest, start_server: StartServer) -> LiveServer:
    if request.param == "memory":
        return await start_server()
    redis: RedisServer = request.getfixturevalue("redis_server")
    return await start_server(backend=redis.url, redis_prefix="state-api")


async def test_the_publisher_stores_a_state_that_the_state_endpoint_serves(
    server: LiveServer,
) -> None:
    body = orjson.dumps(SNAPSHOT)
    async with PusherHTTPPublisher(server.url, APP_ID, KEY, SECRET) as publisher:
        await publisher.save("agent.st-1", body)
    answer = await state_of(server, "st-1")
    assert answer.status_code == 200
    assert answer.json() == SNAPSHOT


async def test_refused_requests_store_nothing(start_server: StartServer) -> None:
    live = await start_server(max_request_bytes=1024)
    good = orjson.dumps(SNAPSHOT)
    cases: list[tuple[int, str, httpx.Response]] = [
        (401, "unsigned", await _unsigned(live, good)),
        (401, "foreign", await put(live, "agent.st-2", good, secret="not-the-secret")),
        (401, "unknown key", await put(live, "agent.st-2", good, key="other-key")),
        (413, "too large", await put(live, "agent.st-2", orjson.dumps({"x": "y" * 2000}))),
        (422, "not JSON", await put(live, "agent.st-2", b"{nope")),
        (422, "a list", await put(live, "agent.st-2", b"[]")),
        (422, "not a snapshot", await put(live, "agent.st-2", orjson.dumps({"agent_id": "a"}))),
        (422, "in progress", await put(live, "agent.st-2", _with(status="in_progress"))),
        (422, "no version", await put(live, "agent.st-2", _with(execution={}))),
        (422, "no zone", await put(live, "agent.st-2", _with(execution={"updated_at": "2026"}))),
        (422, "huge usage", await put(live, "agent.st-2", _with(usage={**USAGE, "total": 2**53}))),
        (422, "not a session channel", await put(live, "other-channel", good)),
    ]
    for status, case, answer in cases:
        assert answer.status_code == status, (case, answer.text)
        assert answer.json()["error"], case
    missing = (await put(live, "agent.st-2", orjson.dumps({"agent_id": "a"}))).json()["error"]
    assert "status is required" in missing
    assert "is not a session channel" in cases[-1][2].json()["error"]
    assert (await state_of(live, "st-2")).status_code == 404


async def test_an_app_keeps_at_most_max_session_states(start_server: StartServer) -> None:
    live = await start_server(max_session_states=2)
    body = orjson.dumps(SNAPSHOT)
    assert (await put(live, "agent.n-1", body)).status_code == 200
    assert (await put(live, "agent.n-2", body)).status_code == 200
    newer = _with(execution={**SNAPSHOT["execution"], "updated_at": "2026-01-16T10:06:00Z"})
    assert (await put(live, "agent.n-1", newer)).status_code == 200, "a replacement is no more"
    third = await put(live, "agent.n-3", body)
    assert third.status_code == 429
    assert "max_session_states" in third.json()["error"]
    assert (await state_of(live, "n-3")).status_code == 404


async def test_serve_takes_max_session_states(server_factory: ServerFactory) -> None:
    server = server_factory("--max-session-states", "1", "--log-level", "warning")
    body = orjson.dumps(SNAPSHOT)
    assert (await put(server, "agent.p-1", body)).status_code == 200
    assert (await put(server, "agent.p-2", body)).status_code == 429


async def _unsigned(live: LiveServer, body: bytes) -> httpx.Response:
    async with httpx.AsyncClient(base_url=live.url) as http:
        return await http.put(state_path("agent.st-2"), content=body)


def _with(**changes: Any) -> bytes:
    return orjson.dumps({**SNAPSHOT, **changes})


@pytest.mark.parametrize("framework", sorted(RUNS))
async def test_an_outside_run_is_stored_by_its_publisher_alone(
    framework: str,
    server: LiveServer,
    clients: Callable[..., Awaitable[Client]],
) -> None:
    """No state store given: the publisher stores the snapshot on the server, before
    the final status that names it, and the helper returns with everything delivered."""
    session = f"own-{framework}"
    watcher = await clients(server.app_url())
    await watcher.subscribe(channel_for(session))
    async with PusherHTTPPublisher(server.url, APP_ID, KEY, SECRET) as publisher:
        await RUNS[framework](publisher, session)
        assert publisher.stats.published > 0
        assert not publisher._buffer, "delivered before the helper returned"
    seen = await envelopes_on(watcher)
    final = seen[-1]["payload"]
    assert (final["status"], final["stop_reason"]) == ("completed", "completed")
    assert final["state_url"] == f"/api/sessions/{session}/state"
    state = (await state_of(server, session)).json()
    assert (state["status"], state["step_count"]) == ("completed", final["step_count"])
    assert state["messages"][0]["content"] == QUESTION
    assert state["messages"][-1]["content"] == ANSWER
    assert state["last_continuation"] == {
        "should_continue": False,
        "stop_reason": "completed",
        "resolved_by": framework,
    }
    assert CALL_IDS[framework] in [c["id"] for s in state["steps"] for c in s["tool_calls"]]


async def test_an_outside_run_over_http_is_listed_with_what_its_state_says(
    server: LiveServer, clients: Callable[..., Awaitable[Client]]
) -> None:
    """The state arrives before the run's final status: the run index takes the stop
    reason, deciding criterion, steps and tokens from it, as the final status says."""
    session = "listed-outside"
    watcher = await clients(server.app_url())
    await watcher.subscribe(channel_for(session))
    async with PusherHTTPPublisher(server.url, APP_ID, KEY, SECRET) as publisher:
        await RUNS["pydantic-ai"](publisher, session)
    final = (await envelopes_on(watcher))[-1]["payload"]
    async with httpx.AsyncClient(base_url=server.url) as http:
        listed = (await http.get("/api/sessions", params={"q": session})).json()["runs"]
    [run] = listed
    usage = final["usage"]
    assert (run["session_id"], run["status"], run["stop_reason"]) == (
        session,
        "completed",
        "completed",
    )
    assert (run["resolved_by"], run["steps"]) == ("pydantic-ai", final["step_count"])
    assert run["tokens"] == {
        "input": usage["prompt"],
        "output": usage["completion"],
        "total": usage["total"],
    }


async def test_the_in_process_publisher_stores_the_state_on_its_node(
    start_server: StartServer,
) -> None:
    live = await start_server()
    async with InProcessPublisher(live.node, APP_ID) as publisher:
        await RUNS["pydantic-ai"](publisher, "inproc-1")
    state = await state_of(live, "inproc-1")
    assert (state.status_code, state.json()["status"]) == (200, "completed")


@pytest.mark.redis
async def test_the_redis_publisher_stores_the_state_where_the_servers_read_it(
    start_server: StartServer, redis_server: RedisServer
) -> None:
    live = await start_server(backend=redis_server.url, redis_prefix="state-pub")
    client = Redis.from_url(redis_server.url)
    try:
        async with RedisPublisher(client, APP_ID, prefix="state-pub") as publisher:
            await RUNS["langgraph"](publisher, "redis-1")
    finally:
        await client.aclose()
    state = await state_of(live, "redis-1")
    assert (state.status_code, state.json()["status"]) == (200, "completed")


def _at(updated_at: str, **changes: Any) -> bytes:
    return _with(execution={**SNAPSHOT["execution"], "updated_at": updated_at}, **changes)


async def test_a_replayed_or_older_put_never_moves_a_state_back(server: LiveServer) -> None:
    """A signed PUT is valid for 600 s: replayed, it rolled the stored state back. A
    state replaces the stored one only when its ``execution.updated_at`` is later."""
    first = _at("2026-01-16T10:05:00.000Z", step_count=1)
    second = _at("2026-01-16T10:05:00.001+00:00", step_count=2)
    path = state_path("agent.v-1")
    query = urlencode(signed_params(KEY, SECRET, "PUT", path, first))
    async with httpx.AsyncClient(base_url=server.url) as http:
        assert (await http.put(f"{path}?{query}", content=first)).status_code == 200
        assert (await put(server, "agent.v-1", second)).status_code == 200
        replayed = await http.put(f"{path}?{query}", content=first)  # the very same request
    assert replayed.status_code == 409, replayed.text
    assert "replaced only by a newer one" in replayed.json()["error"]
    again = await put(server, "agent.v-1", second)
    assert again.status_code == 409, "the same version is not newer"
    assert (await state_of(server, "v-1")).json()["step_count"] == 2
    later = _at("2026-01-16T11:00:00+01:00", step_count=3)  # 10:00 UTC: earlier
    assert (await put(server, "agent.v-1", later)).status_code == 409
    assert (await put(server, "agent.v-1", _at("2026-01-16T10:05:01Z"))).status_code == 200
