"""The Redis backend, one package for every topology (standalone, Sentinel, Cluster).

=================  ===================================================================
module             what it holds
=================  ===================================================================
``layout``         the key layout (one, hash-tagged, on every topology)
``codec``          the publication payload (header + the channel event's frame)
``scripts``        the Lua scripts, written once for one slot
``resp``           RESP on raw connections: packed commands, pub/sub and reply readers
``urls``           ``redis://``, ``redis-sentinel://``, ``redis-cluster://`` URLs
``clients``        clients of the Sentinel primary and of a Cluster
``publish``        the client side: publish, store and claim without a node (agents)
``topology``       where the primary is and its clients: standalone, Sentinel, Cluster
``core``           options, state, lifecycle, readiness, values, history
``pubsub``         subscribe passes and dispatch; one pub/sub connection
``batching``       publish batching; the publications' own connection
``presence``       presence members and subscription counts
``liveness``       heartbeats, readiness probe, restore, admission, claims
``backend``        :class:`RedisBackend` (standalone, Sentinel): those parts composed
``cluster``        Redis Cluster: sharded pub/sub and a pipeline per shard, composed
                   with the same core, presence and liveness
=================  ===================================================================

The client side (``layout``, ``codec``, ``scripts``, ``resp``, ``urls``, ``clients``,
``publish``) imports no server module and not the backend: ``RedisBackend`` is loaded
from here only when asked for, so a worker that imports :func:`publish_via_redis`
does not load it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from broadcaster.backends.redis.codec import (
    FORMAT_VERSION,
    decode_publication,
    encode_publication,
    script_payload,
    split_payload,
)
from broadcaster.backends.redis.layout import (
    DEFAULT_PREFIX,
    LAYOUT_VERSION,
    channel_key,
    claim_key,
    publication_channel,
    value_key,
)
from broadcaster.backends.redis.publish import (
    claim_via_redis,
    publish_many_via_redis,
    publish_via_redis,
    publish_via_redis_cluster,
    release_via_redis,
    store_value_via_redis,
)
from broadcaster.backends.redis.resp import PubSubReader, ReplyReader, pack_commands, take_over
from broadcaster.backends.redis.urls import parse_hosts, safe_url

if TYPE_CHECKING:
    from broadcaster.backends.redis.backend import RedisBackend

__all__ = [
    "DEFAULT_PREFIX",
    "FORMAT_VERSION",
    "LAYOUT_VERSION",
    "PubSubReader",
    "RedisBackend",
    "ReplyReader",
    "channel_key",
    "claim_key",
    "claim_via_redis",
    "decode_publication",
    "encode_publication",
    "pack_commands",
    "parse_hosts",
    "publication_channel",
    "publish_many_via_redis",
    "publish_via_redis",
    "publish_via_redis_cluster",
    "release_via_redis",
    "safe_url",
    "script_payload",
    "split_payload",
    "store_value_via_redis",
    "take_over",
    "value_key",
]


def __getattr__(name: str) -> Any:
    """``RedisBackend``, imported when first asked for (not by the client side)."""
    if name == "RedisBackend":
        from broadcaster.backends.redis.backend import RedisBackend

        return RedisBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
