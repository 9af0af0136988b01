"""``/app/{key}`` served natively by the fast-path protocol: no task per idle connection,
commands answered in the order sent, and a connection lost mid-command cleaned up."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

import pytest
import websockets

from broadcaster.backends.memory import MemoryBackend
from tests.support.live import APP_ID, Client, StartServer, wait_for

Connect = Callable[..., Awaitable[Client]]


class GatedBackend(MemoryBackend):
    """A memory backend whose channel subscriptions wait until ``gate`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.waiting = 0

    async def subscribe(self, app_id: str, channel: str) -> None:
        self.waiting += 1
        await self.gate.wait()
        await super().subscribe(app_id, channel)


async def test_idle_connections_hold_no_server_task(
    start_server: StartServer, clients: Connect
) -> None:
    live = await start_server()
    opened = [await clients(live.app_url()) for _ in range(20)]
    for client in opened[:10]:
        assert (await client.subscribe(f"agent.idle-{client.socket_id}"))["event"].endswith(
            "subscription_succeeded"
        )
    await wait_for(lambda: not live.server.server_state.tasks, "the subscribe tasks to end")
    assert len(live.node.connections) == 20


async def test_commands_sent_without_waiting_are_answered_in_order(
    start_server: StartServer, clients: Connect
) -> None:
    live = await start_server()
    client = await clients(live.app_url())
    for event, data in [
        ("pusher:subscribe", {"channel": "agent.a"}),
        ("pusher:ping", {}),
        ("pusher:unsubscribe", {"channel": "agent.a"}),
        ("pusher:subscribe", {"channel": "agent.b"}),
        ("pusher:bogus", {}),
        ("pusher:subscribe", {"channel": "agent.c"}),
    ]:
        await client.send(event, data)
    answers = [await client.recv() for _ in range(5)]
    assert [(m["event"], m.get("channel")) for m in answers] == [
        ("pusher_internal:subscription_succeeded", "agent.a"),
        ("pusher:pong", None),
        ("pusher_internal:subscription_succeeded", "agent.b"),
        ("pusher:error", None),
        ("pusher_internal:subscription_succeeded", "agent.c"),
    ]
    await live.node.publish(APP_ID, ["agent.a", "agent.b"], "e", '"x"')
    assert (await client.expect("e"))["channel"] == "agent.b"  # agent.a was left


async def test_connection_lost_during_a_subscribe_leaves_nothing_behind(
    start_server: StartServer,
) -> None:
    backend = GatedBackend()
    live = await start_server(backend_object=backend)
    ws = await websockets.connect(live.app_url())
    await ws.recv()
    await ws.send(json.dumps({"event": "pusher:subscribe", "data": {"channel": "agent.slow"}}))
    await ws.send(json.dumps({"event": "pusher:subscribe", "data": {"channel": "agent.next"}}))
    await wait_for(lambda: backend.waiting == 1, "the subscription to wait on the backend")
    ws.transport.abort()
    backend.gate.set()
    await wait_for(lambda: not live.node.connections, "the connection to be forgotten")
    await wait_for(lambda: live.node.hub.channels() == 0, "the channels to be left")
    assert await live.node.channel_counts(APP_ID) == {}


async def test_text_that_is_not_utf8_closes_with_1007(start_server: StartServer) -> None:
    live = await start_server()
    async with websockets.connect(live.app_url()) as ws:
        await ws.recv()
        # A text frame with bytes that are not UTF-8 (the client library would refuse).
        await ws.send(b"\xff\xfe", text=True)
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), 5)
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == 1007
    await wait_for(lambda: not live.node.connections, "the connection to be forgotten")
