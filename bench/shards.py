"""Publish capacity through 1 vs 3 Redis Cluster shards, with 2 server nodes.

For each shard count, a Redis Cluster of that many primaries (no replicas; the slots
split evenly) and two ``agent-broadcaster serve`` processes on it. A load generator per
node subscribes one client to each of ``channels`` channels (so every publication is
delivered twice, once by each node). A publisher process publishes 300-byte envelopes
the way agents do (``publish_via_redis_cluster``: the publish script, pipelined per
shard), round robin over the channels, at a paced rate for a few seconds; the rate is
raised step by step until publish-to-receive p99 goes over 50 ms or messages are lost.

Figures per step: publications/s, p50/p99, Redis CPU per publication (all primaries),
server CPU per publication (both nodes). Only our server runs this scenario (the
references have no Redis Cluster publish path).

Run: ``scripts/bench --shards [--quick] [--counts 1,3]`` (or ``python -m bench.shards``);
results go to ``bench/results/shards-<time>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from redis.asyncio import Redis

from bench._proc import REPO, Child, ChildFailed, cpu_seconds
from bench.envelope import EVENT, envelope, session_of
from bench.scenarios import LOADGEN, _close, _drain, _stats
from bench.servers import APP, SERVERS, RunningServer, start_server
from broadcaster.backends.base import DEFAULT_REDIS_PREFIX

__all__ = ["main", "run_shards"]

P99_LIMIT_MS = 50.0
RATES = (1000, 2000, 3000, 4000, 6000, 8000, 12000, 16000)
Result = dict[str, Any]


# -- a Redis Cluster of primaries only ----------------------------------------------------


def _port_pair() -> int:
    """A free port P whose cluster bus port P + 10000 is free too."""
    for _ in range(1000):
        port = random.randrange(20000, 55000)
        if all(_free(p) for p in (port, port + 10000)):
            return port
    raise ChildFailed("no free port pair for a cluster node")


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class PrimariesCluster:
    """``shards`` cluster-enabled ``redis-server`` s, slots split evenly, joined by
    ``CLUSTER MEET`` (``redis-cli --cluster create`` wants at least 3 primaries)."""

    def __init__(self, shards: int) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise ChildFailed("redis-server is not installed (scripts/install --test installs it)")
        self.ports = [_port_pair() for _ in range(shards)]
        self.dirs = [tempfile.mkdtemp(prefix="bench-cluster-") for _ in range(shards)]
        self.children = []
        for port, folder in zip(self.ports, self.dirs, strict=True):
            argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
            argv += ["--appendonly", "no", "--dir", folder, "--logfile", ""]
            argv += ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
            self.children.append(Child(f"redis-{port}", argv))

    @property
    def url(self) -> str:
        return "redis-cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports) + "/"

    @property
    def pids(self) -> list[int]:
        return [c.pid for c in self.children]

    async def start(self, within: float = 30) -> PrimariesCluster:
        for child in self.children:
            await child.start()
        clients = [Redis(port=p) for p in self.ports]
        try:
            await _until(lambda: _all_answer(clients), within, "the cluster nodes to answer")
            n = len(clients)
            for i, client in enumerate(clients):
                low, high = 16384 * i // n, 16384 * (i + 1) // n - 1
                await client.execute_command("CLUSTER", "ADDSLOTSRANGE", low, high)
                if i:
                    await client.execute_command("CLUSTER", "MEET", "127.0.0.1", self.ports[0])
            await _until(lambda: _all_ok(clients), within, "the cluster to be ok")
        finally:
            for client in clients:
                await client.aclose()
        return self

    async def stop(self) -> None:
        await asyncio.gather(*(c.stop() for c in self.children))
        for folder in self.dirs:
            shutil.rmtree(folder, ignore_errors=True)


async def _all_answer(clients: Sequence[Redis]) -> bool:
    try:
        for client in clients:
            await client.ping()
    except OSError:
        return False
    except Exception:
        return False
    return True


async def _all_ok(clients: Sequence[Redis]) -> bool:
    for client in clients:
        info = await client.execute_command("CLUSTER", "INFO")
        text = info.decode() if isinstance(info, bytes) else str(info)
        if "cluster_state:ok" not in text or f"cluster_known_nodes:{len(clients)}" not in text:
            return False
    return True


async def _until(predicate: Any, within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not await predicate():
        if time.monotonic() > deadline:
            raise ChildFailed(f"timed out after {within}s waiting for {what}")
        await asyncio.sleep(0.05)


# -- the publisher (a child process) ------------------------------------------------------


async def _publish(cfg: dict[str, Any]) -> None:
    """Publish at ``rate``/s for ``duration`` s, round robin over ``channels``, each
    5 ms tick's due publications in one cluster pipeline; print ready, then done."""
    from broadcaster.backends.redis.clients import cluster_client
    from broadcaster.backends.redis.publish import publish_script_args
    from broadcaster.backends.redis.scripts import PUBLISH
    from broadcaster.publication import Publication

    client = cluster_client(cfg["url"])
    await client.initialize()
    await client.script_load(PUBLISH.source)
    channels: list[str] = cfg["channels"]
    seqs = dict.fromkeys(channels, 0)
    rate, duration = float(cfg["rate"]), float(cfg["duration"])
    total = round(rate * duration)
    print(json.dumps({"type": "ready"}), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)  # "start"
    sent, start = 0, time.monotonic()
    while sent < total:
        due = min(total, int((time.monotonic() - start) * rate) + 1)
        pipe = client.pipeline()
        for k in range(sent, due):
            channel = channels[k % len(channels)]
            seqs[channel] += 1
            data = envelope(session_of(channel), seqs[channel])
            publication = Publication(app_id=APP["id"], channel=channel, event=EVENT, data=data)
            keys, args = publish_script_args(
                DEFAULT_REDIS_PREFIX, publication, 100, 600, 86400, sharded=True
            )
            pipe.execute_command("EVALSHA", PUBLISH.sha, len(keys), *keys, *args)
        if due > sent:
            await pipe.execute()
        sent = due
        await asyncio.sleep(max(0.0, start + sent / rate - time.monotonic()))
    seconds = time.monotonic() - start
    published = {ch: n for ch, n in seqs.items() if n}
    print(
        json.dumps({"type": "done", "published": published, "total": sent, "seconds": seconds}),
        flush=True,
    )
    await client.aclose()
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)  # "close"


# -- the scenario -------------------------------------------------------------------------


async def _step(
    cluster: PrimariesCluster, servers: Sequence[RunningServer], rate: int, step: int, sizes: Any
) -> Result:
    channels = [f"agent.shards-{step}-{i}" for i in range(sizes.channels)]
    gens = []
    for i, server in enumerate(servers):
        cfg = {"url": server.ws_url, "protocol": "pusher", "channels": channels}
        cfg |= {"subscribe": True, "latency": True, "concurrency": 100}
        gens.append(await Child(f"loadgen-{i}", ["node", LOADGEN, json.dumps(cfg)]).start())
    pub_cfg = {"url": cluster.url, "channels": channels, "rate": rate, "duration": sizes.seconds}
    argv = [sys.executable, "-m", "bench.shards", "--publisher", json.dumps(pub_cfg)]
    pub = Child("publisher", argv)
    try:
        readies = await asyncio.gather(*(g.expect("ready", 60) for g in gens))
        await pub.start()
        await pub.expect("ready", 30)
        pids = {"redis": cluster.pids, "server": [s.pid for s in servers], "pub": [pub.pid]}
        before = {k: sum(cpu_seconds(p) for p in v) for k, v in pids.items()}
        pub.send({"cmd": "start"})
        done = await pub.expect("done", sizes.seconds + 60)
        expected = done["total"] * len(servers)
        await _drain(gens, expected, quiet=3)
        cpu = {k: sum(cpu_seconds(p) for p in v) - before[k] for k, v in pids.items()}
        stats = await _stats(gens, dict(done["published"].items()))
    finally:
        await _close([*gens, pub])
    n = done["total"]
    lost = stats["lost"]
    return {
        "shards": len(cluster.ports),
        "rate": rate,
        "published": n,
        "publications_per_s": round(n / done["seconds"]),
        "delivered": stats["received"],
        "lost": lost,
        "out_of_order": stats["out_of_order"],
        "subscribe_failed": sum(r["failed"] for r in readies),
        "unexpected_closes": stats["unexpected_closes"],
        "errors": [*(e for r in readies for e in r["errors"]), *stats.get("errors", [])][:5],
        "latency_ms": stats.get("latency_ms"),
        "redis_cpu_us_per_publication": round(cpu["redis"] * 1e6 / n, 2),
        "server_cpu_us_per_publication": round(cpu["server"] * 1e6 / n, 2),
        "publisher_cpu_pct": round(100 * cpu["pub"] / done["seconds"], 1),
    }


async def run_shards(shards: int, sizes: Any) -> Result:
    """Raise the rate until p99 > 50 ms (or a loss); the capacity is the last rate under."""
    cluster = await PrimariesCluster(shards).start()
    servers: list[RunningServer] = []
    steps: list[Result] = []
    try:
        for _ in range(2):
            servers.append(await start_server(SERVERS["broadcaster"], cluster.url))
        for i, rate in enumerate(sizes.rates):
            step = await _step(cluster, servers, rate, i, sizes)
            steps.append(step)
            print(json.dumps(step), flush=True)
            latency = step["latency_ms"] or {}
            if step["lost"] or latency.get("p99", 1e9) > P99_LIMIT_MS:
                break
    finally:
        for server in servers:
            await server.child.stop()
        await cluster.stop()
    under = [s for s in steps if not s["lost"] and (s["latency_ms"] or {}).get("p99", 1e9) <= 50]
    best = max(under, key=lambda s: s["publications_per_s"], default=None)
    return {"scenario": "shards", "shards": shards, "capacity": best, "steps": steps}


class Sizes:
    def __init__(self, quick: bool) -> None:
        self.channels = 32 if quick else 64
        self.seconds = 2.0 if quick else 4.0
        self.rates = RATES[::2] if quick else RATES


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--counts", default="1,3", help="shard counts to compare [1,3]")
    parser.add_argument("--quick", action="store_true", help="fewer channels, shorter steps")
    parser.add_argument("--publisher", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.publisher:
        asyncio.run(_publish(json.loads(args.publisher)))
        return 0
    sizes = Sizes(args.quick)
    results = [asyncio.run(run_shards(int(n), sizes)) for n in args.counts.split(",")]
    out = REPO / "bench" / "results" / f"shards-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    for result in results:
        best = result["capacity"] or {}
        print(
            f"{result['shards']} shard(s): {best.get('publications_per_s', 0)} publications/s "
            f"at p99 {(best.get('latency_ms') or {}).get('p99')} ms, Redis CPU "
            f"{best.get('redis_cpu_us_per_publication')} µs/publication"
        )
    print(f"wrote {out.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
