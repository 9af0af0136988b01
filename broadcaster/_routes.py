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

What it refuses, the same way in both definitions, whoever calls it: ``routes`` that is
not a ``dict`` or ``reply`` that is not a ``list`` (subclasses neither), a table entry
that is neither ``None`` (no route) nor a :class:`Route`, an uninitialised route
(``Route.__new__(Route)``), and a ``get_write_buffer_size()`` that is not a
non-negative ``int``: ``TypeError`` (``ValueError`` for a negative size). A reply of
another length, or whose name or payload is not exactly ``bytes`` (``bytearray``,
``memoryview``, a subclass), is declined. A :class:`Route` checks its fields when made
(``TypeError`` or ``ValueError``), is made once (not re-initialised, subclassed,
copied or pickled), and only its ``offset`` can be set, to an ``int`` from 0 to
2**63 - 1. Every callback (the attribute reads of the connection and its socket,
``is_closing()``, ``get_write_buffer_size()``, ``write()``) may run any Python code:
the compiled one holds a strong reference to each object it uses across them, and a
delivery sets the route's offset to the one it wrote.

:func:`deliver` is compiled from ``broadcaster/_routes_c.c`` when a C compiler was there
at install (``hatch_build.py``); this module's Python definition, identical in
behaviour, serves otherwise. ``tests/broadcaster/test_routes.py`` runs both against the
same cases, and ``tests/broadcaster/test_routes_differential.py`` compares them on
generated inputs and hostile objects, also in a build with AddressSanitizer. Per
message, from the read to the write (``bench/callgrind_channels.py``, user space): about
36,000 instructions on the full path, 21,000 with the Python definition, 9,800 compiled.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from broadcaster._frames import _HEADER_16, _HEADER_64

if TYPE_CHECKING:
    from broadcaster.connection import Connection

__all__ = ["COMPILED", "PyRoute", "Route", "RouteTable", "deliver", "py_deliver"]


_MAX_OFFSET = (1 << 63) - 1


def _not_bytes(field: str, value: object) -> None:
    if type(value) is not bytes:
        raise TypeError(f"Route {field} must be bytes, not {type(value).__name__}")


def _bounded(field: str, value: object, most: int, most_text: str) -> int:
    if type(value) is not int:
        raise TypeError(f"Route {field} must be an int, not {type(value).__name__}")
    if not 0 <= value <= most:
        raise ValueError(f"Route {field} must be from 0 to {most_text}")
    return value


def _uninitialised(error: type[Exception]) -> Exception:
    return error("an uninitialised Route (made by Route.__new__ without __init__)")


class Route:
    """One channel's direct route to its only subscriber.

    Made once by the hub; its fields are read-only but ``offset``. It cannot be
    subclassed, copied or initialised twice (``TypeError``), as the compiled one.

    Attributes:
        table: The :class:`RouteTable` it is in (while attached).
        name: Its key there: the channel's pub/sub channel name (bytes).
        conn: The subscriber (a fast-path :class:`~broadcaster.connection.Connection`).
        raw: Its socket (``close_sent``, ``disconnected`` and ``transport`` are read).
        transport: ``raw.transport``, read once.
        head: ``2 <app_id> <channel> ``: what the channel's payloads start with (bytes).
        epoch: The epoch of the last position delivered, as bytes.
        offset: The offset of the last position delivered (set by each delivery); an int
            from 0 to 2**63 - 1.
        limit: The connection's buffer limit (``max_buffer_bytes``), from 0 to
            ``sys.maxsize``.
        open_state: ``ConnectionState.OPEN`` (compared by identity).
    """

    __slots__ = (
        "_conn",
        "_epoch",
        "_head",
        "_limit",
        "_name",
        "_offset",
        "_open_state",
        "_raw",
        "_table",
        "_transport",
    )
    _table: RouteTable
    _name: bytes
    _conn: Connection
    _raw: Any
    _transport: Any
    _head: bytes
    _epoch: bytes
    _offset: int
    _limit: int
    _open_state: object

    def __init_subclass__(cls, **kwargs: Any) -> None:
        raise TypeError("Route is not an acceptable base type")

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
        try:
            self._head  # noqa: B018 - set last, so set means initialised
        except AttributeError:
            pass
        else:
            raise TypeError("a Route is initialised once: make a new one")
        _not_bytes("name", name)
        _not_bytes("head", head)
        _not_bytes("epoch", epoch)
        offset = _bounded("offset", offset, _MAX_OFFSET, "2**63 - 1")
        limit = _bounded("limit", limit, sys.maxsize, "sys.maxsize")
        transport = raw.transport
        self._table = table
        self._name = name
        self._conn = conn
        self._raw = raw
        self._transport = transport
        self._epoch = epoch
        self._open_state = open_state
        self._offset = offset
        self._limit = limit
        self._head = head

    def __reduce__(self) -> Any:
        raise TypeError("a Route cannot be copied or pickled: make a new one")

    table = property(attrgetter("_table"))
    name = property(attrgetter("_name"))
    conn = property(attrgetter("_conn"))
    raw = property(attrgetter("_raw"))
    transport = property(attrgetter("_transport"))
    head = property(attrgetter("_head"))
    epoch = property(attrgetter("_epoch"))
    open_state = property(attrgetter("_open_state"))

    def _initialised(self, error: type[Exception]) -> None:
        """Raise ``error`` when the route was never initialised (``__init__`` sets
        ``_head`` last)."""
        try:
            self._head  # noqa: B018
        except AttributeError:
            raise _uninitialised(error) from None

    @property
    def limit(self) -> int:
        self._initialised(AttributeError)
        return self._limit

    @property
    def offset(self) -> int:
        self._initialised(AttributeError)
        return self._offset

    @offset.setter
    def offset(self, value: int) -> None:
        value = _bounded("offset", value, _MAX_OFFSET, "2**63 - 1")
        self._initialised(TypeError)
        self._offset = value


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


_PyRoute = Route


def _deliver(routes: dict[bytes, Route], reply: list[Any]) -> bool:
    """Write the ``message`` push ``reply`` (``[b"message", name, payload]``) to the
    subscriber of ``name``'s route; False (nothing done) when there is no route or any
    condition of the module doc fails. TypeError for containers of other types or a
    route that is not an initialised Route."""
    if type(routes) is not dict:
        raise TypeError(f"deliver: routes must be a dict, not {type(routes).__name__}")
    if type(reply) is not list:
        raise TypeError(
            f"deliver: reply must be a list (a pub/sub push), not {type(reply).__name__}"
        )
    if len(reply) != 3:
        return False
    _, name, data = reply
    if type(name) is not bytes or type(data) is not bytes:
        return False
    route = routes.get(name)
    if type(route) is not _PyRoute:
        if route is None:
            return False
        raise TypeError(f"deliver: a route must be a Route, not {type(route).__name__}")
    try:
        head = route._head
    except AttributeError:
        raise _uninitialised(TypeError) from None
    if not data.startswith(head):
        return False
    start = len(head)
    end = data.find(b"\n", start)
    if end < 0:
        return False
    fields = data[start:end].split(b" ")
    if len(fields) != 3:
        return False
    digits, epoch, exclude = fields
    # (At most 18 digits, as the compiled one parses: past what a position reaches.)
    if exclude != b"-" or epoch != route._epoch or not digits.isdigit() or len(digits) > 18:
        return False
    offset = int(digits)
    if offset != route._offset + 1:
        return False
    conn: Any = route._conn
    raw = route._raw
    transport = route._transport
    if conn.state is not route._open_state or conn._pending is not None or conn._oversized:
        return False
    if raw.close_sent or raw.disconnected or transport.is_closing():
        return False
    size = len(data) - end - 1
    if size < 126:
        header = bytes((0x81, size))
    elif size < 1 << 16:
        header = _HEADER_16(0x81, 126, size)
    else:
        header = _HEADER_64(0x81, 127, size)
    buffered = transport.get_write_buffer_size()
    if type(buffered) is not int:
        raise TypeError(f"get_write_buffer_size() returned {type(buffered).__name__}, not an int")
    if buffered < 0:
        raise ValueError("get_write_buffer_size() returned a negative size")
    if buffered + len(header) + size > route._limit:
        return False
    transport.write(header + data[end + 1 :])
    route._offset = offset  # the position it delivered
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
