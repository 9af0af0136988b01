"""The WebSocket endpoint ``/app/{key}``: a thin ASGI shell around the node.

Admission (app key, protocol version, origin, connection limit) happens after the
handshake, as Pusher does, so that the client reads a ``pusher:error`` with the code and
then a close frame with the same code. Inbound messages are parsed by the sans-I/O
:mod:`broadcaster.protocol` and dispatched to :class:`~broadcaster.node.Node`; outbound
messages leave through the connection's buffer (the fast path when the server is run
with :class:`~broadcaster._uvicorn.FastWebSocketProtocol`, the ASGI ``send`` otherwise).
"""

from __future__ import annotations

import logging
from typing import assert_never
from urllib.parse import parse_qs

from starlette.types import Receive, Scope, Send

from broadcaster import protocol
from broadcaster._frames import Outgoing
from broadcaster._uvicorn import EXTENSION, RawSocket
from broadcaster.codes import ErrorCode
from broadcaster.connection import Connection
from broadcaster.exceptions import ProtocolError
from broadcaster.node import Node

__all__ = ["BadPathEndpoint", "WebSocketEndpoint"]

log = logging.getLogger("broadcaster.websocket")
_PONG = Outgoing(protocol.pong())


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
            await self._serve(conn, receive)
        finally:
            await self.node.disconnect(conn)

    async def _serve(self, conn: Connection, receive: Receive) -> None:
        max_size = conn.app.max_message_size
        member_size = conn.app.max_presence_member_size
        while True:
            message = await receive()
            if message["type"] != "websocket.receive":
                return  # websocket.disconnect
            self.node.seen(conn)
            if not conn.is_open:
                continue  # closing: the disconnect follows
            text = message.get("text")
            data = text if text is not None else message.get("bytes") or b""
            try:
                command = protocol.parse_client_message(data, max_size, max_member_size=member_size)
                await self._dispatch(conn, command)
            except ProtocolError as exc:
                _report(conn, exc)

    async def _dispatch(self, conn: Connection, command: protocol.Command) -> None:
        node = self.node
        match command:
            case protocol.Subscribe():
                await node.subscribe(conn, command)
            case protocol.Unsubscribe():
                await node.unsubscribe(conn, command.channel)
            case protocol.ClientEvent():
                await node.client_event(conn, command)
            case protocol.Ping():
                conn.send(_PONG)
            case protocol.Pong():
                pass  # node.seen() already noted the activity
            case protocol.Signin():
                node.signin(conn, command)
            case _:
                assert_never(command)


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
    await send({"type": "websocket.close", "code": int(code), "reason": message[:120]})


def _report(conn: Connection, exc: ProtocolError) -> None:
    if exc.channel is not None and not exc.close:
        status = 401 if exc.code is ErrorCode.SUBSCRIPTION_UNAUTHORIZED else 400
        kind = "AuthError" if status == 401 else "InvalidRequest"
        frame = protocol.subscription_error(
            exc.channel, exc.message, status=status, error_type=kind, code=exc.code
        )
        conn.send(Outgoing(frame))
    else:
        conn.send(Outgoing(protocol.error(exc.code, exc.message)))
    if exc.close:
        conn.close(exc.code, exc.message[:120])


def _query_value(scope: Scope, name: str) -> str | None:
    values = parse_qs(scope.get("query_string", b"").decode("latin-1")).get(name)
    return values[0] if values else None


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value).decode("latin-1")
    return None
