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
- **trusted proxies** (:class:`~broadcaster.proxies.TrustedProxies`,
  ``trusted_proxies``): a connection from one is not counted as the proxy's; each of
  its requests is counted, for as long as it is served (a WebSocket or a stream: its
  whole life), as the client its ``X-Forwarded-For``/``Forwarded`` header names, and
  that client is the request's (the ASGI scope's, the access log's, a WebSocket's).
  Over the limit, the request is answered 429 and the proxy's connection closed.

It also serves the HTTP API's publish routes itself, without ASGI, when the application
offers them (a :class:`~broadcaster.transport.NativePosts` in the lifespan state under
:data:`~broadcaster.transport.POSTS_STATE`): no task, scope, receive/send messages or
middleware per request, and the whole answer in one write. Only requests that the ASGI
path would hand to the application unchanged are served so: ``POST``, a path it routes
(without ``%`` escapes), a ``Content-Length`` and no ``Transfer-Encoding``, no
``Expect: 100-continue``, no upgrade, no ``root_path`` or concurrency limit, not
pipelined behind an unfinished answer, and no ``X-Forwarded-For`` while the access log
is on (uvicorn's proxy-headers middleware would change the client logged). Every other
request goes the ASGI way, as before. The answers are byte-identical to the ASGI
path's (uvicorn's ``date`` and ``server`` headers included); the body is held to the
same limits (413, and 408 after ``body_timeout``); keep-alive, pipelining (a request
that arrives while a publication is in flight waits for its answer), graceful shutdown
and the access log behave as uvicorn's.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Callable, Sequence
from http import HTTPStatus
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from broadcaster.proxies import TrustedProxies
from broadcaster.transport import (
    POSTS_STATE,
    SERVER_ERROR,
    Answer,
    NativePost,
    NativePosts,
    Pending,
    ReportsLoss,
)

__all__ = [
    "MAX_HEAD_BYTES",
    "RETRY_AFTER",
    "AddressSlots",
    "GuardedHttpProtocol",
    "http_class",
    "refusal",
]

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
    proxies = TrustedProxies()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._address: str | None = None  # counted in slots while not None
        self._proxy: str | None = None  # the peer, when it is a trusted proxy
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_deadline: float | None = None  # while a request head is awaited
        self._idle_deadline: float | None = None  # uvicorn's keep-alive, while idle
        self._in_head = False
        self._head_bytes = 0
        self._refused = False
        self._upgraded = False
        self._native: _NativeCycle | None = None  # a natively served request, until its end
        self._scoped = False  # uvicorn's scope is built for the request being read

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if self.client and self.proxies and self.proxies.trusts(self.client[0]):
            self._proxy = self.client[0]  # its requests are counted one by one
            self._expect_head()
            return
        address = self.client[0] if self.client and self.slots.limit else None
        if address is not None:  # counted only under a limit: nothing kept per connection
            if not self.slots.take(address):
                self._refuse(address)
                return
            self._address = address
        self._expect_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        if self._native is not None:
            self._native.stop_timer()
            self._native = None
        self._give_back()
        super().connection_lost(exc)

    def _give_back(self) -> None:
        if self._address is not None:
            self.slots.give_back(self._address)
            self._address = None

    # -- requests through a trusted proxy -----------------------------------------------

    def _admit_forwarded(self, proxy: str) -> bool:
        """Name the request's client as the proxy forwards it, and count it under the
        limit; False (answered 429, the connection closing) over it."""
        client = self.proxies.client(proxy, self.headers)
        self.client = (client, 0)
        self.scope["client"] = self.client
        self._give_back()  # a request pipelined behind another: one slot at a time
        if self.slots.limit:
            if not self.slots.take(client):
                self._refuse(client)
                return False
            self._address = client
        return True

    def data_received(self, data: bytes) -> None:
        if self._refused:
            if b"\r\n\r\n" in data:
                self.transport.close()
            return
        super().data_received(data)
        native = self._native
        if native is not None and native.timer is None and self._reading(native):
            # The body did not come with its head: from now on it has body_timeout.
            native.timer = self.loop.call_later(native.post.body_timeout, self._body_overdue)
        if self._in_head and not self._upgraded:
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES:
                self._in_head = False
                self._answer(431, f"the request head is over {MAX_HEAD_BYTES} bytes")

    # -- the head deadline ------------------------------------------------------------

    def on_message_begin(self) -> None:
        # uvicorn's, but for its ASGI scope: that is built once the head is complete,
        # for a request that goes to the application (_asgi_scope), not for one served
        # natively, which never reads it.
        self.url = b""
        self.expect_100_continue = False
        self.headers = []
        self._scoped = False
        self._in_head = True
        self._head_bytes = 0

    def _asgi_scope(self) -> None:
        """Build uvicorn's scope of the request (its ``on_message_begin``), keeping what
        the head's callbacks gathered since."""
        if self._scoped:
            return
        self._scoped = True
        url, expect, headers = self.url, self.expect_100_continue, self.headers
        super().on_message_begin()
        self.url, self.expect_100_continue, self.headers = url, expect, headers
        self.scope["headers"] = headers

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._head_deadline = None  # the timer, if armed, finds nothing to do
        if self._proxy is not None:
            self._asgi_scope()
            if not self._admit_forwarded(self._proxy):
                return
        if not self._serve_natively():
            self._asgi_scope()
            super().on_headers_complete()

    def on_response_complete(self) -> None:
        if self._proxy is not None:
            self._give_back()
        # uvicorn's on_response_complete, with its keep-alive timeout as a deadline on
        # the connection's one timer instead of a timer armed for every response.
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self._idle_deadline = None
        if self.flow.read_paused:
            self.flow.resume_reading()
        now = self.loop.time()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
        else:
            self._idle_deadline = now + self.timeout_keep_alive
        if self._awaiting_head() and not self.transport.is_closing():
            self._head_deadline = now + self.header_timeout  # as _expect_head
        self._arm()  # once for both deadlines

    def _unset_keepalive_if_required(self) -> None:
        # uvicorn calls this on every read (and cancels a timer there).
        self._idle_deadline = None

    def _expect_head(self) -> None:
        self._head_deadline = self.loop.time() + self.header_timeout
        self._arm()

    def _arm(self) -> None:
        """Arm the connection's timer for its earliest deadline, unless it fires by then.

        One timer per connection, not one per request: what ends a wait (bytes read,
        a complete head) clears its deadline and leaves the timer armed; when it fires,
        it moves to the earliest deadline set since, if any. (Each response sets later
        deadlines than the ones before it, so the timer moves only when it fires, or
        when the first keep-alive deadline comes before the first head's.)"""
        earliest = self._head_deadline
        idle = self._idle_deadline
        if earliest is None or (idle is not None and idle < earliest):
            earliest = idle
        if earliest is None:
            return
        timer = self._head_timer
        if timer is not None:
            if timer.when() <= earliest:
                return
            timer.cancel()
        self._head_timer = self.loop.call_at(earliest, self._overdue)

    def _cancel_head_timer(self) -> None:
        self._head_deadline = self._idle_deadline = None
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _overdue(self) -> None:
        self._head_timer = None
        now = self.loop.time()
        idle = self._idle_deadline
        if idle is not None and now >= idle:
            # As uvicorn's timeout_keep_alive_handler: nothing came since the response.
            self._idle_deadline = None
            if not self.transport.is_closing():
                self.transport.close()
            return
        head = self._head_deadline
        if head is not None and now >= head:
            self._head_deadline = None
            self._head_overdue()
        self._arm()

    def _awaiting_head(self) -> bool:
        idle = self.cycle is None or self.cycle.response_complete
        return idle and not self.pipeline and not self._upgraded

    def _head_overdue(self) -> None:
        if self._awaiting_head() and not self.transport.is_closing():
            log.debug(
                "closing %s: no complete request head in %g s", self.client, self.header_timeout
            )
            self.transport.close()

    # -- natively served POST routes --------------------------------------------------

    def _serve_natively(self) -> bool:
        posts: NativePosts | None = self.app_state.get(POSTS_STATE)
        if posts is None or self.parser.get_method() != b"POST" or not self._in_order():
            return False
        path, query = _split_target(self.url)
        if b"%" in path:
            return False  # ASGI would give the application the decoded path
        post = posts.route(path.decode("latin-1"))
        if post is None:
            return False
        logged = self.access_log and self.access_logger.isEnabledFor(logging.INFO)
        length = self._content_length(logged)
        if length is None:
            return False
        version = self.parser.get_http_version()
        native = _NativeCycle(post, query, version != "1.0" and self.parser.should_keep_alive())
        if logged:
            target = path.decode("latin-1")
            if query:
                target += "?" + query.decode("ascii", "backslashreplace")
            native.logged = (target, version)
        self._native = native
        # uvicorn's own code reads the protocol's cycle: a request that arrives before
        # this one is answered is queued (pipelined), and a shutdown clears keep_alive.
        self.cycle = native  # type: ignore[assignment]
        try:
            refusal = post.refusal(length)
        except Exception as exc:
            self._native_failed(native, exc)
            return True
        if refusal is not None:
            self._native_answer(native, refusal)  # the body that follows is skipped
        return True

    def _reading(self, native: _NativeCycle) -> bool:
        return not (native.response_complete or self.transport.is_closing())

    def _in_order(self) -> bool:
        """Whether a request whose head just ended may be answered at once: nothing
        pipelined before it, and nothing that uvicorn answers differently."""
        cycle = self.cycle
        return not (
            self.pipeline
            or (cycle is not None and not cycle.response_complete)
            or self.expect_100_continue
            or self.root_path
            or self.limit_concurrency is not None
            or self.parser.should_upgrade()
        )

    def _content_length(self, logged: bool) -> str | None:
        """The request's (first) ``Content-Length``; None for a body ASGI reads
        otherwise (chunked), or a client the access log would name otherwise."""
        length = None
        for name, value in self.headers:
            if name == b"content-length":
                if length is None:
                    length = value.decode("latin-1")
            elif name == b"transfer-encoding" or (logged and name == b"x-forwarded-for"):
                return None
        return length

    def on_body(self, body: bytes) -> None:
        if self._refused:
            return
        native = self._native
        if native is None:
            super().on_body(body)
        elif not native.response_complete:
            native.body.append(body)

    def on_message_complete(self) -> None:
        if self._refused:
            return
        native = self._native
        if native is None:
            super().on_message_complete()
            return
        self._native = None
        native.stop_timer()
        if native.response_complete:
            return  # answered before its body was read
        chunks = native.body
        native.body = []
        try:
            outcome = native.post.answer(native.query, b"".join(chunks))
        except Exception as exc:
            self._native_failed(native, exc)
            return
        if isinstance(outcome, Answer):
            self._native_answer(native, outcome)
        else:
            outcome.done.add_done_callback(
                functools.partial(self._native_published, native, outcome)
            )

    def _native_published(self, native: _NativeCycle, pending: Pending, _: object) -> None:
        try:
            answer = pending.answer()
        except Exception as exc:
            self._native_failed(native, exc)
            return
        self._native_answer(native, answer)

    def _body_overdue(self) -> None:
        native = self._native
        if native is None or native.response_complete:
            return
        native.timer = None
        try:
            answer = native.post.too_slow()
        except Exception as exc:
            self._native_failed(native, exc)
            return
        self._native_answer(native, answer)

    def _native_answer(self, native: _NativeCycle, answer: Answer) -> None:
        native.response_complete = True
        if self.transport.is_closing():
            return  # the client is gone: nobody to answer
        if native.logged is not None:
            self._log_access(native.logged, answer.status)
        keep_alive = native.keep_alive  # read now: a shutdown may have cleared it
        self._write_native(answer, keep_alive, close=not keep_alive)

    def _native_failed(self, native: _NativeCycle, exc: Exception) -> None:
        # As uvicorn after an ASGI application's error: a 500 (when nothing was sent
        # yet), the error logged, the connection closed.
        self.logger.error("Exception in a natively served request\n", exc_info=exc)
        if native.response_complete or self.transport.is_closing():
            self.transport.close()
            return
        native.response_complete = True
        self._write_native(SERVER_ERROR, native.keep_alive, close=True)

    def _write_native(self, answer: Answer, keep_alive: bool, *, close: bool) -> None:
        headers = self.server_state.default_headers
        self.transport.write(_DEFAULT_HEADERS.response(headers, answer, keep_alive))
        if close:
            self.transport.close()
        self.on_response_complete()

    def _log_access(self, logged: tuple[str, str], status: int) -> None:
        # uvicorn's access log line, with the same arguments (its formatter reads them).
        client = "%s:%d" % self.client if self.client else ""  # noqa: UP031
        target, version = logged
        self.access_logger.info('%s - "%s %s HTTP/%s" %d', client, "POST", target, version, status)

    # -- WebSocket upgrades keep their slot ---------------------------------------------

    def handle_websocket_upgrade(self) -> None:
        if self._refused:
            return  # answered 429 from the head (a trusted proxy's client over its limit)
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
        self._cancel_head_timer()  # the timer closes the connection instead
        message = (
            f"too many connections from {address}: the limit is {self.slots.limit} open "
            "connections per client address (max_connections_per_ip); close some or "
            f"retry in {RETRY_AFTER} s"
        )
        self.transport.write(refusal(429, message, (b"retry-after", str(RETRY_AFTER).encode())))
        # Closed once the request head is read (closing with it unread could reset the
        # connection before the client reads the answer), or after a short grace.
        self._head_timer = self.loop.call_later(
            min(_REFUSED_GRACE, self.header_timeout), self.transport.close
        )

    def _answer(self, status: int, message: str) -> None:
        self.transport.write(refusal(status, message))
        self.transport.close()


class _NoEvent:
    """The ``message_event`` of a native cycle: nobody waits on it."""

    def set(self) -> None:
        pass


class _NativeCycle:
    """A natively served request. The protocol's ``cycle`` while it is served, with
    what uvicorn reads and writes of a ``RequestResponseCycle`` there:
    ``response_complete``, ``keep_alive``, ``disconnected`` and ``message_event``."""

    __slots__ = (
        "body",
        "disconnected",
        "keep_alive",
        "logged",
        "post",
        "query",
        "response_complete",
        "timer",
    )
    message_event = _NoEvent()

    def __init__(self, post: NativePost, query: bytes, keep_alive: bool) -> None:
        self.post = post
        self.query = query
        self.keep_alive = keep_alive
        self.body: list[bytes] = []
        self.response_complete = False
        self.disconnected = False
        self.timer: asyncio.TimerHandle | None = None  # the body deadline, once armed
        self.logged: tuple[str, str] | None = None  # target and HTTP version, if logged

    def stop_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


class _DefaultHeaders:
    """The header lines of uvicorn's ``default_headers`` (``date``, ``server``), joined
    once per list (uvicorn replaces the list when the date changes), and the whole
    successful answers written with them, built once per list."""

    __slots__ = ("_answers", "_lines", "_source")

    def __init__(self) -> None:
        self._source: list[tuple[bytes, bytes]] | None = None
        self._lines = b""
        self._answers: dict[tuple[Answer, bool], bytes] = {}

    def lines(self, headers: list[tuple[bytes, bytes]]) -> bytes:
        if headers is not self._source:
            self._lines = b"".join(name + b": " + value + b"\r\n" for name, value in headers)
            self._source = headers
            self._answers.clear()
        return self._lines

    def response(
        self, headers: list[tuple[bytes, bytes]], answer: Answer, keep_alive: bool
    ) -> bytes:
        """:func:`_response` of ``answer`` after ``headers``."""
        if headers is not self._source:
            self.lines(headers)
        head = self._lines
        if answer.status != 200:  # a refusal: its body names the request
            return _response(head, answer, keep_alive)
        key = (answer, keep_alive)
        known = self._answers.get(key)
        if known is None:
            if len(self._answers) >= _MOST_ANSWERS:
                self._answers.clear()
            known = self._answers[key] = _response(head, answer, keep_alive)
        return known


_MOST_ANSWERS = 64  # successful answers kept per second (a few batch sizes, keep-alive)
_DEFAULT_HEADERS = _DefaultHeaders()
_STATUS_LINES = {
    int(status): f"HTTP/1.1 {int(status)} {status.phrase}\r\n".encode() for status in HTTPStatus
}


def _response(head: bytes, answer: Answer, keep_alive: bool) -> bytes:
    """The bytes uvicorn writes for ``answer`` (in two writes) after the default header
    lines ``head``: the same status line, headers and order."""
    body = answer.body
    return b"".join(
        (
            _STATUS_LINES[answer.status],
            head,
            b"content-length: %d\r\ncontent-type: %s\r\n" % (len(body), answer.content_type),
            b"\r\n" if keep_alive else b"connection: close\r\n\r\n",
            body,
        )
    )


def _split_target(url: bytes) -> tuple[bytes, bytes]:
    """The path and query of a request target, as ``httptools.parse_url`` gives them.

    The parser let through only printable ASCII (it refuses spaces, control characters
    and bytes over 127 in a target), so a target in origin form (``/...``) without a
    fragment splits at its first ``?``: the same as ``parse_url``, without its per-byte
    pass and URL object (a test compares both). Any other target is parsed."""
    if url[:1] == b"/" and b"#" not in url:
        path, _, query = url.partition(b"?")
        return path, query
    parsed = httptools.parse_url(url)
    return parsed.path, parsed.query or b""


def refusal(status: int, message: str, *headers: tuple[bytes, bytes]) -> bytes:
    """A whole answer refusing a request before any application sees it: ``status`` and
    the JSON ``{"error": message, "status": status}``, then the connection closes."""
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


def http_class(
    max_connections_per_ip: int,
    header_timeout: float,
    trusted_proxies: Sequence[str] = (),
) -> type[GuardedHttpProtocol]:
    """The protocol to give uvicorn as ``http``, with its own connection count."""
    return type(
        "GuardedHttpProtocol",
        (GuardedHttpProtocol,),
        {
            "slots": AddressSlots(max_connections_per_ip),
            "header_timeout": header_timeout,
            "proxies": TrustedProxies(trusted_proxies),
        },
    )
