"""The publish fast path (:class:`broadcaster.http_api.PublishFastPath`) answers exactly
as the Starlette routes it stands in front of: every request below is sent to the same
running node twice, once through the application (the fast path) and once through
Starlette's own middleware and routing, and the two answers must be byte-identical."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette

from broadcaster.app import create_app
from broadcaster.node import Node
from broadcaster.settings import load_settings
from broadcaster.signing import signed_params
from tests.support.live import APP_ID, KEY, SECRET, write_apps

EVENTS = f"/apps/{APP_ID}/events"
BATCH = f"/apps/{APP_ID}/batch_events"
Message = dict[str, Any]


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
        query: bytes | None = None,
        chunks: Sequence[bytes] | None = None,
        headers: Sequence[tuple[bytes, bytes]] = (),
        stall: bool = False,
        disconnect: bool = False,
    ) -> None:
        self.path = path
        self.query = _signed(path, body) if query is None else query
        self.chunks = list(chunks) if chunks is not None else [body]
        self.headers = list(headers)
        self.stall = stall  # the body never ends
        self.disconnect = disconnect  # the client goes away after the chunks

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
        Exchange("/apps/nope/events", _event(), _signed("/apps/nope/events", _event())),
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
    "wrong key": (Exchange(EVENTS, _event(), _signed(EVENTS, _event(), auth_key="x")), 401, "key"),
    "bad signature": (
        Exchange(EVENTS, _event(), _signed(EVENTS, _event(), auth_signature="0" * 64)),
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
        Exchange(EVENTS, _event(), _signed(EVENTS, b"other")),
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
