"""Agent sessions that publish through Redis, for the bench's ``agents`` scenario.

Each session is a real agent loop (:class:`agent_core.builder.AgentBuilder`) whose
:class:`~agent_core.drivers.scripted.ScriptedDriver` streams text chunks at a fixed rate
(20 per second by default), with the real :class:`AgentEventAdapter` turning its events
into envelopes. Every script step streams one second of text and calls a tool; the last
step only streams text. All sessions of one process share one publisher, as the run
manager's sessions do:

* ``broadcaster``: :class:`broadcaster.publishers.RedisPublisher` (the Redis backend's
  publish script: position, history entry, ``PUBLISH``);
* ``plain``: ``PUBLISH bench:<channel> <frame>`` of a Pusher frame, for the plain
  ``websockets`` reference;
* ``socketio``: the ``@socket.io/redis-emitter`` packet (MessagePack), for the socket.io
  reference's redis adapter.

The two reference publishers use the same bounded, ordered buffer and sender task as
``RedisPublisher`` (:class:`BufferedPublisher`): what waited during a round trip goes in
the next one, as one pipeline (up to 100); they differ only in what they send.

Run as ``python -m bench.agents '<json config>'`` with config ``{kind, redis_url,
app_id, sessions: [session ids], rate: 20, duration: 5}``. It prints ``{"type":
"ready"}``, runs every session on ``{"cmd": "start"}`` (starts staggered over one chunk
interval), then prints ``{"type": "done", "published": {channel: envelopes},
"total", "chunks", "dropped", "failures", "seconds", "lag_ms"}``; ``lag_ms`` is how late
the most delayed chunk left the driver (a saturated process shows here).
"""

from __future__ import annotations

import asyncio
import json
import math
import struct
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import orjson
from redis.asyncio import Redis

from agent_core.adapters.broadcasting import AgentEventAdapter
from agent_core.app.worker import event_loop_factory
from agent_core.builder import AgentBuilder
from agent_core.drivers.base import ModelDriver, ModelRequest, StreamEvent, TextDelta
from agent_core.drivers.scripted import ScriptedDriver, ScriptedResponse, call
from agent_core.tools import Tool
from broadcaster.envelope import Envelope
from broadcaster.publishers import (
    BufferedPublisher,
    Outgoing,
    Publisher,
    PublisherStats,
    RedisPublisher,
)

__all__ = ["main"]

_TEXT = "the agent looks up the figures and explains what it found in plain words"
_WORDS = _TEXT.split(" ")


def _out(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def lookup(query: str) -> str:
    """Look ``query`` up (answers at once: the bench measures publishing, not tools)."""
    return f"3 results for {query}"


def script(steps: int, chunks_per_step: int) -> list[ScriptedResponse]:
    """``steps`` turns of ``chunks_per_step`` word chunks each; all but the last also call
    :func:`lookup`, so the loop goes on."""
    turns = []
    for step in range(steps):
        chunks = tuple(f" {_WORDS[(step + k) % len(_WORDS)]}" for k in range(chunks_per_step))
        calls = () if step == steps - 1 else (call("lookup", f"call-{step}", query=f"q{step}"),)
        turns.append(ScriptedResponse(text="".join(chunks), chunks=chunks, tool_calls=calls))
    return turns


class ChunkPacer:
    """Wraps a driver: its text chunks leave at ``rate`` per second on a fixed schedule
    from ``start`` (other stream events pass at once), like a model streaming tokens.

    Attributes:
        lag: the most any chunk left after it was due (seconds).
    """

    def __init__(self, driver: ModelDriver, rate: float, start: float) -> None:
        self._driver = driver
        self._interval = 1 / rate
        self._next = start
        self.lag = 0.0

    def start(self, start: float) -> None:
        """Schedule the first chunk at ``start`` (monotonic)."""
        self._next = start

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        async for event in self._driver.stream(request):
            if isinstance(event, TextDelta):
                delay = self._next - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                else:
                    self.lag = max(self.lag, -delay)
                self._next += self._interval
            yield event


class Counting:
    """A :class:`Publisher` that counts what it is given per channel and passes it on."""

    def __init__(self, inner: Publisher) -> None:
        self.inner = inner
        self.stats: PublisherStats = inner.stats
        self.never_waits = bool(getattr(inner, "never_waits", False))
        self.counts: Counter[str] = Counter()
        self.chunks = 0

    async def broadcast(self, channel: str, envelope: Envelope) -> None:
        self.counts[channel] += 1
        self.chunks += envelope.type == "agent.stream.chunk"
        await self.inner.broadcast(channel, envelope)

    async def aclose(self) -> None:
        await self.inner.aclose()


class _PublishPublisher(BufferedPublisher):
    """A plain ``PUBLISH`` per envelope, what waited during a round trip in one pipeline
    (as :class:`RedisPublisher` batches); subclasses say what is published where."""

    def __init__(self, client: Redis) -> None:
        super().__init__(max_batch=100)
        self._client = client

    def _message(self, item: Outgoing) -> tuple[str, bytes]:
        raise NotImplementedError

    async def _send(self, batch: list[Outgoing]) -> None:
        pipe = self._client.pipeline(transaction=False)
        for item in batch:
            pipe.publish(*self._message(item))
        await pipe.execute()


class PlainPublisher(_PublishPublisher):
    """``PUBLISH bench:<channel> <Pusher frame>``: what the plain-websockets reference
    forwards unchanged."""

    def _message(self, item: Outgoing) -> tuple[str, bytes]:
        frame = orjson.dumps({"event": item.event, "channel": item.channel, "data": item.data})
        return f"bench:{item.channel}", frame


class SocketIOPublisher(_PublishPublisher):
    """What ``@socket.io/redis-emitter`` publishes for ``emitter.to(channel).emit(event,
    data)``, so that the socket.io reference's redis adapter delivers it to the room."""

    def _message(self, item: Outgoing) -> tuple[str, bytes]:
        packet = emitter_packet(item.channel, item.event, item.data)
        return f"socket.io#/#{item.channel}#", packet


def emitter_packet(room: str, event: str, data: str) -> bytes:
    """MessagePack of ``["emitter", {type: 2, data: [event, data], nsp: "/"}, {rooms:
    [room], flags: {}, except: []}]`` (socket.io-parser's EVENT packet)."""
    packet = b"\x83" + _str("type") + b"\x02" + _str("data") + b"\x92" + _str(event) + _str(data)
    packet += _str("nsp") + _str("/")
    opts = b"\x83" + _str("rooms") + b"\x91" + _str(room) + _str("flags") + b"\x80"
    opts += _str("except") + b"\x90"
    return b"\x93" + _str("emitter") + packet + opts


def _str(text: str) -> bytes:
    raw = text.encode()
    n = len(raw)
    if n < 32:
        return bytes([0xA0 | n]) + raw
    if n < 1 << 8:
        return b"\xd9" + bytes([n]) + raw
    if n < 1 << 16:
        return b"\xda" + struct.pack(">H", n) + raw
    return b"\xdb" + struct.pack(">I", n) + raw


def _publisher(kind: str, client: Redis, app_id: str) -> Publisher:
    if kind == "broadcaster":
        return RedisPublisher(client, app_id)
    if kind == "plain":
        return PlainPublisher(client)
    if kind == "socketio":
        return SocketIOPublisher(client)
    raise ValueError(f"unknown publisher kind {kind!r}: broadcaster, plain or socketio")


class Session:
    """One agent run streaming for about ``duration`` seconds, built before it starts
    (building hundreds of agents while others stream would delay their publishing)."""

    def __init__(self, publisher: Publisher, session: str, rate: float, duration: float) -> None:
        chunks_per_step = max(1, round(rate))
        steps = max(1, math.ceil(duration * rate / chunks_per_step))
        self.session = session
        self.driver = ChunkPacer(ScriptedDriver(script(steps, chunks_per_step)), rate, 0)
        self.adapter = AgentEventAdapter(publisher, session, f"x-{session}")
        builder = AgentBuilder().with_driver(self.driver).with_tools(Tool.from_function(lookup))
        self.agent = self.adapter.install(builder.with_max_steps(steps + 1)).build()

    async def run(self, start: float) -> float:
        """Run from ``start`` (monotonic); the worst lag of its chunks."""
        self.driver.start(start)
        await asyncio.sleep(max(0.0, start - time.monotonic()))
        try:
            await self.agent.run(f"bench session {self.session}")
        finally:
            await self.adapter.aclose()
        return self.driver.lag


async def _run(sessions: list[Session], rate: float, publisher: Counting) -> dict[str, Any]:
    began = time.monotonic()
    first = began + 0.05  # stagger starts over one chunk interval: no lockstep ticks
    n = len(sessions)
    lags = await asyncio.gather(*(s.run(first + i / n / rate) for i, s in enumerate(sessions)))
    await publisher.aclose()  # delivers what is buffered
    return {
        "type": "done",
        "published": dict(publisher.counts),
        "total": sum(publisher.counts.values()),
        "chunks": publisher.chunks,
        "dropped": publisher.stats.dropped,
        "seconds": time.monotonic() - began,
        "lag_ms": round(max(lags, default=0.0) * 1000, 2),
    }


async def _main(cfg: dict[str, Any]) -> None:
    client = Redis.from_url(cfg["redis_url"])
    try:
        await client.ping()
        publisher = Counting(_publisher(cfg["kind"], client, cfg.get("app_id", "bench")))
        rate, duration = float(cfg["rate"]), float(cfg["duration"])
        sessions = [Session(publisher, s, rate, duration) for s in cfg["sessions"]]
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        _out({"type": "ready"})
        while line := await reader.readline():
            cmd = json.loads(line) if line.strip() else {}
            if cmd.get("cmd") == "start":
                _out(await _run(sessions, rate, publisher))
            elif cmd.get("cmd") == "close":
                return
    finally:
        await client.aclose()


def main(argv: list[str] | None = None) -> None:
    """Entry point: ``python -m bench.agents '<json config>'``."""
    args = sys.argv[1:] if argv is None else argv
    try:
        # The loop the agent worker (agent_core/app/worker/cli.py) runs on.
        with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
            runner.run(_main(json.loads(args[0])))
    except Exception as exc:
        _out({"type": "fatal", "error": f"{type(exc).__name__}: {exc}"})
        raise SystemExit(1) from exc


if __name__ == "__main__":
    main()
