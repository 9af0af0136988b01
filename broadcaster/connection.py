"""A connection: one client socket, its session state and its bounded outgoing buffer.

Frames queued for a connection within one event-loop tick are written with one
``transport.write`` when the loop next runs :class:`Delivery`'s flush (fast path), so
fanning a publication out to many subscribers costs one list append each and no task,
await or encode per subscriber.

Slow-consumer policy (named, per the style guide in docs/development.md): when a
connection's unsent bytes (its own pending frames plus the transport's write buffer)
would exceed ``max_buffer_bytes``, the connection is closed with code 4100 ("over
capacity", reconnect with back-off) and its pending frames are dropped. The other
subscribers of the same publications are not delayed or affected. One message larger
than ``max_buffer_bytes`` itself (a publisher's oversized event) is taken whole behind at
most ``max_buffer_bytes`` unsent, and the limit counts what is queued beyond it: so it
reaches every client that keeps up, live or in a resume (which sends it once nothing else
is unsent), and a connection holds at most ``max_buffer_bytes`` plus that one message. A
second one while the first may still be unsent closes the connection like any overflow.
Every close says why in its reason.
"""

from __future__ import annotations

import asyncio
import enum
from collections import deque
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from broadcaster._frames import PreparedMessage, close_reason
from broadcaster.codes import SLOW_CONSUMER
from broadcaster.settings import AppConfig
from broadcaster.transport import RawSocket

__all__ = [
    "SLOW_CONSUMER_CODE",
    "AsgiConnection",
    "Connection",
    "ConnectionState",
    "Delivery",
    "QueuedConnection",
]

SLOW_CONSUMER_CODE = SLOW_CONSUMER
_UNUSED = -1.0  # the subscribe bucket of a connection that never subscribed (shared)
AsgiSend = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class ConnectionState(enum.Enum):
    """Where a connection is in its life."""

    OPEN = "open"
    CLOSING = "closing"  # a close frame is queued or sent; nothing more is sent
    CLOSED = "closed"  # the socket is gone


class Delivery:
    """What every connection of a node shares: the outgoing limits and the once-per-tick
    flush of all connections that have frames waiting."""

    __slots__ = (
        "_dirty",
        "_loop",
        "_scheduled",
        "abort_after",
        "max_buffer_bytes",
        "on_slow_consumer",
    )

    def __init__(
        self,
        max_buffer_bytes: int,
        abort_after: float = 10.0,
        on_slow_consumer: Callable[[Connection], None] | None = None,
    ) -> None:
        self.max_buffer_bytes = max_buffer_bytes
        self.abort_after = abort_after
        self.on_slow_consumer = on_slow_consumer
        self._loop: asyncio.AbstractEventLoop | None = None
        self._dirty: list[Connection] = []
        self._scheduled = False

    def _schedule(self) -> None:
        """Flush at the end of this tick the connections that :meth:`Connection.send`
        adds to ``_dirty``."""
        self._scheduled = True
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        self._loop.call_soon(self.flush)

    def flush(self) -> None:
        """Write every waiting connection's frames (one write per connection)."""
        dirty, self._dirty = self._dirty, []
        self._scheduled = False
        for conn in dirty:
            conn.flush()


class Connection:
    """A client connection on the fast path (raw frames to the transport).

    Attributes:
        socket_id: The Pusher socket id, unique per connection.
        app: The application the client connected to.
        channels: Subscribed channel -> presence user id (None for other channels).
        user_id: The signed-in user (``pusher:signin``), if any.
        last_seen: Event-loop time of the last message from the client.
        pinged: True while a ``pusher:ping`` for inactivity awaits an answer.
    """

    __slots__ = (
        "_backlog",
        "_delivery",
        "_event_count",
        "_event_window",
        "_oversized",
        "_pending",
        "_pending_bytes",
        "_raw",
        "_subscribe_at",
        "_subscribe_tokens",
        "app",
        "channels",
        "last_seen",
        "pinged",
        "socket_id",
        "state",
        "user_id",
    )

    def __init__(self, socket_id: str, app: AppConfig, delivery: Delivery) -> None:
        self.socket_id = socket_id
        self.app = app
        self.channels: dict[str, str | None] = {}
        self.user_id: str | None = None
        self.last_seen = 0.0
        self.pinged = False
        self.state = ConnectionState.OPEN
        self._delivery = delivery
        self._raw: RawSocket | None = None
        self._pending: list[bytes] | None = None
        self._pending_bytes = 0
        self._backlog = 0  # the transport's unsent bytes at this tick's first frame
        self._oversized = 0  # bytes of the one message over the limit that may be unsent
        self._event_window = 0
        self._event_count = 0
        self._subscribe_tokens = _UNUSED  # a full bucket until the first subscribe
        self._subscribe_at = 0.0

    @classmethod
    def fast(cls, socket_id: str, app: AppConfig, delivery: Delivery, raw: RawSocket) -> Connection:
        """A connection writing raw frames to ``raw`` (see :mod:`broadcaster._uvicorn`)."""
        conn = cls(socket_id, app, delivery)
        conn._raw = raw
        return conn

    @property
    def is_open(self) -> bool:
        return self.state is ConnectionState.OPEN

    @property
    def raw(self) -> RawSocket | None:
        """The socket of a fast-path connection (None for a queued one)."""
        return self._raw

    @property
    def buffer_limit(self) -> int:
        """Unsent bytes past which the connection is a slow consumer
        (``max_buffer_bytes``)."""
        return self._delivery.max_buffer_bytes

    def send(self, message: PreparedMessage) -> None:
        """Queue ``message``; closes the connection (4100) if that would overflow it."""
        if self.state is not ConnectionState.OPEN:
            return
        frame = message.frame
        pending = self._pending
        if pending is None:  # the first frame of this tick: read the transport's backlog
            raw = self._raw  # (not self._buffered(): one call less per message)
            assert raw is not None
            self._backlog = raw.buffered()
        size = self._pending_bytes + len(frame)
        limit = self._delivery.max_buffer_bytes
        # The backlog read earlier in the tick can only have shrunk since: read it again
        # before calling the client slow.
        if size + self._backlog > limit:
            if not self._takes(len(frame), self._pending_bytes):
                return
        elif self._oversized:
            self._oversized = 0  # (nearly all) written: the plain limit again
        if pending is None:
            self._pending = [frame]
            # Flush at the end of this tick (inlined: once per connection and tick).
            delivery = self._delivery
            delivery._dirty.append(self)
            if not delivery._scheduled:
                delivery._schedule()
        else:
            pending.append(frame)
        self._pending_bytes = size

    def flush(self) -> None:
        """Write the queued frames now (normally called by :class:`Delivery`)."""
        pending = self._pending
        if pending is None:
            return
        self._pending = None
        self._pending_bytes = 0
        assert self._raw is not None
        self._raw.write(pending[0] if len(pending) == 1 else b"".join(pending))

    def close(self, code: int, reason: str = "") -> None:
        """Send what is queued, then a close frame with ``code``; idempotent."""
        if self.state is not ConnectionState.OPEN:
            return
        self.flush()
        self.state = ConnectionState.CLOSING
        self._close_socket(code, reason, self._delivery.abort_after)

    def closed(self) -> None:
        """The socket is gone: drop anything still queued."""
        self.state = ConnectionState.CLOSED
        self._pending = None
        self._pending_bytes = 0

    def unsent(self) -> int:
        """Bytes queued for this connection and not yet taken by the peer's socket (or
        by the reader of a queued connection)."""
        return self._pending_bytes + self._buffered()

    async def drained(self, below: int) -> bool:
        """Wait until fewer than ``below`` bytes are :meth:`unsent` (for senders that
        pace themselves, e.g. a resume streaming a long history; bound the wait with
        ``asyncio.timeout``).

        Returns:
            True when there is room, False when the connection closed meanwhile.
        """
        pause = 0.002
        while self._writable() and self.unsent() >= below:
            await asyncio.sleep(pause)  # the fast path has no drain callback: poll
            pause = min(pause * 2, 0.05)
        return self._writable()

    def _writable(self) -> bool:
        """Open, and (fast path) its socket not going away: a lost peer never drains."""
        if self.state is not ConnectionState.OPEN:
            return False
        return self._raw is None or not self._raw.closing

    def slow_consumer(self) -> None:
        """Drop what is queued and close with 4100 (the slow-consumer policy)."""
        if self.state is ConnectionState.OPEN:
            self._slow_consumer()

    def allow_subscribe(self, now: float, per_second: int, burst: int) -> bool:
        """Take one subscribe from a bucket of ``burst`` that refills at ``per_second``;
        False when it is empty (nothing is taken then)."""
        tokens = self._subscribe_tokens
        if tokens is _UNUSED:
            tokens = float(burst)
        else:
            tokens = min(float(burst), tokens + (now - self._subscribe_at) * per_second)
        self._subscribe_at = now
        if tokens < 1.0:
            self._subscribe_tokens = tokens
            return False
        self._subscribe_tokens = tokens - 1.0
        return True

    def allow_client_event(self, now: float, per_second: int) -> bool:
        """Count a client event against the per-second limit; False when over it."""
        window = int(now)
        if window != self._event_window:
            self._event_window = window
            self._event_count = 0
        self._event_count += 1
        return self._event_count <= per_second

    def _takes(self, size: int, pending: int) -> bool:
        """Whether a message of ``size`` bytes may join what is unsent (``pending`` of it
        not yet handed to the transport): within ``max_buffer_bytes``, not counting one
        message larger than that (:attr:`_oversized`, taken whole so that it can reach
        anyone at all). Closes the connection (4100) if not."""
        unsent = pending + self._buffered()
        limit = self._delivery.max_buffer_bytes
        if unsent == 0 or unsent + size <= limit:  # what was exempt is (nearly) gone
            self._oversized = size if size > limit else 0
            return True
        if unsent + size <= limit + self._oversized:
            return True
        if size > limit and not self._oversized and unsent <= limit:
            self._oversized = size
            return True
        if size > limit:
            self._slow_consumer(
                f"slow consumer: {unsent} bytes unsent ahead of a {size}-byte message "
                f"(max_buffer_bytes {limit})"
            )
        else:
            self._slow_consumer()
        return False

    def _slow_consumer(self, reason: str | None = None) -> None:
        self._pending = None
        self._pending_bytes = 0
        self.state = ConnectionState.CLOSING
        if reason is None:
            reason = f"slow consumer: more than {self._delivery.max_buffer_bytes} bytes unsent"
        self._close_socket(SLOW_CONSUMER_CODE, reason, self._delivery.abort_after)
        if self._delivery.on_slow_consumer is not None:
            self._delivery.on_slow_consumer(self)

    def _buffered(self) -> int:
        assert self._raw is not None
        return self._raw.buffered()

    def _close_socket(self, code: int, reason: str, abort_after: float) -> None:
        assert self._raw is not None
        self._raw.close_now(code, reason, abort_after)

    def __repr__(self) -> str:
        return f"<Connection {self.socket_id} app={self.app.id} {self.state.value}>"


class QueuedConnection(Connection):
    """A subscriber whose messages wait in its own queue for a task to write them
    (rather than going straight to a transport), under the same byte limit and
    slow-consumer policy. Subclasses drain :attr:`_queue` when :attr:`_wakeup` is set."""

    __slots__ = ("_queue", "_queued_bytes", "_wakeup")

    def __init__(self, socket_id: str, app: AppConfig, delivery: Delivery) -> None:
        super().__init__(socket_id, app, delivery)
        self._queue: deque[PreparedMessage] = deque()
        self._queued_bytes = 0
        self._wakeup = asyncio.Event()

    def send(self, message: PreparedMessage) -> None:
        if self.state is not ConnectionState.OPEN:
            return
        size = self._queued_bytes + len(message)
        if size > self._delivery.max_buffer_bytes:
            if not self._takes(len(message), 0):
                return
        elif self._oversized:
            self._oversized = 0
        self._queue.append(message)
        self._queued_bytes = size
        self._wakeup.set()

    def flush(self) -> None:
        self._wakeup.set()

    def closed(self) -> None:
        super().closed()
        self._drop()
        self._wakeup.set()

    def _drop(self) -> None:
        self._queue.clear()
        self._queued_bytes = 0

    def _slow_consumer(self, reason: str | None = None) -> None:
        self._drop()
        super()._slow_consumer(reason)

    def _buffered(self) -> int:
        return self._queued_bytes


class AsgiConnection(QueuedConnection):
    """The fallback for servers without the fast path: messages go through the ASGI
    ``send`` from one writer task, with the same byte limit and slow-consumer policy."""

    __slots__ = ("_close", "_send", "_writer")

    def __init__(self, socket_id: str, app: AppConfig, delivery: Delivery, send: AsgiSend) -> None:
        super().__init__(socket_id, app, delivery)
        self._send = send
        self._close: tuple[int, str] | None = None
        self._writer = asyncio.get_running_loop().create_task(self._write_loop())

    def closed(self) -> None:
        super().closed()
        self._writer.cancel()

    def _close_socket(self, code: int, reason: str, abort_after: float) -> None:
        self._close = (code, reason)
        self._wakeup.set()

    async def _write_loop(self) -> None:
        try:
            while True:
                await self._wakeup.wait()
                self._wakeup.clear()
                while self._queue:
                    message = self._queue.popleft()
                    self._queued_bytes -= len(message)
                    await self._send({"type": "websocket.send", "text": message.text})
                if self._close is not None:
                    code, reason = self._close
                    close = {
                        "type": "websocket.close",
                        "code": code,
                        "reason": close_reason(reason),
                    }
                    await self._send(close)
                    return
        except Exception:  # any failure to send means the client is gone
            return  # the receive side notices the disconnect and cleans up
