"""The run index's bounds: newest runs per app (memory, Redis, Redis Cluster), and the
memory backend's budget of trace bytes."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from broadcaster.backends._runs import MemoryRunIndex, RedisRunIndex
from broadcaster.backends.redis_cluster import cluster_client
from broadcaster.envelope import parse_envelope
from broadcaster.publishers import RedisPublisher, RedisStateStore
from broadcaster.run_index import RunIndex, run_member
from tests.support.processes import RedisServer
from tests.support.topologies import ClusterTopology

APP = "app1"


@pytest.fixture(
    params=[
        "memory",
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("redis-cluster", marks=pytest.mark.redis),
    ]
)
async def small_index(request: pytest.FixtureRequest) -> AsyncIterator[RunIndex]:
    """An index that keeps 3 runs per app."""
    if request.param == "memory":
        yield MemoryRunIndex(lambda app, channel: [], size=3)
        return
    client: Redis | RedisCluster
    prefix = f"t{uuid.uuid4().hex[:10]}"
    if request.param == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")
        client = Redis.from_url(server.url)
        yield RedisRunIndex(lambda: client, prefix, size=3)
    else:
        cluster: ClusterTopology = request.getfixturevalue("redis_cluster")
        client = cluster_client(cluster.url)
        yield RedisRunIndex(lambda: client, prefix, size=3)
    await client.aclose()


async def test_only_the_newest_runs_of_an_app_are_kept_with_their_traces(
    small_index: RunIndex,
) -> None:
    for i in range(5):
        channel = f"agent.s{i % 2}"
        await small_index.put_run(APP, channel, f"e{i}", 1000 + i, b'{"n":%d}' % i, 60)
        await small_index.put_trace(APP, channel, f"e{i}", b"trace %d" % i, 60)
    await small_index.put_run("app2", "agent.s0", "other", 1, b"{}", 60)

    page, more = await small_index.page(APP, before=None, start_min=None, start_max=None, count=10)
    assert [run.member for run in page] == [
        run_member("agent.s0", "e4"),
        run_member("agent.s1", "e3"),
        run_member("agent.s0", "e2"),
    ]
    assert more is None
    assert await small_index.session_runs(APP, "agent.s1") == [b'{"n":3}']
    assert await small_index.load_run(APP, "agent.s1", "e1") is None
    assert await small_index.load_trace(APP, "agent.s1", "e1") is None
    assert await small_index.load_trace(APP, "agent.s0", "e0") is None
    assert await small_index.load_trace(APP, "agent.s0", "e2") == b"trace 2"
    assert await small_index.session_runs("app2", "agent.s0") == [b"{}"]


async def test_the_memory_index_keeps_a_bounded_total_of_trace_bytes() -> None:
    index = MemoryRunIndex(lambda app, channel: [], trace_budget=2500)
    for i in range(5):
        await index.put_trace(APP, "agent.s", f"e{i}", bytes(1000), 60)
    kept = [await index.load_trace(APP, "agent.s", f"e{i}") is not None for i in range(5)]
    assert kept == [False, False, False, True, True]
    await index.put_trace(APP, "agent.s", "e4", bytes(10), 60)  # replacing frees the old
    await index.put_trace(APP, "agent.s", "e5", bytes(1000), 60)
    assert await index.load_trace(APP, "agent.s", "e3") is not None


@pytest.mark.redis
@pytest.mark.parametrize("topology", ["redis", "redis-cluster"])
async def test_a_workers_state_store_indexes_what_its_publisher_published(
    topology: str, request: pytest.FixtureRequest
) -> None:
    """``RedisStateStore`` and ``RedisPublisher`` of a process without a node (an agent
    worker) agree with the servers on keys: the trace holds the run's envelopes."""
    prefix = f"t{uuid.uuid4().hex[:10]}"
    client: Redis | RedisCluster
    if topology == "redis":
        client = Redis.from_url(request.getfixturevalue("redis_server").url)
    else:
        client = cluster_client(request.getfixturevalue("redis_cluster").url)
    publisher = RedisPublisher(client, APP, prefix=prefix)
    store = RedisStateStore(client, APP, prefix=prefix)
    try:
        await store.runs.started("agent.w", "e1", input_text="hello")
        for kind, payload in [
            ("agent.status", {"status": "in_progress"}),
            ("agent.status", {"status": "completed", "step_count": 2}),
        ]:
            data = {"session_id": "w", "execution_id": "e1", "payload": payload}
            await publisher.broadcast("agent.w", parse_envelope({"type": kind, **data}))
        assert await publisher.flush(10)
        await store.runs.ended("agent.w", "e1")
        index = RedisRunIndex(lambda: client, prefix)
        summary = json.loads(await index.load_run(APP, "agent.w", "e1") or b"")
        trace = json.loads(await index.load_trace(APP, "agent.w", "e1") or b"")
    finally:
        await publisher.aclose()
        await client.aclose()
    assert summary["status"] == "completed"
    assert summary["steps"] == 2
    assert summary["input_preview"] == "hello"
    assert [e["envelope"]["payload"]["status"] for e in trace["envelopes"]] == [
        "in_progress",
        "completed",
    ]
