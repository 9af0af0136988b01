"""The hub: which local connections are subscribed to which channel, and fan-out.

A publication reaching the node is encoded once (one JSON payload, one WebSocket frame)
and the same bytes are queued to every local subscriber (:meth:`Hub.deliver`). The hub
also keeps the backend subscribed to exactly the channels that have a local subscriber,
serialising subscribe/unsubscribe per channel so that a quick leave-and-rejoin cannot
leave the backend unsubscribed.

Resume: a connection that subscribes with a position is registered in *recovering*
state first; live publications for it are held back while :meth:`Hub.resume` reads the
history page by page and sends each page as the connection's buffer drains (a history
larger than ``max_buffer_bytes`` streams instead of overflowing it), then the held live
ones whose offset is newer (no duplicate, no gap at the seam). History reads of resumes
are bounded per node (``max_history_reads`` at a time, first come first served, each
given up after ``history_read_timeout``), so a burst of resumes cannot starve the
others. When the held live publications outgrow ``max_buffer_bytes``, the ones kept in
the history are dropped and read from it again instead.

Gaps: the hub remembers the last position it delivered on each channel. A publication
that skips offsets (the node's pub/sub subscription was down while another node
published, e.g. during a Redis outage) makes the hub hold the channel's live
publications, read the skipped ones from the history and deliver them first, in order;
a copy of a publication already delivered is dropped. :meth:`Hub.check_gaps` does the
same for every channel after the backend reconnected, for gaps at the end of a stream.
When the history no longer holds the skipped publications, they are lost for the live
subscribers (logged); a client resuming from its position is told ``recovered: false``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from broadcaster import protocol
from broadcaster._frames import Outgoing
from broadcaster.backends.base import Backend, BackendUnavailable, HistoryResult
from broadcaster.connection import Connection
from broadcaster.metrics import Metrics
from broadcaster.publication import Position, Publication

__all__ = ["Hub", "Resumed", "encode"]

log = logging.getLogger("broadcaster.hub")

_Key = tuple[str, str]
_PAGE = 100  # publications per history read of a resume
_DRAIN_TIMEOUT = 30.0  # seconds a resuming client may take to make room for the next one


def encode(publication: Publication) -> Outgoing:
    """The server message carrying ``publication`` (with its position, if any)."""
    p = publication
    position = None if p.position is None else str(p.position)
    return Outgoing(protocol.channel_event(p.event, p.channel, p.data, p.user_id, position))


@dataclass(slots=True)
class _Recovery:
    """Live publications held back while a resuming connection's history is read."""

    held: list[tuple[Publication, Outgoing]] | None = None  # made when the first is held
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
    # The last position delivered here, and the publications held while a gap is filled.
    last: Position | None = None
    filling: list[Publication] | None = None


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
    ) -> None:
        self._backend = backend
        self._metrics = metrics
        self._max_buffer_bytes = max_buffer_bytes
        self._reads = asyncio.Semaphore(max_history_reads)  # FIFO: no resume starves
        self._read_timeout = history_read_timeout
        self._channels: dict[_Key, _Channel] = {}
        self._leaving: dict[_Key, asyncio.Task[None]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._starts: list[float] = []  # delivered this tick, latency not yet observed
        self._fills: set[asyncio.Task[None]] = set()

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
        after, budget = since, self._max_buffer_bytes // 2
        while True:
            drops = recovery.drops
            page = await self._read_page((conn.app.id, channel), after)
            if not page.recovered:
                self.release(conn, channel)
                return Resumed(False, page.position)
            for publication in page.publications:
                if not await self._send_paced(conn, publication, budget):
                    self.release(conn, channel)  # closed, or a frame that can never fit
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
        ``budget`` unsent bytes (the rest of its buffer stays free for live traffic)."""
        if publication.exclude_socket_id == conn.socket_id:
            return True
        message = encode(publication)
        size = len(message.frame)
        if size > self._max_buffer_bytes:
            return False
        room = max(budget - size, 1)
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
        for publication, message in recovery.held or ():
            if _is_new(publication.position, after):
                after = publication.position
                if publication.exclude_socket_id != conn.socket_id:
                    conn.send(message)
        entry.subscribers[conn] = None if after is None else _Seam(after)

    async def unsubscribe(self, conn: Connection, channel: str) -> bool:
        """Remove ``conn`` from ``channel``; True if it was subscribed. The backend is
        unsubscribed when the last local subscriber leaves."""
        key = (conn.app.id, channel)
        entry = self._channels.get(key)
        if entry is None or entry.subscribers.pop(conn, _MISSING) is _MISSING:
            return False
        if not entry.subscribers and entry.ready is None:
            await asyncio.shield(self._leave(key))
        return True

    def _leave(self, key: _Key) -> asyncio.Task[None]:
        del self._channels[key]
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
        entry = self._channels.get((publication.app_id, publication.channel))
        if entry is None:
            return
        position = publication.position
        if position is not None:
            if entry.filling is not None:
                entry.filling.append(publication)
                return
            last = entry.last
            if last is not None and last.epoch == position.epoch:
                if position.offset <= last.offset:
                    return  # a copy of what was delivered (from the history) already
                if position.offset > last.offset + 1:
                    self._fill((publication.app_id, publication.channel), entry, last, publication)
                    return
            elif last is not None and position.offset > 1:  # a new epoch, its start missed
                since = Position(0, position.epoch)
                self._fill((publication.app_id, publication.channel), entry, since, publication)
                return
            entry.last = position
        started = time.perf_counter()
        message = encode(publication)
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
        metrics = self._metrics
        metrics.publications += 1
        metrics.messages_out += sent
        self._observe_after_flush(started)

    def _past_seam(
        self,
        entry: _Channel,
        conn: Connection,
        state: _Recovery | _Seam,
        publication: Publication,
        message: Outgoing,
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
        if not _is_new(publication.position, state.after):
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

    def check_gaps(self) -> None:
        """Fill what every channel missed after its last delivered position (call it
        when the backend reconnected: the gap may be at the end of a stream)."""
        for key, entry in self._channels.items():
            if entry.last is not None and entry.filling is None:
                self._fill(key, entry, entry.last, None)

    async def drain_fills(self) -> None:
        """Wait for the gap fills under way (tests, shutdown)."""
        while self._fills:
            await asyncio.gather(*self._fills, return_exceptions=True)

    def _fill(self, key: _Key, entry: _Channel, since: Position, first: Publication | None) -> None:
        entry.filling = [] if first is None else [first]
        task = asyncio.get_running_loop().create_task(self._fill_from_history(key, entry, since))
        self._fills.add(task)
        task.add_done_callback(self._fills.discard)

    async def _fill_from_history(self, key: _Key, entry: _Channel, since: Position) -> None:
        missed: tuple[Publication, ...] = ()
        recovered = False
        try:
            result = await self._backend.history(*key, since)
            latest = result.position
            if not result.recovered and latest is not None and latest.epoch != since.epoch:
                since = Position(0, latest.epoch)  # the epoch changed: its start
                result = await self._backend.history(*key, since)
            recovered, missed = result.recovered, result.publications
            if not recovered:
                log.warning("channel %s missed publications the history no longer has", key[1])
        except BackendUnavailable as exc:
            log.warning("channel %s: missed publications not read (%s)", key[1], exc)
        held, entry.filling = entry.filling or [], None
        if self._channels.get(key) is not entry:
            return  # everyone left meanwhile
        entry.last = since if recovered else None  # None: accept the gap, do not refill
        for publication in (*missed, *held):
            self.deliver(publication)

    def _observe_after_flush(self, started: float) -> None:
        # One callback per tick, after the Delivery flush of this tick (call_soon
        # callbacks run in order), observes every publication delivered in the tick.
        starts = self._starts
        starts.append(started)
        if len(starts) == 1:
            if self._loop is None:
                self._loop = asyncio.get_running_loop()
            self._loop.call_soon(self._observe_latencies)

    def _observe_latencies(self) -> None:
        now = time.perf_counter()
        starts, self._starts = self._starts, []
        observe = self._metrics.send_latency.observe
        for started in starts:
            observe(now - started)


_MISSING = _Recovery()


def _is_new(position: Position | None, after: Position | None) -> bool:
    if position is None or after is None or position.epoch != after.epoch:
        return True
    return position.offset > after.offset
