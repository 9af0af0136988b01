"""Direct routes: a pub/sub message on a channel with one local subscriber, in the usual
case, goes from the Redis read to that subscriber's socket in one call.

The hub attaches a :class:`Route` to a channel once it is in its steady state (one
subscriber, live, nothing resuming, filling or in doubt; the last position known) and
detaches it on any change (see :mod:`broadcaster.hub`). The pub/sub reader
(:class:`broadcaster.backends.redis.resp.PubSubReader`) hands each message to
:func:`deliver` first: it writes the message's frame to the subscriber's transport when
every condition of the hub's and the connection's fast paths holds, and otherwise
declines (False), so the message takes the full path (``Hub.deliver_encoded``,
``Connection.send``), which handles gaps, copies, exclusions, resumes and slow consumers.
A route never decides anything the full path would decide differently; it only skips
the calls:

- the payload's header names the route's app and channel (``2 <app> <channel> ``), its
  offset is the route's next one in the same epoch, and it excludes no socket;
- the connection is open, has no frames queued in this tick (they go first), no
  oversized message that may be unsent, and its socket is not closing;
- the frame fits the connection's buffer limit with what the transport holds.

:func:`deliver` is compiled from ``broadcaster/_routes_c.c`` when a C compiler was there
at install (``hatch_build.py``); this module's Python definition, identical in
behaviour, serves otherwise. ``tests/broadcaster/test_routes.py`` runs both against the
same cases. Per message, from the read to the write (``bench/callgrind_channels.py``,
user space): about 35,000 instructions on the full path, 19,600 with the Python
definition, 9,700 compiled.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from broadcaster._frames import _HEADER_16, _HEADER_64

if TYPE_CHECKING:
    from broadcaster.connection import Connection

__all__ = ["COMPILED", "PyRoute", "Route", "RouteTable", "deliver", "py_deliver"]


class Route:
    """One channel's direct route to its only subscriber.

    Attributes:
        table: The :class:`RouteTable` it is in (while attached).
        name: Its key there: the channel's pub/sub channel name.
        conn: The subscriber (a fast-path :class:`~broadcaster.connection.Connection`).
        raw: Its socket (``close_sent``, ``disconnected`` and ``transport`` are read).
        head: ``2 <app_id> <channel> ``: what the channel's payloads start with.
        epoch: The epoch of the last position delivered, as bytes.
        offset: The offset of the last position delivered (advanced by each delivery).
        limit: The connection's buffer limit (``max_buffer_bytes``).
        open_state: ``ConnectionState.OPEN`` (compared by identity).
    """

    __slots__ = (
        "conn",
        "epoch",
        "head",
        "limit",
        "name",
        "offset",
        "open_state",
        "raw",
        "table",
        "transport",
    )

    def __init__(
        self,
        table: RouteTable,
        name: bytes,
        conn: Connection,
        raw: Any,
        head: bytes,
        epoch: bytes,
        offset: int,
        limit: int,
        open_state: object,
    ) -> None:
        self.table = table
        self.name = name
        self.conn = conn
        self.raw = raw
        self.transport = raw.transport
        self.head = head
        self.epoch = epoch
        self.offset = offset
        self.limit = limit
        self.open_state = open_state


class RouteTable:
    """The routes of one backend's pub/sub connection, by pub/sub channel name.

    Attributes:
        routes: pub/sub channel name -> route (read by :func:`deliver`).
        name_of: The backend's pub/sub channel name of ``(app_id, channel)``.
        head_of: What the payloads of ``(app_id, channel)`` start with.
        on_delivered: Told how many publications a read delivered directly and when the
            read began (``time.perf_counter()``): the hub counts them.
    """

    __slots__ = ("head_of", "name_of", "on_delivered", "routes")

    def __init__(
        self, name_of: Callable[[str, str], bytes], head_of: Callable[[str, str], bytes]
    ) -> None:
        self.routes: dict[bytes, Route] = {}
        self.name_of = name_of
        self.head_of = head_of
        self.on_delivered: Callable[[int, float], None] | None = None

    def clear(self) -> None:
        """Drop every route (the backend broke off a store: every message takes the
        full path, which notices the break)."""
        self.routes.clear()


def _deliver(routes: dict[bytes, Route], reply: list[Any]) -> bool:
    """Write the ``message`` push ``reply`` (``[b"message", name, payload]``) to the
    subscriber of ``name``'s route; False (nothing done) when there is no route or any
    condition of the module doc fails."""
    if len(reply) != 3:
        return False
    route = routes.get(reply[1])
    if route is None:
        return False
    data: bytes = reply[2]
    head = route.head
    if not data.startswith(head):
        return False
    start = len(head)
    end = data.find(b"\n", start)
    if end < 0:
        return False
    fields = data[start:end].split(b" ")
    if len(fields) != 3:
        return False
    offset, epoch, exclude = fields
    # (At most 18 digits, as the compiled one parses: past what a position reaches.)
    if exclude != b"-" or epoch != route.epoch or not offset.isdigit() or len(offset) > 18:
        return False
    if int(offset) != route.offset + 1:
        return False
    conn: Any = route.conn
    if conn.state is not route.open_state or conn._pending is not None or conn._oversized:
        return False
    raw = route.raw
    transport = route.transport
    if raw.close_sent or raw.disconnected or transport.is_closing():
        return False
    size = len(data) - end - 1
    if size < 126:
        header = bytes((0x81, size))
    elif size < 1 << 16:
        header = _HEADER_16(0x81, 126, size)
    else:
        header = _HEADER_64(0x81, 127, size)
    if transport.get_write_buffer_size() + len(header) + size > route.limit:
        return False
    transport.write(header + data[end + 1 :])
    route.offset += 1
    return True


PyRoute = Route
"""The Python definition of :class:`Route` (the tests run it beside the compiled one)."""
py_deliver = _deliver
"""The Python definition of :func:`deliver`."""

deliver: Callable[[dict[bytes, Route], list[Any]], bool] = _deliver
COMPILED = False
"""Whether :class:`Route` and :func:`deliver` are the compiled ones."""
try:
    from broadcaster import _routes_c
except ImportError:  # built without a C compiler
    pass
else:
    Route = _routes_c.Route  # type: ignore[misc,assignment]  # same attributes
    deliver = _routes_c.deliver
    COMPILED = True
