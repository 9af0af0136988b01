"""RESP on raw connections: commands packed by hiredis, and replies read by asyncio
protocols that take over a connected redis-py connection (no stream buffer, task or
future per reply): :class:`PubSubReader` for pub/sub connections, :class:`ReplyReader`
for the publications' connection, :func:`round_trip` on a pooled connection.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, cast

import hiredis
from redis import __version__ as redis_version
from redis.asyncio import Redis
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError

from broadcaster._routes import RouteTable, deliver

__all__ = [
    "PubSubReader",
    "ReplyReader",
    "pack_commands",
    "replies_on",
    "round_trip",
    "take_over",
]


def pack_commands(commands: Sequence[Sequence[str | int | bytes]]) -> bytes:
    """``commands`` in the Redis protocol (RESP arrays of bulk strings, text as UTF-8),
    as one buffer (packed by hiredis: four times faster than in Python)."""
    # hiredis's stub types the command as a 1-tuple; it takes any number of arguments.
    return b"".join([hiredis.pack_command(cast(Any, tuple(command))) for command in commands])


async def round_trip(client: Redis, packed: bytes, replies: int, wait: float = 0.0) -> list[Any]:
    """Send ``packed`` (``replies`` commands) on one of ``client``'s pooled connections
    and read every reply: a command's error is its reply. A connection that fails
    midway is closed, not reused (replies may still be on their way). ``wait``: seconds
    a reply may take beyond the socket timeout (a ``WAIT`` among the commands)."""
    pool = client.connection_pool
    conn = await pool.get_connection()  # type: ignore[no-untyped-call]
    try:
        return await replies_on(conn, packed, replies, wait)
    except BaseException:
        await conn.disconnect()
        raise
    finally:
        await pool.release(conn)


async def replies_on(
    conn: AbstractConnection, packed: bytes, replies: int, wait: float
) -> list[Any]:
    """Send ``packed`` on ``conn`` and read ``replies`` replies (errors as replies)."""
    await conn.send_packed_command(packed)
    timeout = None
    if wait:
        socket_timeout = getattr(conn, "socket_timeout", None)
        timeout = None if socket_timeout is None else socket_timeout + wait
    results: list[Any] = []
    for _ in range(replies):
        try:
            results.append(await conn.read_response(timeout=timeout))
        except ResponseError as exc:  # that command's error; the others stand
            results.append(exc)
    return results


_FEED = 4096
"""Bytes of a large read fed to hiredis at a time: once it consumed 1 KB of its buffer,
it moves the rest to the front after every reply, so a read of many publications fed
whole (a node catching up under load) costs copying that grows with its square."""


class PubSubReader(asyncio.Protocol):
    """Reads a pub/sub connection as an :class:`asyncio.Protocol`: each wake-up feeds the
    bytes that arrived to one hiredis reader and hands every complete reply to
    ``on_reply`` at once, with no task, future or stream buffer per reply.

    With ``read_delay`` > 0, after a wake-up that came within ``read_delay`` of the one
    before or of the end of the last pause (publications arriving faster than one per
    ``read_delay``), it stops reading
    for that long, so the publications that arrive meanwhile are read in one wake-up (one
    system call, one delivery pass, one write per client) instead of one each: less CPU
    per message under load, at most ``read_delay`` more latency. Slower traffic is read
    at once: pausing would batch nothing there, and costs two ``epoll_ctl`` calls and a
    timer per wake-up.

    With ``on_message``, the data of each ``message`` push (``[b"message", channel,
    data]``) goes to it directly, and every other reply to ``on_reply``. With ``routes``,
    a push that a direct route delivers (:func:`broadcaster._routes.deliver`) goes
    nowhere else; the table hears how many a read delivered.

    It takes over a connected redis-py connection (:func:`take_over`), which keeps
    redis-py's connection setup (TLS, AUTH, SELECT, Sentinel) and command writing.
    """

    def __init__(
        self,
        on_reply: Callable[[Any], None],
        read_delay: float = 0.0,
        *,
        on_message: Callable[[bytes], None] | None = None,
        routes: RouteTable | None = None,
    ) -> None:
        self._on_reply = on_reply
        self._on_message = on_message
        self._routes = routes
        self._read_delay = read_delay
        self._parser = hiredis.Reader()
        self._transport: asyncio.Transport | None = None
        self._previous: asyncio.BaseProtocol | None = None  # redis-py's stream protocol
        self._paused = False
        self._last_read = -math.inf  # time.monotonic() of the last wake-up
        # Kept: asyncio.get_running_loop() makes a getpid() system call (CPython 3.11).
        self._loop = asyncio.get_running_loop()
        self.lost: asyncio.Future[BaseException] = self._loop.create_future()
        """Done with the reason once the connection is lost or unreadable."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods.
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        parser = self._parser
        on_reply = self._on_reply
        on_message = self._on_message
        table = self._routes
        routes = None if table is None or not table.routes else table.routes
        direct = 0
        began = time.perf_counter() if routes is not None else 0.0
        size = len(data)
        step = size if size <= 2 * _FEED else _FEED
        try:
            for start in range(0, size, step):
                parser.feed(data, start, min(step, size - start))
                while (reply := parser.gets()) is not False:
                    if on_message is not None and type(reply) is list and reply[0] == b"message":
                        # The hot path: a publication, one call.
                        if routes is not None and deliver(routes, reply):
                            direct += 1
                        else:
                            on_message(reply[2])
                        continue
                    if isinstance(reply, hiredis.ReplyError):
                        raise ResponseError(str(reply))
                    on_reply(reply)
        except (hiredis.ProtocolError, ResponseError) as exc:
            self._fail(RedisConnectionError(f"unreadable pub/sub reply: {exc}"))
            return
        finally:
            if direct and table is not None and table.on_delivered is not None:
                table.on_delivered(direct, began)
        if self._read_delay:
            now = time.monotonic()
            busy = now - self._last_read < self._read_delay
            self._last_read = now
            if busy and not self._paused and self._transport is not None:
                self._paused = True
                self._transport.pause_reading()
                self._loop.call_later(self._read_delay, self._resume)

    def _resume(self) -> None:
        self._paused = False
        # What arrived during the pause is read now, one more busy read: counted from
        # here, it pauses again, as a steady stream of publications should.
        self._last_read = time.monotonic()
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.resume_reading()

    def eof_received(self) -> bool:
        return False  # close the transport: connection_lost follows

    # redis-py's stream writer still writes commands: its flow control and close waiter
    # live in the protocol it made, which hears about them through these.
    def pause_writing(self) -> None:
        if self._previous is not None:
            self._previous.pause_writing()

    def resume_writing(self) -> None:
        if self._previous is not None:
            self._previous.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        if self._previous is not None:
            self._previous.connection_lost(exc)
        if not self.lost.done():
            self.lost.set_result(exc or RedisConnectionError("Redis closed the connection"))

    def _fail(self, exc: BaseException) -> None:
        if not self.lost.done():
            self.lost.set_result(exc)
        if self._transport is not None:
            self._transport.abort()


Replied = Callable[[list[Any] | BaseException], None]
"""What :meth:`ReplyReader.expect_call` calls: with the replies, or the connection's error."""


class ReplyReader(PubSubReader):
    """Reads a command connection's replies in order and hands them over in batches:
    :meth:`expect` a number of replies, :meth:`write` the packed commands, await the
    list (or :meth:`expect_call`: a function gets it). No stream buffer, coroutine or
    await per reply (the backend's publications connection). An error reply is its
    command's reply, as a ``ResponseError`` (``NoScriptError`` for NOSCRIPT); a lost or
    unreadable connection fails every batch still waiting."""

    def __init__(self) -> None:
        super().__init__(self._unexpected)
        # Per batch: its count, its replies so far, and its future or function.
        self._waiting: deque[tuple[int, list[Any], asyncio.Future[list[Any]] | Replied]] = deque()

    def expect(self, count: int) -> asyncio.Future[list[Any]]:
        """A future of the next ``count`` replies (after those expected before)."""
        future: asyncio.Future[list[Any]] = self._loop.create_future()
        if self.lost.done():
            future.set_exception(RedisConnectionError(f"connection lost: {self.lost.result()}"))
        else:
            self._waiting.append((count, [], future))
        return future

    def expect_call(self, count: int, replied: Replied) -> None:
        """Call ``replied`` with the next ``count`` replies (after those expected
        before) as soon as they are read, from the read itself: no future, no task,
        no wake-up of its own. If the connection is lost (or was) or unreadable first,
        ``replied`` gets the error instead, on a later tick. ``replied`` must not
        raise."""
        if self.lost.done():
            error = RedisConnectionError(f"connection lost: {self.lost.result()}")
            self._loop.call_soon(replied, error)
        else:
            self._waiting.append((count, [], replied))

    def write(self, data: bytes) -> None:
        """Send ``data`` (packed commands) on the connection."""
        if self._transport is None:
            raise RedisConnectionError("the connection is closed")
        self._transport.write(data)

    def data_received(self, data: bytes) -> None:
        parser = self._parser
        waiting = self._waiting
        try:
            parser.feed(data)
            while (reply := parser.gets()) is not False:
                if not waiting:
                    raise hiredis.ProtocolError(f"a reply nobody waits for: {reply!r:.80}")
                count, replies, target = waiting[0]
                if isinstance(reply, hiredis.ReplyError):
                    text = str(reply)
                    reply = (
                        NoScriptError(text) if text.startswith("NOSCRIPT") else ResponseError(text)
                    )
                replies.append(reply)
                if len(replies) == count:
                    waiting.popleft()
                    if not isinstance(target, asyncio.Future):
                        target(replies)  # expect_call
                    elif not target.done():  # not cancelled meanwhile
                        target.set_result(replies)
        except hiredis.ProtocolError as exc:
            self._fail(RedisConnectionError(f"unreadable reply: {exc}"))

    def _unexpected(self, reply: Any) -> None:  # pragma: no cover - data_received reads
        raise AssertionError("ReplyReader hands replies to the batches that expect them")

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self._fail_waiting(self.lost.result())

    def _fail(self, exc: BaseException) -> None:
        super()._fail(exc)
        self._fail_waiting(exc)

    def _fail_waiting(self, exc: BaseException) -> None:
        waiting, self._waiting = self._waiting, deque()
        for _, _, target in waiting:
            error = RedisConnectionError(f"connection lost: {exc}")
            if not isinstance(target, asyncio.Future):
                self._loop.call_soon(target, error)  # later, as a future's callbacks
            elif not target.done():
                target.set_exception(error)


async def connected_reply_reader(conn: AbstractConnection) -> ReplyReader:
    """Connect ``conn`` and make a new :class:`ReplyReader` read it (:func:`take_over`);
    ``conn`` is disconnected if either fails."""
    try:
        await conn.connect()  # type: ignore[no-untyped-call]
        reader = ReplyReader()
        take_over(conn, reader)
    except BaseException:
        await conn.disconnect(nowait=True)
        raise
    return reader


def take_over(conn: AbstractConnection, reader: PubSubReader) -> None:
    """Make ``reader`` read the connected redis-py connection ``conn`` (its writes still
    go through redis-py). Call it before sending anything whose reply is awaited.

    Raises:
        RuntimeError: redis-py's connection no longer has the stream attributes this
            relies on (a redis-py upgrade changed them; ``tests`` check this contract).
    """
    stream = getattr(conn, "_reader", None)
    writer = getattr(conn, "_writer", None)
    if not isinstance(stream, asyncio.StreamReader) or not isinstance(writer, asyncio.StreamWriter):
        raise RuntimeError(
            "redis-py's asyncio Connection has no _reader/_writer streams; this version "
            f"of redis-py ({redis_version}) is not supported by the pub/sub reader"
        )
    buffered = bytes(getattr(stream, "_buffer", b""))
    transport = writer.transport
    reader._previous = transport.get_protocol()
    transport.set_protocol(reader)
    reader.connection_made(transport)
    if buffered:
        reader.data_received(buffered)


# -- the backend ------------------------------------------------------------------------
