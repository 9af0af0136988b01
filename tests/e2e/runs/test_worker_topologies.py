"""The scaled-out shape on a Sentinel-managed Redis and on a Redis Cluster: web queues
runs, agent-worker runs them, a fan-out node delivers them, and the final state is
served by a node that never ran the run."""

from __future__ import annotations

import httpx
import pytest
from redis.crc import key_slot

from agent_core.app.worker._scripts import _Keys
from broadcaster.backends.redis import claim_key
from tests.support.processes import ServerFactory
from tests.support.runs import Connect, read_run, start_run, subscribe
from tests.support.worker import WorkerProcess

pytestmark = [pytest.mark.redis, pytest.mark.slow]


@pytest.mark.parametrize("topology", ["redis_sentinel", "redis_cluster"])
async def test_a_queued_run_goes_through_the_topology_to_a_client_on_another_node(
    topology: str, server_factory: ServerFactory, clients: Connect, request: pytest.FixtureRequest
) -> None:
    url = request.getfixturevalue(topology).url
    prefix = f"wire-worker-{topology}"
    worker = WorkerProcess(url, prefix=prefix).started()
    try:
        common = ("--backend", url, "--redis-prefix", prefix)
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
    async with httpx.AsyncClient() as http:
        snapshot = (await http.get(f"{edge.url}{run['state_url']}")).json()
    assert snapshot["step_count"] == 3
    assert snapshot["usage"] == events[-1][2]["usage"]


def test_every_key_a_run_queue_script_touches_is_in_the_apps_slot() -> None:
    keys = _Keys("p", "app-1")
    names = [keys.queue, keys.jobs, keys.leases, keys.takers, keys.client("10.0.0.1")]
    names += [keys.client(None), keys.claim("s-1"), claim_key("p", "app-1", "anything")]
    assert len({key_slot(name.encode()) for name in names}) == 1
    assert key_slot(_Keys("p", "app-2").queue.encode()) != key_slot(keys.queue.encode())
