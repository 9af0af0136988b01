"""Channels over real sockets: private and presence auth, presence members, sign-in,
client events and resume from a position."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import websockets

from broadcaster.signing import channel_auth, user_auth
from tests.support.live import (
    APP_ID,
    KEY,
    SECRET,
    Client,
    LiveServer,
    StartServer,
    presence_fields,
    write_apps,
)

Connect = Callable[..., Awaitable[Client]]


async def sync(client: Client) -> None:
    """Wait until the server has handled everything ``client`` sent so far."""
    await client.send("pusher:ping")
    await client.expect("pusher:pong")


async def test_private_channel_accepts_a_valid_signature(
    live: LiveServer, clients: Connect
) -> None:
    client = await clients(live.app_url())
    auth = channel_auth(KEY, SECRET, client.socket_id, "private-agent.1")
    answer = await client.subscribe("private-agent.1", auth=auth)
    assert answer["event"] == "pusher_internal:subscription_succeeded"
    await live.node.publish(APP_ID, ["private-agent.1"], "step", '{"n":1}')
    event = await client.expect("step")
    assert event["data"] == {"n": 1}
    assert event["position"]


async def test_private_channel_refuses_forged_and_missing_auth(
    live: LiveServer, clients: Connect
) -> None:
    client = await clients(live.app_url())
    other = await clients(live.app_url())
    forgeries = [
        None,  # missing
        "nonsense",  # no key part
        channel_auth(KEY, "wrong-secret", client.socket_id, "private-a"),  # wrong secret
        channel_auth("other-key", SECRET, client.socket_id, "private-a"),  # wrong key
        channel_auth(KEY, SECRET, other.socket_id, "private-a"),  # another socket's auth
        channel_auth(KEY, SECRET, client.socket_id, "private-b"),  # another channel's auth
    ]
    for auth in forgeries:
        fields = {} if auth is None else {"auth": auth}
        answer = await client.subscribe("private-a", **fields)
        assert answer["event"] == "pusher:subscription_error", (auth, answer)
        assert answer["channel"] == "private-a"
        assert answer["data"]["code"] == 4009
        assert answer["data"]["status"] == 401
    await live.node.publish(APP_ID, ["private-a"], "secret", "x")
    await sync(client)  # nothing was delivered before the pong


async def test_presence_members_join_and_leave(live: LiveServer, clients: Connect) -> None:
    channel = "presence-agent.1"
    alice = await clients(live.app_url())
    answer = await alice.subscribe(channel, **presence_fields(alice, channel, "alice", name="A"))
    assert answer["data"]["presence"] == {
        "ids": ["alice"],
        "hash": {"alice": {"name": "A"}},
        "count": 1,
    }

    bob = await clients(live.app_url())
    answer = await bob.subscribe(channel, **presence_fields(bob, channel, "bob", name="B"))
    presence = answer["data"]["presence"]
    assert sorted(presence["ids"]) == ["alice", "bob"]
    assert presence["count"] == 2
    added = await alice.expect("pusher_internal:member_added")
    assert added["data"] == {"user_id": "bob", "user_info": {"name": "B"}}

    await bob.close()
    removed = await alice.expect("pusher_internal:member_removed")
    assert removed["data"] == {"user_id": "bob"}


@pytest.mark.parametrize("backend", ["memory", pytest.param("redis", marks=pytest.mark.redis)])
async def test_a_hundred_presence_members_closing_at_once_each_get_the_close_frame(
    start_server: StartServer, backend: str, request: pytest.FixtureRequest
) -> None:
    """Every member hears the others leave while it closes: the server still answers
    each close frame at once (1000), well within a client's close timeout (2 s here,
    websockets' default is 10 s), rather than the client giving up (1006). The members
    read what they are sent, as pusher-js does: a client that stops reading (websockets
    pauses once ``max_queue`` messages are unread) cannot read the close frame either."""
    url = "memory://" if backend == "memory" else request.getfixturevalue("redis_server").url
    live = await start_server(backend=url)
    channel = "presence-crowd"
    members = []
    for n in range(100):
        member = await Client.connect(live.app_url(), close_timeout=2)
        answer = await member.subscribe(channel, **presence_fields(member, channel, f"u{n}"))
        assert answer["event"] == "pusher_internal:subscription_succeeded"
        members.append(member)
    readers = [asyncio.create_task(read_all(m)) for m in members]
    await asyncio.gather(*(m.ws.close() for m in members))
    await asyncio.gather(*readers)
    codes = [m.ws.protocol.close_rcvd for m in members]
    assert [None if c is None else c.code for c in codes] == [1000] * 100


async def read_all(client: Client) -> None:
    with contextlib.suppress(websockets.ConnectionClosed):
        async for _ in client.ws:
            pass


async def test_second_connection_of_a_member_is_not_announced_twice(
    live: LiveServer, clients: Connect
) -> None:
    channel = "presence-room"
    watcher = await clients(live.app_url())
    await watcher.subscribe(channel, **presence_fields(watcher, channel, "w"))
    first = await clients(live.app_url())
    await first.subscribe(channel, **presence_fields(first, channel, "u"))
    await watcher.expect("pusher_internal:member_added")
    second = await clients(live.app_url())
    answer = await second.subscribe(channel, **presence_fields(second, channel, "u"))
    assert answer["data"]["presence"]["count"] == 2
    await first.close()  # "u" still has a connection: no member_removed
    await second.send("pusher:unsubscribe", {"channel": channel})
    removed = await watcher.expect("pusher_internal:member_removed")
    assert removed["data"] == {"user_id": "u"}


async def test_presence_needs_valid_channel_data_and_room(
    start_server: StartServer, clients: Connect, tmp_path: Path
) -> None:
    app = {"id": APP_ID, "key": KEY, "secret": SECRET, "max_presence_members": 1}
    live = await start_server(apps_file=write_apps(tmp_path / "apps.json", app))
    channel = "presence-small"
    first = await clients(live.app_url())
    await first.subscribe(channel, **presence_fields(first, channel, "one"))
    second = await clients(live.app_url())
    answer = await second.subscribe(channel, **presence_fields(second, channel, "two"))
    assert answer["event"] == "pusher:subscription_error"
    assert answer["data"]["code"] == 4307
    bad = json.dumps({"user_info": {}})  # no user_id
    auth = channel_auth(KEY, SECRET, second.socket_id, channel, bad)
    answer = await second.subscribe(channel, auth=auth, channel_data=bad)
    assert answer["data"]["code"] == 4306


async def test_signin_with_a_valid_signature(live: LiveServer, clients: Connect) -> None:
    client = await clients(live.app_url())
    user_data = json.dumps({"id": "user-1", "user_info": {"name": "U"}})
    auth = user_auth(KEY, SECRET, client.socket_id, user_data)
    await client.send("pusher:signin", {"auth": auth, "user_data": user_data})
    success = await client.expect("pusher:signin_success")
    assert success["data"]["user_data"] == user_data


async def test_signin_with_a_forged_signature_closes_with_4009(
    live: LiveServer, clients: Connect
) -> None:
    client = await clients(live.app_url())
    user_data = json.dumps({"id": "user-1"})
    auth = user_auth(KEY, "not-the-secret", client.socket_id, user_data)
    await client.send("pusher:signin", {"auth": auth, "user_data": user_data})
    error = await client.expect("pusher:error")
    assert error["data"]["code"] == 4009
    assert await client.closed_with() == 4009


async def test_a_second_subscribe_to_a_subscribed_channel_never_contradicts_the_first(
    live: LiveServer, clients: Connect
) -> None:
    """A second subscribe with a wrong auth once got a second subscription_succeeded and
    then subscription_error 4009, while the channel stayed subscribed: the client was
    told both. The subscription stands, so the answer is succeeded again."""
    client = await clients(live.app_url())
    auth = channel_auth(KEY, SECRET, client.socket_id, "private-d")
    assert (await client.subscribe("private-d", auth=auth))["event"] == (
        "pusher_internal:subscription_succeeded"
    )
    again = await client.subscribe("private-d", auth="wrong:signature")
    assert again["event"] == "pusher_internal:subscription_succeeded"
    await live.node.publish(APP_ID, ["private-d"], "e", "{}")
    assert (await client.recv())["event"] == "e"  # nothing else came between


async def test_a_connection_signs_in_as_one_user(live: LiveServer, clients: Connect) -> None:
    """Signing in again as another user is refused (4009, the connection stays as the
    first user): its #server-to-user subscription would otherwise outlive that user,
    and terminate_connections for the first user would miss it. The same user again is
    fine."""
    client = await clients(live.app_url())

    async def signin(user_id: str) -> dict[str, object]:
        user_data = json.dumps({"id": user_id})
        auth = user_auth(KEY, SECRET, client.socket_id, user_data)
        await client.send("pusher:signin", {"auth": auth, "user_data": user_data})
        return await client.recv()

    assert (await signin("alice"))["event"] == "pusher:signin_success"
    assert (await client.subscribe("#server-to-user-alice"))["event"].endswith("succeeded")
    refused = await signin("carol")
    assert refused["event"] == "pusher:error"
    assert refused["data"]["code"] == 4009  # type: ignore[index]
    assert "signed in as 'alice'" in refused["data"]["message"]  # type: ignore[index]
    assert (await signin("alice"))["event"] == "pusher:signin_success"
    denied = await client.subscribe("#server-to-user-carol")
    assert denied["event"] == "pusher:subscription_error"
    await sync(client)  # still open


async def test_client_events_are_off_by_default(live: LiveServer, clients: Connect) -> None:
    client = await clients(live.app_url())
    auth = channel_auth(KEY, SECRET, client.socket_id, "private-chat")
    await client.subscribe("private-chat", auth=auth)
    await client.send("client-typing", {"who": "me"}, channel="private-chat")
    error = await client.expect("pusher:error")
    assert error["data"]["code"] == 4305


async def test_client_events_reach_others_but_not_the_sender(
    start_server: StartServer, clients: Connect
) -> None:
    live = await start_server(enable_client_messages=True)
    channel = "presence-chat"
    sender = await clients(live.app_url())
    await sender.subscribe(channel, **presence_fields(sender, channel, "s"))
    receiver = await clients(live.app_url())
    await receiver.subscribe(channel, **presence_fields(receiver, channel, "r"))
    await sender.expect("pusher_internal:member_added")

    await sender.send("client-typing", {"who": "s"}, channel=channel)
    event = await receiver.expect("client-typing")
    assert event["data"] == {"who": "s"}
    assert event["user_id"] == "s"
    await sync(sender)  # the sender got nothing but its pong

    await sender.send("client-x", {}, channel="public-room")
    assert (await sender.expect("pusher:error"))["data"]["code"] == 4305


async def test_client_events_over_the_rate_limit_get_4301(
    start_server: StartServer, clients: Connect, tmp_path: Path
) -> None:
    app = {
        "id": APP_ID,
        "key": KEY,
        "secret": SECRET,
        "enable_client_messages": True,
        "client_event_rate_limit": 3,
    }
    live = await start_server(apps_file=write_apps(tmp_path / "apps.json", app))
    client = await clients(live.app_url())
    await client.subscribe(
        "private-c", auth=channel_auth(KEY, SECRET, client.socket_id, "private-c")
    )
    for _ in range(20):
        await client.send("client-spam", {}, channel="private-c")
    await client.send("pusher:ping")
    codes = []
    while (message := await client.recv())["event"] != "pusher:pong":  # still connected
        codes.append(message["data"]["code"])
    assert codes
    assert set(codes) == {4301}


async def test_resume_sends_missed_publications_then_live_ones(
    live: LiveServer, clients: Connect
) -> None:
    channel = "agent.resume"
    first = await clients(live.app_url())
    await first.subscribe(channel)
    await live.node.publish(APP_ID, [channel], "e1", "1")
    seen = (await first.expect("e1"))["position"]
    for n in (2, 3):
        await live.node.publish(APP_ID, [channel], f"e{n}", str(n))
    await first.close()

    again = await clients(live.app_url())
    answer = await again.subscribe(channel, position=seen)
    assert answer["event"] == "pusher_internal:subscription_succeeded"
    assert [(await again.recv())["event"] for _ in range(2)] == ["e2", "e3"]
    result = await again.expect("broadcaster:resume")
    assert result["data"]["recovered"] is True
    await live.node.publish(APP_ID, [channel], "e4", "4")
    assert (await again.expect("e4"))["data"] == 4


async def test_resume_from_an_unknown_epoch_is_not_recovered(
    live: LiveServer, clients: Connect
) -> None:
    client = await clients(live.app_url())
    await live.node.publish(APP_ID, ["agent.r"], "e1", "1")
    answer = await client.subscribe("agent.r", position="gone-epoch:1")
    assert answer["event"] == "pusher_internal:subscription_succeeded"
    result = await client.expect("broadcaster:resume")
    assert result["data"]["recovered"] is False
    assert result["data"]["position"]


async def test_server_to_user_channel_is_only_for_that_signed_in_user(
    live: LiveServer, clients: Connect
) -> None:
    client = await clients(live.app_url())
    answer = await client.subscribe("#server-to-user-u1")
    assert answer["event"] == "pusher:subscription_error"
    assert answer["data"]["code"] == 4009
    user_data = json.dumps({"id": "u1"})
    auth = user_auth(KEY, SECRET, client.socket_id, user_data)
    await client.send("pusher:signin", {"auth": auth, "user_data": user_data})
    await client.expect("pusher:signin_success")
    answer = await client.subscribe("#server-to-user-u1")
    assert answer["event"] == "pusher_internal:subscription_succeeded"
    assert (await client.subscribe("#server-to-user-u2"))["data"]["code"] == 4009


async def test_a_connection_has_at_most_max_channels_per_connection(
    start_server: StartServer, clients: Callable[..., Awaitable[Client]], tmp_path: Path
) -> None:
    apps = write_apps(
        tmp_path / "apps.json",
        {"id": "1", "key": KEY, "secret": SECRET, "max_channels_per_connection": 3},
    )
    live = await start_server(apps_file=apps)
    client = await clients(live.app_url())
    for n in range(3):
        assert (await client.subscribe(f"c{n}"))["event"].endswith("subscription_succeeded")
    refused = await client.subscribe("c3")
    assert refused["event"] == "pusher:subscription_error"
    assert refused["data"]["code"] == 4308
    assert "max_channels_per_connection" in refused["data"]["error"]
    again = await client.subscribe("c0")  # re-subscribing to a channel it has is fine
    assert again["event"].endswith("subscription_succeeded")
    await client.send("pusher:unsubscribe", {"channel": "c0"})
    assert (await client.subscribe("c3"))["event"].endswith("subscription_succeeded")
