"""Load and churn: thousands of connections connect, subscribe and leave (half of them
by closing, half by dropping the TCP connection) in overlapping waves while events
flow. Afterwards the server holds no connection, subscription, channel or task more
than before (counted through /metrics) and its memory is back near the baseline."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import resource

import httpx
import pytest

from tests.support.live import APP_ID, Client
from tests.support.processes import ServerFactory
from tests.support.reliability import WS_PATH, eventually, metrics, report, rss_bytes, signed_query

pytestmark = pytest.mark.slow

ROUNDS = 2
WAVES = 3  # per round
PER_WAVE = 500
CHANNELS = 50
BATCH = f"/apps/{APP_ID}/batch_events"
LEAK_COUNTERS = (
    "broadcaster_connections",
    "broadcaster_subscriptions",
    "broadcaster_channels",
    "broadcaster_asyncio_tasks",
)


def enough_file_descriptors(needed: int) -> None:
    """Raise the soft limit of open files towards the hard one (the server process
    inherits it); skip if even the hard limit is too low."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        if hard != resource.RLIM_INFINITY and hard < needed:
            pytest.skip(f"needs {needed} open files; the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


async def wave(url: str, size: int, gate: asyncio.Semaphore) -> list[Client]:
    async def join(n: int) -> Client:
        async with gate:
            client = await Client.connect(url)
            answer = await client.subscribe(f"churn.{random.randrange(CHANNELS)}")
            assert answer["event"] == "pusher_internal:subscription_succeeded"
            return client

    return list(await asyncio.gather(*(join(n) for n in range(size))))


async def leave(clients: list[Client]) -> None:
    """Half close properly, half vanish (the TCP connection is dropped)."""
    for n, client in enumerate(clients):
        if n % 2:
            client.ws.transport.abort()
    await asyncio.gather(
        *(c.close() for n, c in enumerate(clients) if not n % 2), return_exceptions=True
    )
    for client in clients:  # a close that raised (e.g. timed out) must not leak its socket
        client.ws.transport.abort()


async def test_thousands_of_connections_come_and_go_without_leaks(
    server_factory: ServerFactory,
) -> None:
    enough_file_descriptors(2 * PER_WAVE * 2 + 500)
    # A thousand connections from one address: lift the per-address limit.
    server = server_factory("--log-level", "warning", "--max-connections-per-ip", "0")
    assert server.proc is not None
    pid = server.proc.pid
    url = server.ws_url + WS_PATH
    gate = asyncio.Semaphore(100)

    await leave(await wave(url, 100, gate))  # warm up: first-use allocations
    await eventually(lambda: _idle(server.url), "the warm-up connections to go", within=30)
    before = await metrics(server.url)
    baseline_rss = rss_bytes(pid)

    published = 0
    stop = asyncio.Event()

    async def flow() -> None:
        nonlocal published
        async with httpx.AsyncClient(timeout=10) as http:
            while not stop.is_set():
                batch = [
                    {"name": "e", "channel": f"churn.{(published + k) % CHANNELS}", "data": "{}"}
                    for k in range(10)
                ]
                content = json.dumps({"batch": batch}).encode()
                response = await http.post(
                    f"{server.url}{BATCH}",
                    content=content,
                    params=signed_query("POST", BATCH, content),
                )
                assert response.status_code == 200, response.text
                published += len(batch)
                await asyncio.sleep(0.002)

    flowing = asyncio.create_task(flow())
    peak_rss = baseline_rss
    peak_connections = 0.0
    settled_rss: list[int] = []

    async def back_to_baseline() -> bool:
        m = await metrics(server.url)
        return all(m[name] <= before[name] for name in LEAK_COUNTERS)

    try:
        for _ in range(ROUNDS):
            previous: list[Client] = []
            for _ in range(WAVES):
                current = await wave(url, PER_WAVE, gate)  # the previous wave is still on
                m = await metrics(server.url)
                peak_connections = max(peak_connections, m["broadcaster_connections"])
                peak_rss = max(peak_rss, rss_bytes(pid))
                await leave(previous)
                previous = current
            await leave(previous)
            await eventually(back_to_baseline, "the counters to return to baseline", within=60)
            settled_rss.append(rss_bytes(pid))
    finally:
        stop.set()
        await flowing

    after = await metrics(server.url)
    assert after["broadcaster_connections"] == 0
    assert after["broadcaster_subscriptions"] == 0
    assert after["broadcaster_channels"] == 0
    assert after["broadcaster_asyncio_tasks"] <= before["broadcaster_asyncio_tasks"]
    assert server.proc.poll() is None
    first, last = settled_rss[0], settled_rss[-1]
    per_connection = (peak_rss - baseline_rss) / (2 * PER_WAVE)
    # Memory plateaus: the second round of churn, as many connections again, leaves the
    # server within a quarter of what the first round's live connections took (leaking
    # the connections would add about that much again).
    assert last - first < max((peak_rss - baseline_rss) / 4, 2 << 20), settled_rss
    report(
        "churn",
        connections=ROUNDS * WAVES * PER_WAVE,
        waves=ROUNDS * WAVES,
        peak_connections=int(peak_connections),
        events_published=published,
        leaked_connections=int(after["broadcaster_connections"]),
        leaked_subscriptions=int(after["broadcaster_subscriptions"]),
        leaked_channels=int(after["broadcaster_channels"]),
        tasks_before=int(before["broadcaster_asyncio_tasks"]),
        tasks_after=int(after["broadcaster_asyncio_tasks"]),
        rss_baseline_mib=round(baseline_rss / 2**20, 1),
        rss_peak_mib=round(peak_rss / 2**20, 1),
        rss_after_first_round_mib=round(first / 2**20, 1),
        rss_after_second_round_mib=round(last / 2**20, 1),
        rss_per_live_connection_kib=round(per_connection / 1024, 1),
    )


async def _idle(base_url: str) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        return (await metrics(base_url))["broadcaster_connections"] == 0
    return False
