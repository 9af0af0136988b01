"""An app's ``max_connections`` holds across every server node sharing a Redis (standalone,
Sentinel or Cluster): counted in one atomic script per connect, per-node counts that stop
counting once the node's heartbeat expires, refused with 4100 while Redis is away (fail
closed), and no Redis work at all per connect for an app without a limit."""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import websockets
from redis.asyncio import Redis

from tests.support.live import Client, StartServer, wait_for, write_apps
from tests.support.processes import RedisServer, ServerFactory
from tests.support.reliability import eventually, report

pytestmark = pytest.mark.redis
Connect = Callable[..., Awaitable[Client]]
LIMITED = {"id": "9", "key": "limited", "secret": "s", "max_connections": 100}
FREE = {"id": "8", "key": "free", "secret": "s"}


async def answer(url: str) -> tuple[int, websockets.ClientConnection | None]:
    """Connect: (0, the open socket) when established, else (the close code, None)."""
    ws = await websockets.connect(url)
    first = json.loads(await asyncio.wait_for(ws.recv(), 15))
    if first["event"] == "pusher:connection_established":
        return 0, ws
    assert first["event"] == "pusher:error", first
    code = json.loads(first["data"])["code"]
    with pytest.raises(websockets.ConnectionClosed) as closed:
        await asyncio.wait_for(ws.recv(), 15)
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == code
    return code, None


async def admitted(url: str) -> bool:
    """Connect once: True (and close) when established, False when refused."""
    code, ws = await answer(url)
    if ws is not None:
        await ws.close()
    return code == 0


@pytest.mark.parametrize("topology", ["redis_server", "redis_cluster", "redis_sentinel"])
async def test_the_connection_limit_holds_for_concurrent_connects_on_two_nodes(
    topology: str, start_server: StartServer, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """150 clients connect at once, half to each node, with max_connections = 100:
    exactly 100 are established, 50 are refused with 4004."""
    url = request.getfixturevalue(topology).url
    apps = write_apps(tmp_path / "apps.json", LIMITED)
    prefix = f"test-{secrets.token_hex(4)}"
    nodes = [await start_server(backend=url, redis_prefix=prefix, apps_file=apps) for _ in "ab"]
    for node in nodes:
        await wait_for(lambda n=node: n.node.ready, "the node to be ready")  # type: ignore[misc]

    answers = await asyncio.gather(*(answer(nodes[n % 2].app_url("limited")) for n in range(150)))
    codes = [code for code, _ in answers]
    opened = [ws for _, ws in answers if ws is not None]
    try:
        assert codes.count(0) == 100
        assert codes.count(4004) == 50
        report(f"connection_limit ({topology})", connects=150, limit=100, admitted=100)
        await opened.pop().close()  # a slot is free again, on whichever node

        async def takes_the_free_slot() -> bool:
            code, ws = await answer(nodes[0].app_url("limited"))
            if ws is not None:
                opened.append(ws)
            return code == 0

        await eventually(takes_the_free_slot, "the free slot")
        assert (await answer(nodes[1].app_url("limited")))[0] == 4004, "and only that one"
    finally:
        for ws in opened:
            ws.transport.abort()


async def test_connecting_costs_redis_nothing_without_a_limit_and_one_script_with_one(
    start_server: StartServer, redis_server: RedisServer, clients: Connect, tmp_path: Path
) -> None:
    apps = write_apps(tmp_path / "apps.json", LIMITED, FREE)
    prefix = f"test-{secrets.token_hex(4)}"
    live = await start_server(backend=redis_server.url, redis_prefix=prefix, apps_file=apps)
    redis = Redis.from_url(redis_server.url)

    async def scripts_run() -> int:
        stats = await redis.info("commandstats")
        return sum(stats.get(f"cmdstat_{name}", {}).get("calls", 0) for name in ("evalsha", "eval"))

    try:
        before = await scripts_run()
        for _ in range(20):
            await clients(live.app_url("free"))
        after_free = await scripts_run()
        for _ in range(20):
            await clients(live.app_url("limited"))
        after_limited = await scripts_run()
    finally:
        await redis.aclose()
    assert after_free == before, "an app without a limit runs no script per connect"
    assert after_limited - after_free >= 20


async def test_while_redis_is_away_a_limited_app_refuses_with_4100_and_others_connect(
    start_server: StartServer,
    redis_factory: Callable[[], RedisServer],
    clients: Connect,
    tmp_path: Path,
) -> None:
    """Fail closed: a connection that cannot be counted is refused with 4100 (pusher-js
    reconnects after a back-off), never admitted uncounted."""
    redis = redis_factory()
    apps = write_apps(tmp_path / "apps.json", LIMITED, FREE)
    live = await start_server(backend=redis.url, apps_file=apps, redis_prefix="fail-closed")
    await wait_for(lambda: live.node.ready, "the node to be ready")
    await clients(live.app_url("limited"))

    redis.kill()
    await wait_for(lambda: not live.node.ready, "the node to notice")
    assert (await answer(live.app_url("limited")))[0] == 4100
    assert (await clients(live.app_url("free"))).socket_id, "no limit: no Redis needed"

    redis.start()
    await wait_for(lambda: live.node.ready, "the node to reconnect", within=20)
    assert (await answer(live.app_url("limited")))[0] == 0


@pytest.mark.slow
async def test_a_sigkilled_nodes_connections_stop_counting_once_its_heartbeat_expires(
    server_factory: ServerFactory, redis_server: RedisServer, tmp_path: Path
) -> None:
    app = {**LIMITED, "max_connections": 3}
    apps = str(write_apps(tmp_path / "apps.json", app))
    args = ("--backend", redis_server.url, "--redis-prefix", f"test-{secrets.token_hex(4)}")
    args += ("--apps-file", apps, "--redis-node-ttl", "1", "--log-level", "warning")
    doomed, survivor = server_factory(*args), server_factory(*args)
    url = "/app/limited?protocol=7"
    held = [await Client.connect(doomed.ws_url + url) for _ in range(3)]
    assert (await answer(survivor.ws_url + url))[0] == 4004

    doomed.kill()  # SIGKILL: its counts stay in Redis until its heartbeat expires
    assert set(await asyncio.gather(*(c.closed_with() for c in held))) <= {None, 1006}

    await eventually(
        lambda: admitted(survivor.ws_url + url),
        "the dead node's connections to stop counting",
        within=15,
    )


@pytest.mark.parametrize("ws", [None, "websockets-sansio"], ids=["native", "asgi"])
async def test_a_connection_is_established_only_once_counted_and_subscribes_after(
    ws: str | None,
    start_server: StartServer,
    redis_server: RedisServer,
    tmp_path: Path,
) -> None:
    """On the native path and on the ASGI one, a subscribe sent right after the
    handshake waits for the count: established first, then the subscription."""
    apps = write_apps(tmp_path / "apps.json", {**LIMITED, "max_connections": 1})
    prefix = f"test-{secrets.token_hex(4)}"
    live = await start_server(ws=ws, backend=redis_server.url, redis_prefix=prefix, apps_file=apps)
    async with websockets.connect(live.app_url("limited")) as first:
        await first.send(json.dumps({"event": "pusher:subscribe", "data": {"channel": "early"}}))
        events = [json.loads(await asyncio.wait_for(first.recv(), 5))["event"] for _ in "ab"]
        assert events == ["pusher:connection_established", "pusher_internal:subscription_succeeded"]
        assert (await answer(live.app_url("limited")))[0] == 4004
