"""The Redis backend sends the publications of one event-loop tick in one pipeline:
in call order, each caller gets its own position or error, and a Redis that forgot the
publish script (restarted, flushed) is handled within the pipeline."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis
from redis.asyncio.connection import Connection, parse_url
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError

from broadcaster.backends.base import BackendUnavailable, PublishUnconfirmed
from broadcaster.backends.redis import RedisBackend, ReplyReader, pack_commands, take_over
from broadcaster.publication import Position, Publication
from tests.backends.helpers import APP, Node, eventually
from tests.support.processes import RedisServer

pytestmark = pytest.mark.redis


@pytest.fixture
async def node(redis_server: RedisServer) -> AsyncIterator[Node]:
    backend = RedisBackend(redis_server.url, prefix=f"test-{uuid.uuid4().hex[:12]}", apps=(APP,))
    started = Node(backend)
    await backend.start(started.on_publication, started.on_control)
    yield started
    await backend.stop()


def pub(channel: str, n: int) -> Publication:
    return Publication(APP, channel, "agent.event", str(n))


async def test_publications_of_one_tick_keep_their_order_and_get_their_positions(
    node: Node, redis_server: RedisServer
) -> None:
    """Also on a Redis that does not know the publish script yet."""
    async with Redis.from_url(redis_server.url) as admin:
        await admin.script_flush()
    await node.backend.subscribe(APP, "a")
    await node.backend.subscribe(APP, "b")
    calls = [node.backend.publish(pub("a" if n % 3 else "b", n)) for n in range(30)]
    calls.append(node.backend.publish(pub("a", 99), history=False))
    positions = await asyncio.gather(*calls)
    await node.wait_for("a", 21)
    await node.wait_for("b", 10)
    assert [p.data for p in node.on("a")] == [str(n) for n in range(30) if n % 3] + ["99"]
    assert [p.data for p in node.on("b")] == [str(n) for n in range(0, 30, 3)]
    a_offsets = [p.offset for p in positions[:30] if isinstance(p, Position)]
    assert sorted(a_offsets) == sorted([*range(1, 21), *range(1, 11)])
    assert positions[30] is None  # not kept in history
    assert [p.position for p in node.on("a")[:20]] == [positions[n] for n in range(30) if n % 3]


async def test_a_redis_without_the_publish_script_still_publishes_a_pipeline(
    node: Node, redis_server: RedisServer
) -> None:
    await node.backend.subscribe(APP, "c")
    async with Redis.from_url(redis_server.url) as admin:
        await admin.script_flush()
    positions = await asyncio.gather(*(node.backend.publish(pub("c", n)) for n in range(5)))
    assert [p.offset for p in positions if p is not None] == [1, 2, 3, 4, 5]
    await node.wait_for("c", 5)
    assert [p.data for p in node.on("c")] == ["0", "1", "2", "3", "4"]


@pytest.mark.parametrize(
    ("open_first", "refused"),
    [(False, BackendUnavailable), (True, PublishUnconfirmed)],
    ids=["in-a-task", "without-a-task"],
)
async def test_a_batch_redis_does_not_answer_fails_at_its_deadline_and_the_next_goes_out(
    redis_server: RedisServer, open_first: bool, refused: type[BackendUnavailable]
) -> None:
    """One timer watches the batch in flight: past ``command_timeout`` its callers get
    BackendUnavailable, and the following batch goes out on a new connection. Both for
    a batch that opens the publications' connection (in a task) and for one sent on the
    open connection without a task (unconfirmed: it was written)."""
    backend = RedisBackend(
        redis_server.url, prefix=f"test-{uuid.uuid4().hex[:12]}", apps=(APP,), command_timeout=0.3
    )
    started = Node(backend)
    await backend.start(started.on_publication, started.on_control)
    try:
        if open_first:
            await _connected(started)
        await backend.subscribe(APP, "t")
        async with Redis.from_url(redis_server.url) as admin:
            await admin.client_pause(1500, all=True)  # ends by itself
            calls = [backend.publish(pub("t", n)) for n in range(3)]
            results = await asyncio.gather(*calls, return_exceptions=True)
        assert all(isinstance(r, refused) for r in results), results
        assert all("no answer within 0.3 s" in str(r) for r in results)
        await eventually(lambda: backend.ready, "Redis to answer again")
        position = await backend.publish(pub("t", 9))
        assert position is not None
        await eventually(lambda: "9" in [p.data for p in started.on("t")], "the publication")
    finally:
        await backend.stop()


async def test_the_reply_reader_hands_each_batch_its_replies_and_fails_them_when_lost(
    redis_server: RedisServer,
) -> None:
    """The publications' connection is read by a ReplyReader: replies go to the batches
    in order, a command's error is its own reply, and a lost connection fails every
    batch still waiting (nothing waits for ever)."""
    conn = Connection(**parse_url(redis_server.url))
    await conn.connect()  # type: ignore[no-untyped-call]
    reader = ReplyReader()
    take_over(conn, reader)
    key = f"test-{uuid.uuid4().hex[:12]}"
    first = reader.expect(3)
    second = reader.expect(2)
    reader.write(
        pack_commands(
            [("SET", key, "1"), ("HGET", key, "x"), ("EVALSHA", "0" * 40, 0), ("INCR", key)]
        )
    )
    reader.write(pack_commands([("GET", key)]))
    ok, wrong_type, no_script = await first
    assert ok == b"OK"
    assert isinstance(wrong_type, ResponseError)
    assert "WRONGTYPE" in str(wrong_type)
    assert isinstance(no_script, NoScriptError)
    assert await second == [2, b"2"]
    pending = reader.expect(1)
    async with Redis.from_url(redis_server.url) as admin:
        reader.write(pack_commands([("BLPOP", f"{key}:never", 0)]))  # no answer soon
        await asyncio.sleep(0.05)
        await admin.client_kill_filter(_type="normal", skipme=True)
    with pytest.raises(RedisConnectionError, match="connection lost"):
        await asyncio.wait_for(pending, 5)
    with pytest.raises(RedisConnectionError, match="connection lost"):
        await reader.expect(1)
    await conn.disconnect(nowait=True)


def _redis(node: Node) -> RedisBackend:
    assert isinstance(node.backend, RedisBackend)
    return node.backend


async def _connected(node: Node) -> RedisBackend:
    """The node's backend with its publications' connection open (a first publish)."""
    backend = _redis(node)
    await backend.subscribe(APP, "warm")
    assert await backend.publish(pub("warm", 0)) is not None
    return backend


async def test_a_usual_batch_goes_without_a_task_and_settles_when_answered(node: Node) -> None:
    """On the open connection a batch is written and settled from the read of its
    replies (no task per batch); what is published meanwhile follows in order."""
    backend = await _connected(node)
    await backend.subscribe(APP, "u")
    first = [backend.publish(pub("u", n)) for n in range(3)]
    await asyncio.sleep(0)  # the tick's batch goes out
    assert not backend._sending, "a task for a usual batch"
    assert backend._flight is not None
    second = [backend.publish(pub("u", n)) for n in range(3, 6)]
    positions = await asyncio.gather(*first, *second)
    assert [p.offset for p in positions if p is not None] == [1, 2, 3, 4, 5, 6]
    await node.wait_for("u", 6)
    assert [p.data for p in node.on("u")] == [str(n) for n in range(6)]


async def test_batches_of_both_ways_keep_the_order_of_the_calls(node: Node) -> None:
    """A batch with and without history goes in a task (the script is loaded first);
    the batches before and after it go without: the calls' order holds throughout."""
    backend = await _connected(node)
    await backend.subscribe(APP, "o")
    calls = [backend.publish(pub("o", n)) for n in range(3)]
    await asyncio.sleep(0)
    calls += [backend.publish(pub("o", 3)), backend.publish(pub("o", 4), history=False)]
    await asyncio.sleep(0)
    calls += [backend.publish(pub("o", n)) for n in range(5, 8)]
    positions = await asyncio.gather(*calls)
    calls = [backend.publish(pub("o", n)) for n in range(8, 10)]
    positions += await asyncio.gather(*calls)
    await node.wait_for("o", 10)
    assert [p.data for p in node.on("o")] == [str(n) for n in range(10)]
    assert positions[4] is None
    assert [p.offset for p in positions if p is not None] == list(range(1, 10))


async def test_a_script_flush_on_the_open_connection_is_retried_in_order(
    node: Node, redis_server: RedisServer
) -> None:
    backend = await _connected(node)
    await backend.subscribe(APP, "f")
    async with Redis.from_url(redis_server.url) as admin:
        await admin.script_flush()
    positions = await asyncio.gather(*(backend.publish(pub("f", n)) for n in range(5)))
    assert [p.offset for p in positions if p is not None] == [1, 2, 3, 4, 5]
    await node.wait_for("f", 5)
    assert [p.data for p in node.on("f")] == ["0", "1", "2", "3", "4"]


async def test_a_batch_whose_connection_is_lost_is_unconfirmed_and_the_next_reconnects(
    node: Node,
) -> None:
    backend = await _connected(node)
    await backend.subscribe(APP, "l")
    call = backend.publish(pub("l", 1))
    await asyncio.sleep(0)  # written
    assert backend._publisher is not None
    transport = backend._publisher[1]._transport
    assert transport is not None
    transport.abort()
    with pytest.raises(PublishUnconfirmed, match="may or may not have gone out"):
        await call
    await eventually(lambda: backend.ready, "ready again")
    assert await backend.publish(pub("l", 2)) is not None


async def test_stopping_waits_for_the_batch_in_flight(redis_server: RedisServer) -> None:
    backend = RedisBackend(redis_server.url, prefix=f"test-{uuid.uuid4().hex[:12]}", apps=(APP,))
    started = Node(backend)
    await backend.start(started.on_publication, started.on_control)
    await _connected(started)
    async with Redis.from_url(redis_server.url) as admin:
        await admin.client_pause(500, all=True)  # answered once it ends
        call = backend.publish(pub("s", 1))
        await asyncio.sleep(0)  # written, not answered yet
        assert backend._flight is not None
        await backend.stop()
    assert call.done()
    position = call.result()
    assert position is not None
    assert position.offset == 1
