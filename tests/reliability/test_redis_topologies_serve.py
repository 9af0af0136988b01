"""Two server processes on Redis Cluster and on Sentinel: ready, and a publication
accepted by one node reaches a client of the other."""

from __future__ import annotations

import httpx
import pytest

from tests.support.live import Client
from tests.support.processes import ServerFactory
from tests.support.reliability import WS_PATH, publish, status

pytestmark = [pytest.mark.redis, pytest.mark.slow]


@pytest.mark.parametrize("topology", ["redis_cluster", "redis_sentinel"])
async def test_a_publication_crosses_nodes_through_the_topology(
    topology: str, server_factory: ServerFactory, request: pytest.FixtureRequest
) -> None:
    url = request.getfixturevalue(topology).url
    args = ("--backend", url, "--redis-prefix", f"serve-{topology}", "--log-level", "warning")
    first, second = server_factory(*args), server_factory(*args)
    for node in (first, second):
        node.wait_ready()
        assert await status(node.url, "/ready") == 200
    client = await Client.connect(second.ws_url + WS_PATH)
    answer = await client.subscribe("agent.crossing")
    assert answer["event"] == "pusher_internal:subscription_succeeded", answer
    async with httpx.AsyncClient(timeout=5) as http:
        response = await publish(http, first.url, "agent.crossing", "seq", "1")
    assert response.status_code == 200, response.text
    while (message := await client.recv(within=10))["event"] != "seq":
        pass
    assert str(message["data"]) == "1"
    assert message["position"]
    await client.close()
