"""The Redis backend: many nodes (processes, hosts) share publications through Redis.

:class:`RedisBackend` on a standalone Redis or on the primary Sentinel names (the URL's
scheme picks the topology, :mod:`broadcaster.backends.redis.topology`), composed of
its parts: :mod:`.core` (options, lifecycle, readiness, values, history),
:mod:`.pubsub` (one pub/sub connection), :mod:`.batching` (publications in batches on
a connection of their own), :mod:`.presence` (presence and subscription counts) and
:mod:`.liveness` (heartbeats, readiness probe, admission, claims). Redis Cluster
composes the same parts with sharded ones (:mod:`.cluster`).

One publication is one Lua script (:data:`broadcaster.backends.redis.scripts.PUBLISH`):
epoch, offset, stream entry and ``PUBLISH`` happen together, so the delivered position
and the stored one cannot disagree and delivery order is offset order.

Each node ``SUBSCRIBE``\\ s only to the channels its clients use, on one pub/sub
connection (no socket timeout: a heartbeat ``PING`` checks it) read by one task that
decodes each message once and calls the handler. When Redis is lost the node stays up,
:attr:`RedisBackend.ready` turns False, and a background task reconnects with capped,
jittered exponential backoff, subscribes again to every channel it had and rewrites this
node's presence entries and subscription counts.
"""

from __future__ import annotations

from broadcaster.backends.redis.batching import ConnectionBatches
from broadcaster.backends.redis.layout import DEFAULT_PREFIX
from broadcaster.backends.redis.liveness import Liveness
from broadcaster.backends.redis.presence import PresenceAndCounts
from broadcaster.backends.redis.pubsub import OneConnection

__all__ = ["DEFAULT_PREFIX", "RedisBackend"]


class RedisBackend(OneConnection, ConnectionBatches, PresenceAndCounts, Liveness):
    """A :class:`~broadcaster.backends.base.Backend` shared by every node using the same
    Redis and ``prefix``: on a standalone Redis (``redis://``, ``rediss://``,
    ``unix://``) or on the primary Sentinel names (``redis-sentinel://``). Options: see
    :class:`~broadcaster.backends.redis.core.BackendCore`.

    Raises:
        ValueError: for an invalid URL or option, naming it.
    """
