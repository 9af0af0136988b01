"""The durable mode (``wait_replicas``, the servers' ``--redis-wait-replicas``): a
publication with history is acknowledged only once Redis ``WAIT`` confirms that the
replicas keep it, and refused (``NotReplicated``, a 503) otherwise; on a standalone
primary with a replica, behind Sentinel and on Redis Cluster (where ``WAIT`` goes to the
shard that took the write), from a node and from an agent process."""

from __future__ import annotations

import signal
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, cast

import httpx
import pytest
from redis.asyncio import Redis

from broadcaster.backends import create_backend
from broadcaster.backends.base import NotReplicated
from broadcaster.backends.redis import (
    channel_key,
    decode_publication,
    publish_via_redis,
    publish_via_redis_cluster,
)
from broadcaster.backends.redis.clients import cluster_client, sentinel_client
from broadcaster.envelope import StreamChunk, StreamChunkPayload
from broadcaster.publication import Publication
from broadcaster.publishers import RedisPublisher
from tests.backends.helpers import APP, Node, eventually_async
from tests.support.processes import RedisServer, ServerFactory, _wait
from tests.support.reliability import publish
from tests.support.topologies import ClusterTopology, SentinelTopology, command

pytestmark = pytest.mark.redis

RedisFactory = Callable[[], RedisServer]


def pub(data: str, channel: str = "agent.durable") -> Publication:
    return Publication(APP, channel, "e", data)


@pytest.fixture
def primary_and_replica(redis_factory: RedisFactory) -> tuple[RedisServer, RedisServer]:
    """A standalone primary and a replica of it, linked."""
    primary, replica = redis_factory(), redis_factory()
    # Redis waits 5 s for more replicas before a diskless first sync by default.
    command(primary.port, "config", "set", "repl-diskless-sync-delay", "0")
    command(replica.port, "replicaof", "127.0.0.1", str(primary.port))

    def linked() -> bool:
        info = command(primary.port, "info", "replication")
        return "connected_slaves:1" in info and "state=online" in info

    _wait(linked, 10, "the replica to link to the primary")
    return primary, replica


@contextmanager
def frozen(redis: RedisServer) -> Iterator[None]:
    """The server stops (SIGSTOP): as a replica, it acknowledges nothing meanwhile."""
    assert redis.proc is not None
    redis.proc.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        redis.proc.send_signal(signal.SIGCONT)


async def started(url: str, **options: Any) -> Node:
    options.setdefault("prefix", f"test-{uuid.uuid4().hex[:12]}")
    node = Node(create_backend(url, apps=(APP,), command_timeout=2, **options))
    await node.backend.start(node.on_publication, node.on_control)
    return node


async def acknowledged_again(node: Node) -> None:
    """The replica confirms a publication (a few tries: a thawed one first reads what it
    missed, and a loaded machine may take longer than a short ``wait_timeout``)."""

    async def kept() -> bool:
        try:
            return await node.backend.publish(pub("kept")) is not None
        except NotReplicated:
            return False

    await eventually_async(kept, "a publication acknowledged once the replica is back")


async def accepted(http: httpx.AsyncClient, url: str) -> bool:
    return (await publish(http, url, "agent.durable", "e", "{}")).status_code == 200


async def stream_on(port: int, key: str, *, cluster: bool = False) -> list[str]:
    """The data of the publications a (replica) server holds in ``key``."""
    client = Redis(host="127.0.0.1", port=port)
    try:
        if cluster:
            await client.execute_command("READONLY")  # type: ignore[no-untyped-call]
        entries = await client.xrange(key) or []
    finally:
        await client.aclose()
    return [str(decode_publication(cast(Any, fields)[b"p"]).data) for _, fields in entries]


async def test_a_durable_publication_is_acknowledged_once_the_replica_has_it(
    primary_and_replica: tuple[RedisServer, RedisServer],
) -> None:
    primary, replica = primary_and_replica
    node = await started(primary.url, wait_replicas=1, wait_timeout=2)
    try:
        position = await node.backend.publish(pub("kept"))
        assert position is not None
        # Acknowledged: the replica holds it already, no waiting for replication.
        prefix = node.backend.prefix  # type: ignore[attr-defined]
        key = channel_key(prefix, APP, "agent.durable", "stream")
        assert await stream_on(replica.port, key) == ["kept"]
    finally:
        await node.backend.stop()


async def test_a_durable_publication_the_replica_does_not_confirm_is_refused(
    primary_and_replica: tuple[RedisServer, RedisServer],
) -> None:
    """The replica lags (frozen): the publication is not acknowledged, and says so;
    once the replica answers again, publications are acknowledged again."""
    primary, replica = primary_and_replica
    node = await started(primary.url, wait_replicas=1, wait_timeout=0.3)
    try:
        with frozen(replica):
            with pytest.raises(NotReplicated, match=r"1 Redis replica.*0 confirmed it"):
                await node.backend.publish(pub("unconfirmed"))
            # Presence notices and client events keep no history: nothing to wait for.
            assert await node.backend.publish(pub("notice"), history=False) is None
        assert node.backend.ready  # the primary takes writes: not a reason to leave
        await acknowledged_again(node)
    finally:
        await node.backend.stop()


async def test_a_durable_publication_redis_lacked_the_script_for_waits_too(
    primary_and_replica: tuple[RedisServer, RedisServer],
) -> None:
    """A restarted (or flushed) Redis runs the script by its source on another
    connection: the ``WAIT`` must follow it there, not only on the batch's connection."""
    primary, replica = primary_and_replica
    node = await started(primary.url, wait_replicas=1, wait_timeout=0.3)
    try:
        await acknowledged_again(node)
        command(primary.port, "script", "flush")
        with frozen(replica), pytest.raises(NotReplicated):
            await node.backend.publish(pub("unconfirmed"))
        command(primary.port, "script", "flush")
        await acknowledged_again(node)
    finally:
        await node.backend.stop()


async def test_without_the_durable_mode_the_same_lag_is_acknowledged(
    primary_and_replica: tuple[RedisServer, RedisServer],
) -> None:
    """What the durable mode changes: by default the primary's word is enough."""
    primary, replica = primary_and_replica
    node = await started(primary.url)
    try:
        with frozen(replica):
            assert await node.backend.publish(pub("only on the primary")) is not None
    finally:
        await node.backend.stop()


@pytest.mark.parametrize("kind", ["cluster", "sentinel"])
async def test_durable_publications_on_sentinel_and_cluster(
    kind: str, request: pytest.FixtureRequest
) -> None:
    """Each primary there has one replica: 1 is confirmed (on Cluster by the shard that
    took the write: channels on several shards in one batch), 2 never is."""
    topology: ClusterTopology | SentinelTopology = request.getfixturevalue(f"redis_{kind}")
    one = await started(topology.url, wait_replicas=1, wait_timeout=2)
    two = await started(topology.url, wait_replicas=2, wait_timeout=0.2)
    channels = [f"agent.durable-{n}" for n in range(6)]  # spread over the shards
    try:
        for channel in channels:
            await one.backend.subscribe(APP, channel)
        positions = [one.backend.publish(pub(c, c)) for c in channels]
        for future in positions:
            assert await future is not None
        for channel in channels:
            await one.wait_for(channel)
        with pytest.raises(NotReplicated, match="2 Redis replica"):
            await two.backend.publish(pub("short", channels[0]))
        if kind == "cluster":
            assert isinstance(topology, ClusterTopology)
            prefix = one.backend.prefix  # type: ignore[attr-defined]
            key = channel_key(prefix, APP, channels[0], "stream")
            owner = topology.owner(_slot(key))
            replica = _replica_port(topology, owner.port)
            assert "agent.durable-0" in await stream_on(replica, key, cluster=True)
    finally:
        await one.backend.stop()
        await two.backend.stop()


def _slot(key: str) -> int:
    from redis.crc import key_slot

    return key_slot(key.encode())


def _replica_port(topology: ClusterTopology, primary_port: int) -> int:
    for node in topology.nodes:
        if f"master_port:{primary_port}" in command(node.port, "info", "replication"):
            return node.port
    raise LookupError(primary_port)


async def test_agent_processes_publish_durably(
    primary_and_replica: tuple[RedisServer, RedisServer], redis_cluster: ClusterTopology
) -> None:
    """publish_via_redis, its Cluster twin and RedisPublisher honour the mode: refused
    (NotReplicated; the buffered publisher retries) while no replica confirms."""
    primary, replica = primary_and_replica
    client = Redis.from_url(primary.url)
    cluster = cluster_client(redis_cluster.url)
    prefix = f"test-{uuid.uuid4().hex[:12]}"
    try:
        assert await publish_via_redis(client, prefix, pub("a"), wait_replicas=1) is not None
        with frozen(replica), pytest.raises(NotReplicated):
            await publish_via_redis(client, prefix, pub("b"), wait_replicas=1, wait_timeout=0.2)
        position = await publish_via_redis_cluster(cluster, prefix, pub("c"), wait_replicas=1)
        assert position is not None
        with pytest.raises(NotReplicated):
            await publish_via_redis_cluster(
                cluster, prefix, pub("d"), wait_replicas=2, wait_timeout=0.2
            )

        publisher = RedisPublisher(client, APP, prefix=prefix, wait_replicas=2, wait_timeout=0.1)
        chunk = StreamChunk(session_id="s", execution_id="x", payload=StreamChunkPayload(chunk="#"))
        await publisher.broadcast("agent.durable", chunk)
        assert not await publisher.flush(within=1)  # never confirmed: not counted published
        assert publisher.stats.published == 0
        assert "replica" in (publisher.stats.last_error or "")
        await publisher.aclose()
    finally:
        await client.aclose()
        await cluster.aclose()


async def test_sentinel_clients_for_agents_publish_durably(
    redis_sentinel: SentinelTopology,
) -> None:
    client = sentinel_client(redis_sentinel.url)
    try:
        prefix = f"test-{uuid.uuid4().hex[:12]}"
        assert await publish_via_redis(client, prefix, pub("a"), wait_replicas=1) is not None
    finally:
        await client.aclose()


async def test_the_http_api_refuses_an_unreplicated_publication_with_503(
    primary_and_replica: tuple[RedisServer, RedisServer], server_factory: ServerFactory
) -> None:
    """``--redis-wait-replicas`` through a real server (the timeout from the
    environment): 200 while the replica confirms, 503 saying why while it does not."""
    primary, replica = primary_and_replica
    env = {"BROADCASTER_REDIS_WAIT_TIMEOUT": "0.3"}
    server = server_factory("--backend", primary.url, "--redis-wait-replicas", "1", env=env)
    server.wait_ready()
    async with httpx.AsyncClient(timeout=10) as http:
        await eventually_async(lambda: accepted(http, server.url), "200 while it confirms")
        with frozen(replica):
            refused = await publish(http, server.url, "agent.durable", "e", "{}")
        assert refused.status_code == 503
        assert "not acknowledged" in refused.json()["error"]
        assert "--redis-wait-replicas" in refused.json()["error"]
        await eventually_async(lambda: accepted(http, server.url), "200 once the replica is back")
