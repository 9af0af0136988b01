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
"""

from __future__ import annotations

from typing import Protocol, cast

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.http11 import Request

__all__ = [
    "EXTENSION",
    "SHUTDOWN_CLOSE_CODE",
    "FastWebSocketProtocol",
    "RawSocket",
    "protocol_class",
]

EXTENSION = "broadcaster.raw_socket"
SHUTDOWN_CLOSE_CODE = 4200


class RawSocket(Protocol):
    """What a connection needs from the fast path (see :class:`FastWebSocketProtocol`)."""

    @property
    def closing(self) -> bool:
        """True once a close frame was sent or the transport is going away."""
        ...

    def write(self, data: bytes) -> None:
        """Write already framed bytes; dropped silently once closing."""
        ...

    def buffered(self) -> int:
        """Bytes written but not yet accepted by the kernel."""
        ...

    def close_now(self, code: int, reason: str, abort_after: float) -> None:
        """Send a close frame and drop the transport if the peer does not answer."""
        ...


class FastWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's sans-I/O WebSocket protocol plus direct frame writes (see module doc)."""

    shutdown_abort_after = 5.0

    def handle_connect(self, event: Request) -> None:
        super().handle_connect(event)
        if self.response.status_code == 101:
            # The ASGI task is created above but starts on a later tick, so it sees this.
            extensions = cast(dict[str, object], self.scope["extensions"])
            extensions[EXTENSION] = self

    @property
    def closing(self) -> bool:
        return self.close_sent or self.disconnected or self.transport.is_closing()

    def write(self, data: bytes) -> None:
        if not self.closing:
            self.transport.write(data)

    def buffered(self) -> int:
        return self.transport.get_write_buffer_size()

    def close_now(self, code: int, reason: str, abort_after: float) -> None:
        if self.closing or not self.handshake_complete:
            return
        self.queue.put_nowait({"type": "websocket.disconnect", "code": code, "reason": reason})
        self.conn.send_close(code, reason)
        self.transport.write(b"".join(self.conn.data_to_send()))
        self.close_sent = True
        if self.read_paused:
            # Keep reading so that the peer's close frame (the end of the handshake) arrives.
            self.read_paused = False
            self.transport.resume_reading()
        self.close_timer = self.loop.call_later(abort_after, self.transport.abort)

    def shutdown(self) -> None:
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
