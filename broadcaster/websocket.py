"""The WebSocket endpoint ``/app/{key}``: a thin ASGI shell around the node.

Admission (app key, protocol version, origin, connection limit) happens after the
handshake, as Pusher does, so that the client reads a ``pusher:error`` with the code and
then a close frame with the same code. An app whose ``max_connections`` is counted
across nodes (a Redis backend) is checked in the connection's first task, before
``pusher:connection_established``; every other connection is admitted synchronously.
Inbound messages are parsed by the sans-I/O :mod:`broadcaster.protocol` and
dispatched to :class:`~broadcaster.node.Node`; outbound messages leave through the
connection's buffer (the fast path when the server is run with
:class:`~broadcaster._uvicorn.FastWebSocketProtocol`, the ASGI ``send`` otherwise).

Under :class:`~broadcaster._uvicorn.FastWebSocketProtocol`, ``/app/{key}`` is served
natively by :class:`NativeAppEndpoint` instead: the protocol calls the connection's handler for each
message, commands that need no I/O (ping, pong, sign-in, errors) are answered in that
call, and the others run in a short task per connection that exists only while it has
work (reading from the client pauses meanwhile, so commands keep their order). An idle
connection then holds no task, no coroutine frames and no ASGI receive queue. Once
admitted, a native connection reads messages up to its app's ``max_frame_size`` only
(the server-wide limit is the largest app's): larger ones are refused from the frame
header with close 1009.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Awaitable, Coroutine
from typing import Any, Final, assert_never
from urllib.parse import parse_qs

from starlette.types import Receive, Scope, Send

from broadcaster import protocol
from broadcaster._frames import PreparedMessage, close_reason, text_frame
from broadcaster.codes import CloseCode, ErrorCode
from broadcaster.connection import Connection
from broadcaster.exceptions import ProtocolError
from broadcaster.node import Node
from broadcaster.transport import EXTENSION, NativeSocket, RawSocket

__all__ = ["BadPathEndpoint", "NativeAppEndpoint", "WebSocketEndpoint"]

log = logging.getLogger("broadcaster.websocket")
_PONG = PreparedMessage(protocol.pong())
_APP_PREFIX = "/app/"


class WebSocketEndpoint:
    """ASGI endpoint of ``/app/{key}``."""

    def __init__(self, node: Node) -> None:
        self.node = node

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (await receive())["type"] != "websocket.connect":
            return
        try:
            app = self.node.admit(
                scope["path_params"]["key"],
                _query_value(scope, "protocol"),
                _header(scope, b"origin"),
            )
        except ProtocolError as exc:
            await refuse(send, exc.code, exc.message)
            return
        await send({"type": "websocket.accept"})
        raw: RawSocket | None = scope.get("extensions", {}).get(EXTENSION)
        conn = self.node.open(app, raw=raw, send=None if raw is not None else send)
        try:
            if self.node.counted_across_nodes(app):
                await _reporting(conn, self.node.count(conn))
            await self._serve(conn, receive)
        finally:
            await self.node.disconnect(conn)

    async def _serve(self, conn: Connection, receive: Receive) -> None:
        while True:
            message = await receive()
            if message["type"] != "websocket.receive":
                return  # websocket.disconnect
            self.node.seen(conn)
            if not conn.is_open:
                continue  # closing: the disconnect follows
            text = message.get("text")
            work = handle(
                self.node, conn, text if text is not None else message.get("bytes") or b""
            )
            if work is not None:
                await work


class NativeAppEndpoint:
    """Serves ``/app/{key}`` without ASGI under the fast-path protocol (see the module
    doc and :class:`broadcaster.transport.NativeHandlers`)."""

    __slots__ = ("node",)

    def __init__(self, node: Node) -> None:
        self.node = node

    def serves(self, path: str) -> bool:
        return (
            path.startswith(_APP_PREFIX)
            and "/" not in path[len(_APP_PREFIX) :]
            and (len(path) > len(_APP_PREFIX))
        )

    def open(
        self, socket: NativeSocket, path: str, query: str, origin: str | None
    ) -> _NativeConnection | None:
        node = self.node
        try:
            app = node.admit(path[len(_APP_PREFIX) :], _query_param(query, "protocol"), origin)
        except ProtocolError as exc:
            socket.write(text_frame(protocol.error(exc.code, exc.message)))
            socket.close_now(int(exc.code), exc.message, node.delivery.abort_after)
            return None
        socket.limit_message_size(app.max_frame_size)
        conn = node.open(app, raw=socket)
        handler = _NativeConnection(node, conn, socket)
        if node.counted_across_nodes(app):
            # Counted across nodes first; messages that arrive meanwhile wait their turn.
            handler.start(_reporting(conn, node.count(conn)))
        return handler


_GONE: Final = object()  # queued after the messages of a connection that is gone


class _NativeConnection:
    """One natively served connection: messages are handled as they arrive; commands
    that await run one after the other in a task that lives while there is work."""

    __slots__ = ("_backlog", "_conn", "_node", "_socket")

    def __init__(self, node: Node, conn: Connection, socket: NativeSocket) -> None:
        self._node = node
        self._conn = conn
        self._socket = socket
        self._backlog: deque[object] | None = None  # not None while the task runs

    def received(self, data: str | bytes) -> None:
        self._node.seen(self._conn)
        if self._backlog is not None:
            self._backlog.append(data)
            self._socket.pause_reading()
        elif self._conn.is_open:
            work = handle(self._node, self._conn, data)
            if work is not None:
                self.start(work)

    def lost(self) -> None:
        if self._backlog is not None:
            self._backlog.append(_GONE)
        else:
            self._socket.run_task(self._disconnect())

    def start(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` in this connection's task; messages received meanwhile are
        handled after it, in order (reading pauses while they wait)."""
        self._backlog = deque()
        self._socket.run_task(self._work(work))

    async def _work(self, work: Coroutine[Any, Any, None]) -> None:
        backlog = self._backlog
        assert backlog is not None
        conn = self._conn
        gone = False
        try:
            await work
            while backlog and not gone:
                item = backlog.popleft()
                if item is _GONE:
                    gone = True
                elif conn.is_open:
                    assert isinstance(item, str | bytes)
                    more = handle(self._node, conn, item)
                    if more is not None:
                        await more
        except Exception:
            log.exception("unexpected error serving %s; closing it", conn.socket_id)
            conn.close(CloseCode.INTERNAL_ERROR, "internal server error")
            gone = _GONE in backlog
        finally:
            self._backlog = None
            self._socket.resume_reading()
        if gone:
            await self._disconnect()

    async def _disconnect(self) -> None:
        try:
            await self._node.disconnect(self._conn)
        except Exception:
            log.exception("unexpected error forgetting %s", self._conn.socket_id)


def handle(node: Node, conn: Connection, data: str | bytes) -> Coroutine[Any, Any, None] | None:
    """Parse and handle one client message. Commands that need no I/O are done on
    return; for the others, the work to await is returned (it reports its own
    protocol errors to the client)."""
    try:
        command = protocol.parse_client_message(
            data, conn.app.max_message_size, max_member_size=conn.app.max_presence_member_size
        )
        match command:
            case protocol.Subscribe():
                return _reporting(conn, node.subscribe(conn, command))
            case protocol.Unsubscribe():
                return _reporting(conn, node.unsubscribe(conn, command.channel))
            case protocol.ClientEvent():
                return _reporting(conn, node.client_event(conn, command))
            case protocol.Ping():
                conn.send(_PONG)
            case protocol.Pong():
                pass  # node.seen() already noted the activity
            case protocol.Signin():
                node.signin(conn, command)
            case _:
                assert_never(command)
    except ProtocolError as exc:
        _report(conn, exc)
    return None


async def _reporting(conn: Connection, work: Awaitable[None]) -> None:
    try:
        await work
    except ProtocolError as exc:
        _report(conn, exc)


class BadPathEndpoint:
    """Every other WebSocket path: ``pusher:error`` 4005 and close."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (await receive())["type"] != "websocket.connect":
            return
        path = scope.get("path", "")
        await refuse(
            send, ErrorCode.PATH_NOT_FOUND, f"no WebSocket endpoint at {path!r}; use /app/<key>"
        )


async def refuse(send: Send, code: ErrorCode, message: str) -> None:
    """Accept the handshake, send ``pusher:error`` with ``code`` and close with it."""
    await send({"type": "websocket.accept"})
    await send({"type": "websocket.send", "text": protocol.error(code, message).decode()})
    await send({"type": "websocket.close", "code": int(code), "reason": close_reason(message)})


_SUBSCRIPTION_STATUS = {
    ErrorCode.SUBSCRIPTION_UNAUTHORIZED: (401, "AuthError"),
    ErrorCode.SUBSCRIPTION_RATE_LIMIT: (429, "LimitReached"),
}
"""The status and type of a ``pusher:subscription_error`` by code (else 400)."""


def _report(conn: Connection, exc: ProtocolError) -> None:
    if exc.channel is not None and not exc.close:
        status, kind = _SUBSCRIPTION_STATUS.get(exc.code, (400, "InvalidRequest"))
        frame = protocol.subscription_error(
            exc.channel, exc.message, status=status, error_type=kind, code=exc.code
        )
        conn.send(PreparedMessage(frame))
    else:
        conn.send(PreparedMessage(protocol.error(exc.code, exc.message)))
    if exc.close:
        conn.close(exc.code, exc.message)


def _query_value(scope: Scope, name: str) -> str | None:
    return _query_param(scope.get("query_string", b"").decode("latin-1"), name)


def _query_param(query: str, name: str) -> str | None:
    values = parse_qs(query).get(name)
    return values[0] if values else None


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value).decode("latin-1")
    return None
