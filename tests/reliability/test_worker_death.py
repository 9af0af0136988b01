"""A killed worker does not lose its run (issue 13, point 11): web node, workers and a
private redis-server (or the 6-node Redis Cluster) as real processes; the worker running
a paced run is SIGKILLed, another starts, and the run's followers get a final
``failed`` agent.status, the state is served and the session takes a new run."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterator

import httpx
import pytest

from tests.support.live import Client
from tests.support.processes import RedisServer, ServerFactory
from tests.support.reliability import report
from tests.support.runs import read_run, start_run, subscribe
from tests.support.worker import WorkerProcess

pytestmark = [pytest.mark.redis, pytest.mark.slow]
Connect = Callable[..., Awaitable[Client]]


@pytest.fixture
def workers() -> Iterator[Callable[[str, str], WorkerProcess]]:
    """Start workers on a Redis URL with a 1 s lease; all are stopped afterwards."""
    started: list[WorkerProcess] = []

    def start(url: str, prefix: str) -> WorkerProcess:
        env = {"AGENT_WORKER_LEASE": "1"}
        worker = WorkerProcess(url, prefix, env=env).started()
        started.append(worker)
        return worker

    yield start
    for worker in started:
        if worker.proc.poll() is None:
            worker.stop()


@pytest.mark.parametrize("topology", ["redis_server", "redis_cluster"])
async def test_a_sigkilled_workers_run_ends_failed_and_frees_its_session(
    topology: str,
    server_factory: ServerFactory,
    workers: Callable[[str, str], WorkerProcess],
    clients: Connect,
    request: pytest.FixtureRequest,
) -> None:
    url = request.getfixturevalue(topology).url
    prefix = f"worker-death-{topology}"
    # The web node looks for abandoned runs only every 20 s: the new worker must.
    env = {"AGENT_DEMO_RUN_MODE": "queue", "AGENT_DEMO_RUN_LEASE": "60"}
    web = server_factory("--demo", "--backend", url, "--redis-prefix", prefix, env=env)
    doomed = workers(url, prefix)
    client = await clients(f"{web.ws_url}/app/agent-key?protocol=7")
    run = await start_run(web.url, pace_ms=150, trace=True)
    await subscribe(client, run["channel"], run["position"])
    before = await read_run(client, stop_after=4)
    assert before[0][2]["status"] == "in_progress", "the worker is running it"

    doomed.kill()
    killed_at = time.monotonic()
    workers(url, prefix)
    after = await read_run(client)
    detected_in = time.monotonic() - killed_at

    final = after[-1][2]
    assert after[-1][1] == "agent.status"
    assert final["status"] == "failed"
    assert final["stop_reason"] == "error"
    assert "stopped renewing its lease: it died" in final["error_message"]
    assert final["state_url"] == run["state_url"]
    section = "worker killed mid-run" + (" (Redis Cluster)" if topology == "redis_cluster" else "")
    report(section, lease_s=1, detected_in_s=round(detected_in, 2))
    async with httpx.AsyncClient() as http:
        state = await http.get(f"{web.url}{run['state_url']}")
        assert state.status_code == 200, state.text
        snapshot = state.json()
        assert snapshot["status"] == "failed"
        assert "stopped renewing its lease: it died" in snapshot["error_message"]
        assert snapshot["last_continuation"]["resolved_by"] == "RunSupervisor"
        again = await http.post(
            f"{web.url}/run", json={"input": "And in Lima?", "session_id": run["session_id"]}
        )
    assert again.status_code == 202, again.text
    second = again.json()
    await subscribe(client, second["channel"], second["position"])
    assert (await read_run(client))[-1][2]["status"] == "completed", "the new worker runs it"


async def test_a_run_no_worker_takes_ends_failed_after_the_queue_timeout(
    server_factory: ServerFactory, redis_server: RedisServer, clients: Connect
) -> None:
    prefix = "no-worker"
    env = {
        "AGENT_DEMO_RUN_MODE": "queue",
        "AGENT_DEMO_QUEUE_TIMEOUT": "1",
        "AGENT_DEMO_RUN_LEASE": "1",
    }
    web = server_factory("--demo", "--backend", redis_server.url, "--redis-prefix", prefix, env=env)
    client = await clients(f"{web.ws_url}/app/agent-key?protocol=7")
    run = await start_run(web.url)
    await subscribe(client, run["channel"], run["position"])
    events = await read_run(client)

    assert [kind for _, kind, _ in events] == ["agent.status"]
    assert events[0][2]["status"] == "failed"
    assert "no worker took this run" in events[0][2]["error_message"]
    async with httpx.AsyncClient() as http:
        state = await http.get(f"{web.url}{run['state_url']}")
        assert state.status_code == 200
        users = [m["content"] for m in state.json()["messages"] if m["role"] == "user"]
        assert users == ["What is the weather in Oslo?"], "the state says what was asked"
        again = await http.post(
            f"{web.url}/run", json={"input": "again", "session_id": run["session_id"]}
        )
    assert again.status_code == 202, again.text
