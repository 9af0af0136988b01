"""What a connection needs from the socket under it: transport-neutral types.

A :class:`~broadcaster.connection.Connection` writes pre-built frames to a
:class:`RawSocket` when the server runs the fast path (:mod:`broadcaster._uvicorn`, a
subclass of a private uvicorn class), and a :class:`NativeHandlers` serves WebSocket paths
natively under it; :class:`NativePosts` serves POST routes natively under the HTTP
protocol (:mod:`broadcaster._guard`). Nothing here imports uvicorn: the node, the
connections, the WebSocket endpoint and the HTTP API depend on these types only, so a
uvicorn release that breaks the fast path cannot break ``import broadcaster.node``; the
server then falls back to the plain ASGI path (see :mod:`broadcaster._compat`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, NamedTuple, Protocol, runtime_checkable

__all__ = [
    "EXTENSION",
    "HANDLERS_STATE",
    "POSTS_STATE",
    "SERVER_ERROR",
    "Answer",
    "NativeHandler",
    "NativeHandlers",
    "NativePost",
    "NativePosts",
    "NativeSocket",
    "Pending",
    "RawSocket",
    "ReportsLoss",
]

EXTENSION = "broadcaster.raw_socket"
"""The key of the :class:`RawSocket` in an ASGI WebSocket scope's ``extensions``."""

HANDLERS_STATE = "broadcaster_native_handlers"
"""The key of the :class:`NativeHandlers` in the application's lifespan state."""

POSTS_STATE = "broadcaster_posts"
"""The key of the :class:`NativePosts` in the application's lifespan state."""


class RawSocket(Protocol):
    """What a connection needs from the fast path (see
    :class:`broadcaster._uvicorn.FastWebSocketProtocol`)."""

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


class NativeSocket(RawSocket, Protocol):
    """What a native :class:`NativeHandler` gets besides frame writes: inbound flow control
    and tasks that the server waits for on shutdown."""

    def pause_reading(self) -> None:
        """Stop reading from the peer until :meth:`resume_reading` (not while closing)."""
        ...

    def resume_reading(self) -> None:
        """Read from the peer again."""
        ...

    def run_task(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` as a task that a graceful shutdown waits for."""
        ...

    def limit_message_size(self, size: int) -> None:
        """Refuse inbound messages over ``size`` bytes from now on (close 1009, from the
        frame header, before their payload is read)."""
        ...


class NativeHandler(Protocol):
    """One natively served WebSocket connection, driven by the protocol's callbacks."""

    def received(self, data: str | bytes) -> None:
        """A complete message arrived (text as ``str``)."""
        ...

    def lost(self) -> None:
        """The transport is gone; called once, last."""
        ...


class NativeHandlers(Protocol):
    """Serves WebSocket paths natively (see the module doc)."""

    def serves(self, path: str) -> bool:
        """Whether ``path`` (percent-decoded, without the query) is served natively."""
        ...

    def open(
        self, socket: NativeSocket, path: str, query: str, origin: str | None
    ) -> NativeHandler | None:
        """A handshake to ``path`` was accepted: its handler, or None when the
        connection was refused (an error and a close frame written to ``socket``)."""
        ...


@runtime_checkable
class ReportsLoss(Protocol):
    """A WebSocket protocol that calls ``on_lost`` once its transport is gone (the fast
    path does; the connection guard then gives the address's slot back through it)."""

    on_lost: Callable[[], None] | None


class Answer(NamedTuple):
    """The whole answer to a natively served request (its JSON body, or another body of
    ``content_type``); the protocol adds the status line and its own headers."""

    status: int
    body: bytes
    content_type: bytes = b"application/json"


SERVER_ERROR = Answer(500, b"Internal Server Error", b"text/plain; charset=utf-8")
"""The answer to a request that failed on a bug (as Starlette's ``ServerErrorMiddleware``
gives it); the connection is closed after it."""


class Pending(Protocol):
    """An answer that waits for ``done`` (e.g. a publication handed to the backend)."""

    @property
    def done(self) -> asyncio.Future[Any]:
        """Done when the answer is known."""
        ...

    def answer(self) -> Answer:
        """The answer, once ``done`` is done."""
        ...


class NativePost(Protocol):
    """One ``POST`` that :class:`NativePosts` serves, step by step as it arrives."""

    @property
    def body_timeout(self) -> float:
        """Seconds the body may take to arrive, from the end of the request head."""
        ...

    def refusal(self, content_length: str) -> Answer | None:
        """The answer to give before the body is read (an unknown app, a declared body
        over the limit), else None; ``content_length`` as sent."""
        ...

    def too_slow(self) -> Answer:
        """The answer to a body that did not arrive within :attr:`body_timeout`."""
        ...

    def answer(self, query: bytes, body: bytes) -> Answer | Pending:
        """The answer to the whole request (``query`` as sent, without ``?``)."""
        ...


class NativePosts(Protocol):
    """Serves ``POST`` paths natively, without ASGI (the HTTP API's publish routes).

    The HTTP protocol asks only about requests that ASGI would hand to the application
    unchanged (see :class:`broadcaster._guard.GuardedHttpProtocol`); every other request
    goes to the ASGI application as before.
    """

    def route(self, path: str) -> NativePost | None:
        """The ``POST`` to ``path`` (as sent, without ``%`` escapes) if served here."""
        ...
