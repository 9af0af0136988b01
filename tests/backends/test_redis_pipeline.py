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

from broadcaster.backends.base import BackendUnavailable
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


async def test_a_batch_redis_does_not_answer_fails_at_its_deadline_and_the_next_goes_out(
    redis_server: RedisServer,
) -> None:
    """One timer watches the batch in flight: past ``command_timeout`` its callers get
    BackendUnavailable, and the following batch goes out on a new connection."""
    backend = RedisBackend(
        redis_server.url, prefix=f"test-{uuid.uuid4().hex[:12]}", apps=(APP,), command_timeout=0.3
    )
    started = Node(backend)
    await backend.start(started.on_publication, started.on_control)
    try:
        await backend.subscribe(APP, "t")
        async with Redis.from_url(redis_server.url) as admin:
            await admin.client_pause(1500, all=True)  # ends by itself
            calls = [backend.publish(pub("t", n)) for n in range(3)]
            results = await asyncio.gather(*calls, return_exceptions=True)
        assert all(isinstance(r, BackendUnavailable) for r in results), results
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
