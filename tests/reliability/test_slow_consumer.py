"""Slow consumer: one client stops reading while 100 others read.

Policy (broadcaster.connection): a connection whose unsent bytes (its queue plus the
transport's write buffer) would pass ``max_buffer_bytes`` is closed with 4100 (over
capacity: reconnect with back-off) and its queue dropped. Checked here against a server
process: the slow client is cut with 4100, the server's memory stays bounded, and the
other clients get every event throughout. Their delivery latency (publish call to
receipt, p99) is measured without the slow client, while it is stuck, and after it was
cut, and reported (not asserted: timings depend on the machine).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass, field

import httpx
import pytest

from tests.support.live import APP_ID, Client
from tests.support.processes import ServerFactory
from tests.support.rawws import RawClient
from tests.support.reliability import (
    WS_PATH,
    eventually,
    metrics,
    percentile,
    report,
    rss_bytes,
    signed_query,
)

pytestmark = pytest.mark.slow

READERS = 100
LIMIT = 256 * 1024  # max_buffer_bytes of the server under test
FANOUT = "agent.fanout"
HEAVY = "agent.heavy"  # only the slow client is subscribed
HEAVY_BATCH = [{"name": "bulk", "channel": HEAVY, "data": "x" * 10_000}] * 10


@dataclass
class Reader:
    client: Client
    latencies: dict[str, list[float]] = field(default_factory=dict)
    count: int = 0
    task: asyncio.Task[None] | None = None

    async def read(self) -> None:
        with contextlib.suppress(Exception):
            while True:
                message = json.loads(await self.client.ws.recv())
                if message.get("event") == "tick":
                    phase, sent = json.loads(message["data"])
                    self.latencies.setdefault(phase, []).append(time.time() - sent)
                    self.count += 1


class Load:
    """Publishes one ``tick`` on the fan-out channel and one batch of 10 x 10 kB on the
    heavy channel per step, as signed HTTP requests."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.http = httpx.AsyncClient(timeout=10)
        self.ticks = 0
        self.heavy_bytes = 0

    async def post(self, path: str, body: object) -> None:
        content = json.dumps(body).encode()
        response = await self.http.post(
            f"{self.base_url}{path}",
            content=content,
            params=signed_query("POST", path, content),
            headers={"content-type": "application/json"},
        )
        assert response.status_code == 200, response.text

    async def step(self, phase: str) -> None:
        data = json.dumps([phase, time.time()])
        await self.post(f"/apps/{APP_ID}/events", {"name": "tick", "channel": FANOUT, "data": data})
        self.ticks += 1
        await self.post(f"/apps/{APP_ID}/batch_events", {"batch": HEAVY_BATCH})
        self.heavy_bytes += 100_000


async def slow_consumer_cut(base_url: str) -> float:
    return (await metrics(base_url)).get("broadcaster_slow_consumer_disconnects_total", 0.0)


async def test_a_slow_consumer_is_cut_with_4100_and_the_others_keep_their_pace(
    server_factory: ServerFactory,
) -> None:
    server = server_factory("--max-buffer-bytes", str(LIMIT), "--log-level", "warning")
    assert server.proc is not None
    pid = server.proc.pid
    readers = []
    for _ in range(READERS):
        client = await Client.connect(server.ws_url + WS_PATH)
        assert (await client.subscribe(FANOUT))["event"].endswith("subscription_succeeded")
        readers.append(Reader(client))
    for reader in readers:
        reader.task = asyncio.create_task(reader.read())
    load = Load(server.url)

    for _ in range(150):  # without the slow client (and a warm server)
        await load.step("without")
    baseline_rss = rss_bytes(pid)

    slow = await asyncio.to_thread(RawClient, server.ws_url + WS_PATH)
    for channel in (FANOUT, HEAVY):
        slow.send_json({"event": "pusher:subscribe", "data": {"channel": channel}})
    peak_rss = baseline_rss
    heavy_before = load.heavy_bytes
    while await slow_consumer_cut(server.url) < 1:
        await load.step("with")
        peak_rss = max(peak_rss, rss_bytes(pid))
        assert load.heavy_bytes - heavy_before < 200 * LIMIT, "the slow client was never cut"
    sent_to_slow = load.heavy_bytes - heavy_before
    frames, code = await asyncio.to_thread(slow.read_until_close)
    slow.close()

    for _ in range(150):  # after the cut
        await load.step("after")
        peak_rss = max(peak_rss, rss_bytes(pid))

    await eventually(lambda: all(r.count == load.ticks for r in readers), "every tick delivered")
    assert code == 4100
    assert server.proc.poll() is None
    growth = peak_rss - baseline_rss
    assert growth < 64 * LIMIT, f"server memory grew by {growth} bytes"
    m = await metrics(server.url)
    assert m["broadcaster_connections"] == READERS

    p99 = {
        phase: round(1000 * percentile([x for r in readers for x in r.latencies[phase]], 0.99), 2)
        for phase in ("without", "with", "after")
    }
    for reader in readers:
        await reader.client.close()
        if reader.task is not None:
            reader.task.cancel()
    await load.http.aclose()
    report(
        "slow_consumer",
        readers=READERS,
        max_buffer_bytes=LIMIT,
        close_code=code,
        bytes_published_to_slow_client=sent_to_slow,
        frames_it_got_before_close=frames,
        server_rss_baseline_mib=round(baseline_rss / 2**20, 1),
        server_rss_growth_mib=round(growth / 2**20, 2),
        ticks_per_reader=load.ticks,
        p99_ms_without_slow=p99["without"],
        p99_ms_with_slow=p99["with"],
        p99_ms_after_cut=p99["after"],
    )
