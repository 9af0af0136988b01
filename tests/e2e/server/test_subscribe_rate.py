"""Subscribes are rate limited per connection (4309, as ``pusher:subscription_error``
with status 429): a client subscribes to all its channels at once, then at most
``subscription_rate_limit`` a second. Unlimited, one presence member cycling
subscribe and unsubscribe sent every other member a member_added and a
member_removed per cycle, 80 times the bytes it sent."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from broadcaster.signing import channel_auth
from tests.support.live import KEY, SECRET, Client, StartServer, write_apps

Connect = Callable[..., Awaitable[Client]]


async def answers_until_pong(client: Client) -> list[dict[str, Any]]:
    """Everything ``client`` receives before the answer to a ping sent now."""
    await client.send("pusher:ping")
    received = []
    while (message := await client.recv())["event"] != "pusher:pong":
        received.append(message)
    return received


async def test_subscribes_over_the_rate_are_refused_until_the_bucket_refills(
    start_server: StartServer, clients: Connect, tmp_path: Path
) -> None:
    app = {
        "id": "1",
        "key": KEY,
        "secret": SECRET,
        "max_channels_per_connection": 3,
        "subscription_rate_limit": 2,
    }
    live = await start_server(apps_file=write_apps(tmp_path / "apps.json", app))
    client = await clients(live.app_url())
    for _ in range(20):
        await client.send("pusher:subscribe", {"channel": "c"})
        await client.send("pusher:unsubscribe", {"channel": "c"})
    answers = await answers_until_pong(client)  # the connection stays open
    succeeded = [a for a in answers if a["event"] == "pusher_internal:subscription_succeeded"]
    refused = [a for a in answers if a["event"] == "pusher:subscription_error"]
    assert 5 <= len(succeeded) <= 7, answers  # the burst: 3 channels + 2 a second
    assert len(refused) == 20 - len(succeeded)
    assert refused[0]["channel"] == "c"
    assert refused[0]["data"]["code"] == 4309
    assert refused[0]["data"]["status"] == 429
    assert refused[0]["data"]["type"] == "LimitReached"
    assert "subscription_rate_limit" in refused[0]["data"]["error"]
    await asyncio.sleep(1.1)  # two more subscribes' worth
    again = await client.subscribe("c")
    assert again["event"] == "pusher_internal:subscription_succeeded"
    # Over the rate, a subscribe to a channel it has gets a pusher:error (no channel):
    # an error about the channel would contradict its subscription, which stands.
    for _ in range(10):
        await client.send("pusher:subscribe", {"channel": "c"})
    answers = await answers_until_pong(client)
    errors = [a for a in answers if a["event"] == "pusher:error"]
    assert errors
    assert {e["data"]["code"] for e in errors} == {4309}
    assert "which this connection has, was ignored" in errors[0]["data"]["message"]
    assert not [a for a in answers if a["event"] == "pusher:subscription_error"]


async def test_a_presence_member_cannot_flood_the_others_with_joins_and_leaves(
    start_server: StartServer, clients: Connect
) -> None:
    """400 subscribe/unsubscribe cycles in a burst: the other member hears at most the
    burst (128 channels + 10) plus 10 a second of joins, not 400."""
    live = await start_server()
    channel = "presence-room"
    observer = await clients(live.app_url())
    data = json.dumps({"user_id": "observer"})
    auth = channel_auth(KEY, SECRET, observer.socket_id, channel, data)
    joined = await observer.subscribe(channel, auth=auth, channel_data=data)
    assert joined["event"] == "pusher_internal:subscription_succeeded"
    attacker = await clients(live.app_url())
    data = json.dumps({"user_id": "attacker"})
    auth = channel_auth(KEY, SECRET, attacker.socket_id, channel, data)
    started = time.monotonic()
    for _ in range(400):
        await attacker.send(
            "pusher:subscribe", {"channel": channel, "auth": auth, "channel_data": data}
        )
        await attacker.send("pusher:unsubscribe", {"channel": channel})
    answers = await answers_until_pong(attacker)
    elapsed = time.monotonic() - started
    refused = [a for a in answers if a["event"] == "pusher:subscription_error"]
    assert refused, "no subscribe was refused"
    assert {a["data"]["code"] for a in refused} == {4309}
    notices = await answers_until_pong(observer)
    joins = [n for n in notices if n["event"] == "pusher_internal:member_added"]
    assert len(joins) == 400 - len(refused)
    assert len(joins) <= 138 + 10 * elapsed + 1, f"{len(joins)} joins in {elapsed:.2f} s"
