"""The backend contract: what moves publications (and shared state) between nodes.

A node owns local connections; the backend only moves publications between processes,
keeps each channel's bounded history, and holds the state that must be seen by every
node (presence members, subscription counts). Implementations are chosen by URL scheme
(``memory://``, ``redis://``) in :func:`broadcaster.backends.create_backend`, and one
conformance suite (``tests/backends/``) runs against each of them.

Every method is called on the node's event loop. The handler is called on that loop too,
synchronously, once per publication per node; it must not block.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from broadcaster.publication import Position, PresenceMember, Publication
from broadcaster.run_index import RunIndex

__all__ = [
    "DEFAULT_HISTORY_META_TTL",
    "DEFAULT_HISTORY_SIZE",
    "DEFAULT_HISTORY_TTL",
    "DEFAULT_REDIS_PREFIX",
    "Backend",
    "BackendUnavailable",
    "Broker",
    "Connections",
    "Control",
    "ControlHandler",
    "EncodedHandler",
    "HistoryResult",
    "NotReplicated",
    "Presence",
    "PresenceFull",
    "PresenceMember",
    "PublicationHandler",
    "PublishUnconfirmed",
    "Runs",
    "Values",
    "check_history_options",
    "new_epoch",
]

DEFAULT_REDIS_PREFIX = "agentbc"
"""The Redis key prefix of a deployment unless configured: servers, publishers and
workers must agree on it."""

DEFAULT_HISTORY_SIZE = 1000
"""Publications kept per channel unless configured (``history_size``)."""
DEFAULT_HISTORY_TTL = 600.0
"""Seconds a channel's history lives after its last publication (``history_ttl``)."""
DEFAULT_HISTORY_META_TTL = 86_400.0
"""Seconds a channel's epoch outlives its last publication (``history_meta_ttl``)."""

PublicationHandler = Callable[[Publication], None]
ControlHandler = Callable[[str, Mapping[str, Any]], None]
"""Called with ``(app_id, message)`` for control messages sent by any node."""
EncodedHandler = Callable[[str, str, Position | None, str | None, bytes], None]
"""Called with ``(app_id, channel, position, exclude_socket_id, frame)`` for a
publication that arrived already encoded: ``frame`` is its channel event exactly as
:func:`broadcaster.protocol.channel_event` writes it."""


def new_epoch() -> str:
    """A random epoch: a channel's history that is created anew never resumes old
    positions. Drawn from a pool of random bytes that one system call refills for
    :data:`_EPOCH_POOL` epochs (a publish batch draws one; a child process after a fork
    draws its own)."""
    if not _epochs:
        pool = secrets.token_hex(4 * _EPOCH_POOL)
        _epochs.extend(pool[i : i + 8] for i in range(0, len(pool), 8))
    return _epochs.pop()


_EPOCH_POOL = 256
_epochs: list[str] = []
os.register_at_fork(after_in_child=_epochs.clear)


def check_history_options(history_size: int, history_ttl: float, history_meta_ttl: float) -> None:
    """Validate the history options shared by every backend.

    Raises:
        ValueError: naming the bad option.
    """
    if history_size < 1:
        raise ValueError(f"history_size must be at least 1, got {history_size!r}")
    if not history_ttl > 0:
        raise ValueError(f"history_ttl must be a positive number of seconds, got {history_ttl!r}")
    if not history_meta_ttl >= history_ttl:
        raise ValueError(
            f"history_meta_ttl ({history_meta_ttl!r}) must be at least history_ttl "
            f"({history_ttl!r}): a channel's epoch must outlive its history"
        )


class BackendUnavailable(Exception):
    """The backend cannot do this now (e.g. Redis is unreachable); the caller may retry."""


class PublishUnconfirmed(BackendUnavailable):
    """A publication was sent but not answered (a timeout, a connection lost while
    waiting): it may or may not have gone out, so a retry may deliver it twice."""


class NotReplicated(BackendUnavailable):
    """A publication was written to the primary but not confirmed by the replicas the
    durable mode asks for (Redis ``WAIT``) in time: it is refused, not acknowledged. It
    may still be in the primary's history and may have reached subscribers (a primary
    that stays up keeps it; one that dies takes it with it), so a retry may deliver it
    twice."""


class PresenceFull(Exception):
    """A presence channel already has its maximum of distinct members (checked in the
    same atomic step that would have added the new one)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the presence channel has the maximum of {limit} members")
        self.limit = limit


@dataclass(frozen=True, slots=True)
class HistoryResult:
    """Publications after a position, oldest first.

    ``recovered`` is False when the history no longer reaches back to the position
    asked for (trimmed, expired, or a different epoch): the client must be told, never
    silently handed a gap. ``publications`` is then empty. ``position`` is the channel's
    latest position, None when the channel has none (never published to, or forgotten).
    """

    publications: tuple[Publication, ...]
    recovered: bool
    position: Position | None


class Broker(Protocol):
    """Moves publications between nodes and keeps each channel's bounded history."""

    @property
    def node_id(self) -> str:
        """A unique id of this node (process), used to attribute presence and counts."""
        ...

    @property
    def ready(self) -> bool:
        """True while publications can be delivered (e.g. Redis is connected)."""
        ...

    @property
    def problem(self) -> str | None:
        """Why the backend is not ready, in a few words (None while it is ready)."""
        ...

    @property
    def reconnects(self) -> int:
        """How many times the backend reconnected since it started (0 for one that
        cannot lose its connection). The node fills every channel's gap after a change."""
        ...

    @property
    def breaks(self) -> int:
        """How many times the backend stopped listening to a store that may have taken
        publications this node did not read: it followed a failover to a new primary,
        gave up on a server that stopped answering, or lost its connection (a server
        that dies may have acknowledged a publication to its publisher and not yet
        written it to this node's connection). The hub cannot prove that a channel's
        epoch ended where this node stopped reading, until the same store's history
        shows it (0 for a backend that cannot break)."""
        ...

    async def start(
        self,
        on_publication: PublicationHandler,
        on_control: ControlHandler,
        on_encoded: EncodedHandler | None = None,
    ) -> None:
        """Connect and start delivering. Raises BackendUnavailable only if the first
        connection fails and the backend cannot retry in the background.

        A backend whose publications arrive encoded hands them to ``on_encoded`` when
        given (no decoding), else decodes them for ``on_publication``."""
        ...

    async def stop(self) -> None:
        """Disconnect and release everything; idempotent."""
        ...

    async def subscribe(self, app_id: str, channel: str) -> None:
        """Start receiving ``channel``'s publications on this node (first local
        subscriber); returns once they are delivered here. Idempotent. Kept across
        reconnections of the backend.

        Raises:
            BackendUnavailable: the subscription could not be made in time (the backend
                is reconnecting); nothing is kept.
        """
        ...

    async def unsubscribe(self, app_id: str, channel: str) -> None:
        """Stop receiving ``channel`` (last local subscriber left). Idempotent."""
        ...

    def publish(
        self, publication: Publication, *, history: bool = True
    ) -> Awaitable[Position | None]:
        """Deliver to every node subscribed to the channel, this one included.

        An awaitable (a coroutine, or a future: the Redis backend's, so that many
        publications can be started and gathered without a task each).

        With ``history``, assign the channel's next position atomically with the
        delivery, keep the publication in the channel's bounded, expiring history and
        return the position (the delivered publication carries it). Without it (presence
        notices, client events), nothing is stored and ``None`` is returned.

        Raises:
            BackendUnavailable: nothing was published; the caller may retry.
        """
        ...

    async def latest(self, app_id: str, channel: str) -> Position | None:
        """The channel's latest position, or None when it has none (never published
        to, or forgotten). Unlike :meth:`position` it creates nothing, so requests that
        merely ask about a channel cannot make the backend hold state for it.

        Raises:
            BackendUnavailable: the backend cannot be read now.
        """
        ...

    async def history(
        self, app_id: str, channel: str, since: Position, limit: int | None = None
    ) -> HistoryResult:
        """Publications after ``since`` (exclusive), oldest first: at most ``limit`` of
        them (a page; read the next one after the last), or all with None.

        Only the last ``history_size`` publications of a channel are kept, and the whole
        history expires ``history_ttl`` seconds after the channel's last publication.
        Like :meth:`latest` it creates nothing: anyone may ask about any channel.

        Raises:
            BackendUnavailable: the history cannot be read now.
        """
        ...

    async def position(self, app_id: str, channel: str) -> Position:
        """The channel's latest position (offset 0 of a new epoch if nothing was published
        yet), to hand a new subscriber so that it can resume later. The epoch is created
        if needed, so the answer stays valid for the next publications.

        Raises:
            BackendUnavailable: the position cannot be read now.
        """
        ...


class Presence(Protocol):
    """Presence members and subscription counts, across every live node."""

    async def presence_add(
        self,
        app_id: str,
        channel: str,
        socket_id: str,
        member: PresenceMember,
        limit: int | None = None,
    ) -> bool:
        """Record a presence connection. True when ``member.user_id`` had no connection
        on the channel before (on any node): a ``member_added`` must be sent.

        Raises:
            PresenceFull: the user is new and the channel already has ``limit`` distinct
                members (on all nodes, checked atomically with the addition); nothing
                was recorded.
        """
        ...

    async def presence_remove(
        self, app_id: str, channel: str, socket_id: str
    ) -> PresenceMember | None:
        """Forget a presence connection. Returns the member when its user has no
        connection left on the channel (a ``member_removed`` must be sent), else None."""
        ...

    async def presence_members(self, app_id: str, channel: str) -> list[PresenceMember]:
        """Unique members (by user id) across all live nodes."""
        ...

    async def add_subscriptions(self, app_id: str, channel: str, delta: int) -> None:
        """Adjust this node's subscription count for the channel by ``delta``."""
        ...

    async def subscription_counts(
        self, app_id: str, channels: Collection[str] | None = None
    ) -> dict[str, int]:
        """Occupied channels of the app and their subscription counts across live nodes:
        of ``channels`` only, when given (a few channels need not cost every channel)."""
        ...


class Values(Protocol):
    """Small values and leases shared by every node (final states, session claims)."""

    async def store_value(self, app_id: str, key: str, value: bytes, ttl: float) -> None:
        """Keep ``value`` under ``key`` for ``ttl`` seconds, visible to every node (e.g. a
        session's final state for reconcile).

        Raises:
            BackendUnavailable: nothing was stored.
        """
        ...

    async def load_value(self, app_id: str, key: str) -> bytes | None:
        """The value stored under ``key``, or None when absent or expired.

        Raises:
            BackendUnavailable: the backend cannot be read now.
        """
        ...

    async def claim_value(self, app_id: str, key: str, owner: str, ttl: float) -> bool:
        """Claim ``key`` for ``owner`` for ``ttl`` seconds, across every node: True when
        the key was free (or its claim expired) or is already ``owner``'s (the claim is
        then renewed), False when another owner holds it. A lease: the holder renews it
        (every third of ``ttl``, say) while it needs it, so a crashed holder's claim
        expires on its own.

        Raises:
            ValueError: ``ttl`` is not positive.
            BackendUnavailable: nothing was claimed.
        """
        ...

    async def release_value(self, app_id: str, key: str, owner: str) -> bool:
        """Release ``owner``'s claim on ``key``; True when it held it (another owner's
        claim is left alone).

        Raises:
            BackendUnavailable: the backend cannot be reached now.
        """
        ...

    async def claim_holder(self, app_id: str, key: str) -> str | None:
        """The owner of the claim on ``key``, or None when nobody holds it (never
        claimed, released or expired). Reading does not renew it.

        Raises:
            BackendUnavailable: the backend cannot be read now.
        """
        ...


class Connections(Protocol):
    """Counts of open connections across nodes, for apps with ``max_connections``."""

    @property
    def counts_across_nodes(self) -> bool:
        """True when other nodes' connections count too, so the node asks
        :meth:`admit_connection` before admitting a connection of an app with a limit;
        False when one process sees every connection (memory): the node's own count is
        then the whole count and it asks nothing."""
        ...

    async def admit_connection(self, app_id: str, limit: int) -> bool:
        """Count one more connection of ``app_id`` on this node, unless the app already
        has ``limit`` connections on all live nodes (checked in the same atomic step as
        the count). True when it was counted. A node's connections stop counting once
        its heartbeat has expired (it died).

        Raises:
            BackendUnavailable: nothing was counted (the node refuses the connection).
        """
        ...

    async def release_connection(self, app_id: str) -> None:
        """A connection counted by :meth:`admit_connection` closed. Never fails: while
        the backend is unreachable the count is kept here and written on reconnection."""
        ...


class Control(Protocol):
    """Control messages to every node (e.g. terminate a user's connections)."""

    async def send_control(self, app_id: str, message: Mapping[str, Any]) -> None:
        """Send a control message (e.g. terminate a user's connections) to every node,
        this one included."""
        ...


class Runs(Protocol):
    """The run index (:mod:`broadcaster.run_index`), shared by every node."""

    @property
    def runs(self) -> RunIndex:
        """Where runs, their summaries and traces are kept."""
        ...


class Backend(Broker, Presence, Values, Connections, Control, Runs, Protocol):
    """Everything a node needs from its backend: the union of the six parts."""
