"""The bench scenarios. Each runs one server against a fresh private Redis and returns
one flat result dict (one JSON line of the report).

* ``fanout``: 100 clients on one channel, publications as fast as the server delivers
  them (the publisher is given credit for a bounded window of undelivered messages).
* ``latency``: 100 clients on one channel, 200 publications/s: publish-to-receive p50/p99.
* ``channels``: 1,000 clients, each on its own ``agent.<session>`` channel, each
  receiving only its own events; 4,000 publications/s round robin for every server
  (``--channels-rate``; 0: as fast as each server delivers).
* ``idle``: 50,000 connections from several loopback source addresses (one address has
  about 28,000 ephemeral ports): server RSS per connection, connect rate; then each
  subscribes to its own channel (RSS again). Fewer when the open-file limit is lower
  (``ulimit -Hn``); the result says so.
* ``agents``: real agent loops (``bench/agents.py``: a scripted driver streaming 20
  chunks/s, the real ``AgentEventAdapter`` and ``RedisPublisher``) in a few publishing
  processes, 1-3 viewers per session; stepped 50, 100, 200... sessions until p99 from the
  adapter's publish to the viewer passes 50 ms or the server nears one core. The
  references get the same agent traffic through a publisher in their own format.
* ``agentside``: the publishing side of ``agents`` alone (no viewers): 50 sessions in
  publishing processes of 25, first on the product's path (as ``agents``), then on a
  minimal publisher written in the bench (``bench/agentside.py``) that replays a recorded
  product session's envelopes at the same offsets through the same publish script;
  publishing-process CPU per envelope of both, the ratio, sessions per worker core, and
  every envelope counted in its channel's Redis history. Our server only.
* ``http``: signed ``POST /apps/{id}/events`` (single) and ``/batch_events`` (10 events)
  back to back from 8 workers; servers without the HTTP API are skipped. The bare-uvicorn
  reference gets the same requests and no subscriber (it delivers nothing).
* ``nodes``, ``nodes-cluster`` (``bench/nodes.py``): 60,000 connections over 4 server
  nodes on one Redis or a 3-primary Redis Cluster, a shared and a signed private channel
  each; broadcasts timed per client. Our server and socket.io only.

The primary figure is the server's CPU time (``/proc``: this one process) per delivered
message over the measured window, from the first publication until the last delivery.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import os
import re
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from bench._proc import (
    REPO,
    Child,
    ChildFailed,
    cpu_seconds,
    machine_cpu_seconds,
    open_file_limit,
    rss_bytes,
)
from bench._redis import PrivateRedis
from bench.profile import PYTHON_SERVERS, start_profiler, stop_profiler
from bench.servers import APP, RunningServer, ServerSpec, start_server

__all__ = [
    "FULL",
    "NODE_SCENARIOS",
    "QUICK",
    "SCENARIOS",
    "SCENARIO_NAMES",
    "Sizes",
    "run_scenario",
]

LOADGEN = str(REPO / "bench" / "node" / "loadgen.js")
HTTPLOAD = str(REPO / "bench" / "node" / "httpload.js")
Result = dict[str, Any]


@dataclass(frozen=True)
class Sizes:
    """How big each scenario is (the issue's figures by default)."""

    clients: int = 100  # fanout and latency: subscribers of the one channel
    duration: float = 5.0  # seconds of publishing (fanout, channels)
    messages: int | None = None  # a fixed publication count instead of ``duration``
    window: int = 20_000  # undelivered messages allowed in flight at maximum rate
    latency_rate: int = 200  # publications per second in the latency scenario
    latency_duration: float = 5.0
    channels: int = 1000
    channels_rate: int = 4000  # publications/s in 'channels', the same for every server
    idle: int = 50_000
    idle_procs: int = 2  # load generator processes for the idle connections (at least)
    # agents: sessions per step (stepped until p99 > 50 ms or the server nears one core)
    agents: tuple[int, ...] = (50, 100, 200, 400, 800, 1600)
    agents_duration: float = 5.0  # seconds each session streams
    agents_rate: float = 20  # text chunks per second per session
    agents_per_proc: int = 25  # sessions per publishing process (a worker runs 8 by default)
    agentside: int = 50  # sessions in 'agentside' (product and floor each)
    agentside_duration: float = 5.0  # seconds each of its sessions streams
    http_workers: int = 8
    http_duration: float = 4.0
    http_batch: int = 10
    # nodes / nodes-cluster (bench/nodes.py): connections over several server nodes
    nodes_connections: int = 60_000
    nodes: int = 4
    nodes_loadgens: int = 4  # load generator processes (at least; each under the fd limit)
    nodes_broadcasts: int = 5  # broadcasts on the shared channel
    nodes_gap: float = 1.0  # seconds between broadcasts


FULL = Sizes()
QUICK = Sizes(
    duration=2,
    latency_duration=2,
    channels=200,
    idle=1000,
    agents=(20, 40),
    agents_duration=2,
    agentside=50,
    agentside_duration=3,
    http_duration=1.5,
    nodes_connections=2000,
    nodes_broadcasts=3,
    nodes_gap=0.5,
)


@dataclass
class Ctx:
    spec: ServerSpec
    server: RunningServer
    redis: PrivateRedis
    sizes: Sizes
    profile: Path | None = None  # write py-spy samples of the measured window here


class Meter:
    """CPU seconds of named processes and wall time between :meth:`start` and :meth:`stop`."""

    def __init__(self, pids: dict[str, Sequence[int]]) -> None:
        self.pids = pids
        self.before: dict[str, float] = {}
        self.t0 = 0.0

    def _sample(self) -> dict[str, float]:
        sample = {name: sum(cpu_seconds(p) for p in pids) for name, pids in self.pids.items()}
        sample["bench"] = cpu_seconds(os.getpid())
        machine = machine_cpu_seconds()
        sample["machine"] = machine["tasks"]
        sample["irq"] = machine["irq"]
        sample["steal"] = machine["steal"]
        return sample

    def start(self) -> None:
        self.before = self._sample()
        self.t0 = asyncio.get_running_loop().time()

    def stop(self) -> tuple[float, dict[str, float]]:
        after = self._sample()
        wall = asyncio.get_running_loop().time() - self.t0
        return wall, {name: after[name] - self.before[name] for name in after}


async def run_scenario(
    spec: ServerSpec, scenario: str, sizes: Sizes, profile_dir: Path | None = None
) -> Result | None:
    """Run ``scenario`` on ``spec`` with a fresh Redis and server; None if not applicable.

    With ``profile_dir``, Python servers are sampled by py-spy during the measured window
    (which costs them some CPU: figures of a profiled run are not comparable)."""
    if not spec.takes_part(scenario):
        return None
    if scenario in NODE_SCENARIOS:  # several nodes, their own Redis or Cluster
        from bench.nodes import run_nodes

        return await run_nodes(spec, scenario, sizes)
    redis = await PrivateRedis().start()
    try:
        server = await start_server(spec, redis.url)
        try:
            profile = None
            if profile_dir is not None and spec.name in PYTHON_SERVERS:
                profile = profile_dir / f"profile-{spec.name}-{scenario}.txt"
            ctx = Ctx(spec, server, redis, sizes, profile)
            result = await SCENARIOS[scenario](ctx)
            if profile is not None and profile.exists():
                result["profile"] = str(profile.relative_to(REPO))
            result["server_rss_kb_end"] = rss_bytes(server.pid) // 1024
            return result
        finally:
            await server.child.stop()
    finally:
        await redis.stop()


# -- load generators and publishers -------------------------------------------------------


async def _loadgens(
    ctx: Ctx,
    channels: Sequence[str],
    procs: int = 1,
    subscribe: bool = True,
    latency: bool = True,
    within: float = 120,
    sources: Sequence[str] = (),
    **extra: Any,
) -> list[Child]:
    parts = [list(channels[i::procs]) for i in range(procs) if channels[i::procs]]
    gens: list[Child] = []
    configs = tempfile.TemporaryDirectory(prefix="bench-loadgen-")
    try:
        for i, part in enumerate(parts):
            cfg = {
                "url": ctx.server.ws_url,
                "protocol": ctx.spec.protocol,
                "channels": part,
                "subscribe": subscribe,
                "latency": latency,
                "concurrency": 100,
                "sources": list(sources),
                **extra,
            }
            text = json.dumps(cfg)
            if len(text) > 100_000:  # one argument may not exceed 128 KB
                path = Path(configs.name) / f"loadgen-{i}.json"
                path.write_text(text)
                text = f"@{path}"
            gens.append(await Child(f"loadgen-{i}", ["node", LOADGEN, text]).start())
        readies = await asyncio.gather(*(g.expect("ready", within) for g in gens))
    except BaseException:
        await _close(gens)
        raise
    finally:
        configs.cleanup()
    for gen, ready in zip(gens, readies, strict=True):
        if ready["failed"]:
            await _close(gens)
            raise gen.failure(f"{ready['failed']} connections failed: {ready['errors'][:3]}")
        gen.ready_info = ready  # type: ignore[attr-defined]
    return gens


async def _close(children: Sequence[Child]) -> None:
    for child in children:
        if child.proc is not None and child.proc.returncode is None:
            with contextlib.suppress(ConnectionError, RuntimeError):
                child.send({"cmd": "close"})
    await asyncio.gather(*(c.stop() for c in children))


async def _publisher(ctx: Ctx, channels: Sequence[str], **options: Any) -> Child:
    cfg = {
        "kind": ctx.spec.publisher,
        "redis_url": ctx.redis.url,
        "channels": list(channels),
        "app_id": APP["id"],
        **options,
    }
    child = await Child("publisher", ctx.spec.publisher_argv(cfg)).start()
    await child.expect("ready", 30)
    return child


def _received(gens: Sequence[Child]) -> int:
    return sum(g.received for g in gens)


async def _credit(
    gens: Sequence[Child], pub: Child, fanout: float, sizes: Sizes, limit: int | None
) -> None:
    """Keep ``sizes.window`` messages in flight until the duration or the limit is reached."""
    loop = asyncio.get_running_loop()
    window = max(1, int(sizes.window / fanout))
    end = loop.time() + sizes.duration
    granted = window
    pub.send({"cmd": "credit", "n": granted})
    stall = loop.time()
    last = -1
    while True:
        received = _received(gens)
        if limit is not None and received >= limit * fanout:
            return
        if limit is None and loop.time() >= end:
            return
        now = loop.time()
        if received != last:
            last, stall = received, now
        elif now - stall > 10:
            return  # nothing arrives any more: the drain and the stats will say what is lost
        want = int(received / fanout) + window
        if want > granted:
            granted = want
            pub.send({"cmd": "credit", "n": granted})
        await asyncio.sleep(0.002)


async def _drain(gens: Sequence[Child], expected: int, quiet: float = 5) -> None:
    """Wait until ``expected`` messages arrived, or nothing arrived for ``quiet`` seconds."""
    loop = asyncio.get_running_loop()
    last, since = -1, loop.time()
    while (received := _received(gens)) < expected:
        if received != last:
            last, since = received, loop.time()
        elif loop.time() - since > quiet:
            return
        await asyncio.sleep(0.002)


async def _stats(gens: Sequence[Child], published: dict[str, int]) -> Result:
    for gen in gens:
        gen.send({"cmd": "stats", "expected": published})
    parts = await asyncio.gather(*(g.expect("stats", 60) for g in gens))
    total: Result = {"lost": 0, "out_of_order": 0, "wrong_channel": 0, "unexpected_closes": 0}
    for part in parts:
        for key in total:
            total[key] += part[key]
    total["received"] = sum(p["received"] for p in parts)
    latencies = [p["latency_us"] for p in parts if p["latency_us"]]
    if latencies:  # exact with one load generator; the worst part's with several
        total["latency_ms"] = {
            k: round(max(lat[k] for lat in latencies) / 1000, 3) for k in ("p50", "p99", "max")
        }
    total["loadgen_loop_delay_ms"] = {
        k: round(max(p["loop_delay_ms"][k] for p in parts), 2) for k in ("p99", "max")
    }
    errors = [e for p in parts for e in p["errors"]]
    if errors:
        total["errors"] = errors[:5]
    return total


# -- the scenarios ------------------------------------------------------------------------


async def _stream(
    ctx: Ctx,
    scenario: str,
    client_channels: Sequence[str],
    pub_channels: Sequence[str],
    rate: float | None,
    duration: float = 0,
    tasks: int = 1,
    equal_rate: bool = False,
) -> Result:
    """Publish on ``pub_channels`` to clients of ``client_channels``: ``rate`` per second
    for ``duration`` seconds (paced), or with ``rate`` None as fast as delivered (credit).
    With ``equal_rate``, a publisher that fell behind the rate fails the run."""
    sizes = ctx.sizes
    paced = rate is not None
    gens = await _loadgens(ctx, client_channels, latency=True)
    options: dict[str, Any] = {"mode": "paced" if paced else "credit", "tasks": tasks}
    if paced:
        options |= {"rate": rate, "duration": duration}
    elif sizes.messages is not None:
        options["limit"] = sizes.messages
    try:
        pub = await _publisher(ctx, pub_channels, **options)
    except BaseException:
        await _close(gens)
        raise
    subscribers = Counter(client_channels)
    fanout = len(client_channels) / len(pub_channels)
    meter = Meter(
        {
            "server": [ctx.server.pid],
            "loadgen": [g.pid for g in gens],
            "publisher": [pub.pid],
            "redis": [ctx.redis.pid],
        }
    )
    spy = None
    try:
        if ctx.profile is not None:
            spy = await start_profiler(ctx.server.pid, ctx.profile)
        meter.start()
        if paced:
            pub.send({"cmd": "start"})
            done = await pub.expect("done", duration + 60)
        else:
            await _credit(gens, pub, fanout, sizes, sizes.messages)
            pub.send({"cmd": "stop"})
            done = await pub.expect("done", 60)
        published: dict[str, int] = done["published"]
        expected = sum(n * subscribers[ch] for ch, n in published.items())
        await _drain(gens, expected)
        wall, cpu = meter.stop()
        if spy is not None:
            await stop_profiler(spy)
        stats = await _stats(gens, published)
    finally:
        await _close([*gens, pub] + ([spy] if spy is not None else []))
    delivered = stats["received"]
    result: Result = {
        "server": ctx.spec.name,
        "scenario": scenario,
        "clients": len(client_channels),
        "channels": len(pub_channels),
        "published": done["total"],
        "expected": expected,
        "delivered": delivered,
        "seconds": round(wall, 3),
        "msgs_per_s": round(delivered / wall),
        "server_cpu_us_per_msg": _per(cpu["server"], delivered),
        "server_cpu_pct": round(100 * cpu["server"] / wall, 1),
        "loadgen_cpu_us_per_msg": _per(cpu["loadgen"], delivered),
        "loadgen_cpu_pct": round(100 * cpu["loadgen"] / wall, 1),
        "publisher_cpu_pct": round(100 * cpu["publisher"] / wall, 1),
        "redis_cpu_pct": round(100 * cpu["redis"] / wall, 1),
        "bench_cpu_pct": round(100 * cpu["bench"] / wall, 1),
        # Everything else busy on the machine meanwhile (other work skews a run: rerun).
        "other_cpu_pct": round(100 * _other(cpu) / wall, 1),
        "irq_cpu_pct": round(100 * cpu["irq"] / wall, 1),  # loopback TCP in softirqs
        "steal_cpu_pct": round(100 * cpu["steal"] / wall, 1),
    }
    if paced:
        result |= _pace(pub, done, rate or 0, equal_rate)
    return result | {k: v for k, v in stats.items() if k != "received"}


def _pace(pub: Child, done: Result, rate: float, strict: bool) -> Result:
    """The rate the publisher achieved; with ``strict``, a publisher more than 3% behind
    fails the run (the servers would not be compared at the same rate)."""
    achieved = done["total"] / done["seconds"] if done.get("seconds") else 0.0
    if strict and achieved < 0.97 * rate:
        raise pub.failure(
            f"the publisher fell behind: {achieved:,.0f} of {rate:,.0f} publications/s "
            f"(lagged up to {done.get('lag_ms')} ms); rerun on a quieter machine or lower "
            "the rate (--channels-rate)"
        )
    return {
        "publish_rate": rate,
        "publish_rate_achieved": round(achieved),
        "publish_lag_ms": done.get("lag_ms"),
    }


def _other(cpu: dict[str, float]) -> float:
    machine = ("machine", "irq", "steal")
    return cpu["machine"] - sum(v for k, v in cpu.items() if k not in machine)


def _per(seconds: float, count: int) -> float | None:
    return round(seconds * 1e6 / count, 3) if count else None


async def fanout(ctx: Ctx) -> Result:
    channel = ["agent.bench-0"]
    return await _stream(ctx, "fanout", channel * ctx.sizes.clients, channel, rate=None)


async def latency(ctx: Ctx) -> Result:
    channel = ["agent.bench-0"]
    sizes = ctx.sizes
    clients = channel * sizes.clients
    return await _stream(
        ctx, "latency", clients, channel, rate=sizes.latency_rate, duration=sizes.latency_duration
    )


async def channels(ctx: Ctx) -> Result:
    """Equal paced rate for every server (``channels_rate``, round robin), or with
    ``channels_rate`` 0 as fast as each server delivers."""
    sizes = ctx.sizes
    names = [f"agent.bench-{i}" for i in range(sizes.channels)]
    rate = sizes.channels_rate or None
    result = await _stream(
        ctx, "channels", names, names, rate=rate, duration=sizes.duration, tasks=4, equal_rate=True
    )
    if ctx.spec.publisher == "broadcaster":
        result["history_len"] = await _history_len(ctx, names[0])
    return result


async def _history_len(ctx: Ctx, channel: str) -> int:
    """Entries in ``channel``'s history stream: proof that our publications went through
    the backend's script with history and positions on."""
    from redis.asyncio import Redis

    from broadcaster.backends.base import DEFAULT_REDIS_PREFIX
    from broadcaster.backends.redis import channel_key

    client = Redis.from_url(ctx.redis.url)
    try:
        stream = channel_key(DEFAULT_REDIS_PREFIX, APP["id"], channel, "stream")
        return int(await client.xlen(stream))
    finally:
        await client.aclose()


async def idle(ctx: Ctx) -> Result:
    sizes = ctx.sizes
    pid = ctx.server.pid
    fd_limit = open_file_limit(pid)
    n = min(sizes.idle, fd_limit - _SPARE_FDS)
    if n < sizes.idle:
        print(
            f"warning: {ctx.spec.name}/idle: {n:,} connections instead of {sizes.idle:,}: the "
            f"server may open {fd_limit:,} files (raise the hard limit, ulimit -Hn, as root)",
            file=sys.stderr,
        )
    procs = max(sizes.idle_procs, math.ceil(n / (fd_limit - _SPARE_FDS)))
    sources = _source_addresses(n)
    rss0, cpu0 = rss_bytes(pid), cpu_seconds(pid)
    names = [f"agent.idle-{i}" for i in range(n)]
    gens = await _loadgens(ctx, names, procs=procs, subscribe=False, within=300, sources=sources)
    try:
        rss1, cpu1 = rss_bytes(pid), cpu_seconds(pid)
        connect_seconds = max(g.ready_info["connect_seconds"] for g in gens)  # type: ignore[attr-defined]
        for gen in gens:
            gen.send({"cmd": "subscribe"})
        subscribed = await asyncio.gather(*(g.expect("subscribed", 300) for g in gens))
        failed = sum(s["failed"] for s in subscribed)
        rss2, cpu2 = rss_bytes(pid), cpu_seconds(pid)
        stats = await _stats(gens, {})
    finally:
        await _close(gens)
    return {
        "server": ctx.spec.name,
        "scenario": "idle",
        "connections": n,
        "connections_wanted": sizes.idle,
        "server_fd_limit": fd_limit,
        "source_addresses": len(sources),
        "rss_kb_before": rss0 // 1024,
        "rss_kb_connected": rss1 // 1024,
        "rss_kb_subscribed": rss2 // 1024,
        "rss_kb_per_conn": round((rss1 - rss0) / 1024 / n, 2),
        "rss_kb_per_conn_subscribed": round((rss2 - rss0) / 1024 / n, 2),
        "connect_per_s": round(n / connect_seconds),
        "server_cpu_us_per_connect": _per(cpu1 - cpu0, n),
        "server_cpu_us_per_subscribe": _per(cpu2 - cpu1, n),
        "subscribe_failed": failed,
        "unexpected_closes": stats["unexpected_closes"],
        "lost": 0,
        "out_of_order": 0,
    }


_SPARE_FDS = 256  # open files a server or load generator needs besides its connections
# bind() to port 0 searches one half of the ephemeral range first: past about 12,500
# ports on one address each bind() took about 4 ms instead of 10-18 us (issue 33, part 3),
# so connects stalled; 5,000 per address keeps every bind() fast.
_PORTS_PER_ADDRESS = 5_000
_next_address = itertools.count()


def _source_addresses(n: int) -> list[str]:
    """Loopback source addresses for ``n`` connections, fresh for each run: a closed
    connection's port stays in TIME_WAIT for a minute, and a port bound to an address
    (as a chosen source address is) is not reused meanwhile, even towards another server."""
    count = max(1, math.ceil(n / _PORTS_PER_ADDRESS))
    return [f"127.0.0.{2 + next(_next_address) % 250}" for _ in range(count)]


_TAPPED = 5  # sessions whose publications the bench reads from Redis itself
AGENT_P99_MS = 50.0  # the capacity figure counts steps whose p99 is within this
_SATURATED_PCT = 90.0  # server CPU (% of one core) at which stepping stops


async def agents(ctx: Ctx) -> Result:
    """Step the number of agent sessions; capacity = the largest step with p99 within
    :data:`AGENT_P99_MS` and nothing lost, per server core it used."""
    steps: list[Result] = []
    stopped = "every step passed"
    for k, sessions in enumerate(ctx.sizes.agents):
        step = await _agents_step(ctx, 2 * k, sessions)
        if step["retry"]:  # one slow moment fails a p99: measure that step once more
            step = await _agents_step(ctx, 2 * k + 1, sessions) | {"retried": True}
        steps.append(step)
        if not step["ok"]:
            stopped = f"{sessions} sessions: {step['why']}"
            break
        if step["server_cpu_pct"] >= _SATURATED_PCT:
            stopped = f"{sessions} sessions: server CPU {step['server_cpu_pct']}% of a core"
            break
    passing = [s for s in steps if s["ok"]]
    best = passing[-1] if passing else steps[0]
    figures = (
        "server_cpu_us_per_envelope",
        "publisher_cpu_us_per_envelope",
        "latency_ms",
        "publish_side_ms",
    )
    result: Result = {
        "server": ctx.spec.name,
        "scenario": "agents",
        "capacity_sessions": best["sessions"] if passing else 0,
        "sessions_per_core": best["sessions_per_core"] if passing else None,
        "stopped_because": stopped,
        "at_sessions": best["sessions"],
        **{k: best.get(k) for k in figures},
        "sessions_per_worker_core": best["sessions_per_worker_core"] if passing else None,
        "envelopes_per_s": best["envelopes_per_s"],
        "delivered_per_s": best["delivered_per_s"],
        "server_cpu_pct": best["server_cpu_pct"],
        "publisher_cpu_pct": best["publisher_cpu_pct"],
        "other_cpu_pct": best["other_cpu_pct"],
        # Losses where the server is within its capacity; beyond it, in the last step.
        "lost": sum(s["lost"] for s in passing),
        "out_of_order": sum(s["out_of_order"] for s in steps),
        "wrong_channel": sum(s["wrong_channel"] for s in steps),
        "steps": steps,
    }
    return result


class RedisTap:
    """Listens on the Redis channels of a few sessions and measures how long their
    chunk envelopes took from the adapter's timestamp to leaving Redis: the publishing
    side's share of the latency (its buffer and round trip), apart from the server's."""

    _STAMP = re.compile(rb'timestamp\\?":\\?"([0-9T:.-]+)Z')

    def __init__(self, url: str, channels: Sequence[str]) -> None:
        from redis.asyncio import Redis

        self.client = Redis.from_url(url)
        self.pubsub = self.client.pubsub()
        self.channels = list(channels)
        self.samples: list[float] = []
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> RedisTap:
        await self.pubsub.subscribe(*self.channels)
        self.task = asyncio.create_task(self._read())
        return self

    async def _read(self) -> None:
        while True:
            message = await self.pubsub.get_message(ignore_subscribe_messages=True, timeout=1)
            data = message["data"] if message else b""
            if b"chunk_index" in data and (found := self._STAMP.search(data)):
                sent = datetime.fromisoformat(found.group(1).decode() + "+00:00").timestamp()
                self.samples.append((time.time() - sent) * 1000 - 0.5)

    async def stop(self) -> Result | None:
        """p50/p99 ms of what was seen (None if nothing was); idempotent."""
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
            self.task = None
            await self.pubsub.aclose()  # type: ignore[no-untyped-call]
            await self.client.aclose()
        if not self.samples:
            return None
        ordered = sorted(self.samples)
        pick = [ordered[min(len(ordered) - 1, int(p * len(ordered)))] for p in (0.5, 0.99)]
        return {"n": len(ordered), "p50": round(pick[0], 3), "p99": round(pick[1], 3)}


def _redis_channel(spec: ServerSpec, channel: str) -> str:
    """Where ``spec``'s publisher puts ``channel``'s publications in Redis."""
    if spec.publisher == "plain":
        return f"bench:{channel}"
    if spec.publisher == "socketio":
        return f"socket.io#/#{channel}#"
    from broadcaster.backends.base import DEFAULT_REDIS_PREFIX
    from broadcaster.backends.redis import publication_channel

    return publication_channel(DEFAULT_REDIS_PREFIX, APP["id"], channel)


async def _agents_step(ctx: Ctx, k: int, sessions: int) -> Result:
    sizes = ctx.sizes
    names = [f"bench-{k}-{i}" for i in range(sessions)]
    viewers = [f"agent.{n}" for i, n in enumerate(names) for _ in range(1 + i % 3)]
    gen_procs = max(1, math.ceil(len(viewers) / 5000))
    gens = await _loadgens(ctx, viewers, procs=gen_procs, stamp="timestamp", firstSeq=0)
    procs = math.ceil(sessions / sizes.agents_per_proc)
    pubs: list[Child] = []
    tap: RedisTap | None = None
    try:
        for i in range(procs):
            cfg = {
                "kind": ctx.spec.publisher,
                "redis_url": ctx.redis.url,
                "app_id": APP["id"],
                "sessions": names[i::procs],
                "rate": sizes.agents_rate,
                "duration": sizes.agents_duration,
            }
            argv = [sys.executable, "-m", "bench.agents", json.dumps(cfg)]
            pubs.append(await Child(f"agents-{i}", argv).start())
        await asyncio.gather(*(p.expect("ready", 30) for p in pubs))
        sampled = [_redis_channel(ctx.spec, f"agent.{n}") for n in names[:_TAPPED]]
        tap = await RedisTap(ctx.redis.url, sampled).start()
        meter = Meter(
            {
                "server": [ctx.server.pid],
                "loadgen": [g.pid for g in gens],
                "publisher": [p.pid for p in pubs],
                "redis": [ctx.redis.pid],
            }
        )
        meter.start()
        for pub in pubs:
            pub.send({"cmd": "start"})
        dones = await asyncio.gather(*(p.expect("done", sizes.agents_duration + 120) for p in pubs))
        published: dict[str, int] = {}
        for done in dones:
            published |= done["published"]
        viewers_of = Counter(viewers)
        expected = sum(n * viewers_of[ch] for ch, n in published.items())
        await _drain(gens, expected)
        wall, cpu = meter.stop()
        publish_side = await tap.stop()
        stats = await _stats(gens, published)
    finally:
        if tap is not None:
            await tap.stop()
        await _close([*gens, *pubs])
    figures = _agents_figures(sessions, len(viewers), procs, dones, stats, wall, cpu)
    return figures | {"publish_side_ms": publish_side}


def _agents_figures(
    sessions: int,
    viewers: int,
    procs: int,
    dones: Sequence[Result],
    stats: Result,
    wall: float,
    cpu: dict[str, float],
) -> Result:
    envelopes = sum(d["total"] for d in dones)
    delivered = stats["received"]
    dropped = sum(d["dropped"] for d in dones)
    p99 = (stats.get("latency_ms") or {}).get("p99")
    server_cores = cpu["server"] / wall
    lag = max(d["lag_ms"] for d in dones)
    why = []
    if p99 is None or p99 > AGENT_P99_MS:
        why.append(f"p99 {p99} ms > {AGENT_P99_MS:g} ms")
    if stats["lost"] or stats["out_of_order"] or dropped:
        why.append(f"lost {stats['lost']}, reordered {stats['out_of_order']}, dropped {dropped}")
    if why and lag > AGENT_P99_MS:  # then the publishing side, not the server, is the limit
        why.append(f"the publishing processes are saturated (chunks up to {lag:.0f} ms late)")
    return {
        "retry": why == [f"p99 {p99} ms > {AGENT_P99_MS:g} ms"],
        "sessions": sessions,
        "viewers": viewers,
        "publishing_procs": procs,
        "ok": not why,
        "why": "; ".join(why),
        "envelopes": envelopes,
        "chunks": sum(d["chunks"] for d in dones),
        "delivered": delivered,
        "seconds": round(wall, 3),
        "envelopes_per_s": round(envelopes / wall),
        "delivered_per_s": round(delivered / wall),
        "server_cpu_us_per_envelope": _per(cpu["server"], delivered),
        "publisher_cpu_us_per_envelope": _per(cpu["publisher"], envelopes),
        "server_cpu_pct": round(100 * server_cores, 1),
        "publisher_cpu_pct": round(100 * cpu["publisher"] / wall, 1),
        "loadgen_cpu_pct": round(100 * cpu["loadgen"] / wall, 1),
        "redis_cpu_pct": round(100 * cpu["redis"] / wall, 1),
        "other_cpu_pct": round(100 * _other(cpu) / wall, 1),
        "sessions_per_core": round(sessions / server_cores) if server_cores else None,
        "sessions_per_worker_core": _per_core(sessions, cpu["publisher"], wall),
        "chunk_lag_ms": lag,
        "dropped": dropped,
        **{k: v for k, v in stats.items() if k != "received"},
    }


async def http(ctx: Ctx) -> Result:
    """Single and batch publishing; one result with both halves (one profile for both)."""
    spy = None if ctx.profile is None else await start_profiler(ctx.server.pid, ctx.profile)
    try:
        single = await _http_half(ctx, 0)
        batch = await _http_half(ctx, ctx.sizes.http_batch)
    finally:
        if spy is not None:
            await stop_profiler(spy)
    result: Result = {"server": ctx.spec.name, "scenario": "http"}
    for prefix, half in (("single", single), ("batch", batch)):
        result |= {f"{prefix}_{k}": v for k, v in half.items()}
    result["lost"] = single["lost"] + batch["lost"]
    result["out_of_order"] = single["out_of_order"] + batch["out_of_order"]
    return result


async def _http_half(ctx: Ctx, batch: int) -> Result:
    sizes = ctx.sizes
    tag = "batch" if batch else "single"
    names = [f"agent.http-{tag}-{i}" for i in range(sizes.http_workers)]
    # An HTTP-only reference (bare uvicorn) gets the same requests and no subscriber.
    gens = await _loadgens(ctx, names, latency=False) if ctx.spec.subscribers else []
    cfg = {
        "url": ctx.server.url,
        "app_id": APP["id"],
        "key": APP["key"],
        "secret": APP["secret"],
        "channels": names,
        "batch": batch,
        "duration": sizes.http_duration,
    }
    load = Child("httpload", ["node", HTTPLOAD, json.dumps(cfg)])
    meter = Meter({"server": [ctx.server.pid], "loadgen": [g.pid for g in gens]})
    try:
        meter.start()
        await load.start()
        done = await load.expect("done", sizes.http_duration + 60)
        await _drain(gens, int(done["events"]) if gens else 0)
        wall, cpu = meter.stop()
        stats = await _stats(gens, done["published"]) if gens else None
    finally:
        await _close([*gens, load])
    if done["errors"]:
        raise load.failure(f"{done['errors']} requests failed: {done['error_samples']}")
    return {
        "requests": done["requests"],
        "events": done["events"],
        "requests_per_s": round(done["requests"] / done["seconds"]),
        "events_per_s": round(done["events"] / done["seconds"]),
        "server_cpu_us_per_request": _per(cpu["server"], done["requests"]),
        "server_cpu_us_per_event": _per(cpu["server"], done["events"]),
        "server_cpu_pct": round(100 * cpu["server"] / wall, 1),
        "client_cpu_pct": round(100 * done["cpu_seconds"] / wall, 1),
        "request_ms": done["latency_ms"],
        "delivered": stats["received"] if stats else None,
        "lost": stats["lost"] if stats else 0,
        "out_of_order": stats["out_of_order"] if stats else 0,
    }


# -- agentside: the publishing side against a hand-written floor (issue 33) -------------------


def _per_core(sessions: int, cpu: float, wall: float) -> int | None:
    """Sessions per core of the processes that used ``cpu`` seconds in ``wall``."""
    return round(sessions * wall / cpu) if cpu > 0 else None


async def _agentside_half(
    ctx: Ctx, kind: str, names: Sequence[str], extra: dict[str, Any]
) -> tuple[Result, list[Result]]:
    """Run ``names`` in publishing processes of ``kind`` (bench/agentside.py): their
    figures and their ``done`` messages."""
    sizes = ctx.sizes
    procs = math.ceil(len(names) / sizes.agents_per_proc)
    pubs: list[Child] = []
    configs = tempfile.TemporaryDirectory(prefix="bench-agentside-")
    try:
        for i in range(procs):
            cfg = {
                "kind": kind,
                "redis_url": ctx.redis.url,
                "app_id": APP["id"],
                "sessions": list(names[i::procs]),
                "rate": sizes.agents_rate,
                "duration": sizes.agentside_duration,
                **extra,
            }
            path = Path(configs.name) / f"{kind}-{i}.json"
            path.write_text(json.dumps(cfg))
            argv = [sys.executable, "-m", "bench.agentside", f"@{path}"]
            pubs.append(await Child(f"agentside-{kind}-{i}", argv).start())
        await asyncio.gather(*(p.expect("ready", 60) for p in pubs))
        meter = Meter({"publisher": [p.pid for p in pubs], "server": [ctx.server.pid]})
        meter.start()
        for pub in pubs:
            pub.send({"cmd": "start"})
        within = sizes.agentside_duration + 120
        dones = await asyncio.gather(*(p.expect("done", within) for p in pubs))
        wall, cpu = meter.stop()
    finally:
        await _close(pubs)
        configs.cleanup()
    total = sum(d["total"] for d in dones)
    in_history = await _history_lens(ctx, [f"agent.{name}" for name in names])
    lost = max(0, total - sum(in_history.values()))  # publications not in a history
    figures: Result = {
        "sessions": len(names),
        "publishing_procs": procs,
        "envelopes": total,
        "envelopes_per_session": round(total / len(names), 1),
        "seconds": round(wall, 3),
        "cpu_us_per_envelope": _per(cpu["publisher"], total),
        "cpu_pct": round(100 * cpu["publisher"] / wall, 1),
        "sessions_per_worker_core": _per_core(len(names), cpu["publisher"], wall),
        "redis_round_trips": sum(d.get("sends", 0) for d in dones) or None,
        "chunk_lag_ms": max(d["lag_ms"] for d in dones),
        "in_history": sum(in_history.values()),
        "lost": lost + sum(d["dropped"] for d in dones),
        "server_cpu_pct": round(100 * cpu["server"] / wall, 1),
        "other_cpu_pct": round(100 * _other(cpu) / wall, 1),
    }
    return figures, list(dones)


async def _recording(ctx: Ctx, channel: str, start: float) -> list[list[Any]]:
    """``[seconds after start, event, data]`` of every publication in ``channel``'s
    history: when (the envelope's ``timestamp``) and what the product's session sent."""
    from redis.asyncio import Redis

    from broadcaster.backends.base import DEFAULT_REDIS_PREFIX
    from broadcaster.backends.redis import channel_key

    client = Redis.from_url(ctx.redis.url)
    try:
        stream = channel_key(DEFAULT_REDIS_PREFIX, APP["id"], channel, "stream")
        entries: list[Any] = await client.xrange(stream) or []
    finally:
        await client.aclose()
    recording = []
    for _, fields in entries:
        frame = json.loads(bytes(fields[b"p"]).partition(b"\n")[2])
        data = frame["data"]
        stamp = datetime.fromisoformat(json.loads(data)["timestamp"].replace("Z", "+00:00"))
        recording.append([round(stamp.timestamp() - start, 4), frame["event"], data])
    return recording


async def _history_lens(ctx: Ctx, channels: Sequence[str]) -> dict[str, int]:
    """Entries in each channel's history stream (one pipeline)."""
    from redis.asyncio import Redis

    from broadcaster.backends.base import DEFAULT_REDIS_PREFIX
    from broadcaster.backends.redis import channel_key

    client = Redis.from_url(ctx.redis.url)
    try:
        pipe = client.pipeline(transaction=False)
        for channel in channels:
            pipe.xlen(channel_key(DEFAULT_REDIS_PREFIX, APP["id"], channel, "stream"))
        return dict(zip(channels, (int(n) for n in await pipe.execute()), strict=True))
    finally:
        await client.aclose()


async def agentside(ctx: Ctx) -> Result:
    """The same sessions two ways, one after the other: the product's path (real agent
    loops, adapter and ``RedisPublisher``) and a minimal publisher written in the bench
    (bench/agentside.py) replaying a product session's envelopes at the same pace through
    the same publish script. Publishing-process CPU per envelope, and the ratio."""
    from broadcaster.backends.base import DEFAULT_REDIS_PREFIX
    from broadcaster.backends.redis import scripts

    n = ctx.sizes.agentside
    names_p = [f"side-p-{i}" for i in range(n)]
    product, dones = await _agentside_half(ctx, "product", names_p, {})
    recording = await _recording(ctx, f"agent.{names_p[0]}", dones[0]["start_wall"])
    floor_cfg = {"prefix": DEFAULT_REDIS_PREFIX, "script": scripts.PUBLISH.source}
    floor, _ = await _agentside_half(
        ctx, "floor", [f"side-f-{i}" for i in range(n)], floor_cfg | {"recording": recording}
    )
    us, floor_us = product["cpu_us_per_envelope"], floor["cpu_us_per_envelope"]
    return {
        "server": ctx.spec.name,
        "scenario": "agentside",
        "sessions": n,
        "cpu_us_per_envelope": us,
        "floor_cpu_us_per_envelope": floor_us,
        "floor_ratio": round(us / floor_us, 2) if us and floor_us else None,
        "sessions_per_worker_core": product["sessions_per_worker_core"],
        "floor_sessions_per_worker_core": floor["sessions_per_worker_core"],
        "envelopes_per_round_trip": (
            round(product["envelopes"] / product["redis_round_trips"], 2)
            if product["redis_round_trips"]
            else None
        ),
        "lost": product["lost"] + floor["lost"],
        "out_of_order": 0,
        "other_cpu_pct": max(product["other_cpu_pct"], floor["other_cpu_pct"]),
        "product": product,
        "floor": floor,
    }


SCENARIOS: dict[str, Callable[[Ctx], Awaitable[Result]]] = {
    "fanout": fanout,
    "latency": latency,
    "channels": channels,
    "idle": idle,
    "agents": agents,
    "http": http,
    "agentside": agentside,
}
# Run by bench/nodes.py (it starts its own nodes and Redis or Redis Cluster).
NODE_SCENARIOS = ("nodes", "nodes-cluster")
SCENARIO_NAMES = (*SCENARIOS, *NODE_SCENARIOS)

# Re-exported for callers that want to catch a failed child.
__all__ += ["ChildFailed"]
