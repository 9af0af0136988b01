"""The hub: which local connections are subscribed to which channel, and fan-out.

A publication reaching the node is encoded once (one JSON payload, one WebSocket frame)
and the same bytes are queued to every local subscriber (:meth:`Hub.deliver`). The hub
also keeps the backend subscribed to exactly the channels that have a local subscriber,
serialising subscribe/unsubscribe per channel so that a quick leave-and-rejoin cannot
leave the backend unsubscribed.

Resume: a connection that subscribes with a position is registered in *recovering*
state first; live publications for it are held back while :meth:`Hub.resume` reads the
history page by page and sends each page as the connection's buffer drains (a history
larger than ``max_buffer_bytes`` streams instead of overflowing it; a publication larger
than the buffer is sent whole once nothing else is unsent), then the held live
ones whose offset is newer (no duplicate, no gap at the seam). History reads of resumes
are bounded per node (``max_history_reads`` at a time, first come first served, each
given up after ``history_read_timeout``), so a burst of resumes cannot starve the
others. When the held live publications outgrow ``max_buffer_bytes``, the ones kept in
the history are dropped and read from it again instead.

Gaps: the hub remembers the last position it delivered on each channel. A publication
that skips offsets (the node's pub/sub subscription was down while another node
published, e.g. during a Redis outage) makes the hub hold the channel's live
publications, read the skipped ones from the history and deliver them first, in order;
a live copy of a publication already delivered from the history is dropped.
:meth:`Hub.check_gaps` does the same for every channel after the backend reconnected,
for gaps at the end of a stream. A history read that fails (the backend is failing
over) is tried again with a growing pause, for ``fill_attempts`` reads within
``fill_deadline`` seconds; the live publications held meanwhile are bounded by
``max_buffer_bytes`` (beyond it they are dropped and read from the history too). When
the skipped publications cannot be read (the history no longer holds them, or the
backend stayed away), the channel's local subscribers are closed with 4100: they
reconnect and resume from their position, and are told ``recovered: false`` if the
history cannot give them what they missed. Never a silent gap.

A live publication at or before the last one received live in the same epoch is not a
copy (pub/sub delivers a channel's publications once, in offset order): the channel's
store went back (it lost publications and hands out their offsets again). It is
delivered and logged. The Redis scripts prevent this by starting a new epoch on a
primary with another replication id (see :mod:`broadcaster.backends.redis.scripts`); a new
epoch's start is delivered as a normal start.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from broadcaster import protocol
from broadcaster._frames import PreparedMessage
from broadcaster._routes import Route, RouteTable
from broadcaster.backends.base import Backend, BackendUnavailable, HistoryResult
from broadcaster.codes import ErrorCode
from broadcaster.connection import Connection, ConnectionState
from broadcaster.metrics import Metrics
from broadcaster.publication import Position, Publication, make_position

__all__ = ["Hub", "Resumed", "encode"]

log = logging.getLogger("broadcaster.hub")

_Key = tuple[str, str]
_PAGE = 100  # publications per history read of a resume
_DRAIN_TIMEOUT = 30.0  # seconds a resuming client may take to make room for the next one
_FILL_PAUSE = 0.1  # seconds before a failed gap fill reads again; doubles up to _FILL_PAUSE_MAX
_FILL_PAUSE_MAX = 2.0
_HELD_OVERHEAD = 64  # bytes counted per held publication besides its data


def encode(publication: Publication) -> PreparedMessage:
    """The server message carrying ``publication`` (with its position, if any)."""
    p = publication
    position = None if p.position is None else str(p.position)
    return PreparedMessage(protocol.channel_event(p.event, p.channel, p.data, p.user_id, position))


@dataclass(slots=True)
class _Recovery:
    """Live publications held back while a resuming connection's history is read."""

    held: list[tuple[Publication, PreparedMessage]] | None = None  # made when the first is held
    held_bytes: int = 0
    drops: int = 0  # times the held publications kept in history were dropped


@dataclass(frozen=True, slots=True)
class Resumed:
    """The outcome of :meth:`Hub.resume`: whether every missed publication was sent,
    and the channel's latest position (None when it has none)."""

    recovered: bool
    position: Position | None


@dataclass(slots=True)
class _Seam:
    """After a resume: the last position already sent from history. With Redis, the
    history read can include a publication whose pub/sub copy is still on its way; it
    is dropped here until the first newer one arrives (pub/sub order is offset order)."""

    after: Position


@dataclass(slots=True)
class _Channel:
    subscribers: dict[Connection, _Recovery | _Seam | None] = field(default_factory=dict)
    # Set while the backend subscription is being made; waited on by later subscribers.
    ready: asyncio.Future[None] | None = None
    # The last position delivered here, and the last one received live (pub/sub): a
    # live one between the two is a copy of what the history gave, one at or before
    # ``live`` means the store went back (properties: ``route`` holds both while set).
    _last: Position | None = None
    _live: Position | None = None
    # Before anything was delivered here (``last`` None): the top of the channel's
    # history that a resume read after the backend subscription was made. What comes
    # after it reaches this node live, so it is a baseline for gaps and doubts (not for
    # copies: one at or before it may still be on its way to subscribers that did not
    # resume).
    floor: Position | None = None
    # The live publications held while a gap is filled, their size, and whether some
    # were dropped (over max_buffer_bytes; the fill reads them from the history again).
    filling: list[Publication] | None = None
    held_bytes: int = 0
    shed: bool = False
    # The backend stopped reading the store of ``last`` (or ``floor``) while it may have
    # taken publications (a failover it followed): until the same epoch goes on, a new
    # epoch cannot prove that the old one ended at ``last``.
    doubt: bool = False
    # The direct route of the channel's only subscriber (see broadcaster._routes), while
    # attached: it advances the position with each publication it delivers.
    route: Route | None = None
    route_names: tuple[bytes, bytes] | None = None  # its name and head, made once

    @property
    def last(self) -> Position | None:
        return self._last if self.route is None else _position_of(self.route)

    @last.setter
    def last(self, position: Position | None) -> None:
        self.detach()
        self._last = position

    @property
    def live(self) -> Position | None:
        # ``last`` and ``live`` are equal while a route is attached.
        return self._live if self.route is None else _position_of(self.route)

    @live.setter
    def live(self, position: Position | None) -> None:
        self.detach()
        self._live = position

    def detach(self) -> None:
        """Take the direct route out of its table: from now on every publication takes
        the full path (call it before any change to the channel's state)."""
        route = self.route
        if route is None:
            return
        self.route = None
        self._last = self._live = _position_of(route)
        routes = route.table.routes
        if routes.get(route.name) is route:
            del routes[route.name]

    def since(self) -> Position | None:
        """Where this node's knowledge of the channel's stream ends: the last position
        delivered here, else a resume's ``floor`` (None: nothing to check against)."""
        return self.last if self.last is not None else self.floor


def _position_of(route: Route) -> Position:
    """The last position ``route`` delivered."""
    return make_position(route.offset, route.epoch.decode())


class _Unfillable(Exception):
    """The missed publications cannot be read: the history no longer has them."""


class Hub:
    """Local subscriptions of one node and the fan-out of publications to them."""

    def __init__(
        self,
        backend: Backend,
        metrics: Metrics,
        *,
        max_buffer_bytes: int = 1 << 20,
        max_history_reads: int = 32,
        history_read_timeout: float = 10.0,
        fill_attempts: int = 20,
        fill_deadline: float = 30.0,
    ) -> None:
        self._backend = backend
        self._metrics = metrics
        self._max_buffer_bytes = max_buffer_bytes
        self._reads = asyncio.Semaphore(max_history_reads)  # FIFO: no resume starves
        self._read_timeout = history_read_timeout
        self._fill_attempts = fill_attempts
        self._fill_deadline = fill_deadline
        self._channels: dict[_Key, _Channel] = {}
        self._leaving: dict[_Key, asyncio.Task[None]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        # The first delivery of this tick (perf_counter) and the publications delivered
        # since, whose send latency is not yet observed.
        self._tick_start: float | None = None
        self._tick_publications = 0
        self._fills: set[asyncio.Task[None]] = set()
        self._breaks = backend.breaks  # the backend's breaks already marked
        # A backend whose pub/sub reader takes direct routes (broadcaster._routes).
        self._routes: RouteTable | None = getattr(backend, "routes", None)
        if self._routes is not None:
            self._routes.on_delivered = self._delivered_directly

    def subscriber_count(self, app_id: str, channel: str) -> int:
        """Local connections subscribed to ``channel``."""
        entry = self._channels.get((app_id, channel))
        return 0 if entry is None else len(entry.subscribers)

    def channels(self) -> int:
        """Channels with at least one local subscriber."""
        return len(self._channels)

    async def subscribe(self, conn: Connection, channel: str, *, recovering: bool = False) -> None:
        """Add ``conn`` to ``channel``; returns once the backend delivers the channel here.

        With ``recovering``, live publications for ``conn`` are held back until
        :meth:`resume` (or :meth:`release`) returns it to live delivery.

        Raises:
            BackendUnavailable: the backend could not subscribe; ``conn`` is not added.
        """
        key = (conn.app.id, channel)
        entry = self._channels.get(key)
        recovery = _Recovery() if recovering else None
        if entry is None:
            entry = self._channels[key] = _Channel(ready=asyncio.get_running_loop().create_future())
            entry.subscribers[conn] = recovery
            await self._subscribe_backend(key, entry)
        else:
            entry.detach()
            entry.subscribers[conn] = recovery
            if entry.ready is not None:
                await asyncio.shield(entry.ready)
        if self._channels.get(key) is not entry:  # the backend subscription failed
            raise BackendUnavailable(f"cannot subscribe to {channel!r} now; retry later")

    async def _subscribe_backend(self, key: _Key, entry: _Channel) -> None:
        ready = entry.ready
        assert ready is not None
        try:
            leaving = self._leaving.get(key)
            if leaving is not None:
                await asyncio.shield(leaving)
            await self._backend.subscribe(*key)
        except BaseException:
            if self._channels.get(key) is entry:
                del self._channels[key]
            raise
        finally:
            entry.ready = None
            ready.set_result(None)
        if not entry.subscribers and self._channels.get(key) is entry:
            self._leave(key)  # every subscriber left while the subscription was made

    async def resume(self, conn: Connection, channel: str, since: Position) -> Resumed:
        """Send ``conn`` (subscribed with ``recovering``) the publications of
        ``channel`` after ``since`` from the history, page by page as its buffer drains,
        then the live ones held back that are newer, and return it to live delivery.

        Raises:
            BackendUnavailable: a page could not be read (or not within
                ``history_read_timeout``); ``conn`` stays held back, the caller must
                unsubscribe it and tell the client to come back.
        """
        recovery = self._recovery(conn, channel)
        if recovery is None:
            return Resumed(False, None)
        key = (conn.app.id, channel)
        after, budget = since, self._max_buffer_bytes // 2
        while True:
            drops = recovery.drops
            page = await self._read_page(key, after)
            self._note_floor(key, page.position)
            if not page.recovered:
                self.release(conn, channel)
                return Resumed(False, page.position)
            for publication in page.publications:
                if not await self._send_paced(conn, publication, budget):
                    self.release(conn, channel)  # closed meanwhile
                    return Resumed(False, page.position)
                after = publication.position or after
            if after == page.position:
                if recovery.drops == drops:
                    break  # at the top, and everything newer was held back since this read
            elif not page.publications:
                self.release(conn, channel)
                return Resumed(False, page.position)  # the history ended short of the top
        self.release(conn, channel, after=after)
        return Resumed(True, page.position)

    def _note_floor(self, key: _Key, top: Position | None) -> None:
        """A history read after the backend subscription found the channel's ``top``:
        with nothing delivered here yet, it is where live delivery takes over (see
        ``_Channel.floor``)."""
        entry = self._channels.get(key)
        if entry is not None and entry.last is None and top is not None:
            entry.floor = top

    def _recovery(self, conn: Connection, channel: str) -> _Recovery | None:
        entry = self._channels.get((conn.app.id, channel))
        state = None if entry is None else entry.subscribers.get(conn)
        return state if isinstance(state, _Recovery) else None

    async def _read_page(self, key: _Key, since: Position) -> HistoryResult:
        try:
            async with asyncio.timeout(self._read_timeout), self._reads:
                return await self._backend.history(*key, since, _PAGE)
        except TimeoutError:
            raise BackendUnavailable(
                f"the history of {key[1]!r} could not be read within "
                f"{self._read_timeout:g} s (history_read_timeout)"
            ) from None

    async def _send_paced(self, conn: Connection, publication: Publication, budget: int) -> bool:
        """Send one publication from history once ``conn`` has room for it within
        ``budget`` unsent bytes (the rest of its buffer stays free for live traffic); one
        larger than that once nothing is unsent (a connection takes one message of any
        size then, see :mod:`broadcaster.connection`). False when ``conn`` closed."""
        if publication.exclude_socket_id == conn.socket_id:
            return True
        message = encode(publication)
        room = max(budget - len(message.frame), 1)
        if conn.unsent() >= room:
            try:
                async with asyncio.timeout(_DRAIN_TIMEOUT):
                    if not await conn.drained(room):
                        return False  # closed
            except TimeoutError:
                conn.slow_consumer()  # it made no room for half a minute
                return False
        conn.send(message)
        return conn.is_open

    def release(self, conn: Connection, channel: str, after: Position | None = None) -> None:
        """Return ``conn`` to live delivery on ``channel``, first sending what was held
        back for it (skipping publications at or before ``after`` of the same epoch)."""
        entry = self._channels.get((conn.app.id, channel))
        recovery = None if entry is None else entry.subscribers.get(conn)
        if entry is None or not isinstance(recovery, _Recovery):
            return
        entry.detach()
        for publication, message in recovery.held or ():
            position = publication.position
            if position is not None:
                if not _is_new(position, after):
                    continue  # sent from history already
                after = position
            # (A client event or presence notice has no position: it is in no history,
            # so it was not sent, and it does not move the seam.)
            if publication.exclude_socket_id != conn.socket_id:
                conn.send(message)
        entry.subscribers[conn] = None if after is None else _Seam(after)

    async def unsubscribe(self, conn: Connection, channel: str) -> bool:
        """Remove ``conn`` from ``channel``; True if it was subscribed. The backend is
        unsubscribed when the last local subscriber leaves."""
        key = (conn.app.id, channel)
        entry = self._channels.get(key)
        if entry is None or conn not in entry.subscribers:
            return False
        entry.detach()
        del entry.subscribers[conn]
        if not entry.subscribers and entry.ready is None:
            await asyncio.shield(self._leave(key))
        return True

    def _leave(self, key: _Key) -> asyncio.Task[None]:
        self._channels.pop(key).detach()
        task = asyncio.get_running_loop().create_task(self._unsubscribe_backend(key))
        self._leaving[key] = task
        return task

    async def _unsubscribe_backend(self, key: _Key) -> None:
        try:
            await self._backend.unsubscribe(*key)
        except BackendUnavailable:
            pass  # a reconnecting backend resubscribes only to what is still wanted
        finally:
            if self._leaving.get(key) is asyncio.current_task():
                del self._leaving[key]

    def deliver(self, publication: Publication) -> None:
        """Queue ``publication`` to every local subscriber (the backend's handler)."""
        key = (publication.app_id, publication.channel)
        entry = self._channels.get(key)
        if entry is not None:
            self._take(key, entry, publication, None)

    def deliver_encoded(
        self,
        app_id: str,
        channel: str,
        position: Position | None,
        exclude_socket_id: str | None,
        frame: bytes,
    ) -> None:
        """:meth:`deliver` for a publication that arrived encoded (the backend's
        ``on_encoded``): in the usual case (the next position, nobody resuming) its
        frame goes to every subscriber as it came, without decoding it."""
        key = (app_id, channel)
        entry = self._channels.get(key)
        if entry is None:
            return
        if position is not None:
            if self._backend.breaks != self._breaks:
                self._mark_breaks()
            # (Not the properties: this runs once per publication.) A route declined
            # this one: frames queued in this tick, a full buffer, or what follows.
            route = entry.route
            last = entry._last if route is None else _position_of(route)
            if (
                entry.filling is not None
                or entry.doubt
                or (
                    last is not None
                    and (position.offset != last.offset + 1 or position.epoch != last.epoch)
                )
                or (last is None and entry.floor is not None)
            ):  # a copy, a gap, a new epoch, a gap being filled, a doubt or the first
                # publication after a resume: the full path
                publication = protocol.channel_event_publication(
                    app_id, position, exclude_socket_id, frame
                )
                self._take(key, entry, publication, None)
                return
            if route is None:
                entry._last = entry._live = position
            else:
                route.offset = position.offset  # it holds the position (same epoch)
        subscribers = entry.subscribers
        if any(subscribers.values()):  # a resuming subscriber: the full path
            publication = protocol.channel_event_publication(
                app_id, position, exclude_socket_id, frame
            )
            self._fan_out(entry, publication, PreparedMessage(frame))
            return
        if self._tick_start is None:
            self._tick_start = time.perf_counter()
        message = PreparedMessage(frame)
        sent = 0
        for conn in subscribers:
            if conn.socket_id != exclude_socket_id:
                conn.send(message)
                sent += 1
        if (
            self._routes is not None
            and sent == 1
            and position is not None
            and entry.route is None
            and len(subscribers) == 1
        ):
            self._attach(key, entry, conn, position)
        # _delivered(sent), inlined: this runs once per publication.
        metrics = self._metrics
        metrics.publications += 1
        metrics.messages_out += sent
        self._tick_publications += 1
        if self._tick_publications == 1:
            self._observe_soon()

    def _take(
        self, key: _Key, entry: _Channel, publication: Publication, filled: Position | None
    ) -> None:
        """Deliver a live ``publication`` in order (``filled``: where the gap fill whose
        held publications these are started)."""
        position = publication.position
        if position is not None:
            if self._backend.breaks != self._breaks:
                self._mark_breaks()
            if entry.filling is not None:
                self._hold(entry, publication)
                return
            if not self._in_order(key, entry, publication, position, filled):
                return
        self._fan_out(entry, publication)

    def _in_order(
        self,
        key: _Key,
        entry: _Channel,
        publication: Publication,
        position: Position,
        filled: Position | None,
    ) -> bool:
        """Whether to deliver ``publication`` now: False for a copy, or when it revealed
        a gap (it is held while the gap is filled)."""
        last, live, base = entry.last, entry.live, entry.since()
        gap = None  # where the missed publications start
        if base is not None and base.epoch == position.epoch:
            if position.offset <= base.offset:
                if last is None:
                    pass  # on its way when a resume read the history (seams skip it)
                elif live is None or live.epoch != position.epoch or position.offset > live.offset:
                    entry.live = position
                    return False  # a copy of what the history gave
                else:
                    self._went_back(key, entry, live, position)
            elif position.offset > base.offset + 1:
                gap = base
            else:
                entry.doubt = False  # the same store's epoch goes on
        elif base is not None:  # a new epoch
            if entry.doubt:
                self._lost(key, entry, _doubt(base, f"epoch {position.epoch} began"))
                return False
            if position.offset > 1:  # its start missed
                gap = Position(0, position.epoch)
        if gap is not None and self._fill(key, entry, gap, publication, filled):
            return False
        entry.last = entry.live = position
        return True

    def _went_back(self, key: _Key, entry: _Channel, live: Position, position: Position) -> None:
        log.warning(
            "channel %s: a live publication at %s after %s: the store lost publications "
            "and hands out their offsets again; delivered",
            key[1],
            position,
            live,
        )
        entry.detach()
        for conn, state in entry.subscribers.items():
            if isinstance(state, _Seam):  # its seam is meaningless now: take every one
                entry.subscribers[conn] = None

    def _fan_out(
        self, entry: _Channel, publication: Publication, message: PreparedMessage | None = None
    ) -> None:
        if message is None:
            message = encode(publication)
        if self._tick_start is None:
            self._tick_start = time.perf_counter()
        exclude = publication.exclude_socket_id
        sent = 0
        for conn, recovery in entry.subscribers.items():
            if recovery is not None and not self._past_seam(
                entry, conn, recovery, publication, message
            ):
                continue
            if conn.socket_id != exclude:
                conn.send(message)
                sent += 1
        self._delivered(sent)

    def _past_seam(
        self,
        entry: _Channel,
        conn: Connection,
        state: _Recovery | _Seam,
        publication: Publication,
        message: PreparedMessage,
    ) -> bool:
        """Whether a connection that is resuming takes ``publication`` live now."""
        if isinstance(state, _Recovery):
            if state.held is None:
                state.held = []
            state.held.append((publication, message))
            state.held_bytes += len(message)
            if state.held_bytes > self._max_buffer_bytes:
                self._shed(conn, state)
            return False
        position = publication.position
        if position is None:
            return True  # a client event or presence notice: in no history; seam kept
        if not _is_new(position, state.after):
            return False  # already sent from history
        entry.subscribers[conn] = None
        return True

    def _shed(self, conn: Connection, state: _Recovery) -> None:
        """Held-back publications outgrew the buffer: drop those kept in the history
        (the resume reads them from there again); close the connection as a slow
        consumer if the others (client events, presence notices) alone are too many."""
        kept = [(p, m) for p, m in state.held or () if p.position is None]
        state.held = kept
        state.held_bytes = sum(len(m) for _, m in kept)
        state.drops += 1
        if state.held_bytes > self._max_buffer_bytes:
            conn.slow_consumer()

    def _mark_breaks(self) -> None:
        """The backend stopped reading a store that may still take publications: put
        every channel with a position in doubt (see ``_Channel.doubt``)."""
        self._breaks = self._backend.breaks
        for entry in self._channels.values():
            entry.detach()
            if entry.since() is not None:
                entry.doubt = True

    def check_gaps(self) -> None:
        """Fill what every channel missed after its last delivered position (call it
        when the backend reconnected: the gap may be at the end of a stream)."""
        if self._backend.breaks != self._breaks:
            self._mark_breaks()
        for key, entry in self._channels.items():
            since = entry.since()
            if since is not None and entry.filling is None:
                self._fill(key, entry, since, None, None)

    async def drain_fills(self) -> None:
        """Wait for the gap fills under way (tests, shutdown)."""
        while self._fills:
            await asyncio.gather(*self._fills, return_exceptions=True)

    def _fill(
        self,
        key: _Key,
        entry: _Channel,
        since: Position,
        first: Publication | None,
        filled: Position | None,
    ) -> bool:
        """Start filling the gap after ``since``, holding ``first``. False (nothing
        started, ``first`` to be delivered now) when the fill that just ended started
        there too: it could not close the gap, so the subscribers are told (see
        :meth:`_lost`)."""
        if since == filled:
            self._lost(key, entry, f"publications after {since} are missing from the history")
            return False
        entry.detach()
        entry.filling, entry.held_bytes, entry.shed = [], 0, False
        if first is not None:
            self._hold(entry, first)
        task = asyncio.get_running_loop().create_task(self._fill_from_history(key, entry, since))
        self._fills.add(task)
        task.add_done_callback(self._fills.discard)
        return True

    def _hold(self, entry: _Channel, publication: Publication) -> None:
        held = entry.filling
        assert held is not None
        held.append(publication)
        entry.held_bytes += len(publication.data) + _HELD_OVERHEAD
        if entry.held_bytes > self._max_buffer_bytes:
            held.clear()  # they all have a position: the fill reads them from the history
            entry.held_bytes, entry.shed = 0, True

    async def _fill_from_history(self, key: _Key, entry: _Channel, since: Position) -> None:
        started, problem = since, None
        try:
            for _ in range(self._fill_attempts):
                entry.shed = False
                since = await self._fill_pages(key, entry, since)
                entry.last = since
                if not entry.shed:
                    break  # else held ones were dropped after the read: read on
            else:
                problem = "the live publications outran the history reads"
        except _Unfillable as exc:
            problem = str(exc)
        except BackendUnavailable as exc:
            problem = f"the history could not be read ({exc})"
        held, entry.filling, entry.held_bytes = entry.filling or [], None, 0
        if self._channels.get(key) is not entry:
            return  # everyone left meanwhile
        if problem is not None:
            self._lost(key, entry, problem)
        for publication in held:
            self._take(key, entry, publication, started)

    async def _fill_pages(self, key: _Key, entry: _Channel, since: Position) -> Position:
        """Deliver what the channel published after ``since``, in order, a page
        (``_PAGE`` publications) per history read as a resume reads it; the position of
        the last one delivered.

        Raises:
            _Unfillable: the history no longer has them (or lost them between pages).
            BackendUnavailable: a page could not be read within the bounds.
        """
        since, page = await self._read_missed(key, entry, since)
        while True:
            for publication in page.publications:  # in order, right after ``since``
                self._fan_out(entry, publication)
                since = publication.position or since
            top = page.position
            if len(page.publications) < _PAGE or top is None or since == top:
                return since
            page = await self._read_retrying(key, entry, since)
            if not page.recovered:
                raise _Unfillable(f"publications after {since} are missing from the history")

    async def _read_missed(
        self, key: _Key, entry: _Channel, since: Position
    ) -> tuple[Position, HistoryResult]:
        """The first page of what the channel published after ``since``, and where
        that starts (the start of a new epoch when the epoch changed).

        Raises:
            _Unfillable: the history no longer has them.
            BackendUnavailable: the history could not be read within the bounds.
        """
        result = await self._read_retrying(key, entry, since)
        latest = result.position
        if result.recovered:
            entry.doubt = False  # the store's history goes on from ``since``
            return since, result
        if latest is None or (latest.epoch == since.epoch and latest.offset <= since.offset):
            # Nothing stored (Redis restarted empty), or the store went back (a failover
            # lost its last publications): nothing after ``since`` to read. After a
            # break the store cannot show whether it took more that never reached this
            # node (see ``Backend.breaks``): tell the subscribers now, not at the next
            # publication, which may never come.
            if entry.doubt:
                found = "its store is empty" if latest is None else f"its store ends at {latest}"
                raise _Unfillable(_doubt(since, found))
            return since, HistoryResult((), True, None)  # the next one starts a new epoch
        if latest.epoch == since.epoch:
            raise _Unfillable(f"publications after {since} are missing from the history")
        if entry.doubt:
            raise _Unfillable(_doubt(since, f"epoch {latest.epoch} began"))
        since = Position(0, latest.epoch)  # the epoch changed: its start
        result = await self._read_retrying(key, entry, since)
        if not result.recovered:
            raise _Unfillable(f"the start of epoch {latest.epoch} is missing from the history")
        return since, result

    async def _read_retrying(self, key: _Key, entry: _Channel, since: Position) -> HistoryResult:
        """Read a page of the history after ``since``, again after a growing pause
        while the backend is unavailable, within ``fill_attempts`` reads and
        ``fill_deadline``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._fill_deadline
        pause = _FILL_PAUSE
        attempt = 1
        while True:
            try:
                # The resumes' slots (``max_history_reads``): after a reconnect every
                # channel fills at once, and they wait their turn rather than all read
                # together. Waiting for a slot is not a failed read.
                async with self._reads, asyncio.timeout(self._read_timeout):
                    return await self._backend.history(*key, since, _PAGE)
            except (BackendUnavailable, TimeoutError) as exc:
                if attempt >= self._fill_attempts or loop.time() + pause > deadline:
                    raise BackendUnavailable(f"{attempt} reads failed, the last: {exc}") from exc
                if self._channels.get(key) is not entry:
                    raise BackendUnavailable("nobody is subscribed any more") from exc
                log.info("channel %s: missed publications not read yet (%s)", key[1], exc)
            await asyncio.sleep(pause)
            pause, attempt = min(pause * 2, _FILL_PAUSE_MAX), attempt + 1

    def _lost(self, key: _Key, entry: _Channel, problem: str) -> None:
        """The channel's local subscribers missed publications that cannot be read:
        close them with 4100, so that they reconnect and resume from their position
        (told ``recovered: false`` if the history cannot give them what they missed)."""
        log.warning(
            "channel %s: %s; closing its %d local subscribers with 4100 to resume",
            key[1],
            problem,
            len(entry.subscribers),
        )
        entry.last = entry.live = entry.floor = None
        entry.doubt = False
        for conn in list(entry.subscribers):
            conn.close(ErrorCode.OVER_CAPACITY, "missed publications: reconnect and resume")

    def _attach(self, key: _Key, entry: _Channel, conn: Connection, position: Position) -> None:
        """Give the channel a direct route to ``conn``, its only subscriber, which was
        just sent ``position`` live by the fast path of :meth:`deliver_encoded` (so
        nothing is resuming, filling or in doubt on it)."""
        table = self._routes
        raw = conn.raw
        if table is None or raw is None or not getattr(raw, "direct_routes", False):
            return  # a queued (ASGI) connection, or a socket a route cannot write to
        if conn.state is not ConnectionState.OPEN:
            return
        if entry.route_names is None:
            entry.route_names = (table.name_of(*key), table.head_of(*key))
        name, head = entry.route_names
        if name in table.routes:
            return  # (a stale route of another entry: that one detaches it)
        route = Route(
            table,
            name,
            conn,
            raw,
            head,
            position.epoch.encode(),
            position.offset,
            conn.buffer_limit,
            ConnectionState.OPEN,
        )
        table.routes[name] = route
        entry.route = route

    def _delivered_directly(self, count: int, started: float) -> None:
        """Count ``count`` publications that direct routes delivered in a read that
        began at ``started`` (``perf_counter``): written then, so their send latency is
        the read's."""
        metrics = self._metrics
        metrics.publications += count
        metrics.messages_out += count
        metrics.send_latency.observe(time.perf_counter() - started, count)

    def _delivered(self, sent: int) -> None:
        """Count a publication fanned out to ``sent`` connections in this tick (whose
        first delivery set ``_tick_start``)."""
        metrics = self._metrics
        metrics.publications += 1
        metrics.messages_out += sent
        self._tick_publications += 1
        if self._tick_publications == 1:
            self._observe_soon()

    def _observe_soon(self) -> None:
        """Observe the send latency of this tick's publications once they are written:
        one callback per tick, after the Delivery flush of this tick (call_soon
        callbacks run in order)."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        self._loop.call_soon(self._observe_latencies)

    def _observe_latencies(self) -> None:
        """The publications of the tick were written together: each counts the time
        since the tick's first delivery (one histogram update per tick, not per
        publication)."""
        started, count = self._tick_start, self._tick_publications
        self._tick_start = None
        self._tick_publications = 0
        if started is not None and count:
            self._metrics.send_latency.observe(time.perf_counter() - started, count)


_MISSING = _Recovery()


def _doubt(last: Position, found: str) -> str:
    return (
        f"{found} after the node stopped reading the primary it had (it died, the node "
        f"followed a failover, or it stopped answering): publications after {last} may "
        f"have been accepted there unseen"
    )


def _is_new(position: Position | None, after: Position | None) -> bool:
    if position is None or after is None or position.epoch != after.epoch:
        return True
    return position.offset > after.offset
