"""Direct routes (broadcaster._routes): the compiled ``deliver`` and its Python definition
against the same cases, and the hub attaching and detaching them. No sockets."""

from __future__ import annotations

import asyncio
import copy
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import broadcaster
from broadcaster import _routes as routes
from broadcaster import hub as hub_module
from broadcaster._frames import PreparedMessage
from broadcaster.backends.redis import resp
from broadcaster.backends.redis.codec import route_head, split_payload
from broadcaster.connection import ConnectionState, Delivery
from broadcaster.hub import Hub
from broadcaster.metrics import Metrics
from broadcaster.publication import Position
from tests.support.hub import (
    APP,
    RecordingSocket,
    ScriptedBackend,
    publication,
    pubsub_push,
    recording_connection,
    routed_reader,
    tick,
    with_routes,
)

CH = "agent.run"
NAME = b"pub:1:agent.run"
IMPLEMENTATIONS = ["python", "compiled"]


def implementation(kind: str) -> tuple[type[Any], Callable[[dict[bytes, Any], list[Any]], bool]]:
    if kind == "python":
        return routes.PyRoute, routes.py_deliver
    if not routes.COMPILED:
        if os.environ.get("CI") == "true":
            pytest.fail("broadcaster/_routes_c.c is not compiled: run scripts/install")
        pytest.skip("broadcaster/_routes_c.c is not compiled here (no C compiler)")
    return routes.Route, routes.deliver


def test_the_compiled_routes_are_built_from_the_current_source() -> None:
    """scripts/install compiles the C file; a stale build would test old code."""
    if not routes.COMPILED:
        if os.environ.get("CI") == "true":
            pytest.fail("broadcaster/_routes_c.c is not compiled: run scripts/install")
        pytest.skip("broadcaster/_routes_c.c is not compiled here (no C compiler)")
    from broadcaster import _routes_c

    source = Path(broadcaster.__file__).with_name("_routes_c.c")
    built = Path(_routes_c.__file__ or "")
    assert built.stat().st_mtime >= source.stat().st_mtime, "stale: run scripts/install"


class Conn:
    def __init__(self) -> None:
        self.state = ConnectionState.OPEN
        self._pending: list[bytes] | None = None
        self._oversized = 0


class Case:
    """A route to a fake connection whose socket records what is written."""

    def __init__(self, kind: str, *, offset: int = 4, limit: int = 1 << 20) -> None:
        route_class, self.deliver = implementation(kind)
        self.raw = RecordingSocket()
        self.conn = Conn()
        self.table = routes.RouteTable(lambda a, c: NAME, route_head)
        self.route = route_class(
            self.table,
            NAME,
            self.conn,
            self.raw,
            route_head(APP.id, CH),
            b"e1",
            offset,
            limit,
            ConnectionState.OPEN,
        )
        self.table.routes[NAME] = self.route

    @staticmethod
    def arguments() -> list[Any]:
        """Valid arguments of another route (a re-initialisation's)."""
        return [None, NAME, Conn(), RecordingSocket(), b"h", b"e", 0, 1, ConnectionState.OPEN]

    def payload(self) -> bytes:
        """The next publication's payload."""
        return route_head(APP.id, CH) + b'5 e1 -\n{"event":"step"}'

    def push(
        self, offset: bytes = b"5", epoch: bytes = b"e1", exclude: bytes = b"-", **kw: Any
    ) -> bool:
        frame: bytes = kw.get("frame", b'{"event":"step","data":"x"}')
        head: bytes = kw.get("head", route_head(APP.id, CH))
        payload = head + b" ".join((offset, epoch, exclude)) + b"\n" + frame
        return self.deliver(self.table.routes, [b"message", kw.get("name", NAME), payload])


@pytest.fixture(params=IMPLEMENTATIONS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.mark.parametrize("size", [0, 125, 126, 65535, 65536, 70000])
def test_the_next_publication_is_written_as_one_text_frame(kind: str, size: int) -> None:
    case = Case(kind)
    frame = b"x" * size
    assert case.push(frame=frame)
    if size < 126:
        header = bytes((0x81, size))
    elif size < 65536:
        header = bytes((0x81, 126)) + size.to_bytes(2, "big")
    else:
        header = bytes((0x81, 127)) + size.to_bytes(8, "big")
    assert bytes(case.raw.written) == header + frame
    assert case.route.offset == 5
    assert case.push(offset=b"6", frame=b"y")
    assert case.route.offset == 6


DECLINED: dict[str, Callable[[Case], bool]] = {
    "no route for the name": lambda c: c.push(name=b"pub:1:other"),
    "another channel's header": lambda c: c.push(head=route_head(APP.id, "agent.other")),
    "another app's header": lambda c: c.push(head=route_head("2", CH)),
    "a gap": lambda c: c.push(offset=b"6"),
    "a copy": lambda c: c.push(offset=b"4"),
    "another epoch": lambda c: c.push(epoch=b"e2"),
    "a longer epoch": lambda c: c.push(epoch=b"e11"),
    "an excluded socket": lambda c: c.push(exclude=b"1.1"),
    "no position": lambda c: c.push(offset=b"-", epoch=b"-"),
    "an offset past 18 digits": lambda c: c.push(offset=b"1" * 19),
    "a signed offset": lambda c: c.push(offset=b"+5"),
    "an extra field": lambda c: c.push(exclude=b"- x"),
    "no newline": lambda c: c.deliver(c.table.routes, [b"message", NAME, route_head(APP.id, CH)]),
    "a reply of another shape": lambda c: c.deliver(c.table.routes, [b"message", NAME]),
}


@pytest.mark.parametrize("why", list(DECLINED))
def test_a_publication_the_route_cannot_prove_next_is_declined(kind: str, why: str) -> None:
    case = Case(kind)
    assert DECLINED[why](case) is False
    assert case.raw.written == b""
    assert case.route.offset == 4


CONNECTION: dict[str, Callable[[Case], None]] = {
    "closing": lambda c: setattr(c.conn, "state", ConnectionState.CLOSING),
    "frames queued this tick": lambda c: setattr(c.conn, "_pending", [b"earlier"]),
    "an oversized message may be unsent": lambda c: setattr(c.conn, "_oversized", 10),
    "close frame sent": lambda c: setattr(c.raw, "closed_with", 4100),
    "peer gone": lambda c: setattr(c.raw, "disconnected", True),
    "transport closing": lambda c: setattr(c.raw.transport, "closing", True),
}


@pytest.mark.parametrize("why", list(CONNECTION))
def test_a_connection_not_ready_for_a_direct_write_declines(kind: str, why: str) -> None:
    case = Case(kind)
    CONNECTION[why](case)
    assert case.push() is False
    assert case.raw.written == b""


def test_an_offset_past_18_digits_is_declined_even_when_it_is_the_next(kind: str) -> None:
    case = Case(kind, offset=10**18 - 1)
    assert case.push(offset=str(10**18).encode()) is False  # 19 digits: the full path
    assert case.route.offset == 10**18 - 1


def test_a_frame_over_the_buffer_limit_with_the_backlog_is_declined(kind: str) -> None:
    case = Case(kind, limit=100)
    frame = b"x" * 60  # 62 bytes framed
    case.raw.backlog = 38
    assert case.push(frame=frame)  # 38 + 62 = 100: at the limit
    case.raw.backlog = 39
    assert case.push(offset=b"6", frame=frame) is False  # over it: the full path decides


# -- the hub ------------------------------------------------------------------------


@pytest.fixture(params=IMPLEMENTATIONS)
def routed(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    route_class, deliver = implementation(request.param)
    monkeypatch.setattr(resp, "deliver", deliver)
    monkeypatch.setattr(hub_module, "Route", route_class)
    return str(request.param)


class Node:
    """A hub reading pub/sub pushes with direct routes, as the Redis backend does."""

    def __init__(self, backend: ScriptedBackend | None = None) -> None:
        self.backend = with_routes(backend or ScriptedBackend())
        self.metrics = Metrics()
        self.hub = Hub(self.backend, self.metrics)  # type: ignore[arg-type]
        self.table: routes.RouteTable = self.backend.routes  # type: ignore[attr-defined]
        self.reader = routed_reader(self.hub, self.table)

    def publish(self, offset: int, epoch: str = "e1", channel: str = CH) -> None:
        self.reader.data_received(pubsub_push(self.table, publication(channel, offset, epoch)))

    def entry(self, channel: str = CH) -> Any:
        return self.hub._channels[(APP.id, channel)]


async def test_a_lone_subscriber_gets_the_following_publications_by_its_route(routed: str) -> None:
    node = Node()
    conn, raw = recording_connection("1.1")
    await node.hub.subscribe(conn, CH)
    node.publish(1)  # the full path, which attaches the route
    await tick()
    assert node.entry().route is not None
    for n in range(2, 6):
        node.publish(n)
        await tick()
    assert raw.offsets() == [1, 2, 3, 4, 5]
    assert [m["position"] for m in raw.messages()][-1] == "e1:5"
    assert node.entry().route.offset == 5
    assert node.entry().last == node.entry().live == Position(5, "e1")
    assert node.metrics.publications == 5
    assert node.metrics.messages_out == 5
    assert node.metrics.send_latency.count == 5


async def test_a_second_subscriber_detaches_the_route_and_both_get_what_follows(
    routed: str,
) -> None:
    node = Node()
    (a, raw_a), (b, raw_b) = recording_connection("1.1"), recording_connection("1.2")
    await node.hub.subscribe(a, CH)
    node.publish(1)
    await tick()
    node.publish(2)  # by the route
    await tick()
    await node.hub.subscribe(b, CH)
    assert node.entry().route is None
    assert node.table.routes == {}
    assert node.entry().last == Position(2, "e1")  # the route's position, kept
    node.publish(3)
    await tick()
    assert raw_a.offsets() == [1, 2, 3]
    assert raw_b.offsets() == [3]


async def test_leaving_detaches_the_route(routed: str) -> None:
    node = Node()
    conn, raw = recording_connection("1.1")
    await node.hub.subscribe(conn, CH)
    node.publish(1)
    await tick()
    assert node.table.routes
    await node.hub.unsubscribe(conn, CH)
    assert node.table.routes == {}
    node.publish(2)
    await tick()
    assert raw.offsets() == [1]


async def test_a_gap_after_direct_deliveries_is_filled_from_the_history(routed: str) -> None:
    backend = ScriptedBackend(streams={CH: [publication(CH, n) for n in range(1, 7)]})
    node = Node(backend)
    conn, raw = recording_connection("1.1")
    await node.hub.subscribe(conn, CH)
    for n in (1, 2, 3):
        node.publish(n)
        await tick()
    node.publish(6)  # 4 and 5 missed: declined, and the hub fills them before 6
    await node.hub.drain_fills()
    await tick()
    assert raw.offsets() == [1, 2, 3, 4, 5, 6]


async def test_a_break_drops_every_route_and_the_next_publication_is_doubted(
    routed: str,
) -> None:
    backend = ScriptedBackend(streams={CH: [publication(CH, 1), publication(CH, 2)]})
    node = Node(backend)
    conn, raw = recording_connection("1.1")
    await node.hub.subscribe(conn, CH)
    node.publish(1)
    await tick()
    node.publish(2)
    await tick()
    node.backend.breaks += 1  # it followed a failover
    assert node.table.routes == {}
    node.publish(1, epoch="e2")  # a new epoch after a break: not provably complete
    await node.hub.drain_fills()
    await tick()
    assert raw.offsets() == [1, 2]
    assert raw.closed_with == 4100


async def test_a_slow_consumer_is_declined_by_the_route_and_closed_by_the_hub(
    routed: str,
) -> None:
    node = Node()
    delivery = Delivery(max_buffer_bytes=4096)
    conn, raw = recording_connection("1.1", delivery)
    await node.hub.subscribe(conn, CH)
    node.publish(1)
    await tick()
    raw.backlog = 4090  # the client stopped reading
    node.publish(2)
    await tick()
    assert raw.offsets() == [1]
    assert raw.closed_with == 4100
    raw.backlog = 0
    written = len(raw.written)
    node.publish(3)  # the route declines a closed connection until the node lets it go
    await tick()
    assert len(raw.written) == written
    await node.hub.unsubscribe(conn, CH)
    assert node.table.routes == {}


async def test_frames_queued_in_the_same_tick_keep_their_order(routed: str) -> None:
    """A publication read while the connection has frames waiting for this tick's flush
    goes after them, through the connection's queue."""
    node = Node()
    conn, raw = recording_connection("1.1")
    await node.hub.subscribe(conn, CH)
    node.publish(1)
    await tick()
    conn.send(protocol_message := PreparedMessage(b'{"event":"other"}'))
    node.publish(2)
    await tick()
    events = [m["event"] for m in raw.messages()]
    assert events == ["step", "other", "step"]
    assert protocol_message.payload == b'{"event":"other"}'


async def test_a_publication_declined_for_queued_frames_keeps_the_route_going(
    routed: str,
) -> None:
    """Two publications of the channel in one read: the second waits behind the first's
    queued frame (the full path), which advances the route's position; the next read
    goes by the route again."""
    node = Node()
    conn, raw = recording_connection("1.1")
    await node.hub.subscribe(conn, CH)
    node.publish(1)
    await tick()
    route = node.entry().route
    conn.send(PreparedMessage(b'{"event":"other"}'))  # queued in this tick
    node.publish(2)  # declined by the route: through the queue
    await tick()
    assert node.entry().route is route
    assert route.offset == 2
    node.publish(3)
    await tick()
    assert route.offset == 3
    assert raw.offsets() == [1, 2, 3]
    assert node.metrics.publications == 3


def test_the_route_head_is_what_every_payload_of_the_channel_starts_with() -> None:
    payload = route_head(APP.id, CH) + b'7 e1 -\n{"event":"step"}'
    app_id, channel, position, exclude, frame = split_payload(payload)
    assert (app_id, channel, position, exclude) == (APP.id, CH, Position(7, "e1"), None)
    assert json.loads(frame) == {"event": "step"}


async def test_a_closed_connection_is_never_written_by_its_route(routed: str) -> None:
    node = Node()
    conn, raw = recording_connection("1.1")
    await node.hub.subscribe(conn, CH)
    node.publish(1)
    await tick()
    conn.close(4200, "bye")
    written = len(raw.written)
    node.publish(2)
    await asyncio.sleep(0)
    assert len(raw.written) == written


# -- any caller: the same refusals from both definitions ------------------------------


def test_an_uninitialised_route_is_refused_with_type_error(kind: str) -> None:
    """``Route.__new__(Route)`` has no fields: the compiled deliver read them (a crash)."""
    route_class, deliver = implementation(kind)
    table = {NAME: route_class.__new__(route_class)}
    with pytest.raises(TypeError, match="uninitialised Route"):
        deliver(table, [b"message", NAME, route_head(APP.id, CH) + b"5 e1 -\n{}"])


REFUSED: dict[str, tuple[Callable[[Case], object], type[Exception] | None]] = {
    "a tuple reply": (
        lambda c: c.deliver(c.table.routes, (b"message", NAME, c.payload())),
        TypeError,
    ),
    "a table that is not a dict": (
        lambda c: c.deliver(list(c.table.routes.items()), [b"message", NAME, c.payload()]),
        TypeError,
    ),
    "a table entry that is not a Route": (
        lambda c: c.deliver({NAME: "a route"}, [b"message", NAME, c.payload()]),
        TypeError,
    ),
    "a bytearray payload": (
        lambda c: c.deliver(c.table.routes, [b"message", NAME, bytearray(c.payload())]),
        None,
    ),
    "a memoryview payload": (
        lambda c: c.deliver(c.table.routes, [b"message", NAME, memoryview(c.payload())]),
        None,
    ),
    "a bytearray name": (
        lambda c: c.deliver(c.table.routes, [b"message", bytearray(NAME), c.payload()]),
        None,
    ),
}


@pytest.mark.parametrize("why", list(REFUSED))
def test_input_of_another_type_is_refused_or_declined_alike(kind: str, why: str) -> None:
    """TypeError for the caller's containers and table entries; a reply element of
    another type is declined (the full path takes it). Before, the Python definition
    delivered a tuple reply or a bytearray payload that the compiled one declined."""
    case = Case(kind)
    call, error = REFUSED[why]
    if error is None:
        assert call(case) is False
    else:
        with pytest.raises(error):
            call(case)
    assert case.raw.written == b""
    assert case.route.offset == 4


@pytest.mark.parametrize(
    ("change", "error"),
    [
        (lambda r: setattr(r, "head", b"x"), AttributeError),
        (lambda r: setattr(r, "offset", "5"), TypeError),
        (lambda r: setattr(r, "offset", -1), ValueError),
        (lambda r: setattr(r, "offset", 1 << 63), ValueError),
        (lambda r: r.__init__(*Case.arguments()), TypeError),
        (lambda r: type("Sub", (type(r),), {}), TypeError),
        (lambda r: copy.copy(r), TypeError),
    ],
    ids=[
        "a field",
        "a str offset",
        "a negative offset",
        "an offset past 63 bits",
        "re-init",
        "a subclass",
        "a copy",
    ],
)
def test_a_route_is_made_once_and_only_its_offset_moves(
    kind: str, change: Callable[[Any], object], error: type[Exception]
) -> None:
    case = Case(kind)
    with pytest.raises(error):
        change(case.route)
    assert case.push()
    assert case.route.offset == 5
