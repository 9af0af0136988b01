"""Publishes benchmark envelopes through Redis, the way each Python server expects them.

* ``broadcaster``: :func:`broadcaster.backends.redis.publish_many_via_redis`, what agent
  processes publish with (one atomic script per publication: position, history entry,
  ``PUBLISH``; one round trip per batch).
* ``plain``: ``PUBLISH bench:<channel> <frame>`` of a ready Pusher-style frame, for the
  plain-``websockets`` reference, which forwards those bytes unchanged.

Run as ``python -m bench.publisher '<json config>'``; the control protocol is the same as
``bench/node/publisher.js`` (one JSON command per stdin line, JSON lines on stdout):

* credit mode: ``{"cmd": "credit", "n": N}`` allows up to N publications in total,
  ``{"cmd": "stop"}`` ends and prints ``{"type": "done", "published": {channel: count}}``;
* paced mode: ``{"cmd": "start"}`` publishes ``rate`` publications per second (round robin
  over the channels) for ``duration`` seconds, then prints ``done`` with ``seconds`` (from
  the first publication to the last) and ``lag_ms`` (the most any publication was late).

Each channel has its own sequence 1, 2, 3... Channels are spread over ``tasks``
publishing tasks, each with its own Redis connection, so one channel's publications
always leave in order.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from redis.asyncio import Redis

from bench.envelope import EVENT, envelope, session_of
from broadcaster.backends.base import DEFAULT_REDIS_PREFIX

__all__ = ["main"]

Publish = Callable[[Redis, list[tuple[str, int]]], Awaitable[None]]


def _out(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _plain_publisher() -> Publish:
    async def publish(client: Redis, batch: list[tuple[str, int]]) -> None:
        pipe = client.pipeline(transaction=False)
        for channel, seq in batch:
            data = envelope(session_of(channel), seq)
            frame = orjson.dumps({"event": EVENT, "channel": channel, "data": data})
            pipe.publish(f"bench:{channel}", frame)
        await pipe.execute()

    return publish


def _broadcaster_publisher(cfg: dict[str, Any]) -> Publish:
    from broadcaster.backends.redis import publish_many_via_redis
    from broadcaster.publication import Publication

    app_id = cfg.get("app_id", "bench")
    prefix = cfg.get("prefix", DEFAULT_REDIS_PREFIX)
    size = int(cfg.get("history_size", 100))
    ttl = float(cfg.get("history_ttl", 600))

    async def publish(client: Redis, batch: list[tuple[str, int]]) -> None:
        # What agent processes use (RedisPublisher): the publish script, one round trip
        # per batch.
        publications = [
            Publication(
                app_id=app_id, channel=channel, event=EVENT, data=envelope(session_of(channel), seq)
            )
            for channel, seq in batch
        ]
        await publish_many_via_redis(
            client, prefix, publications, history_size=size, history_ttl=ttl
        )

    return publish


class Publisher:
    """Publishes on ``channels`` (round robin) when allowed by credit or a pace."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg = cfg
        self.channels: list[str] = list(cfg["channels"])
        self.seqs = [0] * len(self.channels)
        self.next = 0
        self.published = 0
        self.credit = 0
        self.limit: int | None = cfg.get("limit")
        self.stopped = False
        self.wake = asyncio.Event()
        self.lag = 0.0  # paced: the longest a publication left after it was due (s)
        self.seconds = 0.0  # paced: from the first publication to the last one sent
        kind = cfg["kind"]
        self.publish = _plain_publisher() if kind == "plain" else _broadcaster_publisher(cfg)
        tasks = max(1, min(int(cfg.get("tasks", 1)), len(self.channels)))
        self.clients = [Redis.from_url(cfg["redis_url"]) for _ in range(tasks)]

    def _take(self, n: int) -> list[list[tuple[str, int]]]:
        """The next ``n`` publications, grouped by publishing task."""
        groups: list[list[tuple[str, int]]] = [[] for _ in self.clients]
        for _ in range(n):
            i = self.next
            self.next = (i + 1) % len(self.channels)
            self.seqs[i] += 1
            groups[i % len(self.clients)].append((self.channels[i], self.seqs[i]))
        self.published += n
        return groups

    async def _send(self, n: int) -> None:
        groups = self._take(n)
        await asyncio.gather(
            *(self.publish(c, g) for c, g in zip(self.clients, groups, strict=True) if g)
        )

    async def run_credit(self) -> None:
        while not self.stopped:
            allowed = self.credit if self.limit is None else min(self.credit, self.limit)
            if self.published >= allowed:
                self.wake.clear()
                await self.wake.wait()
                continue
            await self._send(min(allowed - self.published, 64 * len(self.clients)))

    async def run_paced(self) -> None:
        """``rate`` publications per second for ``duration`` seconds. Every wake-up sends
        all that are due in one batch (a sleep per publication cannot keep 4,000/s), so
        the pace holds as long as a batch's round trip keeps up; :meth:`done` reports the
        rate achieved and the worst lag behind the schedule."""
        rate = float(self.cfg["rate"])
        count = round(rate * float(self.cfg["duration"]))
        start = time.monotonic()
        while self.published < count:
            now = time.monotonic()
            due = min(count, int((now - start) * rate) + 1)
            if due > self.published:
                # Envelopes are stamped when built: timer jitter and lag are not latency.
                self.lag = max(self.lag, now - (start + self.published / rate))
                await self._send(due - self.published)
                continue
            await asyncio.sleep(start + self.published / rate - now)
        self.seconds = time.monotonic() - start

    def done(self) -> None:
        counts = {ch: n for ch, n in zip(self.channels, self.seqs, strict=True) if n}
        done: dict[str, Any] = {"type": "done", "published": counts, "total": self.published}
        if self.seconds:
            done |= {"seconds": self.seconds, "lag_ms": round(self.lag * 1000, 2)}
        _out(done)


async def _commands(publisher: Publisher) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    worker: asyncio.Task[None] | None = None
    while line := await reader.readline():
        if not line.strip():
            continue
        cmd = json.loads(line)
        if cmd["cmd"] == "credit":
            publisher.credit = max(publisher.credit, int(cmd["n"]))
            publisher.wake.set()
            if worker is None:
                worker = asyncio.create_task(publisher.run_credit())
        elif cmd["cmd"] == "start":
            await publisher.run_paced()
            publisher.done()
        elif cmd["cmd"] == "stop":
            publisher.stopped = True
            publisher.wake.set()
            if worker is not None:
                await worker
            publisher.done()
        elif cmd["cmd"] == "close":
            return


async def _main(cfg: dict[str, Any]) -> None:
    publisher = Publisher(cfg)
    for client in publisher.clients:
        await client.ping()
    _out({"type": "ready"})
    try:
        await _commands(publisher)
    finally:
        for client in publisher.clients:
            await client.aclose()


def main(argv: list[str] | None = None) -> None:
    """Entry point: ``python -m bench.publisher '<json config>'``."""
    args = sys.argv[1:] if argv is None else argv
    try:
        asyncio.run(_main(json.loads(args[0])))
    except Exception as exc:
        _out({"type": "fatal", "error": f"{type(exc).__name__}: {exc}"})
        raise SystemExit(1) from exc


if __name__ == "__main__":
    main()
