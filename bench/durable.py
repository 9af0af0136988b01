"""What the durable mode (``--redis-wait-replicas``) costs per publication: the Redis
backend publishing to one private primary with one replica on loopback, with and
without ``WAIT 1``, in alternating rounds of the same run (same Redis, same machine
load). ``python -m bench.durable [--publications N] [--rounds R]``; one JSON line.

Two shapes: ``sequential`` (one publication at a time, each awaited: the latency a
publisher sees) and ``concurrent`` (``--in-flight`` publications at a time: the
backend's batches, one ``WAIT`` per batch). Figures are microseconds of wall time per
publication (median over the rounds) and the ratio with/without ``WAIT``; the replica is
on the same machine, so a real network's round trip comes on top.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid
from typing import Any

from redis.asyncio import Redis

from bench._redis import PrivateRedis
from broadcaster.backends.redis import RedisBackend
from broadcaster.publication import Publication

__all__ = ["main", "measure"]

APP = "bench"


async def _linked(primary: PrivateRedis, replica: PrivateRedis) -> None:
    client = Redis(host="127.0.0.1", port=replica.port)
    try:
        await client.replicaof("127.0.0.1", str(primary.port))
        for _ in range(500):
            info = await client.info("replication")
            if info.get("master_link_status") == "up":
                return
            await asyncio.sleep(0.02)
        raise RuntimeError("the replica did not link to the primary")
    finally:
        await client.aclose()


async def _round(backend: RedisBackend, count: int, in_flight: int) -> float:
    """Seconds per publication for ``count`` publications, ``in_flight`` at a time."""
    channel = f"agent.{uuid.uuid4().hex[:8]}"
    data = json.dumps({"type": "agent.stream.chunk", "payload": {"chunk": "x" * 200}})
    started = time.perf_counter()
    for start in range(0, count, in_flight):
        batch = range(start, min(start + in_flight, count))
        await asyncio.gather(
            *(backend.publish(Publication(APP, channel, "e", data)) for _ in batch)
        )
    return (time.perf_counter() - started) / count


async def measure(publications: int, rounds: int, in_flight: int) -> dict[str, Any]:
    """Run the comparison; the result line (see the module's docstring)."""
    primary, replica = await PrivateRedis().start(), await PrivateRedis().start()
    backends: dict[str, RedisBackend] = {}
    try:
        await _linked(primary, replica)
        for name, wait in (("plain", 0), ("wait1", 1)):
            backend = RedisBackend(primary.url, apps=(APP,), wait_replicas=wait)
            await backend.start(lambda p: None, lambda a, m: None)
            backends[name] = backend
        seconds: dict[str, list[float]] = {}
        for shape, flight in (("sequential", 1), ("concurrent", in_flight)):
            count = publications if flight > 1 else publications // 4
            for _ in range(rounds):  # alternating: both see the same drift in load
                for name, backend in backends.items():
                    per = await _round(backend, count, flight)
                    seconds.setdefault(f"{shape}_{name}", []).append(per)
        result: dict[str, Any] = {"scenario": "durable", "rounds": rounds, "in_flight": in_flight}
        for key, values in seconds.items():
            result[f"{key}_us"] = round(statistics.median(values) * 1e6, 1)
        for shape in ("sequential", "concurrent"):
            plain, wait = result[f"{shape}_plain_us"], result[f"{shape}_wait1_us"]
            result[f"{shape}_ratio"] = round(wait / plain, 2)
        return result
    finally:
        for backend in backends.values():
            await backend.stop()
        await primary.stop()
        await replica.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--publications", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--in-flight", type=int, default=64)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(measure(args.publications, args.rounds, args.in_flight))))


if __name__ == "__main__":
    main()
