"""The scaled-out shape on a Sentinel-managed Redis: web queues runs, agent-worker runs
them, a fan-out node delivers them — all finding the primary through Sentinel."""

from __future__ import annotations

import pytest

from tests.support.processes import ServerFactory
from tests.support.topologies import SentinelTopology
from tests.wire.test_runs import read_run, start_run, subscribe
from tests.wire.test_worker import Connect, WorkerProcess

pytestmark = [pytest.mark.redis, pytest.mark.slow]
PREFIX = "wire-worker-sentinel"


async def test_a_queued_run_goes_through_sentinel_to_a_client_on_another_node(
    server_factory: ServerFactory, redis_sentinel: SentinelTopology, clients: Connect
) -> None:
    worker = WorkerProcess(redis_sentinel.url, prefix=PREFIX).started()
    try:
        common = ("--backend", redis_sentinel.url, "--redis-prefix", PREFIX)
        web = server_factory("--demo", *common, env={"AGENT_DEMO_RUN_MODE": "queue"})
        edge = server_factory(*common)
        client = await clients(f"{edge.ws_url}/app/agent-key?protocol=7")

        run = await start_run(web.url, trace=True)
        await subscribe(client, run["channel"], run["position"])
        events = await read_run(client)
    finally:
        worker.stop()
    assert [kind for _, kind, _ in events].count("agent.step.completed") == 3
    assert events[-1][2]["status"] == "completed"


def test_queue_mode_refuses_redis_cluster_with_a_clear_error(server_factory: ServerFactory) -> None:
    backend = ("--backend", "redis-cluster://127.0.0.1:1/")
    with pytest.raises(RuntimeError, match="does not support Redis Cluster"):
        server_factory("--demo", *backend, env={"AGENT_DEMO_RUN_MODE": "queue"})
