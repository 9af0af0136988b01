"""Several nodes on one Redis: delivery, socket_id exclusion and presence across nodes,
and readiness while Redis is lost and back."""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

import httpx
import pusher
import pytest

from broadcaster.signing import channel_auth
from tests.support.live import APP_ID, KEY, SECRET, Client, LiveServer, StartServer
from tests.support.processes import RedisServer, ServerFactory

pytestmark = pytest.mark.redis

Connect = Callable[..., Awaitable[Client]]


def sdk(url: str) -> pusher.Pusher:
    parts = urlsplit(url)
    return pusher.Pusher(
        app_id=APP_ID, key=KEY, secret=SECRET, host=parts.hostname, port=parts.port, ssl=False
    )


async def two_nodes(start_server: StartServer, redis: RedisServer) -> tuple[LiveServer, LiveServer]:
    prefix = f"test-{secrets.token_hex(4)}"  # a namespace of its own on the shared Redis
    first = await start_server(backend=redis.url, redis_prefix=prefix)
    second = await start_server(backend=redis.url, redis_prefix=prefix)
    return first, second


async def test_socket_id_is_excluded_on_every_node(
    start_server: StartServer, redis_server: RedisServer, clients: Connect
) -> None:
    a, b = await two_nodes(start_server, redis_server)
    publisher = await clients(a.app_url())
    watcher = await clients(b.app_url())
    for client in (publisher, watcher):
        await client.subscribe("agent.x")
    await asyncio.to_thread(sdk(b.url).trigger, "agent.x", "mine", "1", publisher.socket_id)
    await asyncio.to_thread(sdk(b.url).trigger, "agent.x", "next", "2")
    assert (await watcher.expect("mine"))["data"] == 1
    assert (await publisher.expect("next"))["data"] == 2  # "mine" never reached it


async def test_presence_members_are_shared_between_nodes(
    start_server: StartServer, redis_server: RedisServer, clients: Connect
) -> None:
    a, b = await two_nodes(start_server, redis_server)
    channel = "presence-team"

    async def join(node: LiveServer, user: str) -> tuple[Client, dict[str, object]]:
        client = await clients(node.app_url())
        data = json.dumps({"user_id": user})
        auth = channel_auth(KEY, SECRET, client.socket_id, channel, data)
        return client, await client.subscribe(channel, auth=auth, channel_data=data)

    alice, _ = await join(a, "alice")
    bob, answer = await join(b, "bob")
    assert sorted(answer["data"]["presence"]["ids"]) == ["alice", "bob"]  # type: ignore[index]
    added = await alice.expect("pusher_internal:member_added")
    assert added["data"]["user_id"] == "bob"
    users = await asyncio.to_thread(sdk(a.url).users_info, channel)
    assert sorted(u["id"] for u in users["users"]) == ["alice", "bob"]
    await bob.close()
    removed = await alice.expect("pusher_internal:member_removed")
    assert removed["data"] == {"user_id": "bob"}


async def test_ready_follows_redis_and_delivery_resumes_after_restart(
    start_server: StartServer, redis_factory: Callable[[], RedisServer], clients: Connect
) -> None:
    redis = redis_factory()
    live = await start_server(backend=redis.url)
    client = await clients(live.app_url())
    await client.subscribe("agent.r")

    async def ready() -> int:
        async with httpx.AsyncClient(base_url=live.url) as http:
            return (await http.get("/ready")).status_code

    async def becomes(status: int) -> None:
        for _ in range(400):  # up to about 20 s
            if await ready() == status:
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"/ready never answered {status}")

    await becomes(200)
    redis.kill()
    await becomes(503)
    async with httpx.AsyncClient(base_url=live.url) as http:
        assert (await http.get("/up")).status_code == 200  # the node stays up
    await client.send("pusher:ping")
    await client.expect("pusher:pong")  # and so do its clients
    redis.start()
    await becomes(200)
    await asyncio.to_thread(sdk(live.url).trigger, "agent.r", "back", "1")
    assert (await client.expect("back"))["data"] == 1


def test_two_server_processes_deliver_events_published_on_either(
    server_factory: ServerFactory, redis_factory: Callable[[], RedisServer]
) -> None:
    redis = redis_factory()
    servers = [server_factory("--backend", redis.url) for _ in range(2)]
    for server in servers:
        server.wait_ready()

    async def scenario() -> None:
        clients = [await Client.connect(f"{s.ws_url}/app/{KEY}?protocol=7") for s in servers]
        try:
            for client in clients:
                await client.subscribe("agent.both")
            for n, server in enumerate(servers):
                await asyncio.to_thread(sdk(server.url).trigger, "agent.both", f"from{n}", "{}")
                for client in clients:
                    assert (await client.expect(f"from{n}"))["channel"] == "agent.both"
        finally:
            for client in clients:
                await client.close()

    asyncio.run(scenario())
