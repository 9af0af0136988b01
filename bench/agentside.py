"""The publishing side of agent sessions, for the bench's ``agentside`` scenario: the
product's path against a minimal publisher written here, same envelopes, same pace.

Two kinds of publishing process, run one after the other in one bench run:

* ``product``: the ``agents`` scenario's sessions (:mod:`bench.agents`: a real
  ``AgentBuilder`` loop, a ``ScriptedDriver`` paced at 20 chunks/s, the real
  ``AgentEventAdapter`` and ``RedisPublisher``, with no counting wrapper in between).
  The bench reads its first session's envelopes back from Redis afterwards: the
  recording, each at its ``timestamp`` (when the adapter built it) after the start.
* ``floor``: no product code at all. Each session replays that recording at the same
  offsets (staggered like the product's sessions), re-stamped with its own session id,
  execution id and the time of sending: envelope dict -> ``orjson`` -> the publish
  script's arguments -> ``EVALSHA``, packed with ``hiredis`` into one write per loop
  tick for every session of the process, on one asyncio stream; replies are only
  counted. The Lua script's text comes from the bench (which reads it from
  ``broadcaster.backends.redis.scripts.PUBLISH``), so both sides run the very same
  script with the same keys and arguments: the history entry, position and ``PUBLISH``
  are the product's.

Run as ``python -m bench.agentside '<json config>'`` (or ``@<file>``). Common config:
``{kind, redis_url, app_id, sessions: [ids], rate, duration}``; the floor also takes
``{prefix, script, recording: [[seconds, event, data], ...]}``. It prints ``{"type":
"ready"}``, runs on ``{"cmd": "start"}`` and prints ``{"type": "done", "total",
"dropped", "seconds", "lag_ms"[, "sends", "start_wall"]}``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sys
import time
from datetime import UTC, datetime
from typing import Any

import hiredis
import orjson

__all__ = ["main"]


def _out(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


# -- the product's path -------------------------------------------------------------------


async def _product(cfg: dict[str, Any]) -> dict[str, Any]:
    """The ``agents`` scenario's sessions (bench/agents.py) on a bare ``RedisPublisher``:
    nothing of the bench's between the adapters and the publisher (the bench counts
    what reached Redis, and reads the first session's envelopes back from its history)."""
    from redis.asyncio import Redis

    from bench.agents import Session
    from broadcaster.publishers import RedisPublisher

    client = Redis.from_url(cfg["redis_url"])
    await client.ping()
    publisher = RedisPublisher(client, cfg["app_id"])
    rate, duration = float(cfg["rate"]), float(cfg["duration"])
    sessions = [Session(publisher, s, rate, duration) for s in cfg["sessions"]]

    async def run() -> dict[str, Any]:
        began = time.monotonic()
        start = began + 0.05
        start_wall = time.time() + (start - time.monotonic())
        n = len(sessions)
        lags = await asyncio.gather(*(s.run(start + i / n / rate) for i, s in enumerate(sessions)))
        await publisher.aclose()
        await client.aclose()
        stats = publisher.stats
        return {
            "total": stats.published + stats.dropped,
            "dropped": stats.dropped,
            "sends": stats.sends,
            "seconds": time.monotonic() - began,
            "lag_ms": round(max(lags, default=0.0) * 1000, 2),
            "start_wall": start_wall,
        }

    return await _serve(run)


# -- the floor: a minimal publisher, no product code ---------------------------------------


class _Replies(asyncio.Protocol):
    """Counts the replies of one Redis connection; remembers the first error."""

    def __init__(self) -> None:
        self.reader = hiredis.Reader()
        self.count = 0
        self.error: str | None = None
        self.transport: asyncio.Transport | None = None
        self.waiter: tuple[int, asyncio.Future[None]] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        while (reply := self.reader.gets()) is not False:
            self.count += 1
            if isinstance(reply, hiredis.ReplyError) and self.error is None:
                self.error = str(reply)
        if self.waiter is not None and self.count >= self.waiter[0]:
            if not self.waiter[1].done():
                self.waiter[1].set_result(None)
            self.waiter = None

    def connection_lost(self, exc: Exception | None) -> None:
        if self.waiter is not None and not self.waiter[1].done():
            self.waiter[1].set_exception(ConnectionError(f"Redis closed the connection: {exc}"))

    async def until(self, count: int) -> None:
        if self.count >= count:
            return
        self.waiter = (count, asyncio.get_running_loop().create_future())
        await self.waiter[1]


class Floor:
    """Envelopes of every session of this process go out as ``EVALSHA`` of the publish
    script, one write per loop tick."""

    def __init__(self, cfg: dict[str, Any], protocol: _Replies) -> None:
        self.app = cfg["app_id"]
        self.prefix = cfg["prefix"]
        self.sha = hashlib.sha1(cfg["script"].encode(), usedforsecurity=False).hexdigest()
        self.protocol = protocol
        self.pending: list[bytes] = []
        self.sent = 0
        self.epoch = os.urandom(6).hex()  # a new channel's epoch (the script keeps one)
        self.loop = asyncio.get_running_loop()

    def publish(self, channel: str, event: str, envelope: dict[str, Any]) -> None:
        data = orjson.dumps(envelope).decode()
        head = orjson.dumps({"event": event, "channel": channel, "data": data})[:-1]
        tag = f"{self.prefix}:{{{self.app}:{channel}}}"
        before = f"2 {self.app} {channel} ".encode()
        after = b" -\n" + head + b',"position":"'
        command = (
            "EVALSHA", self.sha, 2, f"{tag}:meta", f"{tag}:stream",
            f"{tag}:pub", before, 1000, 600_000, 86_400_000, self.epoch, after, b'"}', "PUBLISH",
        )  # fmt: skip
        if not self.pending:
            self.loop.call_soon(self.write)
        self.pending.append(hiredis.pack_command(command))  # type: ignore[arg-type]

    def write(self) -> None:
        assert self.protocol.transport is not None
        self.protocol.transport.write(b"".join(self.pending))
        self.sent += len(self.pending)
        self.pending = []


def _stamp() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")[:-6] + "Z"


async def _replay(
    floor: Floor, session: str, recording: list[tuple[float, str, dict[str, Any]]], start: float
) -> float:
    channel, execution, lag = f"agent.{session}", f"x-{session}", 0.0
    for at, event, template in recording:
        delay = start + at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        else:
            lag = max(lag, -delay)
        envelope = dict(template)
        envelope["session_id"] = session
        envelope["execution_id"] = execution
        envelope["timestamp"] = _stamp()
        floor.publish(channel, event, envelope)
    return lag


async def _floor(cfg: dict[str, Any]) -> dict[str, Any]:
    host, _, port = cfg["redis_url"].removeprefix("redis://").split("/")[0].partition(":")
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.create_connection(_Replies, host, int(port or 6379))
    transport.write(hiredis.pack_command(("SCRIPT", "LOAD", cfg["script"])))  # type: ignore[arg-type]
    await protocol.until(1)
    floor = Floor(cfg, protocol)
    recording = [(float(at), str(ev), orjson.loads(data)) for at, ev, data in cfg["recording"]]
    rate = float(cfg["rate"])

    async def run() -> dict[str, Any]:
        began = time.monotonic()
        start = began + 0.05
        sessions = cfg["sessions"]
        n = len(sessions)
        lags = await asyncio.gather(
            *(_replay(floor, s, recording, start + i / n / rate) for i, s in enumerate(sessions))
        )
        await asyncio.sleep(0)  # the last tick's write
        await protocol.until(1 + floor.sent)
        transport.close()
        if protocol.error is not None:
            raise RuntimeError(f"Redis refused a publication: {protocol.error}")
        return {
            "total": floor.sent,
            "dropped": 0,
            "seconds": time.monotonic() - began,
            "lag_ms": round(max(lags, default=0.0) * 1000, 2),
        }

    return await _serve(run)


# -- the process ----------------------------------------------------------------------------


async def _serve(run: Any) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    _out({"type": "ready"})
    done: dict[str, Any] = {}
    # After "done", wait for "close": the bench reads this process's CPU time first.
    while line := await reader.readline():
        cmd = json.loads(line) if line.strip() else {}
        if cmd.get("cmd") == "start":
            done = {"type": "done"} | await run()
            _out(done)
        elif cmd.get("cmd") == "close":
            break
    return done


def _loop_factory() -> Any:
    """uvloop's loop where it is installed, for both sides: what the agent worker runs
    on (``agent_core.app.worker.event_loop_factory``)."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def main(argv: list[str] | None = None) -> None:
    """Entry point: ``python -m bench.agentside '<json config>'``."""
    args = sys.argv[1:] if argv is None else argv
    text = args[0]
    if text.startswith("@"):  # a file: a long recording may not fit one argument
        with open(text[1:], encoding="utf-8") as file:
            text = file.read()
    cfg = json.loads(text)
    try:
        side = _product if cfg["kind"] == "product" else _floor
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            runner.run(side(cfg))
    except Exception as exc:
        _out({"type": "fatal", "error": f"{type(exc).__name__}: {exc}"})
        raise SystemExit(1) from exc


if __name__ == "__main__":
    main()
