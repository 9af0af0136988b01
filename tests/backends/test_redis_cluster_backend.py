"""What is particular to the Redis Cluster backend: one slot per channel, shard
subscriptions only where needed, following slot moves and a primary's failover."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
from redis.crc import key_slot

from broadcaster.backends import BackendUnavailable, create_backend
from broadcaster.backends.redis import channel_key, publish_via_redis_cluster
from broadcaster.backends.redis.clients import cluster_client
from broadcaster.backends.redis.cluster import RedisClusterBackend
from broadcaster.backends.redis.urls import parse_cluster_url
from broadcaster.publication import Publication
from tests.backends.helpers import APP, Node, eventually, eventually_async
from tests.support.topologies import ClusterTopology, command

pytestmark = pytest.mark.redis


class ClusterNode(Node):
    backend: RedisClusterBackend


Start = Callable[..., Any]


@pytest.fixture
async def nodes(redis_cluster: ClusterTopology) -> AsyncIterator[Start]:
    """Start nodes on the session's cluster (or another ``url``) under one prefix."""
    prefix = f"test-{uuid.uuid4().hex[:12]}"
    started: list[ClusterNode] = []

    async def start(url: str | None = None, **options: Any) -> ClusterNode:
        options = {"prefix": prefix, "apps": (APP,), "reconnect_max": 0.2, **options}
        node = ClusterNode(RedisClusterBackend(url or redis_cluster.url, **options))
        await node.backend.start(node.on_publication, node.on_control)
        started.append(node)
        return node

    yield start
    for node in started:
        await node.backend.stop()


def pub(data: str = "{}", channel: str = "chat") -> Publication:
    return Publication(APP, channel, "agent.event", data)


def test_every_key_of_a_channel_is_in_one_slot() -> None:
    slots = {key_slot(channel_key("p", APP, "chat", k).encode()) for k in ("meta", "pub")}
    slots |= {key_slot(channel_key("p", APP, "chat", k).encode()) for k in ("stream", "presence")}
    assert len(slots) == 1


def test_the_url_names_seeds_credentials_and_tls() -> None:
    parsed = parse_cluster_url("rediss-cluster://u:p%40ss@a:7000,[::1]:7001/")
    assert parsed.seeds == (("a", 7000), ("::1", 7001))
    assert (parsed.username, parsed.password, parsed.tls) == ("u", "p@ss", True)


@pytest.mark.parametrize(
    ("url", "error"),
    [
        ("redis-cluster://a:7000/3", "only database 0"),
        ("redis-cluster://a/", "host:port"),
        ("redis-cluster://a:70000/", "host:port"),
    ],
)
def test_a_bad_url_is_refused_with_what_is_wrong(url: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        create_backend(url)


async def test_a_node_subscribes_only_on_the_shard_of_its_channel(
    nodes: Start, redis_cluster: ClusterTopology
) -> None:
    node = await nodes(apps=())
    await node.backend.subscribe(APP, "chat")
    name = channel_key(node.backend.prefix, APP, "chat", "pub")
    owner = redis_cluster.owner(key_slot(name.encode()))
    assert set(node.backend._shards) == {("127.0.0.1", owner.port)}
    counts = {
        p.port: command(p.port, "pubsub", "shardnumsub", name).split()[1]
        for p in redis_cluster.primaries()
    }
    assert counts == {p.port: "1" if p is owner else "0" for p in redis_cluster.primaries()}


async def test_a_subscription_follows_its_slot_to_another_primary(
    nodes: Start, redis_cluster: ClusterTopology
) -> None:
    publisher, subscriber = await nodes(), await nodes()
    channel = f"moving-{uuid.uuid4().hex[:6]}"
    await subscriber.backend.subscribe(APP, channel)
    await publisher.backend.publish(pub("before", channel))
    await subscriber.wait_for(channel, 1)
    slot = key_slot(channel_key(subscriber.backend.prefix, APP, channel, "pub").encode())
    target = next(p for p in redis_cluster.primaries() if p is not redis_cluster.owner(slot))
    reconnects = subscriber.backend.reconnects

    redis_cluster.move_slot(slot, target)
    await eventually(lambda: subscriber.backend.reconnects > reconnects, "the resubscription")

    position = await publisher.backend.publish(pub("after", channel))
    await subscriber.wait_for(channel, 2)
    assert [p.data for p in subscriber.on(channel)] == ["before", "after"]
    # The history moved with the slot, to a primary with another replication id: the
    # scripts cannot tell that from a failover that lost publications, so a new epoch.
    first = subscriber.on(channel)[0].position
    assert position is not None
    assert first is not None
    assert position.offset == 1
    assert position.epoch != first.epoch


async def test_a_subscriber_of_many_channels_gets_all_of_them_back_after_losing_its_shards(
    nodes: Start, redis_cluster: ClusterTopology
) -> None:
    """300 subscribes at once open one connection per shard, not one per racing
    subscribe; every shard connection is then killed (as a network cut would): the node
    subscribes its channels again and receives on each."""
    publisher, subscriber = await nodes(apps=()), await nodes()
    channels = [f"many-{i}" for i in range(300)]
    await asyncio.gather(*(subscriber.backend.subscribe(APP, c) for c in channels))
    reconnects = subscriber.backend.reconnects
    subscribers = {p.port: _shard_subscribers(p.port) for p in redis_cluster.primaries()}
    assert [len(ids) for ids in subscribers.values()] == [1, 1, 1]

    for port, ids in subscribers.items():
        for client_id in ids:
            command(port, "client", "kill", "id", client_id)
    await eventually(lambda: subscriber.backend.reconnects > reconnects, "the resubscription")
    assert subscriber.backend.ready

    await asyncio.gather(*(publisher.backend.publish(pub(c, c)) for c in channels))
    for channel in channels:
        await subscriber.wait_for(channel)
    assert sorted(p.channel for p in subscriber.publications) == sorted(channels)


async def test_subscribes_and_unsubscribes_while_the_node_follows_a_lost_shard(
    nodes: Start, redis_cluster: ClusterTopology
) -> None:
    """While the node resubscribes after losing its shards (not ready), a subscribe
    returns only once the subscription is in effect (a pass of the resync took it), so
    a publication right after it arrives; an unsubscribe is not left behind in Redis."""
    publisher, subscriber = await nodes(apps=()), await nodes()
    await subscriber.backend.subscribe(APP, "before")
    await subscriber.backend.subscribe(APP, "leaving")
    for primary in redis_cluster.primaries():
        for client_id in _shard_subscribers(primary.port):
            command(primary.port, "client", "kill", "id", client_id)
    deadline = asyncio.get_running_loop().time() + 10
    while subscriber.backend.ready:  # the resync under way: every await of it yields
        assert asyncio.get_running_loop().time() < deadline, "no resync began"
        await asyncio.sleep(0)

    await asyncio.gather(
        subscriber.backend.subscribe(APP, "during"),
        subscriber.backend.unsubscribe(APP, "leaving"),
    )
    assert _shard_subscriptions(redis_cluster, subscriber, "during") == 1
    await publisher.backend.publish(pub("x", "during"))
    await subscriber.wait_for("during")

    await eventually(lambda: subscriber.backend.ready, "the node to be ready again")

    async def left() -> bool:
        await asyncio.sleep(0.05)
        return _shard_subscriptions(redis_cluster, subscriber, "leaving") == 0

    await eventually_async(left, "the channel unsubscribed meanwhile to be left in Redis")


def _shard_subscriptions(cluster: ClusterTopology, node: Node, channel: str) -> int:
    name = channel_key(node.backend.prefix, APP, channel, "pub")
    owner = cluster.owner(key_slot(name.encode()))
    return int(command(owner.port, "pubsub", "shardnumsub", name).split()[1])


async def test_the_shard_readers_take_the_read_delay(nodes: Start) -> None:
    """Every shard connection is read by a PubSubReader with the node's read_delay."""
    publisher, subscriber = await nodes(), await nodes(read_delay=0.01)
    channels = [f"delay-{i}" for i in range(20)]  # on every shard
    await asyncio.gather(*(subscriber.backend.subscribe(APP, c) for c in channels))
    shards = list(subscriber.backend._shards.values())
    assert len(shards) == 3
    assert all(s.reader is not None and s.reader._read_delay == 0.01 for s in shards)

    await asyncio.gather(*(publisher.backend.publish(pub(c, c)) for c in channels))
    for channel in channels:
        await subscriber.wait_for(channel)


async def test_a_shard_that_stops_answering_pings_is_a_break_and_is_followed(
    nodes: Start,
) -> None:
    """A shard connection without a PONG for three heartbeats (the shard frozen or cut
    off, perhaps still taking other nodes' writes) is dropped and counted as a break,
    and the node subscribes its channels again."""
    publisher, subscriber = await nodes(), await nodes()
    await subscriber.backend.subscribe(APP, "frozen")
    name = channel_key(subscriber.backend.prefix, APP, "frozen", "pub").encode()
    (shard,) = [s for s in subscriber.backend._shards.values() if name in s.channels]
    shard.pong_at = 0.0  # as if the last PONG came long ago
    await subscriber.backend._heartbeat()
    assert subscriber.backend.breaks == 1
    await eventually(lambda: subscriber.backend.reconnects == 1, "the channel subscribed again")
    await publisher.backend.publish(pub("after", "frozen"))
    await subscriber.wait_for("frozen")


def _shard_subscribers(port: int) -> list[str]:
    """Ids of the clients of the Redis at ``port`` with sharded subscriptions."""
    ids = []
    for line in command(port, "client", "list").splitlines():
        fields = dict(part.split("=", 1) for part in line.split() if "=" in part)
        if int(fields.get("ssub", "0")) > 0:
            ids.append(fields["id"])
    return ids


async def test_agents_publish_through_the_cluster_as_the_nodes_do(nodes: Start) -> None:
    node = await nodes()
    await node.backend.subscribe(APP, "chat")
    client = cluster_client(node.backend.url)
    try:
        first = await publish_via_redis_cluster(client, node.backend.prefix, pub("1"))
        await publish_via_redis_cluster(client, node.backend.prefix, pub("2"), history=False)
    finally:
        await client.aclose()
    await node.wait_for("chat", 2)
    assert first is not None
    assert first.offset == 1
    assert [p.data for p in node.on("chat")] == ["1", "2"]


# -- a primary's failover, on a cluster of the module's own ------------------------------


@pytest.fixture(scope="module")
def own_cluster() -> Iterator[ClusterTopology]:
    cluster = ClusterTopology().start()
    yield cluster
    cluster.stop()


async def test_a_killed_primary_is_followed_to_its_promoted_replica(
    nodes: Start, own_cluster: ClusterTopology
) -> None:
    publisher = await nodes(own_cluster.url, command_timeout=0.5)
    subscriber = await nodes(own_cluster.url, command_timeout=0.5)
    await subscriber.backend.subscribe(APP, "chat")
    before = await publisher.backend.publish(pub("before"))
    await subscriber.wait_for("chat", 1)
    slot = key_slot(channel_key(subscriber.backend.prefix, APP, "chat", "pub").encode())
    victim = own_cluster.owner(slot)

    victim.kill()
    await eventually(lambda: not subscriber.backend.ready, "the outage to show", within=20)
    await eventually(lambda: subscriber.backend.ready, "the failover", within=30)
    # The shard died: it may have acknowledged a publication it never sent here.
    assert subscriber.backend.breaks >= 1

    after = await _publish_when_ready(publisher, pub("after"))
    await subscriber.wait_for("chat", 2)
    assert subscriber.on("chat")[-1].data == "after"
    assert before is not None
    assert after is not None
    history = await subscriber.backend.history(APP, "chat", before)
    # Asynchronous replication may lose "before" with the primary: then the epoch is
    # new and the history says so (recovered: false) rather than a silent gap.
    assert history.recovered == (after.epoch == before.epoch)


async def _publish_when_ready(node: Node, publication: Publication) -> Any:
    for _ in range(200):
        try:
            return await node.backend.publish(publication)
        except BackendUnavailable:
            await eventually(lambda: node.backend.ready, "readiness", within=20)
    raise AssertionError("the publisher never got through")
