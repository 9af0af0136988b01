"""Resume and readiness when Redis freezes (SIGSTOP of a private redis-server).

- ``/ready`` follows what publishes see: it answers 503 within a few seconds of a freeze
  (a command without an answer, or the readiness PING, flips it) and 200 again once
  Redis answers.
- A resume whose history read fails is not a silent unsubscribe: the server closes the
  connection with 4100, pusher-js reconnects after its back-off, subscribes again from
  its position, and once Redis answers gets every publication it missed, in order, then
  ``recovered: true``.
- Concurrent resumes share a bounded number of history reads: one waiting longer than
  ``history_read_timeout`` is told to come back (4100), the others are served.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

import httpx
import pytest
from redis.asyncio import Redis
from redis.exceptions import OutOfMemoryError

from broadcaster.backends.base import HistoryResult
from broadcaster.backends.memory import MemoryBackend
from broadcaster.publication import Position
from tests.support.live import APP_ID, KEY, Client, StartServer
from tests.support.node import NodeLines
from tests.support.processes import (
    RedisServer,
    ServerFactory,
    ServerProcess,
)
from tests.support.reliability import WS_PATH, eventually, publish, report, status
from tests.support.topologies import command

CHANNEL = "agent.resume-fault"


@contextmanager
def frozen(redis: RedisServer) -> Iterator[None]:
    """Redis stops answering (SIGSTOP) until the block ends (SIGCONT)."""
    assert redis.proc is not None
    redis.proc.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        redis.proc.send_signal(signal.SIGCONT)


# -- /ready during a freeze ---------------------------------------------------------------


@pytest.mark.redis
async def test_ready_turns_503_while_redis_is_frozen_and_200_after(
    server_factory: ServerFactory, redis_factory: Callable[[], RedisServer]
) -> None:
    redis = redis_factory()
    server = server_factory("--backend", redis.url, "--log-level", "warning")
    server.wait_ready()
    assert await answers(server, 200)
    with frozen(redis):
        began = time.monotonic()
        await eventually(lambda: answers(server, 503), "/ready to answer 503")
        flipped = time.monotonic() - began
        async with httpx.AsyncClient(timeout=10) as http:
            refused = await publish(http, server.url, CHANNEL, "e", "{}")
        assert refused.status_code == 503
    began = time.monotonic()
    await eventually(lambda: answers(server, 200), "/ready to answer 200")
    report(
        "ready_during_freeze",
        seconds_to_503=round(flipped, 2),
        seconds_to_200_after_thaw=round(time.monotonic() - began, 2),
    )


@pytest.mark.redis
async def test_ready_turns_503_while_redis_refuses_writes_and_says_why(
    server_factory: ServerFactory, redis_factory: Callable[[], RedisServer]
) -> None:
    """Redis out of memory still answers PING: the publish refused with OOM is what
    tells (a publication with history writes), and /ready must then keep a load
    balancer away until writes pass again."""
    redis = redis_factory()
    server = server_factory("--backend", redis.url, "--history-size", "100")
    server.wait_ready()
    async with httpx.AsyncClient(timeout=10) as http:
        assert (await publish(http, server.url, CHANNEL, "e", "{}")).status_code == 200
        command(redis.port, "config", "set", "maxmemory", "1")
        refused = await publish(http, server.url, CHANNEL, "e", "{}")
        # A publication that would start a channel is refused too (its first write).
        new = await publish(http, server.url, f"{CHANNEL}-new", "e", "{}")
        ready = await http.get(f"{server.url}/ready")
    assert (refused.status_code, new.status_code) == (503, 503)
    assert "OOM" in refused.text
    assert "OOM" in new.text
    assert ready.status_code == 503
    assert ready.json()["backend"].startswith("refuses writes (OOM")

    command(redis.port, "config", "set", "maxmemory", "0")
    await eventually(lambda: answers(server, 200), "/ready to answer 200 once writes pass")
    async with httpx.AsyncClient(timeout=10) as http:
        assert (await publish(http, server.url, CHANNEL, "e", "{}")).status_code == 200


@pytest.mark.redis
async def test_ready_turns_503_when_a_filled_redis_refuses_writes_though_nothing_was_published(
    server_factory: ServerFactory, redis_factory: Callable[[], RedisServer]
) -> None:
    """A real Redis at its ``maxmemory`` with ``noeviction``, filled by others: it
    answers PINGs and reads, and refuses every write. A node that publishes nothing
    itself (agents publish straight to Redis) must say so on /ready too; its heartbeat,
    a third of ``--redis-node-ttl`` away, is not what tells."""
    redis = redis_factory()
    server = server_factory("--backend", redis.url, "--redis-node-ttl", "600")
    server.wait_ready()
    assert await answers(server, 200)
    filler = Redis.from_url(redis.url)
    try:
        used = int((await filler.info("memory"))["used_memory"])
        await filler.config_set("maxmemory-policy", "noeviction")
        await filler.config_set("maxmemory", str(used + (1 << 20)))
        with pytest.raises(OutOfMemoryError):
            await fill(filler)
        await eventually(lambda: answers(server, 503), "/ready to answer 503")
        async with httpx.AsyncClient(timeout=10) as http:
            ready = await http.get(f"{server.url}/ready")
        assert ready.json()["backend"].startswith("refuses writes (OOM")

        await filler.flushdb()  # a delete is no write that memory refuses
        await eventually(lambda: answers(server, 200), "/ready to answer 200 once writes pass")
    finally:
        await filler.aclose()


async def fill(redis: Redis) -> None:
    """Write 16 KiB values until Redis refuses (about 64 fit in the 1 MiB left), then
    lower the limit 64 KiB under what the data holds: memory that a key expiring or a
    client's buffer frees must not let a small write through now and then."""
    with contextlib.suppress(OutOfMemoryError):
        for n in range(100_000):
            await redis.set(f"filler:{n}", b"x" * 16_384)
    used = int((await redis.info("memory"))["used_memory"])
    await redis.config_set("maxmemory", str(used - (64 << 10)))
    await redis.set("filler:last", b"x")


async def answers(server: ServerProcess, code: int) -> bool:
    return await status(server.url, "/ready") == code


# -- pusher-js and a failed history read --------------------------------------------------


def resume_client(server: ServerProcess, epoch: str) -> NodeLines:
    """tests/node/resume_client.mjs: pusher-js resuming ``CHANNEL`` from ``epoch``."""
    url = urlsplit(server.url)
    args = [str(url.hostname), str(url.port), KEY, epoch, CHANNEL]
    return NodeLines("resume_client.mjs", args, package="pusher-js")


@pytest.mark.redis
@pytest.mark.node
async def test_pusher_js_resumes_after_a_history_read_fails(
    server_factory: ServerFactory, redis_factory: Callable[[], RedisServer]
) -> None:
    """Redis freezes while pusher-js resumes: the history read times out, the server
    closes with 4100 (not a bare pusher:error that pusher-js ignores), pusher-js
    reconnects and resubscribes from its position, and after the thaw it gets all it
    missed, in order, then ``recovered: true``."""
    redis = redis_factory()
    server = server_factory(
        "--backend", redis.url, "--history-read-timeout", "1", "--log-level", "warning"
    )
    server.wait_ready()
    missed = 20
    watcher = await Client.connect(server.ws_url + WS_PATH)
    await watcher.subscribe(CHANNEL)
    async with httpx.AsyncClient(timeout=10) as http:
        for n in range(missed):
            answer = await publish(http, server.url, CHANNEL, "seq", json.dumps({"n": n}))
            assert answer.status_code == 200
    first = await watcher.expect("seq")
    await watcher.close()
    epoch = Position.parse(first["position"]).epoch

    client: NodeLines | None = None
    try:
        with frozen(redis):
            client = resume_client(server, epoch)
            await client.until(lambda r: r.get("current") == "connected", "a connection")
            # The history read fails: pusher-js must notice (here: the close makes it
            # reconnect), not stay "subscribed" to a channel that delivers nothing.
            await client.until(
                lambda r: r.get("current") in ("connecting", "unavailable"), "a reconnection"
            )
        resume = await client.until(lambda r: r["type"] == "resume", "a resume answer")
        received = [r["n"] for r in client.seen if r["type"] == "event"]
        assert resume["data"]["recovered"] is True
        assert received == list(range(missed))
        states = [r["current"] for r in client.seen if r["type"] == "state"]
        report("resume_history_read_failed", missed=missed, delivered=len(received), states=states)
    finally:
        if client is not None:
            client.stop()


# -- bounded concurrent history reads ------------------------------------------------------


class SlowHistory(MemoryBackend):
    """History reads that take a while, counting how many run at once."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay
        self.running = 0
        self.most = 0

    async def history(
        self, app_id: str, channel: str, since: Position, limit: int | None = None
    ) -> HistoryResult:
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await asyncio.sleep(self.delay)
            return await super().history(app_id, channel, since, limit)
        finally:
            self.running -= 1


async def test_concurrent_resumes_share_a_bounded_number_of_history_reads(
    start_server: StartServer,
) -> None:
    """Eight clients resume at once with max_history_reads=2 and reads of at least
    0.4 s: never more than two reads run together, the first ones recover, and the last
    pair, whose turn cannot end within history_read_timeout (1.5 s), is closed with 4100
    (pusher-js comes back after a back-off) rather than left waiting or unsubscribed."""
    backend = SlowHistory(delay=0.4)
    live = await start_server(backend_object=backend, max_history_reads=2, history_read_timeout=1.5)
    start = await backend.position(APP_ID, CHANNEL)
    await live.node.publish(APP_ID, [CHANNEL], "seq", json.dumps({"n": 0}))

    async def resume() -> str:
        client = await Client.connect(live.app_url())
        await client.send("pusher:subscribe", {"channel": CHANNEL, "position": str(start)})
        try:
            while True:
                message = await client.recv(within=10)
                if message["event"] == "broadcaster:resume":
                    return "recovered" if message["data"]["recovered"] else "not recovered"
                if message["event"] == "pusher:error":
                    code = await client.closed_with()
                    return f"closed {code}"
        finally:
            await client.close()

    outcomes = await asyncio.gather(*(resume() for _ in range(8)))
    assert backend.most == 2
    assert set(outcomes) == {"recovered", "closed 4100"}, outcomes
