"""Runs end to end: POST /run, the envelope stream on agent.<session>, resume after a
disconnect (memory, Redis, across two server processes), reconcile, bad input."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import jsonschema
import pytest

from broadcaster.envelope import json_schema
from tests.support.live import Client, LiveServer, StartServer
from tests.support.processes import RedisServer, ServerFactory

JSON = {"content-type": "application/json"}  # run-start doors take only JSON (415)

# Built once: jsonschema.validate() re-checks the schema itself on every call.
VALIDATOR = jsonschema.Draft202012Validator(json_schema())
Connect = Callable[..., Awaitable[Client]]
Event = tuple[str, str, Any]  # (position, type, payload)


async def start_run(base_url: str, **body: Any) -> dict[str, Any]:
    body.setdefault("input", "What is the weather in Oslo?")
    async with httpx.AsyncClient() as http:
        response = await http.post(f"{base_url}/run", json=body)
    assert response.status_code == 202, response.text
    answer: dict[str, Any] = response.json()
    return answer


async def read_run(client: Client, *, stop_after: int | None = None) -> list[Event]:
    """Channel events until the run's final agent.status (or ``stop_after`` events)."""
    events: list[Event] = []
    while stop_after is None or len(events) < stop_after:
        message = await client.recv(within=10)
        if not message["event"].startswith("agent."):
            continue
        envelope = message["data"]
        VALIDATOR.validate(envelope)
        assert envelope["type"] == message["event"]
        events.append((message["position"], envelope["type"], envelope["payload"]))
        payload = envelope["payload"]
        nested = payload.get("parent_execution_id") is not None  # a nested run's end
        final = envelope["type"] == "agent.status" and payload["status"] in ("completed", "failed")
        if final and not nested:
            break
    return events


async def subscribe(client: Client, channel: str, position: str | None) -> None:
    fields = {} if position is None else {"position": position}
    answer = await client.subscribe(channel, **fields)
    assert answer["event"] == "pusher_internal:subscription_succeeded", answer


async def resumed(client: Client) -> dict[str, Any]:
    """Skip to the resume answer (missed events come before it and are returned by
    read_run later, so this is only for a fresh subscription with nothing missed)."""
    message = await client.expect("broadcaster:resume")
    data: dict[str, Any] = message["data"]
    return data


def offsets(events: list[Event]) -> list[int]:
    return [int(position.rsplit(":", 1)[1]) for position, _, _ in events]


def stream(events: list[Event]) -> list[tuple[str, Any]]:
    return [(kind, payload) for _, kind, payload in events]


async def full_run(server_url: str, client: Client, **body: Any) -> tuple[dict[str, Any], list]:
    run = await start_run(server_url, **body)
    await subscribe(client, run["channel"], run["position"])
    return run, await read_run(client)


async def test_a_run_streams_the_full_ordered_envelope_sequence(
    start_server: StartServer, clients: Connect
) -> None:
    live = await start_server(demo=True)
    client = await clients(live.app_url())
    run, events = await full_run(live.url, client, trace=True)

    kinds = [kind for _, kind, _ in events]
    assert kinds[0] == "agent.status"
    assert events[0][2]["status"] == "in_progress"
    assert kinds.count("agent.step.started") == kinds.count("agent.step.completed") == 3
    assert kinds.count("agent.tool.started") == kinds.count("agent.tool.completed") == 2
    assert kinds.count("agent.continuation") == 3
    assert events[-1][2]["status"] == "completed"
    first = offsets(events)[0]
    assert offsets(events) == list(range(first, first + len(events))), "no gap, no reorder"
    assert {run["session_id"]} == {run["channel"].removeprefix("agent.")}


async def test_reconcile_snapshot_agrees_with_the_events(
    start_server: StartServer, clients: Connect
) -> None:
    live = await start_server(demo=True)
    client = await clients(live.app_url())
    run, events = await full_run(live.url, client)
    final = events[-1][2]
    assert final["state_url"] == run["state_url"]

    async with httpx.AsyncClient() as http:
        snapshot = (await http.get(f"{live.url}{final['state_url']}")).json()
    steps = [payload for _, kind, payload in events if kind == "agent.step.completed"]
    assert snapshot["status"] == final["status"] == "completed"
    assert snapshot["step_count"] == final["step_count"] == len(steps)
    assert snapshot["usage"] == final["usage"]
    assert snapshot["usage"]["total"] == sum(s["usage"]["total"] for s in steps)
    tool_ids = [[c["id"] for c in s["tool_calls"]] for s in steps]
    assert [[c["id"] for c in s["tool_calls"]] for s in snapshot["steps"]] == tool_ids


async def disconnect_and_resume(
    first_url: str, second_url: str, run_url: str, connect: Connect
) -> None:
    """A reference client reads the whole run; another drops after a few events and
    resumes (possibly on another node) from its last position. Both end equal."""
    reference = await connect(first_url)
    dropper = await connect(first_url)
    run = await start_run(run_url, pace_ms=15, trace=True)
    await subscribe(reference, run["channel"], run["position"])
    await subscribe(dropper, run["channel"], run["position"])

    before = await read_run(dropper, stop_after=5)
    await dropper.close()
    again = await connect(second_url)
    await subscribe(again, run["channel"], before[-1][0])
    after = await read_run(again)

    everything = await read_run(reference)
    assert offsets(before + after) == offsets(everything), (
        offsets(before),
        offsets(after),
        offsets(everything),
    )
    assert stream(before + after) == stream(everything)
    assert offsets(before + after) == offsets(everything)


async def test_resume_after_disconnect_misses_nothing_memory(
    start_server: StartServer, clients: Connect
) -> None:
    live = await start_server(demo=True)
    await disconnect_and_resume(live.app_url(), live.app_url(), live.url, clients)


@pytest.mark.redis
async def test_resume_after_disconnect_misses_nothing_redis(
    start_server: StartServer, clients: Connect, redis_server: RedisServer
) -> None:
    live = await start_server(demo=True, backend=redis_server.url, redis_prefix="wire-resume")
    await disconnect_and_resume(live.app_url(), live.app_url(), live.url, clients)


@pytest.mark.redis
@pytest.mark.slow
async def test_resume_on_another_server_process(
    server_factory: ServerFactory, clients: Connect, redis_server: RedisServer
) -> None:
    args = ("--backend", redis_server.url, "--redis-prefix", "wire-two-nodes")
    runner = server_factory("--demo", *args)
    other = server_factory(*args)
    url = "/app/agent-key?protocol=7"
    await disconnect_and_resume(runner.ws_url + url, other.ws_url + url, runner.url, clients)


async def test_late_subscribers_get_the_whole_run_from_the_returned_position(
    start_server: StartServer, clients: Connect
) -> None:
    live = await start_server(demo=True)
    run = await start_run(live.url)
    async with httpx.AsyncClient() as http:  # the run is over before anyone listens
        for _ in range(200):
            if (await http.get(f"{live.url}{run['state_url']}")).status_code == 200:
                break
            await asyncio.sleep(0.02)
    client = await clients(live.app_url())
    await subscribe(client, run["channel"], run["position"])
    events = await read_run(client)
    assert events[0][1] == "agent.status"
    assert events[0][2]["status"] == "in_progress"
    assert events[-1][2]["status"] == "completed"


async def test_concurrent_runs_on_different_sessions_do_not_interfere(
    start_server: StartServer, clients: Connect
) -> None:
    live = await start_server(demo=True)
    cities = ["Oslo", "Lima", "Cairo"]
    runs = [await start_run(live.url, input=f"Weather in {c}?", pace_ms=5) for c in cities]
    readers = []
    for run in runs:
        client = await clients(live.app_url())
        await subscribe(client, run["channel"], run["position"])
        readers.append(read_run(client))
    results = await asyncio.gather(*readers)
    for city, run, events in zip(cities, runs, results, strict=True):
        assert events[-1][2]["status"] == "completed"
        assert city in events[-1][2]["last_response"]
        assert len({p.rsplit(":", 1)[0] for p, _, _ in events}) == 1
        del run


async def test_a_second_run_on_a_busy_session_is_refused_with_409(live_demo: LiveServer) -> None:
    run = await start_run(live_demo.url, pace_ms=50)
    async with httpx.AsyncClient() as http:
        again = await http.post(
            f"{live_demo.url}/run", json={"input": "again", "session_id": run["session_id"]}
        )
    assert again.status_code == 409
    assert "already has a run in progress" in again.json()["error"]


async def test_a_new_run_continues_the_session_conversation(
    start_server: StartServer, clients: Connect
) -> None:
    live = await start_server(demo=True)
    client = await clients(live.app_url())
    first, _ = await full_run(live.url, client)
    await client.close()  # an unread client would stall its own close handshake
    second = await start_run(live.url, session_id=first["session_id"], input="And in Lima?")
    watcher = await clients(live.app_url())
    await subscribe(watcher, second["channel"], second["position"])
    events = await read_run(watcher)
    assert events[-1][2]["status"] == "completed"
    async with httpx.AsyncClient() as http:
        snapshot = (await http.get(f"{live.url}{second['state_url']}")).json()
    users = [m["content"] for m in snapshot["messages"] if m["role"] == "user"]
    assert users == ["What is the weather in Oslo?", "And in Lima?"]


@pytest.fixture
async def live_demo(start_server: StartServer) -> LiveServer:
    return await start_server(demo=True)


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        (b"not json", 400, "must be JSON"),
        (b"{}", 422, "input"),
        (json.dumps({"input": ""}).encode(), 422, "input"),
        (json.dumps({"input": "x", "pace_ms": 99999}).encode(), 422, "pace_ms"),
        (json.dumps({"input": "x", "session_id": "bad id!"}).encode(), 422, "session_id"),
        (json.dumps({"input": "x", "surprise": 1}).encode(), 422, "surprise"),
    ],
)
async def test_bad_run_requests_get_clear_errors(
    live_demo: LiveServer, body: bytes, status: int, says: str
) -> None:
    async with httpx.AsyncClient() as http:
        response = await http.post(f"{live_demo.url}/run", content=body, headers=JSON)
    assert response.status_code == status
    assert says in response.json()["error"]


@pytest.mark.parametrize(("session", "status"), [("never-ran", 404), ("bad%20id", 400)])
async def test_state_of_an_unknown_session_is_a_json_error(
    live_demo: LiveServer, session: str, status: int
) -> None:
    async with httpx.AsyncClient() as http:
        response = await http.get(f"{live_demo.url}/api/sessions/{session}/state")
    assert response.status_code == status
    assert response.json()["error"]


# -- one session, two nodes (local run mode, Redis backend) ------------------------------


async def post_again(base_url: str, session_id: str) -> int:
    async with httpx.AsyncClient() as http:
        answer = await http.post(
            f"{base_url}/run", json={"input": "again", "session_id": session_id}
        )
    return answer.status_code


@pytest.mark.redis
@pytest.mark.slow
async def test_a_busy_session_is_refused_by_every_node(
    server_factory: ServerFactory, clients: Connect, redis_server: RedisServer
) -> None:
    """The session is claimed in Redis while its run goes (a 1 s lease here, renewed),
    so the other node answers 409 however long the run takes, and 202 once it ended."""
    args = ("--demo", "--backend", redis_server.url, "--redis-prefix", "wire-claims")
    env = {"AGENT_DEMO_RUN_LEASE": "1"}
    runner, other = server_factory(*args, env=env), server_factory(*args, env=env)
    run = await start_run(runner.url, pace_ms=100)
    assert await post_again(other.url, run["session_id"]) == 409
    client = await clients(f"{other.ws_url}/app/agent-key?protocol=7")
    await subscribe(client, run["channel"], run["position"])
    await read_run(client, stop_after=15)  # more than a lease later: renewed, still held
    assert await post_again(other.url, run["session_id"]) == 409
    await read_run(client)
    for _ in range(100):  # released right after the final status
        status = await post_again(other.url, run["session_id"])
        if status != 409:
            break
        await asyncio.sleep(0.02)
    assert status == 202


@pytest.mark.redis
@pytest.mark.slow
async def test_a_dead_nodes_session_is_free_again_after_its_lease(
    server_factory: ServerFactory, clients: Connect, redis_server: RedisServer
) -> None:
    args = ("--demo", "--backend", redis_server.url, "--redis-prefix", "wire-claims-dead")
    env = {"AGENT_DEMO_RUN_LEASE": "1"}
    runner, other = server_factory(*args, env=env), server_factory(*args, env=env)
    run = await start_run(runner.url, pace_ms=200)
    assert await post_again(other.url, run["session_id"]) == 409
    runner.kill()
    for _ in range(300):
        status = await post_again(other.url, run["session_id"])
        if status != 409:
            break
        await asyncio.sleep(0.02)
    assert status == 202
