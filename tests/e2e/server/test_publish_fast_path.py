"""The publish fast path (:class:`broadcaster.http_api.PublishFastPath`) answers exactly
as the Starlette routes it stands in front of: every request below is sent to the same
running node twice, once through the application (the fast path) and once through
Starlette's own middleware and routing, and the two answers must be byte-identical."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import secrets
import signal
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from starlette.applications import Starlette

from broadcaster import http_models
from broadcaster._guard import _NativeCycle
from broadcaster.app import create_app
from broadcaster.node import Node
from broadcaster.settings import load_settings
from broadcaster.signing import signed_params
from tests.support.live import (
    APP_ID,
    KEY,
    SECRET,
    Client,
    LiveServer,
    StartServer,
    wait_for,
    write_apps,
)
from tests.support.processes import RedisServer

EVENTS = f"/apps/{APP_ID}/events"
BATCH = f"/apps/{APP_ID}/batch_events"
Message = dict[str, Any]
Connect = Callable[..., Awaitable[Client]]


def _scope(path: str, query: bytes, headers: Sequence[tuple[bytes, bytes]] = ()) -> Message:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": query,
        "headers": [(b"host", b"127.0.0.1"), *headers],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }


def _query(params: dict[str, str]) -> bytes:
    return "&".join(f"{k}={v}" for k, v in params.items()).encode()


def _signed(path: str, body: bytes, **changes: str) -> bytes:
    params = signed_params(KEY, SECRET, "POST", path, body)
    return _query({**params, **changes})


class Exchange:
    """One request as an ASGI scope and body chunks; :meth:`run` gives the answer."""

    def __init__(
        self,
        path: str,
        body: bytes,
        query: bytes | Callable[[], bytes] | None = None,
        chunks: Sequence[bytes] | None = None,
        headers: Sequence[tuple[bytes, bytes]] = (),
        stall: bool = False,
        disconnect: bool = False,
    ) -> None:
        self.path = path
        self.body = body
        # Signed when used (None: as it should be; a callable: as it makes it): a
        # timestamp made at collection time can be over 600 s old when a long suite
        # gets to the test.
        self._query = query
        self.chunks = list(chunks) if chunks is not None else [body]
        self.headers = list(headers)
        self.stall = stall  # the body never ends
        self.disconnect = disconnect  # the client goes away after the chunks

    @property
    def query(self) -> bytes:
        if self._query is None:
            return _signed(self.path, self.body)
        return self._query() if callable(self._query) else self._query

    async def run(self, app: Any) -> list[Message]:
        chunks = list(self.chunks)
        sent: list[Message] = []

        async def receive() -> Message:
            if chunks:
                chunk = chunks.pop(0)
                more = bool(chunks) or self.stall or self.disconnect
                return {"type": "http.request", "body": chunk, "more_body": more}
            if self.disconnect:
                return {"type": "http.disconnect"}
            await asyncio.sleep(3600)  # stalled: the body timeout ends the wait
            raise AssertionError("not reached")

        async def send(message: Message) -> None:
            sent.append(message)

        await app(_scope(self.path, self.query, self.headers), receive, send)
        return sent


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[Starlette]:
    apps = write_apps(
        tmp_path / "apps.json",
        {"id": APP_ID, "key": KEY, "secret": SECRET, "max_event_data_size": 2000},
        {"id": "off", "key": "off-key", "secret": "off-secret", "enabled": False},
    )
    settings = load_settings(
        port=0, log_level="warning", apps_file=apps, max_request_bytes=4096, body_timeout=0.2
    )
    node = Node(settings)
    async with node.running():
        yield create_app(settings, node)


async def _both(app: Starlette, exchange: Exchange) -> list[Message]:
    """The answer of the fast path, checked identical to Starlette's routed answer."""
    fast = await exchange.run(app)
    routed = await exchange.run(lambda s, r, w: Starlette.__call__(app, s, r, w))
    assert fast == routed
    return fast


def _answer(messages: list[Message]) -> tuple[int, Any]:
    assert [m["type"] for m in messages] == ["http.response.start", "http.response.body"]
    return messages[0]["status"], json.loads(messages[1]["body"])


def _event(**fields: Any) -> bytes:
    return json.dumps({"name": "step", "channel": "agent.1", "data": "{}", **fields}).encode()


ERRORS: dict[str, tuple[Exchange, int, str]] = {
    "unknown app": (
        Exchange("/apps/nope/events", _event(), lambda: _signed("/apps/nope/events", _event())),
        404,
        "no app with id 'nope'",
    ),
    "disabled app": (
        Exchange(
            "/apps/off/events",
            _event(),
            _query(signed_params("off-key", "off-secret", "POST", "/apps/off/events", _event())),
        ),
        403,
        "is disabled",
    ),
    "declared body too large": (
        Exchange(EVENTS, _event(), headers=[(b"content-length", b"5000")]),
        413,
        "request body is 5000 bytes or more",
    ),
    "streamed body too large": (
        Exchange(EVENTS, b"", chunks=[b"x" * 3000, b"x" * 3000]),
        413,
        "the limit is 4096 bytes",
    ),
    "body too slow": (
        Exchange(EVENTS, _event(), chunks=[b"{"], stall=True),
        408,
        "did not arrive within 0.2 s",
    ),
    "no signature": (Exchange(EVENTS, _event(), query=b"auth_key=agent-key"), 401, "missing"),
    "wrong key": (
        Exchange(EVENTS, _event(), lambda: _signed(EVENTS, _event(), auth_key="x")),
        401,
        "key",
    ),
    "bad signature": (
        Exchange(EVENTS, _event(), lambda: _signed(EVENTS, _event(), auth_signature="0" * 64)),
        401,
        "invalid auth_signature",
    ),
    "old timestamp": (
        Exchange(
            EVENTS,
            _event(),
            _query(signed_params(KEY, SECRET, "POST", EVENTS, _event(), timestamp=1000)),
        ),
        401,
        "behind server time",
    ),
    "wrong body_md5": (
        Exchange(EVENTS, _event(), lambda: _signed(EVENTS, b"other")),
        401,
        "body_md5",
    ),
    "empty body": (Exchange(EVENTS, b""), 400, "request body is empty"),
    "not JSON": (Exchange(EVENTS, b"{nope"), 400, "not valid JSON"),
    "not an object": (Exchange(EVENTS, b"[1]"), 400, "must be a JSON object"),
    "no name": (
        Exchange(EVENTS, json.dumps({"channel": "agent.1", "data": "x"}).encode()),
        400,
        "name is required",
    ),
    "data not text": (Exchange(EVENTS, _event(data={"a": 1})), 400, "data must be a string"),
    "data too large": (Exchange(EVENTS, _event(data="x" * 2001)), 413, "data is 2001 bytes"),
    "reserved name": (Exchange(EVENTS, _event(name="pusher:x")), 400, "is reserved"),
    "bad channel": (Exchange(EVENTS, _event(channel="a b")), 400, "channel"),
    "bad socket_id": (Exchange(EVENTS, _event(socket_id="1.x")), 400, "socket_id"),
    "unknown info": (Exchange(EVENTS, _event(info="nope")), 400, "unknown info attribute"),
    "empty batch": (Exchange(BATCH, b'{"batch": []}'), 400, "batch is empty"),
    "batch too large": (
        Exchange(BATCH, json.dumps({"batch": [json.loads(_event())] * 11}).encode()),
        400,
        "the limit is 10",
    ),
    "bad batch item": (
        Exchange(BATCH, json.dumps({"batch": [json.loads(_event()), {"name": "x"}]}).encode()),
        400,
        "batch[1]: ",
    ),
}


@pytest.mark.parametrize("case", list(ERRORS))
async def test_every_refusal_is_identical_to_the_routed_one(app: Starlette, case: str) -> None:
    exchange, status, text = ERRORS[case]
    answer = _answer(await _both(app, exchange))
    assert answer[0] == status
    assert text in answer[1]["error"]
    assert answer[1]["status"] == status


async def test_a_publish_is_answered_as_by_the_routes(app: Starlette) -> None:
    assert _answer(await _both(app, Exchange(EVENTS, _event()))) == (200, {})
    body = _event(info="subscription_count")
    expected = {"channels": {"agent.1": {"subscription_count": 0}}}
    assert _answer(await _both(app, Exchange(EVENTS, body))) == (200, expected)
    batch = json.dumps({"batch": [json.loads(_event())] * 3}).encode()
    assert _answer(await _both(app, Exchange(BATCH, batch))) == (200, {"batch": [{}, {}, {}]})


async def test_a_body_in_several_chunks_and_an_escaped_query_are_read_as_by_the_routes(
    app: Starlette,
) -> None:
    body = _event(data="é" * 10)
    query = _signed(EVENTS, body).replace(b"auth_version=1.0", b"auth_version=1%2E0")
    answer = await _both(app, Exchange(EVENTS, body, query=query, chunks=[body[:7], body[7:]]))
    assert _answer(answer) == (200, {})


async def test_a_client_gone_before_the_end_of_its_body_gets_no_answer(app: Starlette) -> None:
    exchange = Exchange(EVENTS, _event(), chunks=[b"{"], disconnect=True)
    assert await exchange.run(app) == []


async def test_a_stopped_backend_is_a_503_as_by_the_routes(tmp_path: Path) -> None:
    settings = load_settings(port=0, log_level="warning")
    app = create_app(settings, Node(settings))  # never started
    status, error = _answer(await _both(app, Exchange(EVENTS, _event())))
    assert status == 503
    assert "the backend is unavailable" in error["error"]


@pytest.mark.parametrize(
    ("method", "path", "root_path"),
    [
        ("GET", EVENTS, ""),
        ("POST", EVENTS + "/", ""),
        ("POST", "/apps/a b/events", ""),
        ("POST", EVENTS + "\n", ""),
        ("POST", f"/apps/{APP_ID}/channels", ""),
        ("POST", EVENTS, "/prefix"),
    ],
)
async def test_other_requests_are_left_to_starlette(
    app: Starlette, method: str, path: str, root_path: str
) -> None:
    from broadcaster.app import _Application

    assert isinstance(app, _Application)
    scope = {**_scope(path, b""), "method": method, "root_path": root_path}
    assert app._fast.match(scope) is None
    assert app._fast.match(_scope(EVENTS, b"")) is not None


async def test_bodies_read_at_once_each_get_their_own_deadline(app: Starlette) -> None:
    """The reads share one timer: every stalled body is refused (408), whenever it
    started, and the requests whose body arrives are answered."""

    async def later(exchange: Exchange, delay: float) -> list[Message]:
        await asyncio.sleep(delay)
        return await exchange.run(app)

    stalled = Exchange(EVENTS, _event(), chunks=[b"{"], stall=True)
    reads = asyncio.gather(
        later(stalled, 0),
        later(Exchange(EVENTS, _event()), 0),
        later(stalled, 0.1),  # its deadline comes after the first timer fired
        later(Exchange(EVENTS, _event()), 0.15),
    )
    answers = await asyncio.wait_for(reads, 10)  # a stalled read left waiting fails here
    statuses = [_answer(answer)[0] for answer in answers]
    assert statuses == [408, 200, 408, 200]


# -- served natively by the HTTP protocol, over real sockets ----------------------------
#
# The server's own HTTP protocol (broadcaster._guard) serves the publish routes without
# ASGI. Each answer below is compared byte for byte with the answer of the same request
# to a server running uvicorn's own HTTP protocol, where the same routes are served by
# the ASGI fast path above (only the date header may differ, by a second).

_DATE = re.compile(rb"\r\ndate: [^\r]*\r\n")


class Raw:
    """One TCP connection speaking HTTP/1.1 by hand."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, live: LiveServer) -> Raw:
        url = urlsplit(live.url)
        reader, writer = await asyncio.open_connection(url.hostname, url.port)
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return cls(reader, writer)

    @property
    def port(self) -> int:
        port: int = self.writer.get_extra_info("sockname")[1]
        return port

    async def send(self, *segments: bytes) -> None:
        """Each segment in a write of its own, the next once the server read it."""
        for segment in segments:
            self.writer.write(segment)
            await self.writer.drain()
            if len(segments) > 1:
                await asyncio.sleep(0.005)

    async def answer(self, within: float = 10) -> bytes:
        """One whole response (its head says its length), the date header blanked."""
        head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), within)
        length = int(re.search(rb"\r\ncontent-length: (\d+)\r\n", head).group(1))  # type: ignore[union-attr]
        body = await asyncio.wait_for(self.reader.readexactly(length), within)
        return _DATE.sub(b"\r\ndate: -\r\n", head + body)

    async def closed(self, within: float = 10) -> bool:
        """True once the server closed the connection (and sent nothing more)."""
        return await asyncio.wait_for(self.reader.read(), within) == b""

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(OSError):
            await self.writer.wait_closed()


def _request(
    path: str,
    body: bytes,
    query: bytes | None = None,
    *,
    version: str = "1.1",
    headers: Sequence[tuple[bytes, bytes]] = (),
    length: int | None = None,
) -> bytes:
    """A signed POST (``length`` declared unless ``headers`` declare one), body included."""
    query = _signed(path, body) if query is None else query
    lines = [b"POST %s?%s HTTP/%s" % (path.encode(), query, version.encode()), b"host: x"]
    if not any(name.lower() == b"content-length" for name, _ in headers):
        lines.append(b"content-length: %d" % (len(body) if length is None else length))
    lines += [b"content-type: application/json", *(n + b": " + v for n, v in headers)]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def _get(path: str) -> bytes:
    return b"GET %s HTTP/1.1\r\nhost: x\r\n\r\n" % path.encode()


def _protocol(live: LiveServer, raw: Raw) -> Any:
    """The server's HTTP protocol of ``raw``'s connection."""
    for protocol in live.server.server_state.connections:
        if protocol.client and protocol.client[1] == raw.port:
            return protocol
    raise AssertionError("the connection is not open on the server")


def _served_natively(live: LiveServer, raw: Raw) -> bool:
    return isinstance(_protocol(live, raw).cycle, _NativeCycle)


def _status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def _json(answer: bytes) -> Any:
    return json.loads(answer.partition(b"\r\n\r\n")[2])


@dataclass
class Pair:
    """The server under test (native) and the reference (uvicorn's HTTP protocol)."""

    native: LiveServer
    asgi: LiveServer

    async def exchange(self, *segments: bytes, answers: int = 1, stay: bool = False) -> list[bytes]:
        """Send ``segments`` to both, read ``answers`` from both, check them identical
        and that the native server served them (unless ``stay``: then not checked)."""
        results = []
        for live in (self.native, self.asgi):
            raw = await Raw.open(live)
            try:
                await raw.send(*segments)
                results.append([await raw.answer() for _ in range(answers)])
                if live is self.native and not stay:
                    assert _served_natively(live, raw)
            finally:
                await raw.close()
        assert results[0] == results[1]
        return results[0]


Backend = Callable[[], dict[str, str]]


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> Backend:
    """Settings of a backend, new for each server: the memory backend (a publication
    is a coroutine: the native path runs it in a task) or Redis (a future: no task)."""
    if getattr(request, "param", "memory") == "memory":
        return dict
    redis: RedisServer = request.getfixturevalue("redis_server")
    return lambda: {"backend": redis.url, "redis_prefix": f"native-{secrets.token_hex(4)}"}


BACKENDS = pytest.mark.parametrize(
    "backend", ["memory", pytest.param("redis", marks=pytest.mark.redis)], indirect=True
)


async def _pair(
    start_server: StartServer, tmp_path: Path, backend: Backend, **overrides: Any
) -> Pair:
    apps = write_apps(
        tmp_path / "apps.json",
        {"id": APP_ID, "key": KEY, "secret": SECRET, "max_event_data_size": 2000},
        {"id": "off", "key": "off-key", "secret": "off-secret", "enabled": False},
    )
    settings: dict[str, Any] = {
        "apps_file": apps,
        "max_request_bytes": 4096,
        "body_timeout": 0.2,
        **overrides,
    }
    native = await start_server(**settings, **backend())
    asgi = await start_server(http="httptools", **settings, **backend())
    return Pair(native, asgi)


@pytest.fixture
async def pair(start_server: StartServer, tmp_path: Path) -> Pair:
    return await _pair(start_server, tmp_path, dict)


@pytest.mark.parametrize("case", list(ERRORS))
async def test_every_refusal_is_identical_over_sockets(pair: Pair, case: str) -> None:
    exchange, status, text = ERRORS[case]
    body = b"".join(exchange.chunks)
    length = len(exchange.body) if exchange.stall else None
    request = _request(exchange.path, body, exchange.query, headers=exchange.headers, length=length)
    (answer,) = await pair.exchange(request)
    assert _status(answer) == status
    assert text in _json(answer)["error"]


@BACKENDS
async def test_publishes_are_answered_identically_and_reach_subscribers(
    start_server: StartServer, tmp_path: Path, backend: Backend, clients: Connect
) -> None:
    pair = await _pair(start_server, tmp_path, backend)
    subscribers = [await clients(live.app_url()) for live in (pair.native, pair.asgi)]
    for subscriber in subscribers:
        await subscriber.subscribe("agent.1")
    (answer,) = await pair.exchange(_request(EVENTS, _event(data='{"n": 1}')))
    assert (_status(answer), _json(answer)) == (200, {})
    batch = json.dumps({"batch": [json.loads(_event(data=str(n))) for n in (2, 3)]}).encode()
    (answer,) = await pair.exchange(_request(BATCH, batch))
    assert _json(answer) == {"batch": [{}, {}]}
    # Asking for counts takes a task; the answer is the same.
    (answer,) = await pair.exchange(_request(EVENTS, _event(info="subscription_count")))
    assert _json(answer) == {"channels": {"agent.1": {"subscription_count": 1}}}
    for subscriber in subscribers:
        received = [(await subscriber.expect("step"))["data"] for _ in range(4)]
        assert received == [{"n": 1}, 2, 3, {}]
    assert pair.native.node.metrics.http_publishes == 4


@pytest.mark.redis
async def test_redis_down_is_a_503_over_sockets(
    start_server: StartServer, tmp_path: Path, redis_factory: Callable[[], RedisServer]
) -> None:
    redis = redis_factory()
    pair = await _pair(start_server, tmp_path, lambda: {"backend": redis.url})
    redis.kill()
    await wait_for(lambda: not (pair.native.node.ready or pair.asgi.node.ready), "Redis lost")
    (answer,) = await pair.exchange(_request(EVENTS, _event()))
    assert _status(answer) == 503
    assert "the backend is unavailable" in _json(answer)["error"]


async def test_a_bug_is_a_500_and_the_connection_is_closed(
    pair: Pair, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(body: bytes, app: Any) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(http_models, "parse_trigger", broken)
    answers = []
    for live in (pair.native, pair.asgi):
        raw = await Raw.open(live)
        await raw.send(_request(EVENTS, _event()))
        answers.append(await raw.answer())
        assert await raw.closed()
        await raw.close()
    assert answers[0] == answers[1]
    assert answers[0].startswith(b"HTTP/1.1 500 Internal Server Error\r\n")
    assert answers[0].endswith(b"\r\n\r\nInternal Server Error")
    errors = [r for r in caplog.records if r.levelno == logging.ERROR and r.exc_info]
    assert [str(r.exc_info[1]) for r in errors] == ["a bug", "a bug"]  # type: ignore[index]


@BACKENDS
async def test_a_kept_alive_connection_serves_request_after_request(
    start_server: StartServer, tmp_path: Path, backend: Backend
) -> None:
    pair = await _pair(start_server, tmp_path, backend)
    raw = await Raw.open(pair.native)
    protocol = None
    for n in range(5):
        await raw.send(_request(EVENTS, _event(data=str(n))))
        answer = await raw.answer()
        assert (_status(answer), b"connection: close" in answer) == (200, False)
        assert _served_natively(pair.native, raw)
        assert protocol in (None, _protocol(pair.native, raw))  # one connection throughout
        protocol = _protocol(pair.native, raw)
    await raw.send(_get("/up"))  # then any other request, the ASGI way
    assert _json(await raw.answer()) == {"status": "up"}
    await raw.send(_request(EVENTS, _event()))
    assert _status(await raw.answer()) == 200
    assert _served_natively(pair.native, raw)
    assert pair.native.server.server_state.total_requests == 7
    await raw.close()


@pytest.mark.parametrize(
    ("version", "headers"), [("1.0", []), ("1.1", [(b"connection", b"close")])]
)
async def test_http_1_0_and_connection_close_are_answered_then_closed(
    pair: Pair, version: str, headers: list[tuple[bytes, bytes]]
) -> None:
    answers = []
    for live in (pair.native, pair.asgi):
        raw = await Raw.open(live)
        await raw.send(_request(EVENTS, _event(), version=version, headers=headers))
        answers.append(await raw.answer())
        assert await raw.closed()
        await raw.close()
    assert answers[0] == answers[1]
    assert b"\r\nconnection: close\r\n" in answers[0]
    assert _status(answers[0]) == 200


@BACKENDS
async def test_pipelined_requests_are_answered_in_order(
    start_server: StartServer, tmp_path: Path, backend: Backend, clients: Connect
) -> None:
    """The first is served natively; those that arrive before its answer wait for it
    (and are served the ASGI way)."""
    pair = await _pair(start_server, tmp_path, backend)
    subscriber = await clients(pair.native.app_url())
    await subscriber.subscribe("agent.1")
    batch = json.dumps({"batch": [json.loads(_event(data="2"))]}).encode()
    requests = [
        _request(EVENTS, _event(data="1")),
        _request(BATCH, batch),
        _get("/up"),
        _request(EVENTS, _event(data="3")),
        _request(EVENTS, _event(data="x" * 3000)),  # refused: 413
    ]
    answers = await pair.exchange(b"".join(requests), answers=len(requests), stay=True)
    assert [_json(answer) for answer in answers[:4]] == [
        {},
        {"batch": [{}]},
        {"status": "up"},
        {},
    ]
    assert _status(answers[4]) == 413
    assert [(await subscriber.expect("step"))["data"] for _ in range(3)] == [1, 2, 3]


async def test_a_body_in_many_segments_is_read_whole(
    start_server: StartServer, tmp_path: Path
) -> None:
    pair = await _pair(start_server, tmp_path, dict, body_timeout=30)
    request = _request(EVENTS, _event(data="é" * 100))
    head, _, body = request.partition(b"\r\n\r\n")
    segments = [
        head[:10],
        head[10:] + b"\r\n\r\n",
        *(body[i : i + 7] for i in range(0, len(body), 7)),
    ]
    (answer,) = await pair.exchange(*segments)
    assert (_status(answer), _json(answer)) == (200, {})


async def test_a_stalled_body_gets_a_408_and_the_connection_stays_usable(pair: Pair) -> None:
    raw = await Raw.open(pair.native)
    await raw.send(_request(EVENTS, _event())[:-5])
    assert _status(await raw.answer()) == 408
    assert _served_natively(pair.native, raw)
    await raw.send(b"12345")  # the rest of the refused body, skipped
    await raw.send(_request(EVENTS, _event()))
    assert _status(await raw.answer()) == 200
    await raw.close()


@pytest.mark.parametrize(
    "headers",
    [
        [(b"transfer-encoding", b"chunked")],
        [(b"expect", b"100-continue")],
    ],
    ids=["chunked", "100-continue"],
)
async def test_chunked_bodies_and_expect_continue_are_served_the_asgi_way(
    pair: Pair, headers: list[tuple[bytes, bytes]]
) -> None:
    body = _event()
    chunked = headers[0][0] == b"transfer-encoding"
    request = _request(EVENTS, body, headers=headers)
    if chunked:
        head = request.partition(b"\r\n\r\n")[0]
        head = re.sub(rb"\r\ncontent-length: \d+", b"", head)
        request = head + b"\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    for live in (pair.native, pair.asgi):
        raw = await Raw.open(live)
        if chunked:
            await raw.send(request)
        else:
            head, _, rest = request.partition(b"\r\n\r\n")
            await raw.send(head + b"\r\n\r\n")
            assert await raw.reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
            await raw.send(rest)
        assert (_status(await raw.answer()), live) == (200, live)
        assert not _served_natively(live, raw)
        await raw.close()


async def test_a_client_gone_before_the_end_of_its_body_leaves_nothing(pair: Pair) -> None:
    raw = await Raw.open(pair.native)
    await raw.send(_request(EVENTS, _event())[:-5])
    protocol = _protocol(pair.native, raw)
    await raw.close()
    connections = pair.native.server.server_state.connections
    await wait_for(lambda: protocol not in connections, "the connection to be lost")
    assert protocol._native is None
    assert pair.native.node.metrics.http_publishes == 0


@pytest.mark.redis
async def test_a_client_gone_while_its_publication_is_in_flight_leaves_nothing(
    start_server: StartServer,
    tmp_path: Path,
    redis_factory: Callable[[], RedisServer],
    clients: Connect,
    caplog: pytest.LogCaptureFixture,
) -> None:
    redis = redis_factory()
    pair = await _pair(start_server, tmp_path, lambda: {"backend": redis.url})
    live = pair.native
    subscriber = await clients(live.app_url())
    await subscriber.subscribe("agent.1")
    raw = await Raw.open(live)
    assert redis.proc is not None
    redis.proc.send_signal(signal.SIGSTOP)  # the publication waits for Redis's answer
    try:
        await raw.send(_request(EVENTS, _event(data="1")))
        protocol = _protocol(live, raw)
        await wait_for(
            lambda: _served_natively(live, raw) and protocol._native is None,
            "the request to wait for its publication",
        )
        await raw.close()
        connections = live.server.server_state.connections
        await wait_for(lambda: protocol not in connections, "the connection to be lost")
    finally:
        redis.proc.send_signal(signal.SIGCONT)
    assert (await subscriber.expect("step"))["data"] == 1  # published all the same
    await wait_for(lambda: live.node.metrics.http_publishes == 1, "the publication's end")
    assert protocol.cycle.response_complete
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    (answer,) = await pair.exchange(_request(EVENTS, _event(data="2")))  # still serving
    assert _status(answer) == 200


@pytest.mark.redis
@pytest.mark.parametrize("info", [False, True], ids=["plain", "with-info"])
async def test_an_unanswered_publication_is_a_504_that_says_it_may_be_out(
    start_server: StartServer,
    tmp_path: Path,
    redis_factory: Callable[[], RedisServer],
    clients: Connect,
    info: bool,
) -> None:
    """Redis stops answering after taking the publication: the request gets 504, not
    the 503 "retry later" that means nothing went out, because it does go out once
    Redis resumes (a retry would deliver it twice)."""
    redis = redis_factory()
    pair = await _pair(start_server, tmp_path, lambda: {"backend": redis.url})
    live = pair.native
    subscriber = await clients(live.app_url())
    await subscriber.subscribe("agent.1")
    raw = await Raw.open(live)
    await raw.send(_request(EVENTS, _event(data="0")))  # the publications' connection is up
    assert _status(await raw.answer()) == 200
    assert (await subscriber.expect("step"))["data"] == 0
    assert redis.proc is not None
    extra = {"info": "subscription_count"} if info else {}
    redis.proc.send_signal(signal.SIGSTOP)
    try:
        await raw.send(_request(EVENTS, _event(data="1", **extra)))
        answer = await raw.answer()
    finally:
        redis.proc.send_signal(signal.SIGCONT)
    await raw.close()
    assert _status(answer) == 504, answer
    error = _json(answer)["error"]
    assert "did not confirm the publish" in error
    assert "a retry may deliver it twice" in error
    assert (await subscriber.expect("step"))["data"] == 1  # it was out after all


async def test_the_access_log_names_natively_served_requests_as_uvicorn_does(
    pair: Pair, caplog: pytest.LogCaptureFixture
) -> None:
    access = logging.getLogger("uvicorn.access")
    access.addHandler(caplog.handler)  # it does not propagate
    try:
        with caplog.at_level(logging.INFO, logger="uvicorn.access"):
            for live in (pair.native, pair.asgi):
                raw = await Raw.open(live)
                await raw.send(_request(EVENTS, _event()), _request("/apps/nope/events", b"{}"))
                await raw.answer()
                await raw.answer()
                assert _served_natively(live, raw) == (live is pair.native)
                # Behind a proxy, the client logged is the one it names: the ASGI way.
                forwarded = [(b"x-forwarded-for", b"10.1.2.3")]
                await raw.send(_request(EVENTS, _event(), headers=forwarded))
                await raw.answer()
                assert not _served_natively(live, raw)
                await raw.close()
    finally:
        access.removeHandler(caplog.handler)
    lines = [record.args for record in caplog.records if record.name == "uvicorn.access"]
    assert len(lines) == 6
    for native, routed in zip(lines[:3], lines[3:], strict=True):
        assert isinstance(native, tuple)
        assert isinstance(routed, tuple)
        # The same line but for the query's signature, which is made per request (its
        # timestamp may be a second apart).
        assert native[1::2] == routed[1::2]  # method, version
        assert native[2].partition("?")[0] == routed[2].partition("?")[0]
        assert native[4] == routed[4]
        assert native[0].rpartition(":")[0] == routed[0].rpartition(":")[0]
    assert [line[0].rpartition(":")[0] for line in lines[:3]] == ["127.0.0.1"] * 2 + ["10.1.2.3"]  # type: ignore[index]
    assert [line[4] for line in lines[:3]] == [200, 404, 200]  # type: ignore[index]
    assert lines[0][2].startswith(f"{EVENTS}?auth_key=")  # type: ignore[index,union-attr]


@pytest.mark.redis
async def test_a_shutdown_answers_the_publication_in_flight_then_closes(
    start_server: StartServer, tmp_path: Path, redis_factory: Callable[[], RedisServer]
) -> None:
    redis = redis_factory()
    pair = await _pair(start_server, tmp_path, lambda: {"backend": redis.url})
    live = pair.native
    raw = await Raw.open(live)
    assert redis.proc is not None
    redis.proc.send_signal(signal.SIGSTOP)
    try:
        await raw.send(_request(EVENTS, _event()))
        protocol = _protocol(live, raw)
        await wait_for(
            lambda: _served_natively(live, raw) and protocol._native is None,
            "the request to wait for its publication",
        )
        live.server.should_exit = True
        await wait_for(lambda: not protocol.cycle.keep_alive, "the shutdown to reach it")
    finally:
        redis.proc.send_signal(signal.SIGCONT)
    answer = await raw.answer()
    assert (_status(answer), b"\r\nconnection: close\r\n" in answer) == (200, True)
    assert await raw.closed()
    await raw.close()
    await asyncio.wait_for(live.task, 10)
