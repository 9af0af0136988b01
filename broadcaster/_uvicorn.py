"""The fast path: uvicorn's sans-I/O WebSocket protocol, exposed to the application.

:class:`FastWebSocketProtocol` is what :mod:`broadcaster.server` passes to uvicorn as
its ``ws`` implementation. It adds itself to ``scope["extensions"]`` under
:data:`EXTENSION` so that a :class:`~broadcaster.connection.Connection` can write
pre-built server frames straight to the transport (one ``transport.write`` per
connection per event-loop tick), instead of one awaited ASGI ``send`` per message.

Writing raw frames beside the ``websockets`` state machine is sound because the server
never compresses (permessage-deflate is off) and outgoing data frames carry no state;
closing still goes through the state machine (:meth:`FastWebSocketProtocol.close_now`).
It also closes clients with 4200 on server shutdown instead of uvicorn's 1012, which
Pusher clients treat as "reconnect now".

Native handlers: when the application's lifespan state holds a :class:`NativeHandlers` under
:data:`HANDLERS_STATE`, the WebSocket paths it :meth:`~NativeHandlers.serves` skip ASGI
altogether. The protocol answers the handshake itself and hands every inbound message
to a :class:`NativeHandler` by a plain call: no ASGI task, receive queue, scope or middleware
frames are kept per connection, which is most of what an idle connection costs. Other
paths go through the ASGI application as before.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, cast
from urllib.parse import unquote

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.datastructures import Headers
from websockets.frames import Frame
from websockets.http11 import Request

from broadcaster._frames import close_reason
from broadcaster._guard import refusal
from broadcaster._text import excerpt
from broadcaster.codes import CloseCode, ErrorCode
from broadcaster.transport import EXTENSION, HANDLERS_STATE, NativeHandler, NativeHandlers

__all__ = ["SHUTDOWN_CLOSE_CODE", "FastWebSocketProtocol", "protocol_class"]

SHUTDOWN_CLOSE_CODE = ErrorCode.SERVER_CLOSING


class _Discard(asyncio.Queue[Any]):
    """The receive queue of a native connection: there is no ASGI app to read it."""

    def put_nowait(self, item: Any) -> None:
        pass

    def empty(self) -> bool:
        return True


class _AlwaysWritable(asyncio.Event):
    """The ``writable`` flag of a native connection: its frames go straight to the
    transport (bounded per connection, see :mod:`broadcaster.connection`)."""

    def clear(self) -> None:
        pass


_DISCARD = _Discard()
_NO_HEADERS = Headers()
_ALWAYS_WRITABLE = _AlwaysWritable()
_ALWAYS_WRITABLE.set()


class FastWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's sans-I/O WebSocket protocol plus direct frame writes (see module doc)."""

    shutdown_abort_after = 5.0
    handler: NativeHandler | None = None  # a class default: no instance entry unless native
    output_full = False  # between pause_writing and resume_writing (class default, as above)
    on_lost: Callable[[], None] | None = None  # called once the transport is gone

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        upgraded = transport.get_protocol()  # the HTTP protocol, until the upgrade is done
        super().connection_made(transport)
        # Behind a trusted proxy, the HTTP protocol has named the request's client as the
        # proxy forwards it (broadcaster._guard): the WebSocket is that client's too.
        client = getattr(upgraded, "client", None)
        if client and upgraded is not self:
            self.client = client

    def handle_connect(self, event: Request) -> None:
        handlers = cast("NativeHandlers | None", self.app_state.get(HANDLERS_STATE))
        raw_path, _, query = event.path.partition("?")
        path = unquote(raw_path)
        if handlers is not None and handlers.serves(path):
            self._open_native(handlers, event, path, query)
            return
        super().handle_connect(event)
        if self.response.status_code == 101:
            # The ASGI task is created above but starts on a later tick, so it sees this.
            extensions = cast(dict[str, object], self.scope["extensions"])
            extensions[EXTENSION] = self

    def _open_native(self, handlers: NativeHandlers, event: Request, path: str, query: str) -> None:
        response = self.conn.accept(event)
        self.handshake_initiated = True
        self.handshake_complete = True
        if response.status_code != 101:  # not a valid WebSocket handshake
            self.close_sent = True
            self.conn.send_response(response)
            self.transport.write(b"".join(self.conn.data_to_send()))
            self.transport.close()
            return
        del response.headers["Date"]
        response.headers.update(
            (name.decode("latin-1"), value.decode("latin-1"))
            for name, value in self.default_headers
        )
        self.conn.send_response(response)
        self.transport.write(b"".join(self.conn.data_to_send()))
        self.queue = _DISCARD
        self.writable = _ALWAYS_WRITABLE
        if self.logger.isEnabledFor(logging.INFO):
            peer = "%s:%d" % self.client if self.client else "-"  # noqa: UP031
            self.logger.info('%s - "WebSocket %s" [accepted]', peer, event.path)
        origin = event.headers.get("Origin")
        # The handshake parser keeps the request for the connection's life: let its
        # headers go (a few KB per connection), as uvicorn's scope is never built.
        event.headers = _NO_HEADERS
        self.server = None
        self.handler = handlers.open(self, path, query, origin)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if not self.handshake_complete and (exc := self.conn.handshake_exc) is not None:
            self._refuse_unreadable_upgrade(exc)

    def _refuse_unreadable_upgrade(self, exc: Exception) -> None:
        # The websockets parser gave up on the request (over 128 headers, a line over
        # 8 KiB): uvicorn would neither answer nor close, and the connection, past the
        # head deadline of the HTTP protocol, would stay open for good.
        if self.handshake_initiated or self.transport.is_closing():
            return
        cause = exc.__cause__ or exc
        message = f"invalid WebSocket upgrade request: {excerpt(str(cause))}"
        self.transport.write(refusal(400, message))
        self.transport.close()

    def send_receive_event_to_app(self) -> None:
        handler = self.handler
        if handler is None:
            super().send_receive_event_to_app()
            return
        frames = self.frames
        data = frames[0] if len(frames) == 1 else b"".join(frames)
        self.frames = []
        if self.close_sent:
            return  # past our close frame: only the peer's answer matters
        if self.curr_msg_data_type == "bytes":
            handler.received(data)
            return
        try:
            text = data.decode()
        except UnicodeDecodeError:
            self.conn.send_close(CloseCode.INVALID_PAYLOAD, "invalid UTF-8")
            self.handle_parser_exception()
            return
        handler.received(text)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        on_lost = self.on_lost
        if on_lost is not None:
            self.on_lost = None
            on_lost()
        handler = self.handler
        if handler is not None:
            self.handler = None
            handler.lost()

    def pause_reading(self) -> None:
        if not (self.read_paused or self.close_sent or self.transport.is_closing()):
            self.read_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.read_paused:
            self.read_paused = False
            if not (self.output_full or self.transport.is_closing()):
                self.transport.resume_reading()

    def pause_writing(self) -> None:
        # The peer does not read what we send: stop reading what it sends until it
        # does. Otherwise each of its PINGs adds a PONG to a buffer that never drains.
        super().pause_writing()
        self.output_full = True
        if not (self.close_sent or self.transport.is_closing()):
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        super().resume_writing()
        self.output_full = False
        if not (self.read_paused or self.transport.is_closing()):
            self.transport.resume_reading()

    def handle_ping(self) -> None:
        output = self.conn.data_to_send()
        if self.close_sent:
            return  # nothing goes out after our close frame (RFC 6455, 5.5.1)
        self.transport.write(b"".join(output))
        if self.output_full:
            # uvicorn's ASGI receive resumes reading on its own: pause again here.
            self.transport.pause_reading()

    def handle_cont(self, event: Frame) -> None:
        # One growing buffer per fragmented message, not one object per fragment: a
        # message of many 1-byte fragments would weigh 50 times its size limit.
        frames = cast("list[bytes | bytearray]", self.frames)
        buffer = frames[0] if len(frames) == 1 else None
        if isinstance(buffer, bytearray):
            buffer += event.data  # in place
        else:
            buffer = bytearray().join(frames) + event.data
            self.frames = cast("list[bytes]", [buffer])
        if event.fin:
            self.frames = [bytes(buffer)]
            self.send_receive_event_to_app()

    def run_task(self, work: Coroutine[Any, Any, None]) -> None:
        task = self.loop.create_task(work)
        task.add_done_callback(self.on_task_complete)
        self.tasks.add(task)

    def limit_message_size(self, size: int) -> None:
        # Read by the websockets parser before each frame: the next header over it fails.
        self.conn.max_message_size = size

    @property
    def closing(self) -> bool:
        return self.close_sent or self.disconnected or self.transport.is_closing()

    # A direct route (broadcaster._routes) may write frames to ``transport`` itself,
    # after the checks of ``write``: ``close_sent``, ``disconnected``, ``is_closing()``.
    direct_routes = True

    def write(self, data: bytes) -> None:
        # self.closing, inlined: one write per message and connection goes through here.
        transport = self.transport
        if not (self.close_sent or self.disconnected or transport.is_closing()):
            transport.write(data)

    def buffered(self) -> int:
        return self.transport.get_write_buffer_size()

    def close_now(self, code: int, reason: str, abort_after: float) -> None:
        if self.closing or not self.handshake_complete:
            return
        reason = close_reason(reason)
        self.queue.put_nowait({"type": "websocket.disconnect", "code": code, "reason": reason})
        self.conn.send_close(code, reason)
        self.transport.write(b"".join(self.conn.data_to_send()))
        self.close_sent = True
        if self.read_paused or self.output_full:
            # Keep reading so that the peer's close frame (the end of the handshake)
            # arrives; its PINGs are no longer answered (handle_ping).
            self.read_paused = False
            self.transport.resume_reading()
        self.close_timer = self.loop.call_later(abort_after, self.transport.abort)

    def shutdown(self) -> None:
        if self.transport.is_closing():
            return  # already gone (e.g. after a fatal error): nothing left to close
        if self.handshake_complete and not self.closing and self.initial_response is None:
            self.stop_keepalive()
            self.close_now(SHUTDOWN_CLOSE_CODE, "server shutting down", self.shutdown_abort_after)
            return
        super().shutdown()


def protocol_class(shutdown_abort_after: float) -> type[FastWebSocketProtocol]:
    """The protocol to give uvicorn as ``ws``: on shutdown, a client that does not
    answer the 4200 close frame within ``shutdown_abort_after`` seconds is dropped."""
    return type(
        "FastWebSocketProtocol",
        (FastWebSocketProtocol,),
        {"shutdown_abort_after": shutdown_abort_after},
    )
