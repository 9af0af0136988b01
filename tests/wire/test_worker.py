"""The scaled-out shape: web only fans out, agent-worker runs agents through Redis, and
a client on yet another server process follows the run and reconciles it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Awaitable, Callable, Iterator

import httpx
import orjson
import pytest
from redis.asyncio import Redis

from agent_core.runs import RunRequest
from agent_core.worker import RunQueue, lock_key, queue_key
from tests.conftest import ServerFactory
from tests.server.conftest import Client
from tests.support import REPO, RedisServer
from tests.wire.test_routed_runs import ROUTED_RUN, phases
from tests.wire.test_runs import read_run, start_run, subscribe

pytestmark = [pytest.mark.redis, pytest.mark.slow]
Connect = Callable[..., Awaitable[Client]]
PREFIX = "wire-worker"


class WorkerProcess:
    def __init__(self, redis_url: str) -> None:
        args = ["--redis", redis_url, "--redis-prefix", PREFIX, "--concurrency", "4"]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agent_core.worker", *args],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.lines: list[str] = []
        self.ready = threading.Event()
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            if line.startswith("agent-worker ready"):
                self.ready.set()

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(15)
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        return code


@pytest.fixture
def worker(redis_server: RedisServer) -> Iterator[WorkerProcess]:
    process = WorkerProcess(redis_server.url)
    assert process.ready.wait(20), "".join(process.lines)
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
        jobs = [orjson.loads(j) for j in await redis.lrange(queue_key("wire-mode", "1"), 0, -1)]
    finally:
        await redis.delete(queue_key("wire-mode", "1"))
        await redis.delete(*(lock_key("wire-mode", "1", s) for s in ("m1", "m2")))
        await queue.aclose()
    assert [job["request"]["mode"] for job in jobs] == ["route", "agent"]


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
    events = await read_run(client)

    assert phases(events) == ROUTED_RUN
    assert events[-1][2]["status"] == "completed"
    assert events[-1][2]["state_url"] == run["state_url"]
    async with httpx.AsyncClient() as http:
        snapshot = (await http.get(f"{web.url}{run['state_url']}")).json()
    assert (snapshot["process"], snapshot["routing"]["capabilities"]) == (
        "routing",
        ["weather_agent"],
    )
