"""Server-sent events: a channel's publications over plain HTTP, resumable by position.

For networks that block WebSockets, and for browsers' ``EventSource``:

=====  =============================================  ======================================
GET    ``/api/sessions/{session_id}/events``          a session's envelopes (``agent.<id>``,
                                                      or ``private-agent.<id>`` with a token)
GET    ``/api/channels/{channel}/events``             any public or private channel
=====  =============================================  ======================================

Each publication is one SSE event: ``id: <epoch>:<offset>`` (its history position),
``event: <event name>`` (the envelope ``type`` for agent envelopes) and ``data: <data>``
(the envelope JSON). A client that reconnects with ``Last-Event-ID`` (``EventSource``
does this by itself) or ``?since=<epoch>:<offset>`` receives what it missed from the
channel's history and then the live stream, with no gap and no duplicate, followed by a
``broadcaster:resume`` event (no ``id``) saying whether the history reached back that
far. Comment lines (``: ping``) every ``sse_heartbeat`` seconds of silence keep proxies
from closing an idle stream.

Under the hood an SSE stream is one more hub subscriber (:class:`FeedConnection`): the
hub hands it the same encoded message as every WebSocket, it queues it in O(1) and its
own task turns it into SSE text, so the WebSocket fan-out is not slowed. The same
slow-consumer policy applies: a stream whose unsent bytes would exceed
``max_buffer_bytes`` is ended, and the client resumes from its last id.

An ended stream (too slow, or the server shutting down) is unsubscribed at once, and
its connection is dropped if the client has not taken the end of the stream within
:attr:`ChannelFeed.drop_after` seconds (it stopped reading): as a WebSocket consumer that
is too slow, or that does not answer the shutdown close frame, is dropped. A stalled
client holds neither a subscription, nor memory, nor the graceful shutdown.

Each stream holds one TCP connection, so streams count against the same per-address
limit as WebSocket connections (``max_connections_per_ip``, one count for both, see
:mod:`broadcaster._guard`): over it a new stream is answered ``429`` with
``Retry-After`` and a JSON message naming the limit, before this module sees it.
(``EventSource`` does not retry after a 429; a client that wants to should reconnect
after ``Retry-After`` itself.)

Authorization (no socket, so no Pusher socket signature):

- ``private-*`` channels need ``?auth=<app_key>:<hex HMAC-SHA256 of the channel name
  under the stream-auth key>`` (:func:`broadcaster.signing.stream_auth`): a key derived
  from the app secret for this purpose only, so it is never a Pusher signature.
- The session form also accepts ``?token=<session token>`` (or ``Authorization: Bearer``),
  the per-session token the demo hands out (:func:`session_token`). With either, the
  session's private channel ``private-agent.<id>`` is streamed.
- ``presence-*`` and ``#server-to-user-*`` channels need a WebSocket (membership,
  sign-in) and are refused with 400.

Errors are JSON ``{"error": ...}``: 400 (bad channel, session id or position), 403
(missing or wrong authorization), 404 (unknown app, or a session with no history, no
stored state and no position handed out), 503 (the backend is unreachable). A history
that cannot be read once the stream is open (``history_read_timeout``) ends the stream
with an ``: ended: ...`` comment; ``EventSource`` then reconnects with ``Last-Event-ID``.
A long history streams as the client reads it, never more than half of
``max_buffer_bytes`` ahead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import socket
import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route
from starlette.types import Receive, Scope, Send

from broadcaster import protocol
from broadcaster._frames import PreparedMessage
from broadcaster._text import excerpt
from broadcaster.backends.base import BackendUnavailable
from broadcaster.channels import (
    ChannelKind,
    channel_kind,
    server_to_user_id,
    validate_channel_name,
)
from broadcaster.codes import ErrorCode
from broadcaster.connection import Delivery, QueuedConnection
from broadcaster.cors import READ_METHODS, cross_origin
from broadcaster.exceptions import ProtocolError
from broadcaster.node import Node
from broadcaster.publication import Position
from broadcaster.publishers import state_key
from broadcaster.sessions import SessionRefused as _Refused
from broadcaster.sessions import asked_app, request_app, session_channel
from broadcaster.settings import AppConfig
from broadcaster.signing import verify_stream_auth

__all__ = [
    "FINAL_STATUSES",
    "FROM_START",
    "HEARTBEAT",
    "MEDIA_TYPE",
    "ChannelFeed",
    "FeedConnection",
    "FeedItem",
    "decode",
    "encode_event",
    "is_final_status",
    "resume_position",
    "routes",
    "stream_feed",
]

log = logging.getLogger("broadcaster.sse")

FROM_START = "0"
"""``?since=0``: from the start of the channel's kept history."""
FINAL_STATUSES = frozenset({"completed", "failed"})
"""The ``agent.status`` values that end a run (``?until=final`` stops after the first
one of a run that is not nested in another)."""

MEDIA_TYPE = "text/event-stream"
HEARTBEAT = b": ping\n\n"

_LINE_BREAK = re.compile(r"\r\n|\r|\n")
_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


# -- wire format (sans I/O) -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FeedItem:
    """One message of a channel as the hub delivered it: ``event`` name, ``data`` text
    and, for publications kept in history, their ``position`` (``"<epoch>:<offset>"``)."""

    event: str
    data: str
    position: str | None = None


def decode(message: PreparedMessage) -> FeedItem:
    """The event, data and position of a channel message built by the hub."""
    frame: dict[str, Any] = orjson.loads(message.payload)
    data = frame.get("data", "")
    text = data if isinstance(data, str) else orjson.dumps(data).decode()
    return FeedItem(str(frame.get("event", "")), text, frame.get("position"))


def encode_event(item: FeedItem) -> bytes:
    """``item`` as one SSE event: ``id:`` (if it has a position), ``event:`` and one
    ``data:`` line per line of its data."""
    lines = [] if item.position is None else [f"id: {item.position}"]
    lines.append(f"event: {_LINE_BREAK.sub(' ', item.event)}")
    lines.extend(f"data: {line}" for line in _LINE_BREAK.split(item.data))
    return ("\n".join(lines) + "\n\n").encode()


def _comment(text: str) -> bytes:
    return f": {_LINE_BREAK.sub(' ', text)}\n\n".encode()


# -- the hub subscriber ---------------------------------------------------------------


class FeedConnection(QueuedConnection):
    """A hub subscriber that is not a socket: what the hub sends is queued for a
    reader task (:meth:`take`), under the node's byte limit and slow-consumer policy
    (over the limit, the feed ends with :attr:`ended` set)."""

    __slots__ = ("_over", "ended")

    def __init__(self, app: AppConfig, delivery: Delivery) -> None:
        super().__init__(protocol.new_socket_id(), app, delivery)
        self.ended: str | None = None
        self._over = asyncio.Event()

    async def wait_ended(self) -> None:
        """Return once the feed has ended."""
        await self._over.wait()

    async def take(self, wait: float) -> list[PreparedMessage]:
        """What was queued, waiting up to ``wait`` seconds for something (an empty
        list when nothing came or the feed ended)."""
        if not self._queue and self.ended is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), wait)
        self._wakeup.clear()
        batch = list(self._queue)
        self._drop()
        return batch

    def _close_socket(self, code: int, reason: str, abort_after: float) -> None:
        self.ended = reason or f"closed ({code})"
        self._over.set()
        self._wakeup.set()

    def __repr__(self) -> str:
        return f"<FeedConnection {self.socket_id} app={self.app.id} {self.state.value}>"


class ChannelFeed:
    """A channel's messages from a position on, as an async context manager.

    On entry the feed subscribes to ``channel`` (holding live publications back); with
    ``since``, a task then streams the history after it page by page as the reader
    drains the feed, then the held publications that are newer (the hub's resume, as
    for a WebSocket), then a ``broadcaster:resume`` message. A history read that fails
    ends the feed (the client reconnects with ``Last-Event-ID``). Without ``since`` it
    starts with the live stream.

    Args:
        node: the node whose hub and backend to use.
        app: the app of the channel.
        channel: the channel to follow (authorization is the caller's business).
        since: resume after this position.

    Raises:
        BackendUnavailable: on entry, when the backend cannot subscribe or read history.
    """

    def __init__(self, node: Node, app: AppConfig, channel: str, since: Position | None) -> None:
        self.node = node
        self.app = app
        self.channel = channel
        self.since = since
        self.conn = FeedConnection(app, node.delivery)
        self._subscribed = False
        self._occupied = False
        self._resuming: asyncio.Task[None] | None = None

    async def __aenter__(self) -> ChannelFeed:
        hub, conn = self.node.hub, self.conn
        await hub.subscribe(conn, self.channel, recovering=True)
        self.node.streams.add(conn)
        self._subscribed = True
        self._counted(+1)
        try:
            await self.node.backend.add_subscriptions(self.app.id, self.channel, 1)
            self._occupied = True
            await self._resume()
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def _resume(self) -> None:
        if self.since is None:
            self.node.hub.release(self.conn, self.channel)
            return
        # Paced by the reader of the feed: it must run beside the response.
        self._resuming = asyncio.create_task(self._stream_history(self.since))

    async def _stream_history(self, since: Position) -> None:
        hub, conn, channel = self.node.hub, self.conn, self.channel
        try:
            resumed = await hub.resume(conn, channel, since)
        except BackendUnavailable as exc:
            conn.close(ErrorCode.OVER_CAPACITY, f"history not read ({exc})")
            return
        reason = None if resumed.recovered else "the channel's history no longer reaches back"
        notice = protocol.resume_result(channel, resumed.recovered, resumed.position, reason)
        conn.send(PreparedMessage(notice))

    async def receive(self, wait: float) -> list[FeedItem]:
        """The next messages, waiting up to ``wait`` seconds (empty when none came
        or the feed :attr:`ended`)."""
        return [decode(message) for message in await self.conn.take(wait)]

    @property
    def ended(self) -> str | None:
        """Why the feed ended (it fell too far behind), or None while it runs."""
        return self.conn.ended

    @property
    def drop_after(self) -> float:
        """Seconds the client of an ended feed has to take the rest of its stream before
        its connection is dropped: the ``abort_after`` of a slow WebSocket consumer, but
        no more than the half of ``shutdown_timeout`` that a WebSocket client has to
        answer the shutdown close frame, so that a stalled stream, ended before or by a
        shutdown, never holds the graceful shutdown longer."""
        return min(self.node.delivery.abort_after, self.node.settings.shutdown_timeout / 2)

    async def aclose(self) -> None:
        """Unsubscribe and drop what is still queued; idempotent."""
        self.conn.closed()
        await self.leave()

    async def leave(self) -> None:
        """Unsubscribe, leaving what is queued to the reader; idempotent, but not to be
        run by two tasks at once."""
        if self._resuming is not None:
            self._resuming.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._resuming
            self._resuming = None
        self.node.streams.discard(self.conn)
        if not self._subscribed:
            return
        self._subscribed = False
        self._counted(-1)
        await self.node.hub.unsubscribe(self.conn, self.channel)
        if not self._occupied:
            return
        self._occupied = False
        try:
            await self.node.backend.add_subscriptions(self.app.id, self.channel, -1)
        except BackendUnavailable as exc:
            log.warning("leaving %s (SSE %s): %s", self.channel, self.conn.socket_id, exc)

    def _counted(self, delta: int) -> None:
        metrics = self.node.metrics
        metrics.subscriptions.inc(delta)
        metrics.channels.set(self.node.hub.channels())


# -- the response ---------------------------------------------------------------------


class EventStreamResponse(Response):
    """Streams a :class:`ChannelFeed` as SSE until the client goes away; answers 503
    instead when the feed cannot be opened."""

    media_type = MEDIA_TYPE

    def __init__(self, feed: ChannelFeed, heartbeat: float, *, until_final: bool = False) -> None:
        super().__init__(media_type=MEDIA_TYPE)
        self.feed = feed
        self.heartbeat = heartbeat
        self.until_final = until_final

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.feed.__aenter__()
        except BackendUnavailable as exc:
            await _error(503, f"cannot follow {self.feed.channel!r} now: {exc}")(
                scope, receive, send
            )
            return
        events = _events(self.feed, self.heartbeat, self.until_final)
        body = StreamingResponse(events, 200, _HEADERS, MEDIA_TYPE)
        await stream_feed(self.feed, body, scope, receive, send)


async def stream_feed(
    feed: ChannelFeed, body: Response, scope: Scope, receive: Receive, send: Send
) -> None:
    """Send ``body``, the response that streams ``feed`` (entered), then close the feed.

    When the feed ends while ``body`` is still being sent (the client fell
    ``max_buffer_bytes`` behind, or the server is shutting down), the feed unsubscribes
    at once, and the connection is dropped if ``body`` is not sent within
    :attr:`ChannelFeed.drop_after` seconds. Otherwise a client that stops reading keeps
    its subscription, its buffers and a pending graceful shutdown for as long as it
    stays connected: the response waits in ``send`` for a drain that never comes.
    """
    sending = asyncio.create_task(body(scope, receive, send))
    ending = asyncio.create_task(feed.conn.wait_ended())
    try:
        await asyncio.wait((sending, ending), return_when=asyncio.FIRST_COMPLETED)
        if not sending.done():
            await feed.leave()
            done, _ = await asyncio.wait((sending,), timeout=feed.drop_after)
            if not done:
                _abort(receive)  # then the response ends as for any lost client
        await sending
    finally:
        ending.cancel()
        sending.cancel()
        await feed.aclose()


def _abort(receive: Receive) -> None:
    # ASGI cannot drop a connection: uvicorn closes the transport of a failed response,
    # which waits (forever, here) for the client to take the buffered bytes. uvicorn's
    # receive is a method of its request cycle, which holds the transport: abort that.
    transport: Any = getattr(getattr(receive, "__self__", None), "transport", None)
    if not callable(getattr(transport, "abort", None)):
        log.warning("cannot drop a stalled stream: the server's transport is out of reach")
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:  # reset: after a plain close the kernel keeps sending the backlog
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


async def _events(feed: ChannelFeed, heartbeat: float, until_final: bool) -> AsyncIterator[bytes]:
    yield _comment(f"{feed.channel}")
    while True:
        items = await feed.receive(heartbeat)
        if feed.ended is not None:
            if items:  # sent before the end (e.g. the part of a history read so far)
                yield b"".join(encode_event(item) for item in items)
            yield _comment(f"ended: {feed.ended}; reconnect with Last-Event-ID")
            return
        if until_final:
            final = next((i for i, item in enumerate(items) if is_final_status(item)), None)
            if final is not None:
                yield b"".join(encode_event(item) for item in items[: final + 1])
                yield _comment("ended: the run's final agent.status (until=final)")
                return
        yield b"".join(encode_event(item) for item in items) if items else HEARTBEAT


def is_final_status(item: FeedItem) -> bool:
    """Whether ``item`` is an ``agent.status`` that ends a run a follower follows
    (``completed`` or ``failed``, of a run not nested in another). A nested run's final
    status (a routed capability's inner agent, ``payload.parent_execution_id``) ends only
    that inner run: the run it serves goes on to its decider, memory and own status."""
    if item.event != "agent.status":
        return False
    try:
        envelope = orjson.loads(item.data)
    except orjson.JSONDecodeError:
        return False
    payload = envelope.get("payload") if isinstance(envelope, dict) else None
    return (
        isinstance(payload, dict)
        and payload.get("status") in FINAL_STATUSES
        and payload.get("parent_execution_id") is None
    )


# -- routes ---------------------------------------------------------------------------


def routes(node: Node) -> list[BaseRoute]:
    """The SSE routes served by ``node`` (heartbeat: ``settings.sse_heartbeat``)."""
    heartbeat = node.settings.sse_heartbeat

    async def session_events(request: Request) -> Response:
        try:
            until_final = _until_final(request)
            app, channel, since = await _session_stream(node, request)
        except _Refused as exc:
            return _error(exc.status, str(exc))
        except BackendUnavailable as exc:
            return _error(503, str(exc))
        feed = ChannelFeed(node, app, channel, since)
        return EventStreamResponse(feed, heartbeat, until_final=until_final)

    async def channel_events(request: Request) -> Response:
        try:
            until_final = _until_final(request)
            app, channel, since = _channel_stream(node, request)
            if _from_start(request):
                since = await _kept_start(node, app, channel)
        except _Refused as exc:
            return _error(exc.status, str(exc))
        except BackendUnavailable as exc:
            return _error(503, str(exc))
        feed = ChannelFeed(node, app, channel, since)
        return EventStreamResponse(feed, heartbeat, until_final=until_final)

    def app_of(request: Request) -> AppConfig | None:
        return asked_app(node, request)

    return [
        Route(
            "/api/sessions/{session_id}/events",
            cross_origin(session_events, app_of),
            methods=READ_METHODS,
        ),
        Route(
            "/api/channels/{channel}/events",
            cross_origin(channel_events, app_of),
            methods=READ_METHODS,
        ),
    ]


def _until_final(request: Request) -> bool:
    """``?until=final``: end the stream after the run's final ``agent.status``.

    Raises:
        SessionRefused: 400, any other value.
    """
    until = request.query_params.get("until")
    if until is None:
        return False
    if until != "final":
        raise _Refused(
            400,
            f"until: expected 'final' (end the stream after the run's final agent.status), "
            f"got {excerpt(until)}",
        )
    return True


def _from_start(request: Request) -> bool:
    """``?since=0`` (and no ``Last-Event-ID``): from the start of the kept history."""
    return not request.headers.get("last-event-id") and (
        (request.query_params.get("since") or "").strip() == FROM_START
    )


async def _kept_start(node: Node, app: AppConfig, channel: str) -> Position | None:
    """The position before the oldest publication the channel's history keeps (its
    last ``history_size``), or None (live only) when it keeps none.

    Raises:
        BackendUnavailable: the backend cannot be read now.
    """
    latest = await node.backend.latest(app.id, channel)
    return None if latest is None else _kept_from(latest, node.settings.history_size)


def _kept_from(latest: Position, history_size: int) -> Position:
    # A publication between this read and the history read may push the oldest one
    # out: the resume then says recovered: false, never a silent gap.
    return Position(max(0, latest.offset - history_size), latest.epoch)


def resume_position(request: Request) -> Position | None:
    """Where a stream resumes: ``Last-Event-ID`` (an ``EventSource`` reconnecting), else
    ``?since=``; None for neither.

    Raises:
        SessionRefused: 400, the position is malformed.
    """
    text = request.headers.get("last-event-id") or request.query_params.get("since")
    if not text:
        return None
    if text.strip() == FROM_START:
        raise _Refused(
            400,
            "since=0 (from the start of the kept history) is served by "
            "/api/sessions/{id}/events and /api/channels/{channel}/events; here pass a "
            "position '<epoch>:<offset>'",
        )
    try:
        return Position.parse(text.strip())
    except ValueError as exc:
        raise _Refused(400, f"Last-Event-ID / since: {exc}") from None


async def _session_stream(node: Node, request: Request) -> tuple[AppConfig, str, Position | None]:
    session_id = request.path_params["session_id"]
    app = request_app(node, request)
    from_start = _from_start(request)
    since = None if from_start else resume_position(request)
    channel = await session_channel(node, app, request, session_id)
    latest = await node.backend.latest(app.id, channel)
    if from_start and latest is not None:
        since = _kept_from(latest, node.settings.history_size)
    if latest is not None and (
        latest.offset > 0 or (since is not None and since.epoch == latest.epoch)
    ):
        return app, channel, since
    if await node.backend.load_value(app.id, state_key(channel)) is None:
        raise _Refused(
            404,
            f"unknown session {session_id!r}: no events, no stored state and no "
            "position handed out for it (start a run first)",
        )
    return app, channel, since


def _channel_stream(node: Node, request: Request) -> tuple[AppConfig, str, Position | None]:
    try:
        channel = validate_channel_name(request.path_params["channel"])
    except ProtocolError as exc:
        raise _Refused(400, exc.message) from None
    if server_to_user_id(channel) is not None or channel_kind(channel) is ChannelKind.PRESENCE:
        raise _Refused(
            400,
            f"{channel!r} needs a WebSocket connection (presence membership or sign-in); "
            "SSE serves public and private channels",
        )
    app = request_app(node, request)
    since = None if _from_start(request) else resume_position(request)
    if channel_kind(channel) is ChannelKind.PRIVATE:
        auth = request.query_params.get("auth")
        if not verify_stream_auth(app.key, app.secret, auth, channel):
            what = "missing" if not auth else "invalid"
            raise _Refused(
                403,
                f"{what} auth for private channel {channel!r}: pass ?auth=<the stream auth "
                "of the channel> (broadcaster.signing.stream_auth)",
            )
    return app, channel, since


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)
