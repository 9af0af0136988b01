"""The fast path (raw frames to uvicorn's transport) and the ASGI fallback behave alike,
and resume joins history and live publications without duplicate or gap."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from broadcaster.backends.base import HistoryResult
from broadcaster.backends.memory import MemoryBackend
from broadcaster.connection import AsgiConnection, Connection
from broadcaster.publication import Position, Publication
from tests.support.live import APP_ID, Client, StartServer

Connect = Callable[..., Awaitable[Client]]


@pytest.mark.parametrize(
    ("ws", "kind"),
    [(None, Connection), ("websockets-sansio", AsgiConnection)],
)
async def test_each_websocket_implementation_delivers_in_order(
    start_server: StartServer, clients: Connect, ws: str | None, kind: type[Connection]
) -> None:
    live = await start_server(ws=ws)
    client = await clients(live.app_url())
    assert type(live.node.connections[client.socket_id]) is kind
    await client.subscribe("agent.order")
    for n in range(50):
        await live.node.publish(APP_ID, ["agent.order"], "n", str(n))
    assert [(await client.expect("n"))["data"] for _ in range(50)] == list(range(50))
    live.node.connections[client.socket_id].close(4200, "bye")
    assert await client.closed_with() == 4200


async def test_fallback_closes_slow_consumers_with_4100(
    start_server: StartServer, clients: Connect
) -> None:
    live = await start_server(ws="websockets-sansio", max_buffer_bytes=4096)
    client = await clients(live.app_url())
    await client.subscribe("agent.big")
    for _ in range(10):  # delivered within one tick: more than 4 KiB waits unsent
        live.node.hub.deliver(Publication(APP_ID, "agent.big", "chunk", "x" * 1000))
    assert await client.closed_with() == 4100


class RacingBackend(MemoryBackend):
    """A memory backend where a publication lands while a resuming subscriber's history
    is being read: it is both delivered live and part of the history returned."""

    async def history(
        self, app_id: str, channel: str, since: Position, limit: int | None = None
    ) -> HistoryResult:
        await self.publish(Publication(app_id, channel, "during", '"racing"'))
        return await super().history(app_id, channel, since, limit)


async def test_resume_has_no_duplicate_and_no_gap_at_the_seam(
    start_server: StartServer, clients: Connect
) -> None:
    live = await start_server(backend_object=RacingBackend())
    channel = "agent.seam"
    first = await clients(live.app_url())
    await first.subscribe(channel)
    await live.node.publish(APP_ID, [channel], "before", "0")
    seen = (await first.expect("before"))["position"]
    await live.node.publish(APP_ID, [channel], "missed", "1")

    again = await clients(live.app_url())
    answer = await again.subscribe(channel, position=seen)
    assert answer["event"] == "pusher_internal:subscription_succeeded"
    events = [(await again.recv())["event"] for _ in range(3)]
    assert events == ["missed", "during", "broadcaster:resume"]
    await live.node.publish(APP_ID, [channel], "after", "2")
    assert (await again.recv())["event"] == "after"  # "during" was not sent twice
