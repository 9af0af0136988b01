"""Gap filling in the hub: a node whose pub/sub subscription missed publications (as
during a Redis outage, while another node already accepted publications) delivers them
from the channel's history, in order and once, before the live ones."""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from redis.asyncio import Redis

from broadcaster.backends.redis import channel_key, publish_via_redis
from broadcaster.publication import Publication
from tests.support.live import APP_ID, Client, LiveServer, StartServer
from tests.support.processes import RedisServer

pytestmark = pytest.mark.redis

Connect = Callable[..., Awaitable[Client]]
CHANNEL = "agent.gap"


async def setup(
    start_server: StartServer, clients: Connect, redis: RedisServer
) -> tuple[LiveServer, Client, Redis, str]:
    prefix = f"gap-{secrets.token_hex(4)}"
    live = await start_server(backend=redis.url, redis_prefix=prefix)
    client = await clients(live.app_url())
    answer = await client.subscribe(CHANNEL)
    assert answer["event"] == "pusher_internal:subscription_succeeded"
    return live, client, Redis.from_url(redis.url), prefix


async def put(redis: Redis, prefix: str, n: int) -> None:
    """Publish ``n`` through Redis as another node (or an agent worker) would."""
    await publish_via_redis(redis, prefix, Publication(APP_ID, CHANNEL, "n", str(n)))


async def received(client: Client, count: int) -> list[Any]:
    return [(await client.expect("n"))["data"] for _ in range(count)]


async def test_a_skipped_offset_is_filled_from_history_in_order(
    start_server: StartServer, clients: Connect, redis_server: RedisServer
) -> None:
    live, client, redis, prefix = await setup(start_server, clients, redis_server)
    await put(redis, prefix, 1)
    assert await received(client, 1) == [1]
    await live.node.backend.unsubscribe(APP_ID, CHANNEL)  # the pub/sub copy is lost...
    await put(redis, prefix, 2)
    await put(redis, prefix, 3)
    await live.node.backend.subscribe(APP_ID, CHANNEL)  # ...until it is back
    await put(redis, prefix, 4)
    await put(redis, prefix, 5)
    assert await received(client, 4) == [2, 3, 4, 5]
    await redis.aclose()


async def test_a_gap_at_the_end_of_a_stream_is_filled_after_a_reconnection(
    start_server: StartServer, clients: Connect, redis_server: RedisServer
) -> None:
    live, client, redis, prefix = await setup(start_server, clients, redis_server)
    await put(redis, prefix, 1)
    assert await received(client, 1) == [1]
    await live.node.backend.unsubscribe(APP_ID, CHANNEL)
    await put(redis, prefix, 2)  # the last publication: no later one reveals the gap
    await live.node.backend.subscribe(APP_ID, CHANNEL)
    live.node.hub.check_gaps()  # what the node does when the backend reconnected
    assert await received(client, 1) == [2]
    await put(redis, prefix, 3)
    assert await received(client, 1) == [3]  # and nothing twice
    await redis.aclose()


async def test_the_start_of_a_new_epoch_is_filled_when_redis_lost_the_history(
    start_server: StartServer, clients: Connect, redis_server: RedisServer
) -> None:
    live, client, redis, prefix = await setup(start_server, clients, redis_server)
    await put(redis, prefix, 1)
    assert await received(client, 1) == [1]
    await live.node.backend.unsubscribe(APP_ID, CHANNEL)
    meta, stream = (channel_key(prefix, APP_ID, CHANNEL, kind) for kind in ("meta", "stream"))
    await redis.delete(meta, stream)
    await put(redis, prefix, 2)  # offset 1 of a new epoch, missed
    await live.node.backend.subscribe(APP_ID, CHANNEL)
    await put(redis, prefix, 3)
    got = [await client.expect("n") for _ in range(2)]
    assert [m["data"] for m in got] == [2, 3]
    assert got[0]["position"].endswith(":1")
    await redis.aclose()


async def test_a_gap_the_history_no_longer_holds_makes_the_client_resume_unrecovered(
    start_server: StartServer, clients: Connect, redis_server: RedisServer
) -> None:
    """Not a silent gap: the client is closed with 4100 (pusher-js reconnects), and
    its resume from its position is answered ``recovered: false``."""
    prefix = f"gap-{secrets.token_hex(4)}"
    live = await start_server(backend=redis_server.url, redis_prefix=prefix, history_size=2)
    client = await clients(live.app_url())
    await client.subscribe(CHANNEL)
    redis = Redis.from_url(redis_server.url)
    await put(redis, prefix, 1)
    position = (await client.expect("n"))["position"]
    await live.node.backend.unsubscribe(APP_ID, CHANNEL)
    for n in range(2, 7):  # more than the history keeps
        await put(redis, prefix, n)
    await live.node.backend.subscribe(APP_ID, CHANNEL)
    await put(redis, prefix, 7)
    assert await client.closed_with() == 4100
    await live.node.hub.drain_fills()
    again = await clients(live.app_url())
    await again.subscribe(CHANNEL, position=position)
    answer = await again.expect("broadcaster:resume")
    assert answer["data"]["recovered"] is False
    await put(redis, prefix, 8)
    assert await received(again, 1) == [8]
    await redis.aclose()


async def test_a_large_gap_after_an_outage_is_read_in_pages_and_delivered_whole(
    start_server: StartServer, clients: Connect, redis_server: RedisServer
) -> None:
    """250 publications missed: read as a resume reads (pages of 100, each its own
    XRANGE in the history script), not as one read of the whole range."""
    live, client, redis, prefix = await setup(start_server, clients, redis_server)
    await put(redis, prefix, 0)
    assert await received(client, 1) == [0]
    await live.node.backend.unsubscribe(APP_ID, CHANNEL)  # the outage, as node sees it
    for n in range(1, 251):
        await put(redis, prefix, n)
    await live.node.backend.subscribe(APP_ID, CHANNEL)
    before = await xranges(redis)
    live.node.hub.check_gaps()  # what the node does when the backend reconnected
    await live.node.hub.drain_fills()
    assert await received(client, 250) == list(range(1, 251))
    assert await xranges(redis) - before == 3
    await put(redis, prefix, 251)
    assert await received(client, 1) == [251]  # and nothing twice
    await redis.aclose()


async def xranges(redis: Redis) -> int:
    """XRANGE calls Redis has run (the history script's reads count too)."""
    stats = await redis.info("commandstats")
    return int(stats.get("cmdstat_xrange", {}).get("calls", 0))
