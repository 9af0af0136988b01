"""The scaled-out shape: web only fans out, agent-worker runs agents through Redis, and
a client on yet another server process follows the run and reconciles it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator

import httpx
import orjson
import pytest
from redis.asyncio import Redis

from agent_core.app.runs import RunRequest
from agent_core.app.worker import RunQueue
from broadcaster.backends.redis import channel_key
from broadcaster.publishers import state_key
from tests.support.live import Client
from tests.support.processes import RedisServer, ServerFactory
from tests.support.reliability import eventually
from tests.support.runs import ROUTED_RUN, phases, read_run, start_run, subscribe
from tests.support.worker import (
    PREFIX,
    WorkerProcess,
    consuming_worker,
)

pytestmark = [pytest.mark.redis, pytest.mark.slow]
Connect = Callable[..., Awaitable[Client]]


@pytest.fixture
def worker(redis_server: RedisServer) -> Iterator[WorkerProcess]:
    process = WorkerProcess(redis_server.url).started()
    yield process
    process.stop()


async def test_a_queued_run_reaches_a_client_on_another_node(
    server_factory: ServerFactory,
    redis_server: RedisServer,
    worker: WorkerProcess,
    clients: Connect,
) -> None:
    common = ("--backend", redis_server.url, "--redis-prefix", PREFIX)
    web = server_factory("--demo", *common, env={"AGENT_DEMO_RUN_MODE": "queue"})
    edge = server_factory(*common)  # a fan-out node with no demo and no runs
    client = await clients(f"{edge.ws_url}/app/agent-key?protocol=7")

    run = await start_run(web.url, trace=True)
    await subscribe(client, run["channel"], run["position"])
    events = await read_run(client)

    kinds = [kind for _, kind, _ in events]
    assert kinds[0] == "agent.status"
    assert kinds.count("agent.step.completed") == 3
    assert events[-1][2]["status"] == "completed"
    async with httpx.AsyncClient() as http:
        snapshot = (await http.get(f"{edge.url}{run['state_url']}")).json()
    assert snapshot["step_count"] == 3
    assert snapshot["usage"] == events[-1][2]["usage"]

    # "wait": true follows the channel, so it answers a run a worker executed too.
    async with httpx.AsyncClient(timeout=60) as http:
        waited = await http.post(
            f"{web.url}/run", json={"input": "What is 6 * 7?", "mode": "route", "wait": True}
        )
    assert waited.status_code == 200, waited.text
    answer = waited.json()
    assert (answer["status"], answer["output"]) == ("completed", "6 * 7 = 42.")
    assert answer["result"]["capability"] == "weather_agent"


async def test_the_session_is_busy_across_processes_until_the_worker_is_done(
    server_factory: ServerFactory,
    redis_server: RedisServer,
    worker: WorkerProcess,
    clients: Connect,
) -> None:
    common = ("--backend", redis_server.url, "--redis-prefix", PREFIX)
    web = server_factory("--demo", *common, env={"AGENT_DEMO_RUN_MODE": "queue"})
    client = await clients(f"{web.ws_url}/app/agent-key?protocol=7")
    run = await start_run(web.url, pace_ms=20)
    async with httpx.AsyncClient() as http:
        busy = await http.post(
            f"{web.url}/run", json={"input": "again", "session_id": run["session_id"]}
        )
        assert busy.status_code == 409
        await subscribe(client, run["channel"], run["position"])
        await read_run(client)
        for _ in range(100):  # the worker releases the claim right after its last publish
            again = await http.post(
                f"{web.url}/run", json={"input": "Lima?", "session_id": run["session_id"]}
            )
            if again.status_code != 409:
                break
    assert again.status_code == 202


def test_queue_mode_needs_the_redis_backend(server_factory: ServerFactory) -> None:
    with pytest.raises(RuntimeError, match="needs the Redis backend"):
        server_factory("--demo", env={"AGENT_DEMO_RUN_MODE": "queue"})


async def test_a_completed_queued_run_leaves_no_bookkeeping_in_redis(
    server_factory: ServerFactory,
    redis_server: RedisServer,
    worker: WorkerProcess,
    clients: Connect,
) -> None:
    """Only the final state, the channel's history and the run's index entry and trace
    (all expiring) stay behind."""
    common = ("--backend", redis_server.url, "--redis-prefix", PREFIX)
    web = server_factory("--demo", *common, env={"AGENT_DEMO_RUN_MODE": "queue"})
    client = await clients(f"{web.ws_url}/app/agent-key?protocol=7")
    run = await start_run(web.url)
    await subscribe(client, run["channel"], run["position"])
    await read_run(client)
    redis = Redis.from_url(redis_server.url)
    try:

        async def bookkeeping() -> list[str]:
            names = [k.decode() async for k in redis.scan_iter(f"{PREFIX}:*")]
            index = (":run-index", ":run-summary:", ":run-session:", ":trace:")
            names = [n for n in names if not any(part in n for part in index)]
            return [n for n in names if ":run" in n or ":claim:" in n or ":client-runs:" in n]

        await eventually(lambda: _empty(bookkeeping), "the worker to finish the run")
    finally:
        await redis.aclose()
    # The worker indexed the run (RedisStateStore) where the web node lists it.
    async with httpx.AsyncClient(base_url=web.url, timeout=10) as http:
        listed = (await http.get("/api/sessions", params={"q": run["session_id"]})).json()
        trace = await http.get(
            f"/api/sessions/{run['session_id']}/trace",
            params={"execution_id": run["execution_id"]},
        )
    [summary] = listed["runs"]
    assert summary["status"] == "completed"
    assert summary["execution_id"] == run["execution_id"]
    assert trace.json()["envelopes"][-1]["envelope"]["payload"]["status"] == "completed"


async def _empty(keys: Callable[[], Awaitable[list[str]]]) -> bool:
    return await keys() == []


async def test_a_worker_that_lost_its_lease_stops_the_run(redis_server: RedisServer) -> None:
    """Its run was ended as abandoned (here: the lease is taken away, as a reaper does
    once the worker stalled past it): the worker stops it instead of publishing on."""
    prefix = "wire-lost-lease"
    async with consuming_worker(redis_server, prefix, lease=0.6) as (redis, queue, worker):
        run = await queue.start(RunRequest(input="Weather in Oslo?", pace_ms=300))
        takers = f"{prefix}:{{1}}:run-takers"
        await eventually(lambda: redis.hlen(takers), "the worker to take the run")
        run_id = (await redis.hkeys(takers))[0]
        await redis.zrem(f"{prefix}:{{1}}:run-leases", run_id)

        await eventually(lambda: worker.completed == 1, "the worker to stop the run")
        state = await redis.get(f"{prefix}:1:value:{state_key(run.channel)}")
        assert state is None, "the run was stopped before its end"
        assert await redis.exists(f"{prefix}:{{1}}:claim:run:{run.session_id}") == 0


async def test_a_queued_run_past_its_maximum_duration_ends_failed(
    redis_server: RedisServer,
) -> None:
    """AGENT_WORKER_MAX_RUN_SECONDS, as the local runs' limit: the run is stopped, its
    last envelope is a failed agent.status naming the setting, and the session is free."""
    prefix = "wire-max-duration"
    worker_with_deadline = consuming_worker(redis_server, prefix, max_run_seconds=0.5)
    async with worker_with_deadline as (redis, queue, worker):
        long = " ".join(["word"] * 2000)  # route mode echoes it, one word every 2 s
        run = await queue.start(RunRequest(input=long, pace_ms=2000, mode="route"))
        await eventually(lambda: worker.completed == 1, "the worker to stop the run", within=20)
        entries = await redis.xrange(channel_key(prefix, "1", run.channel, "stream"))
        last = b"".join(entries[-1][1].values())  # the channel's history, as published
        assert b"agent.status" in last
        assert b"failed" in last
        assert b"AGENT_WORKER_MAX_RUN_SECONDS" in last
        assert await redis.exists(f"{prefix}:{{1}}:claim:run:{run.session_id}") == 0


async def test_a_queued_job_carries_the_mode_the_web_process_chose(
    redis_server: RedisServer,
) -> None:
    """The worker has no mode setting: the web side's default is resolved into the job."""
    redis = Redis.from_url(redis_server.url)

    async def position(channel: str) -> str | None:
        return None

    queue = RunQueue(redis, "1", position, prefix="wire-mode", default_mode="route")
    try:
        await queue.start(RunRequest(input="hi", session_id="m1"))
        await queue.start(RunRequest(input="hi", session_id="m2", mode="agent"))
        jobs = [orjson.loads(j) for j in await redis.hvals("wire-mode:{1}:run-jobs")]
    finally:
        await redis.delete(*[k async for k in redis.scan_iter("wire-mode:*")])
        await queue.aclose()
    modes = {job["session_id"]: job["request"]["mode"] for job in jobs}
    assert modes == {"m1": "route", "m2": "agent"}


async def test_a_queued_routed_run_shows_its_phases(
    server_factory: ServerFactory,
    redis_server: RedisServer,
    worker: WorkerProcess,
    clients: Connect,
) -> None:
    common = ("--backend", redis_server.url, "--redis-prefix", PREFIX)
    env = {"AGENT_DEMO_RUN_MODE": "queue", "AGENT_DEMO_RUN_DEFAULT_MODE": "route"}
    web = server_factory("--demo", *common, env=env)
    client = await clients(f"{web.ws_url}/app/agent-key?protocol=7")

    run = await start_run(web.url, trace=True)
    await subscribe(client, run["channel"], run["position"])
    channel = await read_run(client)
    # The capability's inner agent runs on the worker too: a run nested under its call.
    events = [e for e in channel if "parent_execution_id" not in e[2]]
    inner = [e[2] for e in channel if "parent_execution_id" in e[2]]

    assert phases(events) == ROUTED_RUN
    assert len(inner) >= 10
    assert {p["parent_execution_id"] for p in inner} == {run["execution_id"]}
    assert events[-1][2]["status"] == "completed"
    assert events[-1][2]["state_url"] == run["state_url"]
    async with httpx.AsyncClient() as http:
        snapshot = (await http.get(f"{web.url}{run['state_url']}")).json()
    assert (snapshot["process"], snapshot["routing"]["capabilities"]) == (
        "routing",
        ["weather_agent"],
    )
