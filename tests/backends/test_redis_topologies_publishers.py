"""Processes that run no node (agent workers) publish and store state through Redis
Cluster and Sentinel as the servers' backends read them."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from redis.asyncio import Redis

from broadcaster.backends import create_backend
from broadcaster.backends.redis.clients import cluster_client, sentinel_client
from broadcaster.envelope import StreamChunk, StreamChunkPayload
from broadcaster.publishers import RedisPublisher, RedisStateStore, state_key
from tests.backends.helpers import APP, Node
from tests.support.topologies import ClusterTopology, SentinelTopology

pytestmark = pytest.mark.redis


def _client(kind: str, url: str) -> Any:
    return cluster_client(url) if kind == "cluster" else sentinel_client(url)


@pytest.mark.parametrize("kind", ["cluster", "sentinel"])
async def test_a_worker_publishes_and_stores_state_where_the_nodes_read_them(
    kind: str, request: pytest.FixtureRequest
) -> None:
    topology: ClusterTopology | SentinelTopology = request.getfixturevalue(f"redis_{kind}")
    prefix = f"test-{uuid.uuid4().hex[:12]}"
    node = Node(create_backend(topology.url, prefix=prefix, apps=(APP,)))
    await node.backend.start(node.on_publication, node.on_control)
    client: Redis = _client(kind, topology.url)
    publisher = RedisPublisher(client, APP, prefix=prefix)
    try:
        await node.backend.subscribe(APP, "agent")
        payload = StreamChunkPayload(chunk="#1")
        await publisher.broadcast(
            "agent", StreamChunk(session_id="s", execution_id="x", payload=payload)
        )
        assert await publisher.flush(within=10)
        await node.wait_for("agent")
        assert node.on("agent")[0].position is not None
        await RedisStateStore(client, APP, prefix=prefix).save("agent", b'{"s":1}')
        assert await node.backend.load_value(APP, state_key("agent")) == b'{"s":1}'
    finally:
        await publisher.aclose()
        await client.aclose()
        await node.backend.stop()
