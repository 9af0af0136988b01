"""Run floods (issue 13, point 6): per-client concurrency and rate limits answer 429
with Retry-After while other clients still start runs, a full node or run queue
answers 503 with Retry-After, and a completed run leaves nothing behind."""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest
from starlette.requests import Request

from agent_core.app._streams import client_address
from agent_core.app.demo import DemoSettings, _Demo
from agent_core.app.runs import ClientRateLimit, RunManager, TooManyRuns
from tests.support.factories import Seconds
from tests.support.live import Client, LiveServer, StartServer
from tests.support.processes import RedisServer
from tests.support.reliability import own_rss, report
from tests.support.runs import read_run, subscribe

OTHER = "127.0.0.2"  # another loopback address: another client


def http_from(address: str = "127.0.0.1") -> httpx.AsyncClient:
    """An HTTP client whose connections come from ``address``."""
    return httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(local_address=address))


async def post_run(http: httpx.AsyncClient, live: LiveServer, **body: Any) -> httpx.Response:
    body.setdefault("input", "What is the weather in Oslo?")
    return await http.post(f"{live.url}/run", json=body)


def demo_of(live: LiveServer) -> _Demo:
    demo = live.server.config.app.state.extensions["demo"]
    assert isinstance(demo, _Demo)
    return demo


# -- the token bucket, without a server -----------------------------------------------


def test_a_client_gets_its_burst_then_its_rate() -> None:
    clock = Seconds()
    limit = ClientRateLimit(per_minute=6, burst=2, clock=clock)
    limit.take("a")
    limit.take("a")
    with pytest.raises(TooManyRuns) as refused:
        limit.take("a")
    assert refused.value.retry_after == 10, "one run every 10 s at 6 a minute"
    assert "at most 2 in a row, then 6 a minute" in str(refused.value)
    limit.take("b")  # another client has its own bucket
    clock.now = 10.0
    limit.take("a")


@pytest.mark.parametrize(
    ("peer", "client"),
    [
        ("203.0.113.9", "203.0.113.9"),
        ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"),
        ("2001:db8:1:2:ffff:ffff:ffff:ffff", "2001:db8:1:2::/64"),  # the same client
        ("2001:db8:1:3::1", "2001:db8:1:3::/64"),  # another /64: another client
        ("::ffff:198.51.100.7", "198.51.100.7"),  # IPv4 through an IPv6 socket
        ("testclient", "testclient"),
    ],
)
def test_an_ipv6_client_is_counted_as_its_slash_64(peer: str, client: str) -> None:
    """A host is commonly given a whole /64: counted per address, it could pick a new
    one for every run and escape every per-client limit."""
    request = Request({"type": "http", "client": (peer, 50000), "headers": []})
    assert client_address(request) == client


def test_a_slash_64_shares_one_allowance() -> None:
    limit = ClientRateLimit(per_minute=1, burst=2, clock=lambda: 0.0)
    for host in ("2001:db8::1", "2001:db8::2"):
        limit.take(str(client_address(Request({"type": "http", "client": (host, 1)}))))
    with pytest.raises(TooManyRuns, match="too many runs from 2001:db8::/64"):
        limit.take(str(client_address(Request({"type": "http", "client": ("2001:db8::3", 1)}))))


def test_a_refund_gives_the_run_back() -> None:
    limit = ClientRateLimit(per_minute=1, burst=1, clock=Seconds())
    limit.take("a")
    limit.refund("a")
    limit.take("a")


def test_the_rate_limit_remembers_a_bounded_number_of_clients() -> None:
    clock = Seconds()
    limit = ClientRateLimit(per_minute=60, burst=5, max_clients=100, clock=clock)
    for n in range(1000):
        limit.take(f"10.0.{n // 256}.{n % 256}")
    assert len(limit) <= 100
    clock.now = 60.0  # every bucket refilled: they are all forgotten on the next overflow
    for n in range(101):
        limit.take(f"10.9.0.{n}")
    assert len(limit) <= 100


@pytest.mark.parametrize(("rate", "burst"), [(0, 1), (1, 0)])
def test_a_rate_limit_needs_a_positive_rate_and_burst(rate: float, burst: int) -> None:
    with pytest.raises(ValueError, match="need a rate > 0"):
        ClientRateLimit(per_minute=rate, burst=burst)


# -- local mode ------------------------------------------------------------------------


async def test_a_client_over_its_concurrent_runs_gets_429_others_still_start(
    start_server: StartServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENT_DEMO_CLIENT_RUNS", "3")
    live = await start_server(demo=True)
    async with http_from() as flooder, http_from(OTHER) as other:
        for _ in range(3):
            assert (await post_run(flooder, live, pace_ms=1000)).status_code == 202
        refused = await post_run(flooder, live, pace_ms=1000)
        assert refused.status_code == 429, refused.text
        assert int(refused.headers["retry-after"]) >= 1
        assert "3 are going already" in refused.json()["error"]
        assert refused.json()["retry_after"] == int(refused.headers["retry-after"])
        assert (await post_run(other, live, pace_ms=1000)).status_code == 202
    manager = demo_of(live).runs
    assert isinstance(manager, RunManager)
    await manager.aclose(grace=0)


async def test_a_client_starting_runs_too_fast_gets_429_others_still_start(
    start_server: StartServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENT_DEMO_CLIENT_RUN_RATE", "2")
    monkeypatch.setenv("AGENT_DEMO_CLIENT_RUN_BURST", "4")
    live = await start_server(demo=True)
    async with http_from() as flooder, http_from(OTHER) as other:
        answers = [await post_run(flooder, live) for _ in range(5)]
        assert [a.status_code for a in answers] == [202, 202, 202, 202, 429]
        assert 1 <= int(answers[-1].headers["retry-after"]) <= 30, "a run every 30 s"
        assert "at most 4 in a row" in answers[-1].json()["error"]
        assert (await post_run(other, live)).status_code == 202


async def test_a_refused_run_does_not_spend_the_rate(
    start_server: StartServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Retrying a busy session (409) must not turn into 429."""
    monkeypatch.setenv("AGENT_DEMO_CLIENT_RUN_BURST", "2")
    live = await start_server(demo=True)
    async with http_from() as http:
        first = await post_run(http, live, pace_ms=200)
        session = first.json()["session_id"]
        for _ in range(5):
            assert (await post_run(http, live, session_id=session)).status_code == 409
        assert (await post_run(http, live)).status_code == 202
    manager = demo_of(live).runs  # the paced run would hold the shutdown for its grace
    assert isinstance(manager, RunManager)
    await manager.aclose(grace=0)


async def test_a_full_node_answers_503_with_retry_after(
    start_server: StartServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENT_DEMO_MAX_RUNS", "2")
    live = await start_server(demo=True)
    async with http_from() as one, http_from(OTHER) as two:
        assert (await post_run(one, live, pace_ms=500)).status_code == 202
        assert (await post_run(two, live, pace_ms=500)).status_code == 202
        full = await post_run(two, live)
    assert full.status_code == 503
    assert full.headers["retry-after"] == "5"
    assert "runs 2 runs already" in full.json()["error"]
    manager = demo_of(live).runs
    assert isinstance(manager, RunManager)
    await manager.aclose(grace=0)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("mode", ["agent", "route"])
async def test_a_run_past_its_maximum_duration_ends_failed_and_frees_its_session(
    start_server: StartServer,
    clients: Callable[..., Awaitable[Client]],
    monkeypatch: pytest.MonkeyPatch,
    mode: str,
) -> None:
    """A paced run that would last for hours is stopped at AGENT_DEMO_MAX_RUN_SECONDS:
    its final status is failed and names the limit, an agent run's state as of its last
    step is stored as failed (a reconcile must not find the run before), the session and
    the client's run slot are free again, and the session takes a new run."""
    monkeypatch.setenv("AGENT_DEMO_MAX_RUN_SECONDS", "0.5")
    live = await start_server(demo=True)
    manager = demo_of(live).runs
    assert isinstance(manager, RunManager)
    watcher = await clients(live.app_url())
    async with http_from() as http:
        long = await post_run(http, live, input="hi \n" * 5000, mode=mode, pace_ms=2000)
        assert long.status_code == 202, long.text
        run = long.json()
        await subscribe(watcher, run["channel"], run["position"])
        final = (await read_run(watcher))[-1][2]
        await manager.wait(run["session_id"])
        assert not manager.running(run["session_id"])
        assert manager._client_counts == {}, "the client's run slot is released"
        if mode == "agent":  # this run's state, as of its last step, is the one stored
            assert final["state_url"] == f"/api/sessions/{run['session_id']}/state"
            snapshot = (await http.get(f"{live.url}{final['state_url']}")).json()
            assert snapshot["status"] == "failed"
            assert snapshot["messages"][0]["content"].startswith("hi \nhi")
            assert "maximum duration" in snapshot["metadata"]["error"]
            assert snapshot["last_continuation"]["resolved_by"] == "RunSupervisor"
        again = await post_run(http, live, session_id=run["session_id"], mode=mode)
        assert again.status_code == 202, again.text
        assert (await read_run(watcher))[-1][2]["status"] == "completed"
    assert final["status"] == "failed"
    assert final["stop_reason"] == "error"
    assert "maximum duration" in final["error_message"]
    assert "AGENT_DEMO_MAX_RUN_SECONDS" in final["error_message"]


@pytest.mark.parametrize("seconds", [0, -1, 86_401])
def test_the_maximum_run_duration_must_be_positive_and_bounded(seconds: float) -> None:
    with pytest.raises(ValueError, match="max_run_seconds"):
        DemoSettings(max_run_seconds=seconds)


async def test_ag_ui_runs_count_against_the_same_limits(
    start_server: StartServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENT_DEMO_CLIENT_RUN_BURST", "1")
    live = await start_server(demo=True)
    agent_input = {
        "threadId": "t-limits",
        "runId": "r-1",
        "state": {},
        "messages": [{"id": "m1", "role": "user", "content": "Weather in Oslo?"}],
        "tools": [],
        "context": [],
        "forwardedProps": {},
    }
    async with http_from() as http:
        assert (await post_run(http, live)).status_code == 202
        refused = await http.post(f"{live.url}/ag-ui", json=agent_input)
    assert refused.status_code == 429
    assert refused.headers["retry-after"]


# -- queue mode ------------------------------------------------------------------------


@pytest.mark.redis
async def test_a_full_run_queue_answers_503_and_a_busy_client_429(
    start_server: StartServer, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No worker runs: runs wait in the queue, which holds at most AGENT_DEMO_QUEUE_MAX;
    one client may have AGENT_DEMO_CLIENT_RUNS of them."""
    monkeypatch.setenv("AGENT_DEMO_RUN_MODE", "queue")
    monkeypatch.setenv("AGENT_DEMO_QUEUE_MAX", "3")
    monkeypatch.setenv("AGENT_DEMO_CLIENT_RUNS", "2")
    live = await start_server(demo=True, backend=redis_server.url, redis_prefix="limits-queue")
    async with http_from() as flooder, http_from(OTHER) as other:
        assert (await post_run(flooder, live)).status_code == 202
        assert (await post_run(flooder, live)).status_code == 202
        busy = await post_run(flooder, live)
        assert busy.status_code == 429, busy.text
        assert "2 are queued or running" in busy.json()["error"]
        assert int(busy.headers["retry-after"]) >= 1
        assert (await post_run(other, live)).status_code == 202
        full = await post_run(other, live)
    assert full.status_code == 503, full.text
    assert "the run queue is full (3 runs wait" in full.json()["error"]
    assert int(full.headers["retry-after"]) >= 1


# -- memory per completed run ----------------------------------------------------------


async def _completed_runs(live: LiveServer, manager: RunManager, count: int) -> None:
    async with http_from() as http:
        for _ in range(0, count, 25):
            answers = await asyncio.gather(*(post_run(http, live) for _ in range(25)))
            assert {a.status_code for a in answers} == {202}
            for answer in answers:
                await manager.wait(answer.json()["session_id"])


@pytest.mark.redis
@pytest.mark.slow
async def test_a_completed_run_leaves_nothing_behind_on_the_node(
    start_server: StartServer, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """300 runs through POST /run on a Redis-backed node (the state and history are
    in Redis): the manager forgets each run, and the node's memory (RSS) per completed
    run is reported (1,000 took 50 s on a slow 2-core machine for the same check)."""
    monkeypatch.setenv("AGENT_DEMO_CLIENT_RUN_RATE", "0")
    monkeypatch.setenv("AGENT_DEMO_CLIENT_RUNS", "0")
    live = await start_server(demo=True, backend=redis_server.url, redis_prefix="limits-mem")
    manager = demo_of(live).runs
    assert isinstance(manager, RunManager)
    await _completed_runs(live, manager, 50)  # warm-up: imports, caches, pools
    await asyncio.sleep(0.2)  # the last runs' coalescing timers end
    gc.collect()
    before = own_rss()
    runs = 300
    started = time.perf_counter()
    await _completed_runs(live, manager, runs)
    elapsed = time.perf_counter() - started
    await asyncio.sleep(0.2)
    gc.collect()
    grown = own_rss() - before
    report(
        "memory per completed run",
        runs=runs,
        rss_bytes_per_run=round(grown / runs),
        runs_per_second=round(runs / elapsed),
    )
    assert len(manager._runs) == 0, "the manager forgot every run"
    assert manager._client_counts == {}, "and every client"
