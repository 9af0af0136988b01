"""End to end with the clients people use: pusher-js (in Node) subscribes to a public, a
private and a presence channel of a real server process, and the official ``pusher``
Python SDK publishes to them."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import pusher
import pytest

from broadcaster.signing import channel_auth
from tests.support.live import APP_ID, KEY, SECRET, Client
from tests.support.node import NodeClient
from tests.support.processes import ServerFactory, ServerProcess

pytestmark = pytest.mark.node

CHANNELS = ("agent.e2e", "private-agent.e2e", "presence-agent.e2e")


@pytest.fixture
def node_client(server_factory: ServerFactory) -> Iterator[tuple[ServerProcess, NodeClient]]:
    server = server_factory()
    client = NodeClient(server, CHANNELS)
    yield server, client
    client.stop()


def event_on(channel: str) -> Callable[[dict[str, Any]], bool]:
    return lambda record: record["type"] == "event" and record["channel"] == channel


def sdk(server: ServerProcess) -> pusher.Pusher:
    url = urlsplit(server.url)
    return pusher.Pusher(
        app_id=APP_ID, key=KEY, secret=SECRET, host=url.hostname, port=url.port, ssl=False
    )


def test_pusher_js_receives_events_published_with_the_python_sdk(
    node_client: tuple[ServerProcess, NodeClient],
) -> None:
    server, client = node_client
    client.wait_for(lambda r: r["type"] == "connected", "a connection")
    subscribed = {}
    for _ in CHANNELS:
        record = client.wait_for(lambda r: r["type"] == "subscribed", "a subscription")
        subscribed[record["channel"]] = record
    assert set(subscribed) == set(CHANNELS)
    assert subscribed["presence-agent.e2e"]["members"] == ["node-user"]

    publisher = sdk(server)
    for n, channel in enumerate(CHANNELS):
        publisher.trigger(channel, "agent.step", {"n": n})
    for n, channel in enumerate(CHANNELS):
        record = client.wait_for(event_on(channel), f"the event on {channel}")
        assert record["event"] == "agent.step"
        assert record["data"] == {"n": n}


def test_pusher_js_signs_in_and_receives_events_sent_to_its_user(
    node_client: tuple[ServerProcess, NodeClient],
) -> None:
    server, client = node_client
    client.wait_for(lambda r: r["type"] == "signed_in", "the sign-in")
    client.wait_for(lambda r: r["type"] == "user_channel", "the #server-to-user channel")
    sdk(server).send_to_user("node-user", "notice", {"hello": "you"})
    record = client.wait_for(lambda r: r["type"] == "user_event", "the event sent to the user")
    assert record["event"] == "notice"
    assert record["data"] == {"hello": "you"}


def test_pusher_js_sees_presence_members_come_and_go(
    node_client: tuple[ServerProcess, NodeClient],
) -> None:
    server, client = node_client
    channel = "presence-agent.e2e"
    client.wait_for(lambda r: r["type"] == "subscribed" and r["channel"] == channel, "presence")

    async def visit() -> None:
        visitor = await Client.connect(f"{server.ws_url}/app/{KEY}?protocol=7")
        data = json.dumps({"user_id": "visitor", "user_info": {"name": "V"}})
        auth = channel_auth(KEY, SECRET, visitor.socket_id, channel, data)
        answer = await visitor.subscribe(channel, auth=auth, channel_data=data)
        assert sorted(answer["data"]["presence"]["ids"]) == ["node-user", "visitor"]
        added = client.wait_for
        await asyncio.to_thread(
            added, lambda r: r.get("event") == "pusher:member_added", "member_added"
        )
        await visitor.close()

    asyncio.run(visit())
    removed = client.wait_for(lambda r: r.get("event") == "pusher:member_removed", "removal")
    assert removed["data"]["id"] == "visitor"
