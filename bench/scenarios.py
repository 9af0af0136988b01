"""The bench scenarios. Each runs one server against a fresh private Redis and returns
one flat result dict (one JSON line of the report).

* ``fanout``: 100 clients on one channel, publications as fast as the server delivers
  them (the publisher is given credit for a bounded window of undelivered messages).
* ``latency``: 100 clients on one channel, 200 publications/s: publish-to-receive p50/p99.
* ``channels``: 1,000 clients, each on its own ``agent.<session>`` channel, each
  receiving only its own events, publications round robin as fast as delivered.
* ``idle``: 10,000 connections: server RSS per connection, connect rate; then each
  subscribes to its own channel (RSS again).
* ``http``: signed ``POST /apps/{id}/events`` (single) and ``/batch_events`` (10 events)
  back to back from 8 workers; servers without the HTTP API are skipped. The bare-uvicorn
  reference gets the same requests and no subscriber (it delivers nothing).

The primary figure is the server's CPU time (``/proc``: this one process) per delivered
message over the measured window, from the first publication until the last delivery.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench._proc import REPO, Child, ChildFailed, cpu_seconds, machine_cpu_seconds, rss_bytes
from bench._redis import PrivateRedis
from bench.profile import PYTHON_SERVERS, start_profiler, stop_profiler
from bench.servers import APP, RunningServer, ServerSpec, start_server

__all__ = ["FULL", "QUICK", "SCENARIOS", "Sizes", "run_scenario"]

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
    idle: int = 10_000
    idle_procs: int = 2  # load generator processes for the idle connections
    http_workers: int = 8
    http_duration: float = 4.0
    http_batch: int = 10


FULL = Sizes()
QUICK = Sizes(duration=2, latency_duration=2, channels=200, idle=1000, http_duration=1.5)


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
) -> list[Child]:
    parts = [list(channels[i::procs]) for i in range(procs) if channels[i::procs]]
    gens = []
    for i, part in enumerate(parts):
        cfg = {
            "url": ctx.server.ws_url,
            "protocol": ctx.spec.protocol,
            "channels": part,
            "subscribe": subscribe,
            "latency": latency,
            "concurrency": 100,
        }
        gens.append(await Child(f"loadgen-{i}", ["node", LOADGEN, json.dumps(cfg)]).start())
    try:
        readies = await asyncio.gather(*(g.expect("ready", within) for g in gens))
    except BaseException:
        await _close(gens)
        raise
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
    paced: bool,
    tasks: int = 1,
) -> Result:
    sizes = ctx.sizes
    gens = await _loadgens(ctx, client_channels, latency=True)
    options: dict[str, Any] = {"mode": "paced" if paced else "credit", "tasks": tasks}
    if paced:
        options |= {"rate": sizes.latency_rate, "duration": sizes.latency_duration}
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
            done = await pub.expect("done", sizes.latency_duration + 60)
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
    return result | {k: v for k, v in stats.items() if k != "received"}


def _other(cpu: dict[str, float]) -> float:
    machine = ("machine", "irq", "steal")
    return cpu["machine"] - sum(v for k, v in cpu.items() if k not in machine)


def _per(seconds: float, count: int) -> float | None:
    return round(seconds * 1e6 / count, 3) if count else None


async def fanout(ctx: Ctx) -> Result:
    channel = ["agent.bench-0"]
    return await _stream(ctx, "fanout", channel * ctx.sizes.clients, channel, paced=False)


async def latency(ctx: Ctx) -> Result:
    channel = ["agent.bench-0"]
    return await _stream(ctx, "latency", channel * ctx.sizes.clients, channel, paced=True)


async def channels(ctx: Ctx) -> Result:
    names = [f"agent.bench-{i}" for i in range(ctx.sizes.channels)]
    return await _stream(ctx, "channels", names, names, paced=False, tasks=4)


async def idle(ctx: Ctx) -> Result:
    sizes = ctx.sizes
    pid = ctx.server.pid
    rss0, cpu0 = rss_bytes(pid), cpu_seconds(pid)
    names = [f"agent.idle-{i}" for i in range(sizes.idle)]
    gens = await _loadgens(ctx, names, procs=sizes.idle_procs, subscribe=False, within=300)
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
    n = sizes.idle
    return {
        "server": ctx.spec.name,
        "scenario": "idle",
        "connections": n,
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


SCENARIOS: dict[str, Callable[[Ctx], Awaitable[Result]]] = {
    "fanout": fanout,
    "latency": latency,
    "channels": channels,
    "idle": idle,
    "http": http,
}

# Re-exported for callers that want to catch a failed child.
__all__ += ["ChildFailed"]
