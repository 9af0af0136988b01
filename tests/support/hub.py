"""A scripted backend and recording connections for unit tests of the hub: no server,
no Redis, every step under the test's control."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from broadcaster._routes import RouteTable
from broadcaster.backends.base import BackendUnavailable, HistoryResult
from broadcaster.backends.redis.codec import (
    encode_publication,
    route_head,
    script_payload,
    split_payload,
)
from broadcaster.backends.redis.resp import PubSubReader, pack_commands
from broadcaster.connection import Connection, Delivery
from broadcaster.hub import Hub
from broadcaster.publication import FRAME_END, Position, Publication
from broadcaster.settings import AppConfig

APP = AppConfig(id="1", key="key", secret="secret")


def publication(channel: str, offset: int, epoch: str = "e1", **fields: Any) -> Publication:
    """A publication of ``channel`` at ``offset`` (its data says which one it is)."""
    data = json.dumps({"n": offset, "epoch": epoch})
    return Publication(APP.id, channel, "step", data, position=Position(offset, epoch), **fields)


@dataclass
class ScriptedBackend:
    """Only what the hub uses (subscribe, unsubscribe, history), scripted per test.

    ``streams`` holds each channel's history (oldest first, one epoch); ``trimmed``
    the offset below which it was trimmed away. ``gate`` makes the named operation
    (``"subscribe"``, ``"unsubscribe"``, ``"history"``) wait until the test sets it;
    ``fail`` makes it raise :class:`BackendUnavailable`, ``failures`` that many times;
    ``calls`` records every call in order.
    """

    streams: dict[str, list[Publication]] = field(default_factory=dict)
    trimmed: dict[str, int] = field(default_factory=dict)
    gate: dict[str, asyncio.Event] = field(default_factory=dict)
    fail: set[str] = field(default_factory=set)
    failures: dict[str, int] = field(default_factory=dict)
    calls: list[tuple[Any, ...]] = field(default_factory=list)
    breaks: int = 0  # a test adds one where the node followed a failover

    def append(self, channel: str, *publications: Publication) -> None:
        self.streams.setdefault(channel, []).extend(publications)

    async def _step(self, name: str) -> None:
        gate = self.gate.get(name)
        if gate is not None:
            await gate.wait()
        if name in self.fail:
            raise BackendUnavailable(f"{name} failed (scripted)")
        if self.failures.get(name, 0) > 0:
            self.failures[name] -= 1
            raise BackendUnavailable(f"{name} failed (scripted, {self.failures[name]} more)")

    async def subscribe(self, app_id: str, channel: str) -> None:
        self.calls.append(("subscribe", channel))
        await self._step("subscribe")

    async def unsubscribe(self, app_id: str, channel: str) -> None:
        self.calls.append(("unsubscribe", channel))
        await self._step("unsubscribe")

    async def history(
        self, app_id: str, channel: str, since: Position, limit: int | None = None
    ) -> HistoryResult:
        self.calls.append(("history", channel, since, limit))
        await self._step("history")
        stream = self.streams.get(channel, [])
        latest = stream[-1].position if stream else None
        if latest is None:
            return HistoryResult((), since.offset == 0, None)
        if (
            since.epoch != latest.epoch
            or since.offset < self.trimmed.get(channel, 0)
            or since.offset > latest.offset  # the store went back (as the Lua script says)
        ):
            return HistoryResult((), False, latest)
        newer = [p for p in stream if p.position is not None and p.position.offset > since.offset]
        return HistoryResult(tuple(newer[:limit] if limit else newer), True, latest)


class RecordingSocket:
    """A :class:`~broadcaster.transport.RawSocket` that keeps what is written to it (also
    what a direct route writes to its ``transport``, see :mod:`broadcaster._routes`)."""

    direct_routes = True

    def __init__(self) -> None:
        self.written = bytearray()
        self.backlog = 0  # bytes the "kernel" has not taken yet
        self.closed_with: int | None = None
        self.close_reason = ""
        self.disconnected = False
        self.transport = RecordingTransport(self)

    @property
    def closing(self) -> bool:
        return self.closed_with is not None

    @property
    def close_sent(self) -> bool:
        return self.closed_with is not None

    def write(self, data: bytes) -> None:
        if not self.closing:
            self.written += data

    def buffered(self) -> int:
        return self.backlog

    def close_now(self, code: int, reason: str, abort_after: float) -> None:
        self.closed_with = code
        self.close_reason = reason

    def messages(self) -> list[dict[str, Any]]:
        """Every text frame written, decoded (server frames are unmasked)."""
        out, data, i = [], bytes(self.written), 0
        while i < len(data):
            length, i = data[i + 1] & 0x7F, i + 2
            if length == 126:
                length, i = int.from_bytes(data[i : i + 2], "big"), i + 2
            elif length == 127:
                length, i = int.from_bytes(data[i : i + 8], "big"), i + 8
            out.append(json.loads(data[i : i + length]))
            i += length
        return out

    def offsets(self) -> list[int]:
        """The ``n`` of every channel event received (see :func:`publication`)."""
        return [json.loads(m["data"])["n"] for m in self.messages() if m["event"] == "step"]


class RecordingTransport:
    """The transport of a :class:`RecordingSocket`: what a direct route writes to."""

    def __init__(self, socket: RecordingSocket) -> None:
        self.socket = socket
        self.closing = False

    def write(self, data: bytes) -> None:
        self.socket.written += data

    def get_write_buffer_size(self) -> int:
        return self.socket.backlog

    def is_closing(self) -> bool:
        return self.closing


class _Routed:
    """What :func:`with_routes` adds to a scripted backend."""

    routes: RouteTable
    _breaks = 0

    @staticmethod
    def name_of(app_id: str, channel: str) -> bytes:
        return f"pub:{app_id}:{channel}".encode()

    @property
    def breaks(self) -> int:
        return self._breaks

    @breaks.setter
    def breaks(self, value: int) -> None:
        self._breaks = value
        self.routes.clear()


def with_routes(backend: ScriptedBackend) -> ScriptedBackend:
    """``backend`` (of any scripted class) with a route table for its pub/sub reader, as
    the Redis backend has: a break drops every route."""
    breaks = backend.breaks
    backend.__class__ = type(f"Routed{type(backend).__name__}", (_Routed, type(backend)), {})
    routed: Any = backend
    routed.routes = RouteTable(_Routed.name_of, route_head)
    routed._breaks = breaks
    return backend


def pubsub_push(table: RouteTable, p: Publication) -> bytes:
    """``p`` as a Redis pub/sub ``message`` push on its channel, the payload as the
    publish script makes it (with a position) or as a plain ``PUBLISH`` sends it."""
    if p.position is None:
        payload = encode_publication(p)
    else:
        before, after = script_payload(p)
        offset, epoch = str(p.position.offset).encode(), p.position.epoch.encode()
        payload = before + offset + b" " + epoch + after + epoch + b":" + offset + FRAME_END
    return pack_commands([(b"message", table.name_of(p.app_id, p.channel), payload)])


def routed_reader(hub: Hub, table: RouteTable) -> PubSubReader:
    """A pub/sub reader as the Redis backend makes it: direct routes first, then the
    hub's encoded path."""
    return PubSubReader(
        lambda reply: None,
        on_message=lambda data: hub.deliver_encoded(*split_payload(data)),
        routes=table,
    )


def recording_connection(
    socket_id: str, delivery: Delivery | None = None
) -> tuple[Connection, RecordingSocket]:
    """A real fast-path connection whose frames are recorded."""
    raw = RecordingSocket()
    return Connection.fast(socket_id, APP, delivery or Delivery(1 << 20), raw), raw


async def tick() -> None:
    """Let the event loop run what is ready (the per-tick flush, started tasks)."""
    for _ in range(3):
        await asyncio.sleep(0)
