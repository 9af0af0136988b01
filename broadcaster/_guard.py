"""Limits below the ASGI application, on every TCP connection: what uvicorn leaves open.

uvicorn times out neither a request head that never ends nor a WebSocket upgrade request
(which is a request head) that never ends, and its httptools parser keeps a head of any
size: one client could hold every file descriptor, or much memory, by sending slowly.
:class:`GuardedHttpProtocol` (uvicorn's httptools protocol, given to uvicorn as ``http``
by :func:`broadcaster.server.uvicorn_config`) adds:

- **a head deadline**: a request head must be complete within ``header_timeout`` seconds
  of the connection opening, or of the end of the previous response on a kept-alive
  connection; otherwise the connection is closed without an answer (there is no request
  to answer). A WebSocket upgrade is such a request, so a half-sent handshake is closed
  the same way; the handshake then completes within the same call (natively served
  paths) or as soon as the application accepts.
- **a head size limit**: a request head over :data:`MAX_HEAD_BYTES` is answered
  ``431`` and the connection closed.
- **a per-client-address connection limit** (:class:`AddressSlots`,
  ``max_connections_per_ip``, 0 for none): every open TCP connection counts, whatever
  it carries (plain HTTP, an SSE or AG-UI stream, a WebSocket, which keeps its slot
  after the upgrade). A connection over the limit is answered at once with ``429``,
  ``Retry-After`` and a JSON message naming the limit, and closed; the application never
  sees it.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from broadcaster.transport import ReportsLoss

__all__ = ["MAX_HEAD_BYTES", "RETRY_AFTER", "AddressSlots", "GuardedHttpProtocol", "http_class"]

log = logging.getLogger("broadcaster.server")

MAX_HEAD_BYTES = 64 << 10
"""The largest request head (request line and headers) read; 431 above it."""

RETRY_AFTER = 5
"""Seconds a client refused for its number of connections is told to wait."""

_REFUSED_GRACE = 1.0  # seconds a refused connection may take to send its request head


_WARN_EVERY = 60.0  # seconds between two warnings about refused connections


class AddressSlots:
    """Open connections per client address, refused above ``limit`` (0: never)."""

    __slots__ = ("_open", "_warned_at", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._open: dict[str, int] = {}
        self._warned_at = -_WARN_EVERY

    def take(self, address: str) -> bool:
        """Count one more connection from ``address``; False (and not counted) when
        it already has ``limit``."""
        held = self._open.get(address, 0)
        if self.limit and held >= self.limit:
            self._warn(address)
            return False
        self._open[address] = held + 1
        return True

    def _warn(self, address: str) -> None:
        now = time.monotonic()
        if now - self._warned_at >= _WARN_EVERY:
            self._warned_at = now
            log.warning(
                "refusing connections from %s: it has %d open, the limit of "
                "max_connections_per_ip (behind a reverse proxy every client has the "
                "proxy's address: raise the limit or set 0); next warning in %d s at most",
                address,
                self.limit,
                _WARN_EVERY,
            )

    def give_back(self, address: str) -> None:
        """One connection from ``address`` closed."""
        held = self._open[address] - 1
        if held:
            self._open[address] = held
        else:
            del self._open[address]

    def held(self, address: str) -> int:
        """Open connections from ``address``."""
        return self._open.get(address, 0)


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the limits of the module doc."""

    slots = AddressSlots(0)
    header_timeout = 10.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._address: str | None = None  # counted in slots while not None
        self._head_timer: asyncio.TimerHandle | None = None
        self._in_head = False
        self._head_bytes = 0
        self._refused = False
        self._upgraded = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        address = self.client[0] if self.client and self.slots.limit else None
        if address is not None:  # counted only under a limit: nothing kept per connection
            if not self.slots.take(address):
                self._refuse(address)
                return
            self._address = address
        self._expect_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        if self._address is not None:
            self.slots.give_back(self._address)
            self._address = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            if b"\r\n\r\n" in data:
                self.transport.close()
            return
        super().data_received(data)
        if self._in_head and not self._upgraded:
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES:
                self._in_head = False
                self._answer(431, f"the request head is over {MAX_HEAD_BYTES} bytes")

    # -- the head deadline ------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        self._head_bytes = 0

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._cancel_head_timer()
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._awaiting_head() and not self.transport.is_closing():
            self._expect_head()

    def _expect_head(self) -> None:
        self._cancel_head_timer()
        self._head_timer = self.loop.call_later(self.header_timeout, self._head_overdue)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _awaiting_head(self) -> bool:
        idle = self.cycle is None or self.cycle.response_complete
        return idle and not self.pipeline and not self._upgraded

    def _head_overdue(self) -> None:
        self._head_timer = None
        if self._awaiting_head() and not self.transport.is_closing():
            log.debug(
                "closing %s: no complete request head in %g s", self.client, self.header_timeout
            )
            self.transport.close()

    # -- WebSocket upgrades keep their slot ---------------------------------------------

    def handle_websocket_upgrade(self) -> None:
        self._upgraded = True
        self._cancel_head_timer()
        super().handle_websocket_upgrade()
        address, self._address = self._address, None
        if address is not None:
            _on_lost(
                self.transport.get_protocol(), functools.partial(self.slots.give_back, address)
            )

    # -- answers without the application ------------------------------------------------

    def _refuse(self, address: str) -> None:
        self._refused = True
        message = (
            f"too many connections from {address}: the limit is {self.slots.limit} open "
            "connections per client address (max_connections_per_ip); close some or "
            f"retry in {RETRY_AFTER} s"
        )
        self.transport.write(_response(429, message, (b"retry-after", str(RETRY_AFTER).encode())))
        # Closed once the request head is read (closing with it unread could reset the
        # connection before the client reads the answer), or after a short grace.
        self._head_timer = self.loop.call_later(
            min(_REFUSED_GRACE, self.header_timeout), self.transport.close
        )

    def _answer(self, status: int, message: str) -> None:
        self.transport.write(_response(status, message))
        self.transport.close()


def _response(status: int, message: str, *headers: tuple[bytes, bytes]) -> bytes:
    body = json.dumps({"error": message, "status": status}).encode()
    lines = [
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}".encode(),
        b"content-type: application/json",
        b"content-length: " + str(len(body)).encode(),
        b"connection: close",
        *(name + b": " + value for name, value in headers),
    ]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def _on_lost(protocol: asyncio.BaseProtocol, release: Callable[[], None]) -> None:
    """Call ``release`` when the WebSocket protocol that took over the transport loses it."""
    if isinstance(protocol, ReportsLoss):
        protocol.on_lost = release
        return
    lost = protocol.connection_lost

    def connection_lost(exc: Exception | None) -> None:
        release()
        lost(exc)

    protocol.connection_lost = connection_lost  # type: ignore[method-assign]


def http_class(max_connections_per_ip: int, header_timeout: float) -> type[GuardedHttpProtocol]:
    """The protocol to give uvicorn as ``http``, with its own connection count."""
    return type(
        "GuardedHttpProtocol",
        (GuardedHttpProtocol,),
        {"slots": AddressSlots(max_connections_per_ip), "header_timeout": header_timeout},
    )
