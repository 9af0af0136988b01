"""The node: the configured apps, the hub of local connections and the backend.

Everything a client or the HTTP API can ask for goes through the node: admitting and
closing connections, subscriptions (with channel auth, presence and resume), client
events, sign-in, publishing and the channel queries. The WebSocket endpoint
(:mod:`broadcaster.websocket`) and the HTTP API (:mod:`broadcaster.http_api`) are thin
shells around it, and extensions reach it through ``ExtensionContext.node`` (e.g. to
publish in-process).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from typing import Any

from broadcaster import protocol
from broadcaster._frames import PreparedMessage
from broadcaster._text import excerpt
from broadcaster.backends import create_backend
from broadcaster.backends.base import Backend, BackendUnavailable, PresenceFull
from broadcaster.channels import server_to_user_id
from broadcaster.codes import ErrorCode
from broadcaster.connection import AsgiConnection, AsgiSend, Connection, Delivery
from broadcaster.exceptions import ProtocolError
from broadcaster.hub import Hub
from broadcaster.metrics import Metrics
from broadcaster.publication import Position, PresenceMember, Publication, make_publication
from broadcaster.settings import AppConfig, Settings
from broadcaster.transport import RawSocket

__all__ = ["Node"]

log = logging.getLogger("broadcaster.node")

_TERMINATE = "terminate_user_connections"
_NOT_RECOVERED = "the channel's history no longer reaches back to that position"
_PING = PreparedMessage(protocol.ping())
_WATCH_INTERVAL = 0.25  # seconds between checks for a backend reconnection


class Node:
    """One server process: apps, local connections, hub and backend.

    Args:
        settings: the validated settings (apps, limits, backend URL).
        backend: a backend to use instead of the one ``settings.backend`` names.
    """

    def __init__(self, settings: Settings, backend: Backend | None = None) -> None:
        self.settings = settings
        self.apps = settings.apps()
        self._by_key = {app.key: app for app in self.apps}
        self._by_id = {app.id: app for app in self.apps}
        self.backend = backend or _backend_for(settings, self.apps)
        self.metrics = Metrics(backend_reconnects=self._backend_reconnects)
        self.hub = Hub(
            self.backend,
            self.metrics,
            max_buffer_bytes=settings.max_buffer_bytes,
            max_history_reads=settings.max_history_reads,
            history_read_timeout=settings.history_read_timeout,
        )
        self.delivery = Delivery(settings.max_buffer_bytes, on_slow_consumer=self._on_slow_consumer)
        self.connections: dict[str, Connection] = {}
        self.streams: set[Connection] = set()  # HTTP streams (SSE, AG-UI) on channels
        self._per_app: dict[str, int] = {app.id: 0 for app in self.apps}
        # Connections of apps with max_connections counted by a backend shared by several
        # nodes (released there when they close); empty on the memory backend.
        self._counted: set[Connection] = set()
        self._shared_counts = self.backend.counts_across_nodes
        self._users: dict[tuple[str, str], set[Connection]] = {}
        self._sweeper: asyncio.TimerHandle | None = None
        self._watcher: asyncio.TimerHandle | None = None
        self._reconnects = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- life -------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Node]:
        """Start the backend and the inactivity sweep; on exit close every client with
        4200 and stop the backend."""
        await self.start()
        try:
            yield self
        finally:
            await self.stop()

    async def start(self) -> None:
        """Connect the backend and start delivering."""
        self._loop = asyncio.get_running_loop()
        await self.backend.start(self.hub.deliver, self._on_control, self.hub.deliver_encoded)
        self._schedule_sweep()
        self._reconnects = self._backend_reconnects()
        self._watch_backend()

    async def stop(self) -> None:
        """Close every connection (4200) and stop the backend; idempotent."""
        for timer in (self._sweeper, self._watcher):
            if timer is not None:
                timer.cancel()
        self._sweeper = self._watcher = None
        for conn in list(self.connections.values()):
            conn.close(ErrorCode.SERVER_CLOSING, "server shutting down")
        await self.backend.stop()

    def close_streams(self) -> None:
        """End every HTTP stream (SSE, AG-UI): the server is shutting down, and an open
        stream would otherwise hold the graceful shutdown until its timeout. Their
        clients reconnect (``Last-Event-ID``) to another node."""
        for conn in list(self.streams):
            conn.close(ErrorCode.SERVER_CLOSING, "server shutting down")

    @property
    def ready(self) -> bool:
        """True while publications can be delivered (the backend is connected)."""
        return self.backend.ready

    # -- apps and admission -----------------------------------------------------------

    def app_by_id(self, app_id: str) -> AppConfig | None:
        """The app with id ``app_id``, if configured."""
        return self._by_id.get(app_id)

    def app_by_key(self, key: str) -> AppConfig | None:
        """The app with key ``key``, if configured."""
        return self._by_key.get(key)

    def admit(self, key: str, protocol_version: str | None, origin: str | None) -> AppConfig:
        """The app a new WebSocket connection to ``/app/{key}`` is for.

        The connection limit is checked here against this node's own count: with the
        memory backend that is the whole check; with a shared backend it only refuses
        early (no Redis work), and :meth:`count` decides across nodes after
        :meth:`open`.

        Raises:
            ProtocolError: unknown key (4001), disabled app (4003), over the app's
                connection limit (4004), bad protocol version (4006-4008), origin not
                allowed (4009).
        """
        app = self._by_key.get(key)
        if app is None:
            raise ProtocolError(ErrorCode.APP_NOT_FOUND, f"no app has the key {excerpt(key)}")
        if not app.enabled:
            raise ProtocolError(ErrorCode.APP_DISABLED, f"app {app.id!r} is disabled")
        protocol.check_protocol_version(protocol_version)
        protocol.check_origin(app, origin)
        limit = app.max_connections
        if limit is not None and self._per_app[app.id] >= limit:
            raise _over_quota(app)
        return app

    def open(
        self, app: AppConfig, raw: RawSocket | None = None, send: AsgiSend | None = None
    ) -> Connection:
        """Register a new accepted connection (fast path with ``raw``, else through the
        ASGI ``send``) and send it ``pusher:connection_established`` — unless
        :meth:`counted_across_nodes` says it must be counted first: then :meth:`count`
        sends it (or refuses the connection)."""
        socket_id = protocol.new_socket_id()
        if raw is not None:
            conn = Connection.fast(socket_id, app, self.delivery, raw)
        else:
            assert send is not None
            conn = AsgiConnection(socket_id, app, self.delivery, send)
        conn.last_seen = self._now()
        self.connections[socket_id] = conn
        self._per_app[app.id] += 1
        self.metrics.connections.labels(app.id).inc()
        if not self.counted_across_nodes(app):
            self._established(conn)
        return conn

    def counted_across_nodes(self, app: AppConfig) -> bool:
        """True when a connection of ``app`` must be counted by the backend (the app has
        ``max_connections`` and the backend is shared by several nodes) before it is
        established: the caller then awaits :meth:`count` after :meth:`open`. Without a
        limit, or on the memory backend, nothing is awaited per connection."""
        return self._shared_counts and app.max_connections is not None

    async def count(self, conn: Connection) -> None:
        """Count an opened connection against its app's ``max_connections`` on every
        node (one atomic backend step), then send ``pusher:connection_established``.

        Fails closed: when the backend cannot count now, the connection is refused with
        4100 (pusher-js reconnects after a back-off) rather than admitted uncounted.

        Raises:
            ProtocolError: the app has ``max_connections`` connections on the live nodes
                (4004), or the backend is unavailable (4100).
        """
        app = conn.app
        assert app.max_connections is not None
        try:
            admitted = await self.backend.admit_connection(app.id, app.max_connections)
        except BackendUnavailable as exc:
            raise ProtocolError(
                ErrorCode.OVER_CAPACITY,
                f"cannot count this connection against app {app.id!r}'s limit now ({exc}); "
                "reconnect later",
            ) from None
        if not admitted:
            raise _over_quota(app)
        self._counted.add(conn)
        if conn.is_open:
            self._established(conn)

    def _established(self, conn: Connection) -> None:
        timeout = self.settings.activity_timeout
        conn.send(PreparedMessage(protocol.connection_established(conn.socket_id, timeout)))

    async def disconnect(self, conn: Connection) -> None:
        """Forget a connection whose socket is gone: leave its channels (presence
        members removed, last subscriber unsubscribes the backend)."""
        conn.closed()
        if self.connections.pop(conn.socket_id, None) is None:
            return
        self._per_app[conn.app.id] -= 1
        self.metrics.connections.labels(conn.app.id).dec()
        self._forget_user(conn)
        if conn in self._counted:
            self._counted.discard(conn)
            await self.backend.release_connection(conn.app.id)
        for channel in list(conn.channels):
            try:
                await self.unsubscribe(conn, channel)
            except BackendUnavailable as exc:
                log.warning("leaving %s of %s: %s", channel, conn.socket_id, exc)

    def seen(self, conn: Connection) -> None:
        """The client sent something: it is active."""
        conn.last_seen = self._now()
        conn.pinged = False
        self.metrics.messages_in += 1

    # -- client commands ----------------------------------------------------------------

    async def subscribe(self, conn: Connection, command: protocol.Subscribe) -> None:
        """Handle ``pusher:subscribe`` (auth, presence, resume from ``position``).

        Raises:
            ProtocolError: over the subscribe rate (4309), bad auth, presence channel
                full, or the backend unavailable (the connection is then closed with
                4100: pusher-js reconnects after a back-off and subscribes again,
                resuming from its position).
        """
        channel = command.channel
        app = conn.app
        rate = app.subscription_rate_limit
        # A burst for every channel a client subscribes to as it connects, and a second.
        burst = app.max_channels_per_connection + rate
        allowed = conn.allow_subscribe(self._now(), rate, burst)
        if channel in conn.channels:
            # Subscribed already: that subscription stands whatever this request says
            # (an error about the channel now would contradict the success the client
            # was told), so it is answered again, within the rate.
            if not allowed:
                raise ProtocolError(
                    ErrorCode.SUBSCRIPTION_RATE_LIMIT,
                    f"a subscribe to {channel!r}, which this connection has, was ignored: "
                    f"more than {rate} subscribes a second (subscription_rate_limit)",
                    close=False,
                )
            await self._succeeded(conn, channel, command.member is not None)
            return
        if not allowed:
            raise ProtocolError(
                ErrorCode.SUBSCRIPTION_RATE_LIMIT,
                f"more than {rate} subscribes a second on this connection (the app's "
                "subscription_rate_limit); subscribe again later",
                channel=channel,
                close=False,
            )
        protocol.authorize_subscription(app, conn.socket_id, command)
        _authorize_user_channel(conn, channel)
        protocol.check_channel_limit(conn.app, len(conn.channels), channel)
        member = command.member
        try:
            await self.hub.subscribe(conn, channel, recovering=True)
        except BackendUnavailable as exc:
            raise _unavailable(channel, exc) from None
        conn.channels[channel] = None if member is None else member.user_id
        self.metrics.subscriptions.inc()
        self.metrics.channels.set(self.hub.channels())
        try:
            await self._joined(conn, channel, member, command.resume_from)
        except BackendUnavailable as exc:
            await self._leave_quietly(conn, channel)
            raise _unavailable(channel, exc) from None
        except PresenceFull as exc:
            await self._leave_quietly(conn, channel)
            raise protocol.presence_member_limit(channel, exc.limit) from None

    async def _joined(
        self,
        conn: Connection,
        channel: str,
        member: protocol.PresenceMember | None,
        since: Position | None,
    ) -> None:
        app_id = conn.app.id
        await self.backend.add_subscriptions(app_id, channel, 1)
        added = False
        if member is not None:
            limit = conn.app.max_presence_members  # checked atomically with the addition
            added = await self.backend.presence_add(app_id, channel, conn.socket_id, member, limit)
        await self._succeeded(conn, channel, member is not None)
        await self._resume(conn, channel, since)
        if added:
            assert member is not None
            await self._presence_notice(conn, channel, protocol.member_added_notice(member))

    async def _succeeded(self, conn: Connection, channel: str, presence: bool) -> None:
        members = None
        if presence:
            found = await self.backend.presence_members(conn.app.id, channel)
            members = {m.user_id: m.user_info for m in found}
        conn.send(PreparedMessage(protocol.subscription_succeeded(channel, members)))

    async def _resume(self, conn: Connection, channel: str, since: Position | None) -> None:
        if since is None:
            self.hub.release(conn, channel)
            return
        resumed = await self.hub.resume(conn, channel, since)
        reason = None if resumed.recovered else _NOT_RECOVERED
        notice = protocol.resume_result(channel, resumed.recovered, resumed.position, reason)
        conn.send(PreparedMessage(notice))

    async def _leave_quietly(self, conn: Connection, channel: str) -> None:
        try:
            await self.unsubscribe(conn, channel)
        except BackendUnavailable as exc:
            log.warning("leaving %s of %s: %s", channel, conn.socket_id, exc)

    async def unsubscribe(self, conn: Connection, channel: str) -> None:
        """Handle ``pusher:unsubscribe`` (a channel not subscribed is ignored)."""
        if channel not in conn.channels:
            return
        user_id = conn.channels.pop(channel)
        if await self.hub.unsubscribe(conn, channel):
            self.metrics.subscriptions.dec()
            self.metrics.channels.set(self.hub.channels())
        app_id = conn.app.id
        await self.backend.add_subscriptions(app_id, channel, -1)
        if user_id is None:
            return
        gone = await self.backend.presence_remove(app_id, channel, conn.socket_id)
        if gone is not None:
            await self._presence_notice(conn, channel, protocol.member_removed_notice(gone.user_id))

    async def _presence_notice(
        self, conn: Connection, channel: str, notice: protocol.Notice
    ) -> None:
        publication = Publication(conn.app.id, channel, notice.event, notice.data, conn.socket_id)
        await self.backend.publish(publication, history=False)

    async def client_event(self, conn: Connection, command: protocol.ClientEvent) -> None:
        """Relay a ``client-*`` event to the channel's other subscribers (every node).

        Raises:
            ProtocolError: client events disabled, public or unjoined channel (4305),
                over the rate limit (4301).
        """
        app = conn.app
        channel = command.channel
        protocol.check_client_event(app, command, subscribed=channel in conn.channels)
        if not conn.allow_client_event(self._now(), app.client_event_rate_limit):
            raise ProtocolError(
                ErrorCode.CLIENT_EVENT_RATE_LIMIT,
                f"more than {app.client_event_rate_limit} client events per second; "
                f"{command.event!r} was dropped",
            )
        publication = Publication(
            app.id, channel, command.event, command.data, conn.socket_id, conn.channels[channel]
        )
        try:
            await self.backend.publish(publication, history=False)
        except BackendUnavailable as exc:
            raise ProtocolError(
                ErrorCode.CLIENT_EVENT_REJECTED, f"cannot relay {command.event!r} now: {exc}"
            ) from None

    def signin(self, conn: Connection, command: protocol.Signin) -> None:
        """Handle ``pusher:signin``: check the signature and remember the user.

        Raises:
            ProtocolError: UNAUTHORIZED (closes) for a bad signature or ``user_data``;
                UNAUTHORIZED (the connection stays, as the user it was) for a sign-in
                as another user than the one this connection signed in as.
        """
        app = conn.app
        protocol.authorize_signin(app, conn.socket_id, command)
        user_id = command.user.id
        if conn.user_id is not None and conn.user_id != user_id:
            # Its #server-to-user-<first> subscriptions would outlive the first user
            # (terminate_connections for that user would miss the connection).
            raise ProtocolError(
                ErrorCode.UNAUTHORIZED,
                f"this connection is signed in as {conn.user_id!r}; a connection signs in "
                f"as one user: open another to sign in as {excerpt(user_id)}",
                close=False,
            )
        self._forget_user(conn)
        conn.user_id = user_id
        self._users.setdefault((app.id, user_id), set()).add(conn)
        conn.send(PreparedMessage(protocol.signin_success(command.user_data)))

    def _forget_user(self, conn: Connection) -> None:
        if conn.user_id is None:
            return
        key = (conn.app.id, conn.user_id)
        users = self._users.get(key)
        if users is not None:
            users.discard(conn)
            if not users:
                del self._users[key]

    # -- HTTP API -----------------------------------------------------------------------

    async def publish(
        self,
        app_id: str,
        channels: Sequence[str],
        event: str,
        data: str,
        exclude_socket_id: str | None = None,
    ) -> dict[str, Position | None]:
        """Publish ``event`` on every channel of ``channels`` (kept in history).

        Returns:
            The position each channel's publication got.

        Raises:
            BackendUnavailable: nothing (or not everything) was published.
        """
        publications = [
            Publication(app_id, channel, event, data, exclude_socket_id) for channel in channels
        ]
        positions = await self._publish_all(publications)
        return dict(zip(channels, positions, strict=True))

    async def publish_batch(
        self, app_id: str, events: Sequence[tuple[Sequence[str], str, str, str | None]]
    ) -> None:
        """Publish several events, each ``(channels, event, data, exclude_socket_id)``
        as for :meth:`publish`, all started at once, in order (one Redis round trip).

        Raises:
            BackendUnavailable: nothing (or not everything) was published.
        """
        await self.start_publish_batch(app_id, events)

    def start_publish_batch(
        self, app_id: str, events: Sequence[tuple[Sequence[str], str, str, str | None]]
    ) -> asyncio.Future[Any]:
        """:meth:`publish_batch` for a caller that waits with a callback rather than a
        task (the HTTP protocol serving the publish routes itself): every publication is
        handed to the backend before this returns, in order, and the future is done once
        all are published.

        Raises:
            BackendUnavailable: (from the future) as :meth:`publish_batch`.
        """
        started = [
            self.backend.publish(make_publication(app_id, channel, event, data, exclude_socket_id))
            for channels, event, data, exclude_socket_id in events
            for channel in channels
        ]
        # A Redis publish is a future already: one publication needs no gathering.
        if len(started) != 1:
            done: asyncio.Future[Any] = asyncio.gather(*started)
        elif isinstance(started[0], asyncio.Future):
            done = started[0]  # as ensure_future gives it, without three calls
        else:
            done = asyncio.ensure_future(started[0])
        done.add_done_callback(functools.partial(self._count_publishes, len(started)))
        return done

    def _count_publishes(self, count: int, done: asyncio.Future[Any]) -> None:
        if not done.cancelled() and done.exception() is None:
            self.metrics.http_publishes += count

    async def _publish_all(self, publications: list[Publication]) -> list[Position | None]:
        if len(publications) == 1:  # the usual case: nothing for gather to do
            positions = [await self.backend.publish(publications[0])]
        else:
            # Futures from the Redis backend: gathered without a task each.
            positions = await asyncio.gather(*(self.backend.publish(p) for p in publications))
        self.metrics.http_publishes += len(publications)
        return positions

    async def channel_counts(
        self, app_id: str, channels: Collection[str] | None = None
    ) -> dict[str, int]:
        """Occupied channels of the app with their subscription counts (all nodes); of
        ``channels`` only, when given."""
        return await self.backend.subscription_counts(app_id, channels)

    async def presence_members(self, app_id: str, channel: str) -> list[PresenceMember]:
        """The members of a presence channel (all nodes)."""
        return await self.backend.presence_members(app_id, channel)

    async def terminate_user(self, app_id: str, user_id: str) -> None:
        """Close every connection signed in as ``user_id`` (on every node)."""
        await self.backend.send_control(app_id, {"type": _TERMINATE, "user_id": user_id})

    def _on_control(self, app_id: str, message: Mapping[str, Any]) -> None:
        if message.get("type") != _TERMINATE:
            log.warning("ignoring unknown control message %r", message)
            return
        user_id = str(message.get("user_id"))
        for conn in list(self._users.get((app_id, user_id), ())):
            conn.send(
                PreparedMessage(protocol.error(ErrorCode.UNAUTHORIZED, "connection terminated"))
            )
            conn.close(ErrorCode.UNAUTHORIZED, "connection terminated by the server")

    # -- inactivity ---------------------------------------------------------------------

    def _schedule_sweep(self) -> None:
        assert self._loop is not None
        interval = min(self.settings.activity_timeout, self.settings.pong_timeout) / 4
        self._sweeper = self._loop.call_later(max(0.25, min(interval, 5.0)), self._sweep)

    def _sweep(self) -> None:
        """Ping connections idle for ``activity_timeout``; close (4201) those that did
        not answer within ``pong_timeout``."""
        now = self._now()
        idle_limit = self.settings.activity_timeout
        pong_limit = idle_limit + self.settings.pong_timeout
        for conn in list(self.connections.values()):
            idle = now - conn.last_seen
            if conn.pinged and idle > pong_limit:
                conn.close(ErrorCode.PONG_NOT_RECEIVED, "pong not received")
            elif not conn.pinged and idle > idle_limit:
                conn.pinged = True
                conn.send(_PING)
        self._schedule_sweep()

    def _watch_backend(self) -> None:
        """After the backend reconnected, fill what channels missed while it was away."""
        reconnects = self._backend_reconnects()
        if reconnects != self._reconnects:
            self._reconnects = reconnects
            self.hub.check_gaps()
        assert self._loop is not None
        self._watcher = self._loop.call_later(_WATCH_INTERVAL, self._watch_backend)

    # -- helpers ------------------------------------------------------------------------

    def _now(self) -> float:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop.time()

    def _on_slow_consumer(self, conn: Connection) -> None:
        self.metrics.slow_consumers.inc()
        log.info("closed slow consumer %s (app %s)", conn.socket_id, conn.app.id)

    def _backend_reconnects(self) -> float:
        return float(self.backend.reconnects)


def _backend_for(settings: Settings, apps: Sequence[AppConfig]) -> Backend:
    options: dict[str, object] = {
        "history_size": settings.history_size,
        "history_ttl": settings.history_ttl,
        # A channel's epoch outlives its history, so old positions are told "not
        # recovered" rather than silently matched against a new history.
        "history_meta_ttl": max(86_400.0, float(settings.history_ttl)),
        "apps": [app.id for app in apps],
    }
    if not settings.backend.startswith("memory"):
        options["prefix"] = settings.redis_prefix
        options["read_delay"] = settings.redis_read_delay
        options["node_ttl"] = settings.redis_node_ttl
        options["wait_replicas"] = settings.redis_wait_replicas
        options["wait_timeout"] = settings.redis_wait_timeout
    return create_backend(settings.backend, **options)


def _authorize_user_channel(conn: Connection, channel: str) -> None:
    user_id = server_to_user_id(channel)
    if user_id is not None and user_id != conn.user_id:
        raise ProtocolError(
            ErrorCode.SUBSCRIPTION_UNAUTHORIZED,
            f"only a connection signed in (pusher:signin) as user {user_id!r} may "
            f"subscribe to {channel!r}",
            channel=channel,
            close=False,
        )


def _over_quota(app: AppConfig) -> ProtocolError:
    return ProtocolError(
        ErrorCode.OVER_QUOTA,
        f"app {app.id!r} is at its limit of {app.max_connections} connections",
    )


def _unavailable(channel: str, exc: BackendUnavailable) -> ProtocolError:
    # Closing is the answer pusher-js acts on: it reconnects after a back-off and
    # subscribes (resumes) again. An error message alone would leave it believing it is
    # subscribed (or waiting for ever for subscription_succeeded) and receiving nothing.
    return ProtocolError(
        ErrorCode.OVER_CAPACITY,
        f"cannot subscribe to {channel!r} now ({exc}); reconnect and subscribe again",
        close=True,
    )
