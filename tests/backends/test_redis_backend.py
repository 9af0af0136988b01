"""What is particular to the Redis backend: surviving the loss of Redis, dead nodes,
the pub/sub connection's settings and the publisher used by agent processes."""

from __future__ import annotations

import asyncio
import logging
import signal
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from redis.asyncio import BlockingConnectionPool, Redis
from redis.exceptions import ResponseError

from broadcaster import protocol
from broadcaster.backends import BackendUnavailable, PresenceMember, create_backend
from broadcaster.backends.redis import (
    RedisBackend,
    channel_key,
    decode_publication,
    encode_publication,
    publication_channel,
    publish_many_via_redis,
    publish_via_redis,
    split_payload,
)
from broadcaster.publication import Position, Publication
from tests.backends.helpers import APP, Node, eventually, eventually_async
from tests.support.processes import RedisServer, free_port

pytestmark = pytest.mark.redis

RedisFactory = Callable[[], RedisServer]


class RedisNode(Node):
    backend: RedisBackend


@pytest.fixture
async def cluster() -> AsyncIterator[Callable[..., Any]]:
    """Start Redis-backed nodes sharing one prefix; all are stopped afterwards."""
    prefix = f"test-{uuid.uuid4().hex[:12]}"
    nodes: list[RedisNode] = []

    async def start(url: str, **options: Any) -> RedisNode:
        options = {"prefix": prefix, "apps": (APP,), "reconnect_max": 0.2, **options}
        node = RedisNode(RedisBackend(url, **options))
        await node.backend.start(node.on_publication, node.on_control)
        nodes.append(node)
        return node

    yield start
    for node in nodes:
        await node.backend.stop()


def pub(data: str = "{}", channel: str = "chat") -> Publication:
    return Publication(APP, channel, "agent.event", data)


async def test_losing_redis_makes_the_node_not_ready_and_publish_fail(
    redis_factory: RedisFactory, cluster: Callable[..., Any]
) -> None:
    redis = redis_factory()
    node = await cluster(redis.url)

    redis.kill()

    await eventually(lambda: not node.backend.ready, "the node to notice the loss")
    # A Redis that died may have acknowledged a publication to its publisher without
    # writing it to this node's connection: the hub must not take the epoch as whole.
    assert node.backend.breaks == 1
    with pytest.raises(BackendUnavailable, match="unreachable; the node is reconnecting"):
        await node.backend.publish(pub())
    with pytest.raises(BackendUnavailable):
        await node.backend.history(APP, "chat", Position(0, "e"))


@pytest.mark.parametrize(
    ("refuse", "allow", "code"),
    [
        (("replicaof", "127.0.0.1", "{other}"), ("replicaof", "no", "one"), "READONLY"),
        (("config", "set", "maxmemory", "1"), ("config", "set", "maxmemory", "0"), "OOM"),
    ],
    ids=["demoted-to-replica", "out-of-memory"],
)
async def test_a_redis_that_refuses_writes_makes_the_node_not_ready_until_it_takes_them(
    redis_factory: RedisFactory,
    cluster: Callable[..., Any],
    refuse: tuple[str, ...],
    allow: tuple[str, ...],
    code: str,
) -> None:
    """PING still answers, so only the refusal tells: /ready must not send traffic to a
    node whose every publish fails. A refused publication is an error, never a success."""
    redis, other = redis_factory(), redis_factory()
    node = await cluster(redis.url, command_timeout=1)
    client = Redis.from_url(redis.url)
    try:
        assert await node.backend.publish(pub("before")) is not None
        await client.execute_command(*(a.format(other=other.port) for a in refuse))

        with pytest.raises(BackendUnavailable, match=code):
            await node.backend.publish(pub("refused"))
        assert not node.backend.ready
        assert (node.backend.problem or "").startswith(f"refuses writes ({code}")
        await asyncio.sleep(1.5)  # probed meanwhile: still refusing, still not ready
        assert not node.backend.ready

        await client.execute_command(*allow)
        await eventually(lambda: node.backend.ready, "ready once Redis takes writes", within=10)
        assert node.backend.problem is None
        assert await node.backend.publish(pub("after")) is not None
    finally:
        await client.aclose()


async def test_a_refusal_seen_by_the_heartbeat_alone_makes_the_node_not_ready(
    redis_factory: RedisFactory, cluster: Callable[..., Any]
) -> None:
    """A node that publishes nothing learns of it from its heartbeat's write."""
    redis = redis_factory()
    node = await cluster(redis.url, heartbeat_interval=0.1, command_timeout=1)
    client = Redis.from_url(redis.url)
    try:
        await client.config_set("maxmemory", "1")
        await eventually(lambda: not node.backend.ready, "the heartbeat to see the refusal")
        await client.config_set("maxmemory", "0")
        await eventually(lambda: node.backend.ready, "ready again", within=10)
    finally:
        await client.aclose()


async def test_a_subscribe_while_redis_is_away_returns_once_it_is_in_effect(
    redis_factory: RedisFactory, cluster: Callable[..., Any]
) -> None:
    """Returning at once (the channel merely recorded) would let the node tell a client
    ``subscription_succeeded`` before Redis delivers the channel to it."""
    redis = redis_factory()
    node = await cluster(redis.url, command_timeout=5, reconnect_max=0.1)
    redis.kill()
    await eventually(lambda: not node.backend.ready, "the node to notice the loss")

    subscribing = asyncio.create_task(node.backend.subscribe(APP, "meanwhile"))
    await asyncio.sleep(0.3)
    assert not subscribing.done(), "subscribed while Redis was away"
    redis.start()
    await subscribing
    name = publication_channel(node.backend.prefix, APP, "meanwhile")
    client = Redis.from_url(redis.url)
    try:
        assert await client.pubsub_numsub(name) == [(name.encode(), 1)]
    finally:
        await client.aclose()


async def test_a_subscribe_gives_up_when_redis_stays_away(
    redis_factory: RedisFactory, cluster: Callable[..., Any]
) -> None:
    redis = redis_factory()
    node = await cluster(redis.url, command_timeout=0.3)
    redis.kill()
    await eventually(lambda: not node.backend.ready, "the node to notice the loss")
    with pytest.raises(BackendUnavailable, match="reconnecting"):
        await node.backend.subscribe(APP, "never")
    redis.start()
    await eventually(lambda: node.backend.ready, "the reconnection", within=20)
    await node.backend.subscribe(APP, "never")  # recorded nowhere: subscribed afresh
    client = Redis.from_url(redis.url)
    name = publication_channel(node.backend.prefix, APP, "never")
    try:
        assert await client.pubsub_numsub(name) == [(name.encode(), 1)]
    finally:
        await client.aclose()


async def test_a_node_resubscribes_and_restores_its_state_when_redis_comes_back(
    redis_factory: RedisFactory, cluster: Callable[..., Any]
) -> None:
    redis = redis_factory()
    subscriber = await cluster(redis.url)
    publisher = await cluster(redis.url)
    await subscriber.backend.subscribe(APP, "chat")
    await subscriber.backend.add_subscriptions(APP, "chat", 2)
    alice = PresenceMember("alice", {"name": "Alice"})
    await subscriber.backend.presence_add(APP, "presence-room", "1.1", alice)

    redis.kill()
    await eventually(lambda: not subscriber.backend.ready, "the subscriber to notice the loss")
    await subscriber.backend.add_subscriptions(APP, "news", 1)  # while Redis is away
    redis.start()  # empty: everything Redis held is gone

    await eventually(lambda: subscriber.backend.ready, "the subscriber to reconnect")
    await eventually(lambda: publisher.backend.ready, "the publisher to reconnect")
    assert subscriber.backend.reconnects == 1
    position = await publisher.backend.publish(pub("after restart"))
    await subscriber.wait_for("chat")
    assert [p.data for p in subscriber.on("chat")] == ["after restart"]
    assert position == subscriber.on("chat")[0].position
    counts = await publisher.backend.subscription_counts(APP)
    assert counts == {"chat": 2, "news": 1}
    assert await publisher.backend.presence_members(APP, "presence-room") == [alice]
    assert await subscriber.backend.presence_remove(APP, "presence-room", "1.1") == alice


async def test_counting_named_channels_does_not_read_every_channel(
    redis_factory: RedisFactory, cluster: Callable[..., Any]
) -> None:
    """A query about one channel (GET /apps/{id}/channels/{name}, info on a publish)
    once read every channel's count of every node in one blocking script: 51,200
    public channels held from one address made it 64-112 ms of Redis per call. Named
    channels are read with HMGET."""
    redis = redis_factory()
    node = await cluster(redis.url)
    for i in range(2_000):
        await node.backend.add_subscriptions(APP, f"c{i}", 1)
    client = Redis(port=redis.port)
    try:
        await client.config_resetstat()
        assert await node.backend.subscription_counts(APP, ["c7", "nobody"]) == {"c7": 1}
        stats = await client.info("commandstats")
        assert "cmdstat_hgetall" not in stats
        assert stats["cmdstat_hmget"]["calls"] == 1
        assert len(await node.backend.subscription_counts(APP)) == 2_000  # the whole app
    finally:
        await client.aclose()


async def test_an_unresponsive_redis_is_detected_by_the_heartbeat(
    redis_factory: RedisFactory, cluster: Callable[..., Any]
) -> None:
    redis = redis_factory()
    node = await cluster(
        redis.url, node_ttl=3, heartbeat_interval=0.1, command_timeout=0.5, connect_timeout=0.5
    )
    await node.backend.subscribe(APP, "chat")
    assert redis.proc is not None

    redis.proc.send_signal(signal.SIGSTOP)
    try:
        await eventually(lambda: not node.backend.ready, "the heartbeat to notice")
        # It stopped reading a server that may still take others' writes: a break.
        await eventually(lambda: node.backend.breaks >= 1, "the pub/sub connection dropped")
    finally:
        redis.proc.send_signal(signal.SIGCONT)

    await eventually(lambda: node.backend.ready, "the node to reconnect")
    await node.backend.publish(pub("back"))
    await node.wait_for("chat")


async def test_a_node_started_before_redis_connects_when_redis_appears(
    cluster: Callable[..., Any],
) -> None:
    port = free_port()
    redis = RedisServer(port=port)
    node = await cluster(redis.url)
    assert not node.backend.ready
    with pytest.raises(BackendUnavailable, match="unreachable"):
        await node.backend.publish(pub())
    # Returns once the node has connected and subscribed (within command_timeout).
    subscribing = asyncio.create_task(node.backend.subscribe(APP, "chat"))

    redis.start()
    try:
        await subscribing
        await eventually(lambda: node.backend.ready, "the node to connect")
        assert node.backend.reconnects == 0
        await node.backend.publish(pub("first"))
        await node.wait_for("chat")
    finally:
        await node.backend.stop()
        redis.stop()


async def test_a_dead_nodes_presence_and_counts_disappear_after_its_ttl(
    redis_server: RedisServer, cluster: Callable[..., Any]
) -> None:
    doomed = await cluster(redis_server.url, node_ttl=0.5, heartbeat_interval=0.1)
    survivor = await cluster(redis_server.url)
    alice = PresenceMember("alice")
    assert await doomed.backend.presence_add(APP, "presence-room", "1.1", alice)
    await doomed.backend.add_subscriptions(APP, "chat", 1)
    assert await survivor.backend.presence_members(APP, "presence-room") == [alice]

    for task in doomed.backend._tasks:  # the process dies: no more heartbeats
        task.cancel()

    async def gone() -> bool:
        members = await survivor.backend.presence_members(APP, "presence-room")
        return not members and not await survivor.backend.subscription_counts(APP)

    await eventually_async(gone, "the dead node's presence and counts to disappear")
    assert await survivor.backend.presence_add(APP, "presence-room", "2.1", alice) is True


async def test_a_storm_of_subscriptions_in_one_tick_is_each_in_effect_on_return(
    redis_server: RedisServer, cluster: Callable[..., Any]
) -> None:
    """A reconnect storm: many channels subscribed and counted at once (sent to Redis
    together); each subscribe returns only once its channel is delivered here, and
    every count, including one that went up and down in the same tick, is right."""
    subscriber = await cluster(redis_server.url)
    publisher = await cluster(redis_server.url)
    channels = [f"storm-{i}" for i in range(300)]
    pool = BlockingConnectionPool.from_url(redis_server.url)
    client = Redis(connection_pool=pool)
    prefix = subscriber.backend.prefix
    listeners: list[int] = []

    async def join(channel: str) -> None:
        await subscriber.backend.subscribe(APP, channel)
        [(_, n)] = await client.pubsub_numsub(publication_channel(prefix, APP, channel))
        listeners.append(n)
        await publisher.backend.publish(pub(channel, channel), history=False)

    try:
        await asyncio.gather(*map(join, channels))
    finally:
        await client.aclose()
        await pool.disconnect()
    assert listeners == [1] * len(channels)
    await asyncio.gather(
        *(subscriber.backend.add_subscriptions(APP, c, 1) for c in channels),
        subscriber.backend.add_subscriptions(APP, "storm-0", 2),
        subscriber.backend.add_subscriptions(APP, "brief", 1),
        subscriber.backend.add_subscriptions(APP, "brief", -1),
    )

    for channel in channels:
        await subscriber.wait_for(channel)
    expected = dict.fromkeys(channels, 1) | {"storm-0": 3}
    assert await publisher.backend.subscription_counts(APP) == expected


async def test_subscribes_sent_together_each_wait_for_redis_to_confirm(
    redis_factory: RedisFactory, cluster: Callable[..., Any]
) -> None:
    """Subscribing, then reading the history is safe only if subscribe returns once Redis
    confirmed: while Redis holds its clients, no subscribe of the batch returns."""
    redis = redis_factory()
    node = await cluster(redis.url)
    admin = Redis.from_url(redis.url)
    try:
        await admin.client_pause(1000, all=True)  # ends by itself
        joins = [asyncio.create_task(node.backend.subscribe(APP, f"c{i}")) for i in range(20)]
        for _ in range(20):
            await asyncio.sleep(0)
        assert not any(join.done() for join in joins)
        await asyncio.gather(*joins)
        names = [publication_channel(node.backend.prefix, APP, f"c{i}") for i in range(20)]
        assert [n for _, n in await admin.pubsub_numsub(*names)] == [1] * 20
    finally:
        await admin.aclose()


async def test_a_storm_of_history_reads_waits_for_connections_instead_of_failing(
    redis_server: RedisServer, cluster: Callable[..., Any]
) -> None:
    """Thousands of clients resuming at once read more histories concurrently than the
    node has connections to Redis: every read succeeds."""
    node = await cluster(redis_server.url)
    await node.backend.publish(pub("missed", "storm"))

    results = await asyncio.gather(
        *(node.backend.history(APP, "storm", Position(0, "old")) for _ in range(1000))
    )

    assert {r.position.offset for r in results} == {1}


async def test_unsubscribing_in_the_tick_of_the_subscribe_leaves_the_channel_unsubscribed(
    redis_server: RedisServer, cluster: Callable[..., Any]
) -> None:
    node = await cluster(redis_server.url)
    await asyncio.gather(
        node.backend.subscribe(APP, "chat"),
        node.backend.unsubscribe(APP, "chat"),
        node.backend.subscribe(APP, "news"),
    )

    await node.backend.publish(pub("dropped", "chat"), history=False)
    await node.backend.publish(pub("kept", "news"), history=False)
    await node.fence()
    assert node.on("chat") == []
    assert [p.data for p in node.on("news")] == ["kept"]


async def test_the_pubsub_connection_has_no_socket_timeout(
    redis_server: RedisServer, cluster: Callable[..., Any]
) -> None:
    node = await cluster(redis_server.url, command_timeout=1.5)
    assert node.backend._pubsub is not None

    assert node.backend._pubsub.socket_timeout is None
    assert node.backend._pubsub.socket_keepalive
    assert node.backend._client.connection_pool.connection_kwargs["socket_timeout"] == 1.5


async def test_an_agent_process_publishes_with_a_plain_client(
    redis_server: RedisServer, cluster: Callable[..., Any]
) -> None:
    node = await cluster(redis_server.url)
    await node.backend.subscribe(APP, "chat")
    start = await node.backend.position(APP, "chat")
    client = Redis.from_url(redis_server.url, decode_responses=True)

    try:
        position = await publish_via_redis(client, node.backend.prefix, pub("from agent"))
        volatile = await publish_via_redis(client, node.backend.prefix, pub("x"), history=False)
    finally:
        await client.aclose()

    assert volatile is None
    assert position == Position(1, start.epoch)
    await node.wait_for("chat", 2)
    assert [p.data for p in node.on("chat")] == ["from agent", "x"]
    history = await node.backend.history(APP, "chat", start)
    assert [p.position for p in history.publications] == [position]


async def test_wrong_credentials_fail_start_without_leaking_the_password(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    url = redis_server.url.replace("redis://", "redis://:hunter2-secret@")
    backend = create_backend(url, apps=(APP,))
    caplog.set_level(logging.DEBUG)

    with pytest.raises(BackendUnavailable, match="refused this node") as failure:
        await backend.start(lambda p: None, lambda a, m: None)

    assert "hunter2" not in str(failure.value)
    assert "hunter2" not in caplog.text
    await backend.stop()


def test_options_are_validated_with_messages_that_name_them() -> None:
    with pytest.raises(ValueError, match="invalid Redis URL 'http://localhost'"):
        RedisBackend("http://localhost")
    with pytest.raises(ValueError, match="prefix must be"):
        RedisBackend("redis://localhost", prefix="")
    with pytest.raises(ValueError, match="node_id may contain only"):
        RedisBackend("redis://localhost", node_id="a:b")
    with pytest.raises(ValueError, match="node_id may contain only"):
        RedisBackend("redis://localhost", node_id="a\n")  # it would split a routing line
    with pytest.raises(ValueError, match="heartbeat_interval must be between"):
        RedisBackend("redis://localhost", node_ttl=1, heartbeat_interval=2)
    with pytest.raises(ValueError, match="history_size must be at least 1"):
        RedisBackend("redis://localhost", history_size=0)


def test_payloads_that_are_not_publications_are_refused() -> None:
    frame = b'{"event":"e","channel":"chat","data":"{}"}'
    for payload in (
        b"nope",
        b"[2,1]",
        b"[1]",
        b"{}",
        b"2 app chat - - -",  # no frame
        b"2 app chat - -\n" + frame,  # a header field missing
        b"2 app chat x e1 -\n" + frame,  # an offset that is no number
        b"3 app chat - - -\n" + frame,  # an unknown version
    ):
        with pytest.raises(ValueError, match="payload"):
            decode_publication(payload)
    with pytest.raises(ValueError, match="payload"):  # the header and the frame disagree
        decode_publication(b"2 app other - - -\n" + frame)
    with pytest.raises(ValueError, match="not a channel event"):
        decode_publication(b"2 app chat - - -\n[1]")


def test_the_payload_carries_the_frame_clients_receive_and_decodes_back() -> None:
    """Format 2: a header to route and order by, then the channel event exactly as
    :func:`broadcaster.protocol.channel_event` writes it (the node sends it as is)."""
    p = Publication(APP, "presence-room", "client-typing", '{"a":"\u00e9\\n"}', "12.34", "u-7")
    payload = encode_publication(p)
    app_id, channel, position, exclude, frame = split_payload(payload)
    assert (app_id, channel, position, exclude) == (APP, "presence-room", None, "12.34")
    assert frame == protocol.channel_event(p.event, p.channel, p.data, p.user_id)
    assert decode_publication(payload) == decode_publication(payload.decode()) == p
    assert decode_publication(encode_publication(pub())) == pub()


def test_format_1_payloads_of_earlier_versions_stay_readable() -> None:
    v1 = b'[1,"app","chat","ev","{}",null,"u",7,"e1"]'
    assert decode_publication(v1) == Publication(
        "app", "chat", "ev", "{}", None, "u", Position(7, "e1")
    )
    assert decode_publication(b'[1,"app","chat","ev","{}","1.2",null]').exclude_socket_id == "1.2"


def test_names_that_cannot_be_routed_are_refused_when_publishing() -> None:
    for bad in (
        Publication(APP, "my chat", "e", "{}"),
        Publication(APP, "chat\n", "e", "{}"),
        Publication("", "chat", "e", "{}"),
        Publication(APP, "chat", "e", "{}", exclude_socket_id="1 2"),
    ):
        with pytest.raises(ValueError, match="cannot publish with the"):
            encode_publication(bad)


@dataclass
class EncodedNode:
    """A Redis backend started with an ``on_encoded`` handler, what each handler got, and
    a plain client on the same Redis."""

    backend: RedisBackend
    client: Redis
    encoded: list[tuple[str, str, Position | None, str | None, bytes]]
    objects: list[Publication]


@pytest.fixture
async def encoded_node(redis_server: RedisServer) -> AsyncIterator[EncodedNode]:
    prefix = f"test-{uuid.uuid4().hex[:12]}"
    backend = RedisBackend(redis_server.url, prefix=prefix, apps=(APP,))
    node = EncodedNode(backend, Redis.from_url(redis_server.url), [], [])
    await backend.start(
        node.objects.append, lambda app, message: None, lambda *a: node.encoded.append(a)
    )
    await backend.subscribe(APP, "chat")
    yield node
    await node.client.aclose()
    await backend.stop()


async def test_published_payloads_carry_the_position_in_header_and_frame(
    encoded_node: EncodedNode,
) -> None:
    """The publish script writes the position into the header and the frame; a node
    gets the frame undecoded, byte for byte what ``channel_event`` makes with it, and
    the history keeps the same payload."""
    node, backend = encoded_node, encoded_node.backend
    first = await backend.publish(pub('{"n":1}'))
    p = Publication(APP, "chat", "agent.event", '{"n":2}', "9.9", None)
    second = await publish_via_redis(node.client, backend.prefix, p)
    await eventually(lambda: len(node.encoded) == 2, "both publications, encoded")
    assert first is not None
    assert second == Position(first.offset + 1, first.epoch)
    for (app_id, channel, position, exclude, frame), data, excluded, at in zip(
        node.encoded, ('{"n":1}', '{"n":2}'), (None, "9.9"), (first, second), strict=True
    ):
        assert (app_id, channel, position, exclude) == (APP, "chat", at, excluded)
        assert frame == protocol.channel_event("agent.event", "chat", data, None, str(at))
    assert node.objects == []  # nothing decoded on the way
    history = await backend.history(APP, "chat", Position(0, first.epoch))
    assert [h.data for h in history.publications] == ['{"n":1}', '{"n":2}']
    assert history.publications[1] == Publication(
        APP, "chat", "agent.event", '{"n":2}', "9.9", None, second
    )


async def test_a_node_still_delivers_format_1_publications_of_older_publishers(
    encoded_node: EncodedNode,
) -> None:
    node = encoded_node
    v1 = f'[1,"{APP}","chat","ev","{{}}",null,null,3,"e1"]'
    await node.client.publish(publication_channel(node.backend.prefix, APP, "chat"), v1)
    await eventually(lambda: bool(node.objects), "the format 1 publication")
    assert node.objects == [Publication(APP, "chat", "ev", "{}", None, None, Position(3, "e1"))]
    assert node.encoded == []


async def test_a_malformed_message_is_dropped_and_delivery_goes_on(
    redis_server: RedisServer, cluster: Callable[..., Any]
) -> None:
    node = await cluster(redis_server.url)
    await node.backend.subscribe(APP, "chat")
    client = Redis.from_url(redis_server.url)
    try:
        channel = channel_key(node.backend.prefix, APP, "chat", "pub")
        await client.publish(channel, b"[not json")
        await client.publish(f"{node.backend.prefix}:{{{APP}}}:#control", b"{broken")
    finally:
        await client.aclose()
    await node.backend.publish(pub("fine"))
    await node.backend.send_control(APP, {"type": "fine"})
    await node.wait_for("chat")
    await eventually(lambda: bool(node.controls), "the valid control message")
    assert [p.data for p in node.on("chat")] == ["fine"]
    assert node.controls == [(APP, {"type": "fine"})]


async def test_with_a_read_delay_what_arrives_meanwhile_is_read_in_one_pass(
    redis_server: RedisServer, cluster: Callable[..., Any]
) -> None:
    # A long delay (1 s) makes the batch certain on a loaded machine: the 50
    # publications below are sent within it, so they are read together.
    node = await cluster(redis_server.url, read_delay=1.0)
    await node.backend.subscribe(APP, "chat")
    reader = node.backend._reader
    assert reader is not None
    reads = 0
    received = reader.data_received

    def counting_reads(data: bytes) -> None:
        nonlocal reads
        reads += 1
        received(data)

    reader.data_received = counting_reads  # type: ignore[method-assign]
    client = Redis.from_url(redis_server.url)
    try:
        channel = publication_channel(node.backend.prefix, APP, "chat")
        await publish_via_redis(client, node.backend.prefix, pub("first"))
        await node.wait_for("chat", 1)
        for i in range(50):  # one at a time: each reaches the node in its own packet
            await client.publish(channel, orjson_payload(i))
    finally:
        await client.aclose()

    await node.wait_for("chat", 51)
    assert [p.data for p in node.on("chat")] == ["first", *(f"n{i}" for i in range(50))]
    assert reads <= 3  # "first" alone, then the 50 together (a split read at most)


async def test_with_a_read_delay_slow_traffic_is_read_at_once(
    redis_server: RedisServer, cluster: Callable[..., Any]
) -> None:
    """Pausing batches nothing when publications come less often than the read delay: a
    wake-up long after the one before leaves the connection reading; the next one
    within the delay pauses it."""
    node = await cluster(redis_server.url, read_delay=1.0)
    await node.backend.subscribe(APP, "chat")
    reader = node.backend._reader
    assert reader is not None
    assert reader._transport is not None
    # More than read_delay since the subscribe's reply and the end of the pause it may
    # have started.
    await asyncio.sleep(2.1)
    client = Redis.from_url(redis_server.url)
    try:
        await publish_via_redis(client, node.backend.prefix, pub("lone"))
        await node.wait_for("chat", 1)
        assert not reader._paused
        assert reader._transport.is_reading()
        await publish_via_redis(client, node.backend.prefix, pub("soon after"))
        await node.wait_for("chat", 2)
        assert reader._paused  # two wake-ups within the delay: what follows waits
        await publish_via_redis(client, node.backend.prefix, pub("during the pause"))
        await node.wait_for("chat", 3)  # read when the pause ended
        assert reader._paused  # that read was busy too: steady traffic keeps batching
    finally:
        await client.aclose()
    assert [p.data for p in node.on("chat")] == ["lone", "soon after", "during the pause"]


def orjson_payload(i: int) -> bytes:
    return b'[1,"%s","chat","agent.event","n%d",null,null]' % (APP.encode(), i)


async def test_an_error_reply_on_the_pubsub_connection_makes_the_node_reconnect() -> None:
    from broadcaster.backends.redis import PubSubReader

    served = asyncio.Event()

    async def serve(stream: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"*3\r\n$9\r\nsubscribe\r\n$1\r\na\r\n:1\r\n-NOPERM no access\r\n")
        await writer.drain()
        await stream.read()  # until the reader drops the connection
        writer.close()
        await writer.wait_closed()
        served.set()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    replies: list[Any] = []
    reader = PubSubReader(replies.append)
    loop = asyncio.get_running_loop()
    try:
        await loop.create_connection(lambda: reader, "127.0.0.1", port)
        lost = await asyncio.wait_for(reader.lost, 5)
        await asyncio.wait_for(served.wait(), 5)
    finally:
        server.close()
        await server.wait_closed()
    assert replies == [[b"subscribe", b"a", 1]]
    assert "NOPERM no access" in str(lost)


def test_the_pubsub_reader_hands_message_pushes_to_on_message_and_the_rest_to_on_reply() -> None:
    from broadcaster.backends.redis import PubSubReader

    replies: list[Any] = []
    messages: list[bytes] = []

    async def feed() -> None:
        reader = PubSubReader(replies.append, on_message=messages.append)
        reader.data_received(
            b"*3\r\n$9\r\nsubscribe\r\n$1\r\na\r\n:1\r\n"
            b"*3\r\n$7\r\nmessage\r\n$1\r\na\r\n$3\r\none\r\n"
            b"*2\r\n$4\r\npong\r\n$0\r\n\r\n"
            b"*3\r\n$7\r\nmessage\r\n$1\r\na\r\n$3\r\ntw"  # the rest comes later
        )
        reader.data_received(b"o\r\n")
        assert not reader.lost.done()

    asyncio.run(feed())
    assert messages == [b"one", b"two"]
    assert replies == [[b"subscribe", b"a", 1], [b"pong", b""]]


def test_the_pubsub_reader_reads_a_large_read_in_pieces_without_losing_a_reply() -> None:
    from broadcaster.backends.redis import PubSubReader

    payloads = [b"%d " % i + b"x" * 300 for i in range(100)]  # about 35 KB in all
    pushes = [b"*3\r\n$7\r\nmessage\r\n$1\r\na\r\n$%d\r\n%b\r\n" % (len(p), p) for p in payloads]
    data = b"".join(pushes) + b"*2\r\n$4\r\npong\r\n$0\r\n\r\n" + pushes[0]
    replies: list[Any] = []
    messages: list[bytes] = []

    async def feed() -> None:
        reader = PubSubReader(replies.append, on_message=messages.append)
        reader.data_received(data[:-20])
        reader.data_received(data[-20:])
        assert not reader.lost.done()

    asyncio.run(feed())
    assert messages == [*payloads, payloads[0]]
    assert replies == [[b"pong", b""]]


def test_the_pubsub_reader_refuses_a_connection_it_cannot_take_over() -> None:
    from broadcaster.backends.redis import PubSubReader, take_over

    class Unknown:
        pass

    async def attempt() -> None:
        with pytest.raises(RuntimeError, match="no _reader/_writer streams"):
            take_over(Unknown(), PubSubReader(lambda reply: None))  # type: ignore[arg-type]

    asyncio.run(attempt())


def test_the_read_delay_is_validated() -> None:
    with pytest.raises(ValueError, match="read_delay must be 0-1 seconds"):
        RedisBackend("redis://localhost", read_delay=2)


async def test_a_connection_count_redis_lost_is_written_back_by_the_heartbeat(
    redis_factory: RedisFactory, cluster: Callable[..., Any]
) -> None:
    """Redis restarted empty (or took the node for dead): the node's heartbeat writes its
    count again, so the limit holds on without the node's clients reconnecting."""
    redis = redis_factory()
    holder = await cluster(redis.url, node_ttl=0.6)
    other = await cluster(redis.url, node_ttl=0.6)
    assert await holder.backend.admit_connection(APP, 2) is True
    assert await holder.backend.admit_connection(APP, 2) is True
    client = Redis.from_url(redis.url)
    try:
        await client.delete(*holder.backend._connection_keys(APP))
        await eventually_async(
            lambda: client.hget(holder.backend._connection_keys(APP)[0], holder.backend.node_id),
            "the heartbeat to write the count back",
        )
    finally:
        await client.aclose()
    assert await other.backend.admit_connection(APP, 2) is False


async def test_a_release_redis_did_not_take_is_written_once_it_answers(
    redis_factory: RedisFactory, cluster: Callable[..., Any]
) -> None:
    """Redis froze (data kept) while a connection closed: the node's count there is one
    too high until Redis answers again, then the heartbeat writes the true count."""
    redis = redis_factory()
    holder = await cluster(redis.url, command_timeout=0.3, node_ttl=1.5)
    other = await cluster(redis.url)
    assert await holder.backend.admit_connection(APP, 2) is True
    assert await holder.backend.admit_connection(APP, 2) is True
    assert redis.proc is not None
    redis.proc.send_signal(signal.SIGSTOP)
    try:
        await eventually(lambda: not holder.backend.ready, "the node to notice")
        await holder.backend.release_connection(APP)  # never fails; nothing sent
    finally:
        redis.proc.send_signal(signal.SIGCONT)
    await eventually_async(
        lambda: other.backend.admit_connection(APP, 2), "the true count to be written"
    )


async def _promote(client: Redis) -> None:
    """Make the server a replica of nothing reachable, then a primary again: what a
    promoted replica does, with the same data and a new replication id."""
    await client.execute_command("REPLICAOF", "127.0.0.1", str(free_port()))
    await client.execute_command("REPLICAOF", "NO", "ONE")


async def test_a_new_replication_id_starts_a_new_epoch_and_resumes_across_it_are_not_recovered(
    redis_factory: RedisFactory, cluster: Callable[..., Any]
) -> None:
    """After a failover the promoted replica may lack the last publications: their
    offsets must not be handed out again, nor a resume across it called recovered."""
    redis = redis_factory()
    node = await cluster(redis.url)
    backend: RedisBackend = node.backend
    old = [await backend.publish(pub(str(n))) for n in range(3)]
    assert old[0] is not None
    assert old[2] is not None
    assert (await backend.history(APP, "chat", old[0])).recovered
    client = Redis.from_url(redis.url)
    try:
        replid = (await client.info("replication"))["master_replid"]
        await _promote(client)
        assert (await client.info("replication"))["master_replid"] != replid
        # Before the next publication: no resume across the promotion is recovered.
        for since in (old[0], old[2]):
            result = await backend.history(APP, "chat", since)
            assert not result.recovered
            assert result.position == old[2]
        new = await backend.publish(pub("after"))
        assert new is not None
        assert new.epoch != old[0].epoch
        assert new.offset == 1
        assert not (await backend.history(APP, "chat", old[2])).recovered
        after = await backend.history(APP, "chat", Position(0, new.epoch))
        assert after.recovered
        assert [p.data for p in after.publications] == ["after"]
        position = await backend.position(APP, "other")
        await _promote(client)
        moved = await backend.position(APP, "other")
        assert moved.epoch != position.epoch
        assert moved.offset == 0
    finally:
        await client.aclose()


async def test_a_channel_meta_written_before_replication_ids_adopts_the_current_one(
    redis_server: RedisServer, cluster: Callable[..., Any]
) -> None:
    node = await cluster(redis_server.url)
    backend: RedisBackend = node.backend
    first = await backend.publish(pub("1"))
    assert first is not None
    client = Redis.from_url(redis_server.url)
    meta = channel_key(backend.prefix, APP, "chat", "meta")
    try:
        await client.hdel(meta, "r")  # as an older version wrote it
        assert (await backend.history(APP, "chat", first)).recovered
        second = await backend.publish(pub("2"))
        assert second == Position(2, first.epoch)
        assert await client.hget(meta, "r") is not None
    finally:
        await client.aclose()


async def test_agents_publish_many_in_order_after_a_script_flush_and_see_refusals(
    redis_server: RedisServer,
) -> None:
    """``publish_many_via_redis`` (what ``RedisPublisher`` uses): one write for the
    batch, positions in order; after SCRIPT FLUSH the script is loaded again and
    nothing is lost; a refused publication raises, and the pooled connection is fine
    for the next batch."""
    prefix = f"test-{uuid.uuid4().hex[:12]}"
    client = Redis.from_url(redis_server.url)
    try:
        batch = [pub(f'{{"n":{n}}}', channel=f"s{n % 2}") for n in range(6)]
        first = await publish_many_via_redis(client, prefix, batch)
        await client.script_flush()
        again = await publish_many_via_redis(client, prefix, batch[:2])
        assert [p.offset for p in first] == [1, 1, 2, 2, 3, 3]
        assert [p.offset for p in again] == [4, 4]
        assert first[0].epoch == again[0].epoch
        await client.set(channel_key(prefix, APP, "broken", "meta"), "not a hash")
        with pytest.raises(ResponseError, match="WRONGTYPE"):
            await publish_many_via_redis(client, prefix, [pub(channel="s0"), pub(channel="broken")])
        after = await publish_many_via_redis(client, prefix, [pub(channel="s0")])
        assert after[0].offset == 6  # the one before the refused one was published
        history: Any = await client.xrange(channel_key(prefix, APP, "s0", "stream"))
        assert [decode_publication(f[b"p"]).data for _, f in history][-1] == "{}"
    finally:
        await client.aclose()


async def test_a_standalone_redis_has_the_hash_tagged_layout_of_redis_cluster(
    redis_server: RedisServer, cluster: Callable[..., Any]
) -> None:
    """Key layout 2, one for every topology: a channel's keys share the tag
    ``{app:channel}``, the app's keys ``{app}``, and live nodes are one sorted set
    ``{#nodes}``; nothing of the untagged layout 1 (``P:A:meta:chat``, ``P:#node:id``)."""
    node = await cluster(redis_server.url)
    backend: RedisBackend = node.backend
    await backend.subscribe(APP, "chat")
    await backend.add_subscriptions(APP, "chat", 1)
    await backend.publish(pub("1"))
    await backend.presence_add(APP, "presence-room", "1.1", PresenceMember("u"))
    client = Redis.from_url(redis_server.url)
    try:
        keys = {key.decode() async for key in client.scan_iter(match=f"{backend.prefix}:*")}
        live = await client.zrange(f"{backend.prefix}:{{#nodes}}", 0, -1)
    finally:
        await client.aclose()
    p = backend.prefix
    assert {
        f"{p}:{{{APP}:chat}}:meta",
        f"{p}:{{{APP}:chat}}:stream",
        f"{p}:{{{APP}:presence-room}}:presence",
        f"{p}:{{{APP}}}:subs:{backend.node_id}",
        f"{p}:{{{APP}}}:subs-nodes",
        f"{p}:{{#nodes}}",
    } <= keys
    assert [key for key in keys if key.startswith(f"{p}:{APP}:") or "#node:" in key] == []
    assert live == [backend.node_id.encode()]
