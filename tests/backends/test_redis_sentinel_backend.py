"""What is particular to the Redis Sentinel backend: the URL, and following the primary
through a failover."""

from __future__ import annotations

import asyncio
import subprocess
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from broadcaster.backends import BackendUnavailable, create_backend
from broadcaster.backends.redis import publish_via_redis
from broadcaster.backends.redis.backend import RedisBackend
from broadcaster.backends.redis.clients import sentinel_client
from broadcaster.backends.redis.urls import parse_sentinel_url
from broadcaster.publication import Position, Publication
from tests.backends.helpers import APP, Node, eventually
from tests.support.topologies import SentinelTopology, command

pytestmark = pytest.mark.redis

Start = Callable[..., Any]


def pub(data: str = "{}", channel: str = "chat") -> Publication:
    return Publication(APP, channel, "agent.event", data)


def test_the_url_names_sentinels_service_db_credentials_and_tls() -> None:
    parsed = parse_sentinel_url("rediss-sentinel://:s%40cret@a:26379,b:26380/main/2")
    assert parsed.sentinels == (("a", 26379), ("b", 26380))
    assert (parsed.service, parsed.db, parsed.password, parsed.tls) == ("main", 2, "s@cret", True)


@pytest.mark.parametrize(
    ("url", "error"),
    [
        ("redis-sentinel://a:26379/", "/<service>/<db>"),
        ("redis-sentinel://a:26379/main/x", "must be a number"),
        ("redis-sentinel://a/main/0", "host:port"),
    ],
)
def test_a_bad_url_is_refused_with_what_is_wrong(url: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        create_backend(url)


@pytest.fixture(scope="module")
def own_sentinel() -> Iterator[SentinelTopology]:
    """A topology of this module's own, for the tests that kill its primary."""
    topology = SentinelTopology().start()
    yield topology
    topology.stop()


@asynccontextmanager
async def _nodes_on(topology: SentinelTopology) -> AsyncIterator[Start]:
    prefix = f"test-{uuid.uuid4().hex[:12]}"
    started: list[Node] = []

    async def start(**options: Any) -> Node:
        options = {"prefix": prefix, "apps": (APP,), "reconnect_max": 0.2, **options}
        node = Node(RedisBackend(topology.url, **options))
        await node.backend.start(node.on_publication, node.on_control)
        started.append(node)
        return node

    try:
        yield start
    finally:
        for node in started:
            await node.backend.stop()


@pytest.fixture
async def nodes(redis_sentinel: SentinelTopology) -> AsyncIterator[Start]:
    """Nodes on the session's Sentinel topology: for tests that kill nothing."""
    async with _nodes_on(redis_sentinel) as start:
        yield start


@pytest.fixture
async def killable_nodes(own_sentinel: SentinelTopology) -> AsyncIterator[Start]:
    """Nodes on this module's own topology, whose primary the test may kill."""
    async with _nodes_on(own_sentinel) as start:
        yield start


async def test_agents_publish_through_the_primary_sentinel_names(
    nodes: Start, redis_sentinel: SentinelTopology
) -> None:
    node = await nodes()
    await node.backend.subscribe(APP, "chat")
    client = sentinel_client(redis_sentinel.url)
    try:
        position = await publish_via_redis(client, node.backend.prefix, pub("agent"))
    finally:
        await client.aclose()
    await node.wait_for("chat")
    assert position is not None
    assert position.offset == 1


async def test_a_killed_primary_is_followed_to_the_promoted_replica(
    killable_nodes: Start, own_sentinel: SentinelTopology
) -> None:
    publisher = await killable_nodes(command_timeout=0.5)
    subscriber = await killable_nodes(command_timeout=0.5)
    await subscriber.backend.subscribe(APP, "chat")
    before = await publisher.backend.publish(pub("before"))
    await subscriber.wait_for("chat", 1)
    assert own_sentinel.primary is not None
    old = own_sentinel.primary_port()

    next(n for n in (own_sentinel.primary, own_sentinel.replica) if n and n.port == old).kill()
    await eventually(lambda: not subscriber.backend.ready, "the outage to show", within=20)
    await eventually(lambda: subscriber.backend.ready, "the failover", within=40)
    assert own_sentinel.primary_port() != old

    after = await _publish_when_ready(publisher, pub("after"))
    await subscriber.wait_for("chat", 2)
    assert subscriber.on("chat")[-1].data == "after"
    assert before is not None
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


@pytest.mark.parametrize("first_sentinel", ["up", "down"])
async def test_a_manual_failover_is_followed_before_the_old_primary_is_demoted(
    first_sentinel: str,
) -> None:
    """``SENTINEL FAILOVER`` leaves the old primary up and writable until Sentinel makes
    it a replica (about 10 s later), which drops what was written to it meanwhile.
    Publications acknowledged after the switch must land on the new primary and stay in
    its history. With the first Sentinel down, the node listens to the next one."""
    topology = SentinelTopology().start()  # its own: this test moves the primary
    prefix = f"test-{uuid.uuid4().hex[:12]}"
    started: list[Node] = []
    try:
        for _ in range(2):
            options = {"prefix": prefix, "apps": (APP,), "reconnect_max": 0.2}
            node = Node(RedisBackend(topology.url, command_timeout=1, **options))
            await node.backend.start(node.on_publication, node.on_control)
            started.append(node)
        publisher, subscriber = started
        await subscriber.backend.subscribe(APP, "chat")
        await publisher.backend.publish(pub("before"))
        await subscriber.wait_for("chat", 1)
        old = topology.primary_port()
        sentinel = topology.sentinels[0].port
        if first_sentinel == "down":
            topology.sentinels[0].stop()
            sentinel = topology.sentinels[1].port
            await asyncio.sleep(3)  # the listener notices and moves to the next one
        await polled(
            lambda: "OK" in command(sentinel, "sentinel", "failover", topology.service),
            "Sentinel to accept a manual failover",
            within=30,
        )

        def primary() -> int:
            reply = command(sentinel, "sentinel", "get-master-addr-by-name", topology.service)
            return int(reply.split()[1])

        await polled(lambda: primary() != old, "the switch", within=20)
        await asyncio.sleep(1)  # well within the ~10 s the old primary stays a primary

        positions = [await _publish_when_ready(publisher, pub(f"after-{n}")) for n in range(5)]
        await subscriber.wait_for("chat", 6)
        assert "role:master" in command(old, "info", "replication"), "demoted too soon"
        # Each node stopped reading a primary that still took writes: a break (the hub
        # then doubts a new epoch, see tests/broadcaster/test_hub.py).
        assert all(node.backend.breaks >= 1 for node in started)

        def demoted() -> bool:
            try:
                return "role:slave" in command(old, "info", "replication")
            except subprocess.CalledProcessError:
                # Sentinel demotes with CLIENT KILL TYPE normal after REPLICAOF: a
                # redis-cli asking at that moment loses its connection. Ask again.
                return False

        await polled(demoted, "Sentinel to make the old primary a replica", within=40)
        history = await subscriber.backend.history(APP, "chat", Position(0, positions[0].epoch))
        assert history.recovered
        kept = [p.data for p in history.publications]
        assert kept == [f"after-{n}" for n in range(5)], kept
    finally:
        for node in started:
            await node.backend.stop()
        topology.stop()


async def test_losing_one_sentinel_leaves_the_node_ready() -> None:
    """Sentinel is there for high availability: with one of three down, the node must
    stay ready and publish. (redis-py's retries with back-off on the dead Sentinel once
    outlasted every readiness PING, and the node stayed not ready for good.)"""
    topology = SentinelTopology().start()
    node = Node(
        RedisBackend(
            topology.url, prefix=f"test-{uuid.uuid4().hex[:12]}", apps=(APP,), command_timeout=1
        )
    )
    await node.backend.start(node.on_publication, node.on_control)
    try:
        await node.backend.subscribe(APP, "chat")
        await asyncio.to_thread(topology.sentinels[0].stop)
        loop = asyncio.get_running_loop()
        until = loop.time() + 5  # several probes, each of which asks Sentinel anew
        while loop.time() < until:
            assert node.backend.ready, node.backend.problem
            await asyncio.sleep(0.1)
        await node.backend.publish(pub("still"))
        await node.wait_for("chat")
    finally:
        await node.backend.stop()
        topology.stop()


async def polled(check: Callable[[], bool], what: str, within: float) -> None:
    """``check`` every 0.1 s until it holds (it runs ``redis-cli``: not every 5 ms)."""
    deadline = asyncio.get_running_loop().time() + within
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}")
        await asyncio.sleep(0.1)
