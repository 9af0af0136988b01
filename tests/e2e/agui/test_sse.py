"""Server-sent events: session and channel streams with history positions as ids,
Last-Event-ID resume with no gap and no duplicate, heartbeats, authorization, errors."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from collections.abc import Awaitable, Callable

import httpx
import jsonschema
import pytest

from agent_core.app.demo import session_token as demo_session_token
from broadcaster._frames import PreparedMessage
from broadcaster.connection import Delivery
from broadcaster.envelope import json_schema
from broadcaster.publication import Position
from broadcaster.sessions import session_token, stream_auth
from broadcaster.settings import AppConfig
from broadcaster.signing import sign
from broadcaster.sse import (
    FeedConnection,
    FeedItem,
    decode,
    encode_event,
)
from tests.support.live import KEY, SECRET, Client, LiveServer, StartServer
from tests.support.processes import RedisServer, ServerProcess
from tests.support.runs import read_run, start_run, subscribe
from tests.support.sse import SseEvent, SseReader, is_final, read_until_final, sse

VALIDATOR = jsonschema.Draft202012Validator(json_schema())
Connect = Callable[..., Awaitable[Client]]
APP = AppConfig(id="1", key=KEY, secret=SECRET)


def offsets(events: list[SseEvent]) -> list[int]:
    return [Position.parse(e.id or "").offset for e in events]


async def wait_until_stored(live: LiveServer, state_url: str, token: str | None = None) -> None:
    params = {} if token is None else {"token": token}
    async with httpx.AsyncClient() as http:
        for _ in range(500):
            if (await http.get(f"{live.url}{state_url}", params=params)).status_code == 200:
                return
            await asyncio.sleep(0.02)
    raise TimeoutError("the run did not finish")


# -- wire format ----------------------------------------------------------------------


def test_an_event_has_its_position_as_id_its_name_and_one_data_line_per_line() -> None:
    item = FeedItem("agent.status", '{"a":1}\nsecond\r\nthird', "ep:7")
    assert encode_event(item) == (
        b'id: ep:7\nevent: agent.status\ndata: {"a":1}\ndata: second\ndata: third\n\n'
    )


def test_an_event_without_position_has_no_id_and_no_line_break_in_its_name() -> None:
    assert encode_event(FeedItem("client-x\nevil", "d")) == b"event: client-x evil\ndata: d\n\n"


def test_decode_reads_the_hub_message() -> None:
    payload = b'{"event":"e","channel":"c","data":"{\\"x\\":1}","position":"ep:3"}'
    assert decode(PreparedMessage(payload)) == FeedItem("e", '{"x":1}', "ep:3")


def test_the_session_token_is_the_one_the_demo_hands_out() -> None:
    assert session_token(APP, "s-1", "n") == demo_session_token(APP, "s-1", "n")


async def test_a_feed_over_its_byte_limit_ends_as_a_slow_consumer() -> None:
    ended: list[object] = []
    conn = FeedConnection(APP, Delivery(4096, on_slow_consumer=ended.append))
    message = PreparedMessage(b"x" * 1500)
    conn.send(message)
    conn.send(message)
    assert [len(m) for m in await conn.take(1)] == [1500, 1500]
    for _ in range(3):
        conn.send(message)
    assert conn.ended is not None
    assert "slow consumer" in conn.ended
    assert ended == [conn]
    assert await conn.take(1) == []


# -- session streams ------------------------------------------------------------------


async def test_a_session_stream_carries_the_run_as_the_websocket_does(
    start_server: StartServer, clients: Connect
) -> None:
    live = await start_server(demo=True)
    run = await start_run(live.url, trace=True)
    client = await clients(live.app_url())
    await subscribe(client, run["channel"], run["position"])
    url = f"{live.url}/api/sessions/{run['session_id']}/events?since={run['position']}"
    async with sse(url) as reader:
        received = [await reader.events()]
        # The resume notice follows the history: before the final status if the run was
        # still going when the stream opened, after it if the run had already ended.
        while not (
            any(is_final(e) for e in received)
            and any(e.event == "broadcaster:resume" for e in received)
        ):
            received.append(await reader.events())
    websocket = await read_run(client)
    events = [e for e in received if e.event.startswith("agent.")]
    [resume] = [e for e in received if e.event == "broadcaster:resume"]

    for event in events:
        VALIDATOR.validate(event.json)
        assert event.json["type"] == event.event
    assert [(e.id, e.event, e.json["payload"]) for e in events] == websocket
    first = offsets(events)[0]
    assert offsets(events) == list(range(first, first + len(events)))
    assert resume.event == "broadcaster:resume"
    assert resume.id is None
    assert json.loads(resume.data)["recovered"] is True


async def sse_drop_and_resume(live: LiveServer, client: Client) -> None:
    """One SSE stream drops after a few events and reconnects with Last-Event-ID; a
    WebSocket client reads the same run whole. Both end with the same sequence."""
    run = await start_run(live.url, pace_ms=15, trace=True)
    await subscribe(client, run["channel"], run["position"])
    url = f"{live.url}/api/sessions/{run['session_id']}/events"
    async with sse(f"{url}?since={run['position']}") as reader:
        before = await read_until_final(reader, stop_after=5)
    assert not any(
        e.event == "agent.status" and e.json["payload"]["status"] != "in_progress" for e in before
    ), "the run must still be going when the stream drops"
    async with sse(url, headers={"Last-Event-ID": before[-1].id or ""}) as reader:
        after = await read_until_final(reader)
    everything = await read_run(client)

    ids = [e.id for e in before + after]
    assert len(ids) == len(set(ids)), "no duplicate"
    assert ids == [position for position, _, _ in everything], "no gap"
    assert [(e.event, e.json["payload"]) for e in before + after] == [
        (kind, payload) for _, kind, payload in everything
    ]


async def test_a_dropped_stream_resumes_with_last_event_id_memory(
    start_server: StartServer, clients: Connect
) -> None:
    live = await start_server(demo=True)
    await sse_drop_and_resume(live, await clients(live.app_url()))


@pytest.mark.redis
async def test_a_dropped_stream_resumes_with_last_event_id_redis(
    start_server: StartServer, clients: Connect, redis_server: RedisServer
) -> None:
    live = await start_server(demo=True, backend=redis_server.url, redis_prefix="sse-resume")
    await sse_drop_and_resume(live, await clients(live.app_url()))


async def test_a_stream_opened_while_publishing_misses_nothing_and_repeats_nothing(
    live: LiveServer,
) -> None:
    node = live.node
    start = await node.backend.position("1", "busy")
    total = 60

    async def publish() -> None:
        for n in range(total):
            await node.publish("1", ["busy"], "tick", json.dumps({"n": n}))
            await asyncio.sleep(0)

    publisher = asyncio.create_task(publish())
    async with sse(f"{live.url}/api/channels/busy/events?since={start}") as reader:
        got = []
        while len(got) < total:
            event = await reader.events()
            if event.event == "tick":
                got.append(event)
    await publisher
    assert [e.json["n"] for e in got] == list(range(total))
    assert offsets(got) == list(range(start.offset + 1, start.offset + total + 1))


async def ended_after_redis_died(redis: RedisServer, reader: SseReader) -> str:
    """Kill ``redis``, start it again empty, and return the comment that ended the
    stream (an ``AssertionError`` if heartbeats went on for 20 s and nothing ended it)."""
    redis.kill()
    redis.start()
    rest: list[SseEvent] = []
    with contextlib.suppress(EOFError, TimeoutError):
        async with asyncio.timeout(20):
            while True:
                rest.append(await reader.next(within=30))
    ended = [e.comment for e in rest if e.comment and e.comment.startswith("ended:")]
    assert ended, rest
    return ended[0]


@pytest.mark.redis
async def test_a_stream_whose_redis_died_ends_and_its_resume_is_told_the_truth(
    start_server: StartServer, redis_factory: Callable[[], RedisServer]
) -> None:
    """A Redis that died may have acknowledged a publication this node never got, and
    the restarted (empty) one cannot show it: the open stream ends with a comment
    (EventSource reconnects with Last-Event-ID) and the resume says ``recovered:
    false``, rather than the stream going on past a possible hole. Nothing is
    published after the restart: the stream must not wait for a next publication."""
    redis = redis_factory()
    live = await start_server(backend=redis.url, redis_prefix="sse-death")
    url = f"{live.url}/api/channels/agent.death/events"
    async with sse(url) as reader:
        await reader.next()  # the stream is open and subscribed
        for n in (1, 2):
            await live.node.publish("1", ["agent.death"], "step", json.dumps({"n": n}))
        seen = [await reader.events() for _ in range(2)]
        ended = await ended_after_redis_died(redis, reader)
    assert [e.json for e in seen] == [{"n": 1}, {"n": 2}]
    assert "missed publications" in ended
    async with sse(url, {"Last-Event-ID": seen[-1].id or ""}) as again:
        resume = await again.events(within=30)
    assert resume.event == "broadcaster:resume"
    assert resume.json["recovered"] is False


@pytest.mark.redis
async def test_a_resumed_stream_with_nothing_live_yet_ends_when_its_redis_died(
    start_server: StartServer, redis_factory: Callable[[], RedisServer]
) -> None:
    """A stream opened with ``?since=`` at the top (a dashboard that opened a run with
    the position ``POST /run`` gave it) got nothing live before Redis died: the top its
    resume read is what the restarted (empty) store cannot show, so the stream ends."""
    redis = redis_factory()
    live = await start_server(backend=redis.url, redis_prefix="sse-death-since")
    for n in (1, 2):
        top = await live.node.publish("1", ["agent.since"], "step", json.dumps({"n": n}))
    url = f"{live.url}/api/channels/agent.since/events"
    async with sse(f"{url}?since={top['agent.since']}") as reader:
        resume = await reader.events(within=30)
        assert resume.event == "broadcaster:resume"
        assert resume.json["recovered"] is True
        ended = await ended_after_redis_died(redis, reader)
    assert "missed publications" in ended


async def test_idle_streams_get_heartbeat_comments(start_server: StartServer) -> None:
    live = await start_server(sse_heartbeat=0.05)
    async with sse(f"{live.url}/api/channels/quiet/events") as reader:
        first = await reader.next()
        assert first.comment == "quiet"  # the opening comment names the channel
        assert (await reader.next()).comment == "ping"
        assert (await reader.next()).comment == "ping"


async def test_a_position_the_history_no_longer_reaches_is_reported(live: LiveServer) -> None:
    await live.node.publish("1", ["old"], "e", "{}")
    async with sse(f"{live.url}/api/channels/old/events?since=gone:1") as reader:
        resume = await reader.events()
    assert resume.event == "broadcaster:resume"
    assert json.loads(resume.data)["recovered"] is False


async def test_closing_the_stream_unsubscribes_it(live: LiveServer) -> None:
    async with sse(f"{live.url}/api/channels/watched/events") as reader:
        await reader.next()
        assert live.node.hub.subscriber_count("1", "watched") == 1
    deadline = asyncio.get_running_loop().time() + 5
    while live.node.hub.subscriber_count("1", "watched"):
        assert asyncio.get_running_loop().time() < deadline, "still subscribed"
        await asyncio.sleep(0.01)


# -- authorization and errors ---------------------------------------------------------


async def test_a_private_channel_needs_its_stream_auth(live: LiveServer) -> None:
    url = f"{live.url}/api/channels/private-room/events"
    async with httpx.AsyncClient() as http:
        missing = await http.get(url)
        wrong = await http.get(url, params={"auth": stream_auth(KEY, SECRET, "private-other")})
        # A Pusher channel signature (the old form, socket id "sse") serves no stream.
        pusher_form = await http.get(
            url, params={"auth": f"{KEY}:{sign(SECRET, 'sse:private-room')}"}
        )
    assert missing.status_code == wrong.status_code == pusher_form.status_code == 403
    assert "missing auth" in missing.json()["error"]
    assert "stream_auth" in wrong.json()["error"]

    auth = stream_auth(KEY, SECRET, "private-room")
    async with sse(f"{url}?auth={auth}") as reader:
        await reader.next()
        await live.node.publish("1", ["private-room"], "said", '{"hi":1}')
        event = await reader.events()
    assert (event.event, event.json) == ("said", {"hi": 1})


async def test_a_private_session_needs_its_token(
    start_server: StartServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENT_DEMO_PRIVATE_SESSIONS", "true")
    live = await start_server(demo=True)
    run = await start_run(live.url)
    await wait_until_stored(live, run["state_url"], run["auth"]["token"])
    url = f"{live.url}/api/sessions/{run['session_id']}/events"
    async with httpx.AsyncClient() as http:
        anonymous = await http.get(url)
        forged = await http.get(url, params={"token": "0" * 64})
    assert anonymous.status_code == forged.status_code == 403
    assert "is private" in anonymous.json()["error"]

    token = run["auth"]["token"]
    since = run["position"]
    async with sse(f"{url}?since={since}", headers={"Authorization": f"Bearer {token}"}) as r:
        events = await read_until_final(r)
    assert events[-1].json["payload"]["status"] == "completed"
    channel_auth = stream_auth(KEY, SECRET, run["channel"])
    async with sse(f"{url}?since={since}&auth={channel_auth}") as reader:
        assert await read_until_final(reader) == events


@pytest.mark.parametrize(
    ("path", "headers", "status", "says"),
    [
        ("/api/sessions/never-ran/events", {}, 404, "unknown session"),
        ("/api/sessions/bad%20id/events", {}, 400, "invalid session id"),
        ("/api/sessions/s/events?app_id=nope", {}, 404, "unknown app"),
        ("/api/sessions/s/events", {"Last-Event-ID": "12"}, 400, "Last-Event-ID"),
        ("/api/channels/bad%20name/events", {}, 400, "contains ' '"),
        ("/api/channels/presence-room/events", {}, 400, "needs a WebSocket"),
        ("/api/channels/%23server-to-user-1/events", {}, 400, "needs a WebSocket"),
        ("/api/channels/c/events?since=nope", {}, 400, "expected '<epoch>:<offset>'"),
    ],
)
async def test_bad_stream_requests_get_clear_errors(
    live: LiveServer, path: str, headers: dict[str, str], status: int, says: str
) -> None:
    async with httpx.AsyncClient() as http:
        response = await http.get(f"{live.url}{path}", headers=headers)
    assert response.status_code == status, response.text
    assert says in response.json()["error"]


async def test_shutdown_ends_open_streams_instead_of_waiting_for_them(
    server_factory: Callable[..., ServerProcess],
) -> None:
    """An open stream must not hold the graceful shutdown until its timeout (and be
    cancelled then): it is ended with a comment, and the client reconnects elsewhere."""
    server = server_factory("--demo", "--shutdown-timeout", "60")
    run = await start_run(server.url)
    url = f"{server.url}/api/sessions/{run['session_id']}/events?since={run['position']}"
    async with httpx.AsyncClient(timeout=30) as http, http.stream("GET", url) as response:
        assert response.status_code == 200
        lines = response.aiter_lines()
        async for line in lines:
            if line.startswith("event: agent.status"):
                break
        server.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        rest = [line async for line in lines]
    assert any(line.startswith(": ended: server shutting down") for line in rest), rest
    assert server.stop() in (0, -signal.SIGTERM)
    assert "graceful shutdown exceeded" not in server.log
    assert "Finished server process" in server.log
