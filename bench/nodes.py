"""The ``nodes`` scenarios (issue 33, part 3): more connections than one machine's file
limit lets one node hold, over several server nodes on one Redis or on Redis Cluster.

``nodes`` runs over one Redis, ``nodes-cluster`` over a Redis Cluster of 3 primaries
(``bench.shards.PrimariesCluster``). In each, ``nodes`` server processes (4 by default)
share ``nodes_connections`` WebSocket connections (60,000: 15,000 each, under the usual
hard limit of 20,000 open files per process). Node load generators
(``bench/node/nodesgen.js``, each under the file limit too) open them from several
loopback source addresses, client *i* to node *i* mod *nodes*, then subscribe every
connection to one shared channel and to a private channel of its own
(``private-nodes-p<i>``), with the signature a Pusher auth endpoint would return.

Then the bench publishes ``nodes_broadcasts`` broadcasts on the shared channel, spaced
``nodes_gap`` seconds apart, each stamped at publish time, and one publication on every
private channel (each must reach its one subscriber and nobody else). Figures:

* per-client latency from publish to receipt, p50 / p99 / max over every client and
  broadcast, and the time until all clients had each broadcast (its max);
* server CPU (the nodes' sum, from ``/proc``) per delivered broadcast message, over the
  windows from each publication until its last delivery;
* RSS per connection: the nodes' summed RSS with the connections open (and subscribed)
  minus the same nodes' RSS before, divided by the connections;
* connects per second (all load generators in parallel), subscriptions per second;
* nothing lost, no duplicate, no close: the load generators count every close (code
  4100 is our slow-consumer cut) and our nodes' ``/metrics`` give
  ``broadcaster_slow_consumer_disconnects``.

The socket.io reference runs the same number of Node socket.io nodes with
``@socket.io/redis-adapter`` (one Redis) or its sharded adapter (``createShardedAdapter``:
``SSUBSCRIBE``/``SPUBLISH``, one shard channel per room) on the cluster, rooms for the
shared and the private channels, the same signature checked on private rooms
(``bench/node/socketio_server.js``). Its publications are what its emitter sends
(one Redis) or the sharded adapter's own message (cluster), published by the bench.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import resource
from collections.abc import Sequence
from typing import Any

import orjson
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from bench._proc import REPO, Child, cpu_seconds, raise_fd_limit, rss_bytes
from bench._redis import PrivateRedis
from bench.agents import emitter_packet
from bench.envelope import EVENT, envelope
from bench.scenarios import (
    Meter,
    Sizes,
    _close,
    _drain,
    _other,
    _per,
    _received,
    _source_addresses,
)
from bench.servers import APP, RunningServer, ServerSpec, start_server
from broadcaster.backends.base import DEFAULT_REDIS_PREFIX

__all__ = ["COLUMNS", "REFS", "SCENARIOS", "run_nodes", "targets"]

SCENARIOS = ("nodes", "nodes-cluster")
SERVERS = ("broadcaster", "socketio")  # the references without a multi-node path skip it
REFS = dict.fromkeys(SCENARIOS, ("socketio",))
NODESGEN = str(REPO / "bench" / "node" / "nodesgen.js")
SHARED = "nodes-shared"
PRIVATE = "private-nodes-p"
_SPARE_FDS = 256
_HISTORY_SIZE, _HISTORY_TTL = 100, 600.0  # as the nodes keep it by default
Result = dict[str, Any]

COLUMNS: dict[str, list[tuple[str, str]]] = {
    name: [
        ("CPU us/msg", "server_cpu_us_per_msg"),
        ("connections", "connections"),
        ("nodes", "nodes"),
        ("p50 ms", "latency_ms.p50"),
        ("p99 ms", "latency_ms.p99"),
        ("max ms", "latency_ms.max"),
        ("KB/conn", "rss_kb_per_conn"),
        ("KB/conn subscribed", "rss_kb_per_conn_subscribed"),
        ("connects/s", "connect_per_s"),
        ("lost", "lost"),
        ("closes", "unexpected_closes"),
        ("4100 cuts", "slow_consumer_cuts"),
    ]
    for name in SCENARIOS
}


def _publisher_clients(url: str, cluster: bool) -> Redis | RedisCluster:
    if cluster:
        from broadcaster.backends.redis.clients import cluster_client

        return cluster_client(url)
    return Redis.from_url(url)


class Publish:
    """Publishes the scenario's messages the way ``spec``'s nodes read them."""

    def __init__(self, spec: ServerSpec, url: str, cluster: bool) -> None:
        self.spec = spec
        self.cluster = cluster
        self.client = _publisher_clients(url, cluster)

    async def start(self) -> Publish:
        if isinstance(self.client, RedisCluster):
            await self.client.initialize()
            if self.spec.name == "broadcaster":
                from broadcaster.backends.redis.scripts import PUBLISH

                await self.client.script_load(PUBLISH.source)
        return self

    async def many(self, items: Sequence[tuple[str, str]]) -> None:
        """Publish ``(channel, data)`` items, in order per channel, in one batch."""
        if self.spec.name == "broadcaster":
            await self._ours(items)
        elif self.cluster:
            await self._sharded_socketio(items)
        else:
            pipe = self.client.pipeline(transaction=False)
            for channel, data in items:
                pipe.publish(f"socket.io#/#{channel}#", emitter_packet(channel, EVENT, data))
            await pipe.execute()

    async def _ours(self, items: Sequence[tuple[str, str]]) -> None:
        from broadcaster.backends.redis import publish_many_via_redis
        from broadcaster.backends.redis.publish import publish_script_args
        from broadcaster.backends.redis.scripts import PUBLISH
        from broadcaster.publication import Publication

        publications = [
            Publication(app_id=APP["id"], channel=channel, event=EVENT, data=data)
            for channel, data in items
        ]
        if not isinstance(self.client, RedisCluster):
            await publish_many_via_redis(
                self.client,
                DEFAULT_REDIS_PREFIX,
                publications,
                history_size=_HISTORY_SIZE,
                history_ttl=_HISTORY_TTL,
            )
            return
        # As agent processes publish to Redis Cluster (bench/shards.py): the publish
        # script, pipelined per shard by redis-py.
        pipe = self.client.pipeline()
        for publication in publications:
            keys, args = publish_script_args(
                DEFAULT_REDIS_PREFIX,
                publication,
                _HISTORY_SIZE,
                _HISTORY_TTL,
                86400,
                sharded=True,
            )
            pipe.execute_command("EVALSHA", PUBLISH.sha, len(keys), *keys, *args)
        await pipe.execute()

    async def _sharded_socketio(self, items: Sequence[tuple[str, str]]) -> None:
        """What the sharded adapter's ``io.to(room).emit()`` publishes: its JSON cluster
        message (type 3, BROADCAST) on the room's own shard channel (``dynamic`` mode)."""
        assert isinstance(self.client, RedisCluster)
        pipe = self.client.pipeline()
        for channel, data in items:
            message = {
                "uid": "bench",
                "nsp": "/",
                "type": 3,
                "data": {
                    "opts": {"rooms": [channel], "except": [], "flags": {}},
                    "packet": {"type": 2, "data": [EVENT, data], "nsp": "/"},
                },
            }
            pipe.execute_command("SPUBLISH", f"socket.io#/#{channel}#", orjson.dumps(message))
        await pipe.execute()

    async def aclose(self) -> None:
        await self.client.aclose()


async def run_nodes(spec: ServerSpec, scenario: str, sizes: Sizes) -> Result | None:
    """One run of ``scenario`` (``nodes`` or ``nodes-cluster``) on ``spec``'s nodes;
    None for a server without a multi-node path."""
    if spec.name not in SERVERS:
        return None
    cluster = scenario == "nodes-cluster"
    if cluster:
        from bench.shards import PrimariesCluster

        backend: Any = await PrimariesCluster(3).start()
        redis_pids = backend.pids
    else:
        backend = await PrivateRedis().start()
        redis_pids = [backend.pid]
    servers: list[RunningServer] = []
    try:
        # Every process (the nodes, the load generators) gets the hard limit: a node
        # needs one file per connection.
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        limit = raise_fd_limit(hard if hard != resource.RLIM_INFINITY else 1 << 20)
        for _ in range(sizes.nodes):
            servers.append(await start_server(spec, backend.url, within=60))
        return await _measure(spec, scenario, sizes, servers, backend, redis_pids, limit)
    finally:
        for server in servers:
            await server.child.stop()
        await backend.stop()


async def _measure(
    spec: ServerSpec,
    scenario: str,
    sizes: Sizes,
    servers: list[RunningServer],
    backend: Any,
    redis_pids: list[int],
    fd_limit: int,
) -> Result:
    n_nodes = len(servers)
    per_node = fd_limit - _SPARE_FDS
    n = min(sizes.nodes_connections, per_node * n_nodes)
    pids = [s.pid for s in servers]
    procs = max(sizes.nodes_loadgens, math.ceil(n / per_node))
    sources = _source_addresses(n)
    m: Result = {"asked": n, "nodes": n_nodes, "procs": procs, "sources": len(sources)}
    m["fd_limit"] = fd_limit
    m["rss"] = [sum(rss_bytes(p) for p in pids)]
    m["cpu"] = [sum(cpu_seconds(p) for p in pids)]
    gens = await _start_gens(spec, servers, n, procs, sources)
    publish = await Publish(spec, backend.url, scenario == "nodes-cluster").start()
    try:
        readies = [g.ready_info for g in gens]  # type: ignore[attr-defined]
        m["connect_seconds"] = max(r["connect_seconds"] for r in readies)
        m["connected"] = connected = sum(r["connected"] for r in readies)
        m["connect_errors"] = [e for r in readies for e in r["errors"]][:5]
        m["rss"].append(sum(rss_bytes(p) for p in pids))
        m["cpu"].append(sum(cpu_seconds(p) for p in pids))
        for gen in gens:
            gen.send({"cmd": "subscribe"})
        subscribed = await asyncio.gather(*(g.expect("subscribed", 600) for g in gens))
        m["subscribe_failed"] = sum(s["failed"] for s in subscribed)
        m["subscribe_seconds"] = max(s["seconds"] for s in subscribed)
        m["rss"].append(sum(rss_bytes(p) for p in pids))
        m["cpu"].append(sum(cpu_seconds(p) for p in pids))
        await asyncio.sleep(1)  # the reference's room subscriptions are not awaited
        named: dict[str, Sequence[int]] = {
            "server": pids,
            "loadgen": [g.pid for g in gens],
            "redis": redis_pids,
        }
        m["windows"] = await _broadcasts(gens, publish, connected, sizes, named)
        m["private"] = await _privates(gens, publish, n, connected, named)
        for gen in gens:
            gen.send({"cmd": "stats", "broadcasts": sizes.nodes_broadcasts, "privates": True})
        m["parts"] = await asyncio.gather(*(g.expect("stats", 120) for g in gens))
        m["cuts"] = await _slow_consumer_cuts(spec, servers)
        m["rss"].append(sum(rss_bytes(p) for p in pids))
    finally:
        await publish.aclose()
        await _close(gens)
    m["warnings"] = _server_warnings(servers)
    return _figures(spec, scenario, sizes, m)


async def _start_gens(
    spec: ServerSpec, servers: Sequence[RunningServer], n: int, procs: int, sources: list[str]
) -> list[Child]:
    gens: list[Child] = []
    step = math.ceil(n / procs)
    try:
        for i, first in enumerate(range(0, n, step)):
            cfg = {
                "protocol": spec.protocol,
                "urls": [s.ws_url for s in servers],
                "first": first,
                "count": min(step, n - first),
                "shared": SHARED,
                "privatePrefix": PRIVATE,
                "key": APP["key"],
                "secret": APP["secret"],
                "sources": sources,
                "concurrency": 100,
            }
            gens.append(await Child(f"nodesgen-{i}", ["node", NODESGEN, json.dumps(cfg)]).start())
        readies = await asyncio.gather(*(g.expect("ready", 600) for g in gens))
    except BaseException:
        await _close(gens)
        raise
    for gen, ready in zip(gens, readies, strict=True):
        gen.ready_info = ready  # type: ignore[attr-defined]
    if not sum(r["connected"] for r in readies):
        await _close(gens)
        raise gens[0].failure(f"no connection was made: {readies[0]['errors'][:3]}")
    return gens


def _add(total: dict[str, float], part: dict[str, float]) -> None:
    for key, value in part.items():
        total[key] = total.get(key, 0.0) + value


async def _broadcasts(
    gens: Sequence[Child], publish: Publish, n: int, sizes: Sizes, named: dict[str, Sequence[int]]
) -> Result:
    """Each broadcast, then wait until all ``n`` clients have it; the CPU and wall time
    of those windows, summed (the gaps between broadcasts are not counted)."""
    cpu: dict[str, float] = {}
    wall = 0.0
    expected = _received(gens)
    for seq in range(1, sizes.nodes_broadcasts + 1):
        if seq > 1:
            await asyncio.sleep(sizes.nodes_gap)
        meter = Meter(named)
        meter.start()
        await publish.many([(SHARED, envelope(SHARED, seq))])
        expected += n
        await _drain(gens, expected, quiet=10)
        seconds, used = meter.stop()
        wall += seconds
        _add(cpu, used)
    return {"wall": wall, "cpu": cpu}


async def _privates(
    gens: Sequence[Child], publish: Publish, n: int, connected: int, named: dict[str, Sequence[int]]
) -> Result:
    """One publication on every private channel, in batches of 1,000: each must reach
    its one subscriber (the load generator checks the session in it)."""
    await asyncio.sleep(0.5)
    expected = _received(gens) + connected
    meter = Meter(named)
    meter.start()
    for first in range(0, n, 1000):
        items = [
            (f"{PRIVATE}{i}", envelope(f"nodes-p{i}", 1))
            for i in range(first, min(n, first + 1000))
        ]
        await publish.many(items)
    await _drain(gens, expected, quiet=10)
    wall, cpu = meter.stop()
    return {"wall": wall, "cpu": cpu}


async def _slow_consumer_cuts(spec: ServerSpec, servers: Sequence[RunningServer]) -> int | None:
    """The sum of our nodes' ``broadcaster_slow_consumer_disconnects`` (None for the
    reference, which has no such cut)."""
    if spec.name != "broadcaster":
        return None
    total = 0
    for server in servers:
        host, port = server.url.removeprefix("http://").rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            writer.write(
                f"GET /metrics HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode()
            )
            await writer.drain()
            text = (await asyncio.wait_for(reader.read(), 30)).decode(errors="replace")
        finally:
            writer.close()
        found = False
        for line in text.splitlines():
            if line.startswith("broadcaster_slow_consumer_disconnects_total"):
                total += int(float(line.split()[-1]))
                found = True
        if not found:
            raise server.child.failure("no broadcaster_slow_consumer_disconnects in /metrics")
    return total


def _server_warnings(servers: Sequence[RunningServer]) -> list[str]:
    """Lines the nodes logged (at --log-level warning: every one is worth a look)."""
    lines: list[str] = []
    for server in servers:
        with contextlib.suppress(asyncio.QueueEmpty):
            while True:
                line = server.child.lines.get_nowait()
                banner = "listening on" in line or line.startswith("agent-broadcaster backend:")
                if line.strip() and not banner:
                    lines.append(f"{server.child.name}: {line}")
    return lines


def _latency(parts: Sequence[Result], broadcasts: int) -> tuple[Result | None, list[float]]:
    """p50/p99/max over every client and broadcast, and each broadcast's max (the time
    until every client had it), in ms."""
    every: list[int] = []
    until_all: list[float] = []
    for seq in range(1, broadcasts + 1):
        one = [us for p in parts for us in p["latencies_us"].get(str(seq), [])]
        if one:
            until_all.append(round(max(one) / 1000, 2))
        every += one
    if not every:
        return None, until_all
    every.sort()

    def pick(q: float) -> float:
        return round(every[min(len(every) - 1, int(q * len(every)))] / 1000, 2)

    return {"n": len(every), "p50": pick(0.5), "p99": pick(0.99), "max": pick(1.0)}, until_all


def _figures(spec: ServerSpec, scenario: str, sizes: Sizes, m: Result) -> Result:
    rss0, rss1, rss2, rss_end = m["rss"]
    cpu0, cpu1, cpu2 = m["cpu"]
    n = m["connected"]
    parts = m["parts"]
    broadcasts = sizes.nodes_broadcasts
    delivered = sum(p["shared_received"] for p in parts)
    latency, until_all = _latency(parts, broadcasts)
    close_codes: dict[str, int] = {}
    for part in parts:
        for code, count in part["close_codes"].items():
            close_codes[code] = close_codes.get(code, 0) + count
    b_cpu, b_wall = m["windows"]["cpu"], m["windows"]["wall"]
    p_cpu, p_wall = m["private"]["cpu"], m["private"]["wall"]
    private_delivered = sum(p["private_received"] for p in parts)
    errors = [e for p in parts for e in p["errors"]][:5]
    connect_seconds, subscribe_seconds = m["connect_seconds"], m["subscribe_seconds"]
    result: Result = {
        "server": spec.name,
        "scenario": scenario,
        "topology": "Redis Cluster, 3 primaries" if scenario == "nodes-cluster" else "one Redis",
        "nodes": m["nodes"],
        "connections": n,
        "connections_wanted": sizes.nodes_connections,
        "connect_failed": m["asked"] - n,
        "connections_per_node": math.ceil(m["asked"] / m["nodes"]),
        "loadgens": m["procs"],
        "source_addresses": m["sources"],
        "fd_limit": m["fd_limit"],
        "connect_seconds": round(connect_seconds, 2),
        "connect_per_s": round(n / connect_seconds) if connect_seconds else None,
        "subscribe_seconds": round(subscribe_seconds, 2),
        "subscribes_per_s": round(2 * n / subscribe_seconds) if subscribe_seconds else None,
        "subscribe_failed": m["subscribe_failed"],
        "server_cpu_us_per_connect": _per(cpu1 - cpu0, n),
        "server_cpu_us_per_subscribe": _per(cpu2 - cpu1, 2 * n),
        "rss_mb_before": round(rss0 / 2**20, 1),
        "rss_mb_connected": round(rss1 / 2**20, 1),
        "rss_mb_subscribed": round(rss2 / 2**20, 1),
        "rss_mb_end": round(rss_end / 2**20, 1),
        "rss_kb_per_conn": round((rss1 - rss0) / 1024 / n, 2),
        "rss_kb_per_conn_subscribed": round((rss2 - rss0) / 1024 / n, 2),
        "broadcasts": broadcasts,
        "expected": broadcasts * n,
        "delivered": delivered,
        "lost": sum(p["lost"] for p in parts) + sum(p["private_lost"] for p in parts),
        "broadcast_lost": sum(p["lost"] for p in parts),
        "duplicates": sum(p["duplicates"] for p in parts),
        "out_of_order": 0,  # one message per channel between checks: order is not at stake
        "wrong_channel": sum(p["wrong_channel"] for p in parts),
        "latency_ms": latency,
        "until_all_ms": until_all,
        "broadcast_seconds": round(b_wall, 3),
        "server_cpu_us_per_msg": _per(b_cpu.get("server", 0.0), delivered),
        "server_cpu_ms_per_broadcast": round(1000 * b_cpu.get("server", 0.0) / broadcasts, 1),
        "loadgen_cpu_us_per_msg": _per(b_cpu.get("loadgen", 0.0), delivered),
        "redis_cpu_ms_per_broadcast": round(1000 * b_cpu.get("redis", 0.0) / broadcasts, 1),
        "other_cpu_pct": round(100 * _other(b_cpu) / b_wall, 1) if b_wall else None,
        "private_published": m["asked"],
        "private_delivered": private_delivered,
        "private_lost": sum(p["private_lost"] for p in parts),
        "private_seconds": round(p_wall, 3),
        "private_server_cpu_us_per_msg": _per(p_cpu.get("server", 0.0), private_delivered),
        "unexpected_closes": sum(p["unexpected_closes"] for p in parts),
        "close_codes": close_codes,
        "closes_4100": close_codes.get("4100", 0),
        "slow_consumer_cuts": m["cuts"],
        "server_log_lines": len(m["warnings"]),
        "loadgen_loop_delay_ms": max(p["loop_delay_ms"]["max"] for p in parts),
    }
    if m["warnings"]:
        result["server_log"] = m["warnings"][:5]
    if m["connect_errors"]:
        result["connect_errors"] = m["connect_errors"]
    if errors:
        result["errors"] = errors
    return result


def targets(results: Sequence[Result]) -> list[Any]:
    """The scenario's own targets for our server: every connection made (the count
    asked for), nothing lost, no close and no slow-consumer cut; per topology."""
    from bench.report import Target

    found = []
    for scenario in SCENARIOS:
        ours = next(
            (
                r
                for r in results
                if r.get("server") == "broadcaster" and r.get("scenario") == scenario
            ),
            None,
        )
        where = "Redis Cluster" if scenario == "nodes-cluster" else "one Redis"
        if ours is None:
            found.append(Target(f"(33) connections over nodes, {where}", None, "not measured"))
            continue
        if "error" in ours:
            found.append(
                Target(f"(33) connections over nodes, {where}", False, ours["error"][:200])
            )
            continue
        name = (
            f"(33) {ours['connections_wanted']:,} connections over {ours['nodes']} nodes, "
            f"{where}: all connected, nothing lost, no close, no 4100 cut"
        )
        bad = (
            ours["connections"] < ours["connections_wanted"]
            or ours["connect_failed"]
            or ours["subscribe_failed"]
            or ours["lost"]
            or ours["duplicates"]
            or ours["wrong_channel"]
            or ours["unexpected_closes"]
            or ours["slow_consumer_cuts"]
        )
        latency = ours.get("latency_ms") or {}
        detail = (
            f"{ours['connections']:,} connected ({ours['connect_failed']} failed), "
            f"lost {ours['lost']}, "
            f"closes {ours['unexpected_closes']}, cuts {ours['slow_consumer_cuts']}; "
            f"broadcast p50/p99/max {latency.get('p50')}/{latency.get('p99')}/"
            f"{latency.get('max')} ms, {ours['server_cpu_us_per_msg']} us CPU/msg"
        )
        found.append(Target(name, not bad, detail))
    return found
