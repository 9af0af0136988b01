"""The Redis key layout: one for every topology (standalone, Sentinel, Cluster).

For ``prefix`` P and app A (app ids and channel names contain no ``:``), every key of
one channel shares the hash tag ``{A:channel}`` and every key of one app the tag
``{A}``, so each script touches one slot and runs unchanged on Redis Cluster::

    P:{A:<channel>}:pub        (shard) pub/sub channel of the channel's publications
    P:{A:<channel>}:meta       hash {e: epoch, o: last offset, r: replication id}
    P:{A:<channel>}:stream     stream of the last publications, entry id "<offset>-0"
    P:{A:<channel>}:presence   hash socket id -> {"n": node, "u": user, "i": info}
    P:{A}:#control             (shard) pub/sub channel of the app's control messages
    P:{A}:subs:<node>          hash channel -> the node's subscription count
    P:{A}:subs-nodes           set of nodes that count subscriptions for A
    P:{A}:conn-counts          hash node -> its open connections of A (apps with a limit)
    P:{A}:conn-nodes           sorted set node -> deadline of those counts (Redis time)
    P:{A}:claim:<key>          a claim (lease), e.g. a session's run
    P:{A}:run-index            sorted set "<channel>\\n<exec>" -> a run's start (ms)
    P:{A}:run-summary:<member> a run's summary (JSON; member "<channel>\\n<exec>")
    P:{A}:run-session:<ch>     sorted set exec -> start (ms): one session's runs
    P:{A:<channel>}:trace:<exec>  a run's trace (JSON), in its channel's slot
    P:{A}:runs                 the worker's run queue (agent_core.app.worker)
    P:{#nodes}                 sorted set node -> heartbeat deadline (Redis time, ms)
    P:A:value:<key>            a stored value (a session's final state), read alone
    P:probe:<node>             the readiness probe's short-lived write

Node liveness is one sorted set whose scores are deadlines from Redis's own clock; a
node reads the live nodes and passes them to the presence and count scripts (a script
may not read a key of another slot). Values are read alone and carry no tag.

Pub/sub channels are not scoped by the database number, so deployments that share a
Redis must use different prefixes. :data:`LAYOUT_VERSION` names this layout; the
layout before it (version 1, standalone and Sentinel: ``P:A:meta:<channel>``...) is
neither read nor written (see ``CHANGELOG.md`` for the upgrade).
"""

from __future__ import annotations

from broadcaster.backends.base import DEFAULT_REDIS_PREFIX

__all__ = [
    "DEFAULT_PREFIX",
    "LAYOUT_VERSION",
    "app_key",
    "app_tag",
    "channel_key",
    "claim_key",
    "control_channel",
    "nodes_key",
    "probe_key",
    "publication_channel",
    "value_key",
]

DEFAULT_PREFIX = DEFAULT_REDIS_PREFIX
"""The key prefix of a deployment that names none."""

LAYOUT_VERSION = 2
"""2: hash tags on every topology (1: standalone and Sentinel without tags)."""


def channel_key(prefix: str, app_id: str, channel: str, kind: str) -> str:
    """A key (or pub/sub channel) of ``channel``: ``kind`` is ``pub``, ``meta``,
    ``stream`` or ``presence``; all share the tag ``{A:channel}``."""
    return f"{prefix}:{{{app_id}:{channel}}}:{kind}"


def publication_channel(prefix: str, app_id: str, channel: str) -> str:
    """The Redis pub/sub channel of ``channel``'s publications."""
    return channel_key(prefix, app_id, channel, "pub")


def app_tag(prefix: str, app_id: str) -> str:
    """``P:{A}``, what every key in app ``app_id``'s slot starts with."""
    return f"{prefix}:{{{app_id}}}"


def app_key(prefix: str, app_id: str, kind: str, name: str | None = None) -> str:
    """A key of app ``app_id`` (``subs``, ``subs-nodes``, ``conn-counts``...), in the
    app's slot (tag ``{A}``)."""
    if name is None:
        return f"{app_tag(prefix, app_id)}:{kind}"
    return f"{app_tag(prefix, app_id)}:{kind}:{name}"


def control_channel(prefix: str, app_id: str) -> str:
    """The (shard) pub/sub channel of app ``app_id``'s control messages."""
    return app_key(prefix, app_id, "#control")


def claim_key(prefix: str, app_id: str, key: str) -> str:
    """The Redis key of a claim (see :meth:`RedisBackend.claim_value`), tagged with the
    app: on Redis Cluster the run queue's scripts (:mod:`agent_core.app.worker`) read a
    session's claim in the slot of the app's queue keys."""
    return app_key(prefix, app_id, "claim", key)


def value_key(prefix: str, app_id: str, key: str) -> str:
    """The Redis key of a stored value (see :meth:`RedisBackend.store_value`)."""
    return f"{prefix}:{app_id}:value:{key}"


def nodes_key(prefix: str) -> str:
    """The sorted set of live nodes (id -> heartbeat deadline, Redis time in ms)."""
    return f"{prefix}:{{#nodes}}"


def probe_key(prefix: str, node_id: str) -> str:
    """The key a node's readiness probe writes (a short-lived write)."""
    return f"{prefix}:probe:{node_id}"
