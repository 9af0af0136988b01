"""The client side of the Redis backend: publish, store and claim as a node does, for
processes that run no node (agent workers). Imports no server module: a worker loads
this, the payload codec, the key layout and the scripts, never the backend.

:func:`publish_via_redis` (standalone, or the primary Sentinel names) and
:func:`publish_via_redis_cluster` run the same publish script with the same arguments as
the backend (:func:`publish_script_args`); only the pub/sub command differs (``PUBLISH``
or ``SPUBLISH``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, cast

from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.exceptions import NoScriptError, RedisClusterException

from broadcaster.backends.base import (
    DEFAULT_HISTORY_META_TTL,
    DEFAULT_HISTORY_SIZE,
    DEFAULT_HISTORY_TTL,
    NotReplicated,
    new_epoch,
)
from broadcaster.backends.redis import scripts
from broadcaster.backends.redis.codec import (
    encode_publication,
    ms,
    position_of,
    script_payload,
)
from broadcaster.backends.redis.layout import (
    channel_key,
    claim_key,
    publication_channel,
    value_key,
)
from broadcaster.backends.redis.resp import pack_commands, replies_on, round_trip
from broadcaster.publication import FRAME_END, FRAME_POSITION, Position, Publication, frame_head

__all__ = [
    "PublishPacker",
    "check_wait",
    "claim_via_redis",
    "publish_and_wait",
    "publish_commands",
    "publish_many_via_redis",
    "publish_many_with",
    "publish_script_args",
    "publish_via_redis",
    "publish_via_redis_cluster",
    "published_positions",
    "release_via_redis",
    "store_value_via_redis",
]

Call = tuple[tuple[str, str], tuple[str | int | bytes, ...]]
"""``KEYS`` and ``ARGV`` of one run of the publish script."""


async def store_value_via_redis(
    client: Redis | RedisCluster, prefix: str, app_id: str, key: str, value: bytes, ttl: float
) -> None:
    """Store a value as the Redis backend does, for processes that run no node (e.g.
    an agent worker storing a session's final state).

    Raises:
        ValueError: ``ttl`` is not positive.
        redis.exceptions.RedisError: from the client.
    """
    if not ttl > 0:
        raise ValueError(f"ttl must be a positive number of seconds, got {ttl!r}")
    await client.set(value_key(prefix, app_id, key), value, px=ms(ttl))


async def publish_via_redis(
    client: Redis,
    prefix: str,
    publication: Publication,
    history: bool = True,
    *,
    history_size: int = DEFAULT_HISTORY_SIZE,
    history_ttl: float = DEFAULT_HISTORY_TTL,
    history_meta_ttl: float = DEFAULT_HISTORY_META_TTL,
    wait_replicas: int = 0,
    wait_timeout: float = 1.0,
) -> Position | None:
    """Publish ``publication`` to every node of the deployment using ``prefix``, as the
    Redis backend does; for processes (agents) that publish without running a node.

    Args:
        client: a ``redis.asyncio.Redis`` client of the deployment's Redis.
        prefix: the deployment's key prefix (the backend's ``prefix`` option).
        publication: what to publish; its ``position`` is ignored.
        history: keep it in the channel's history and give it the next position.
        history_size: publications kept per channel (as configured on the nodes).
        history_ttl: seconds the history lives after the channel's last publication.
        history_meta_ttl: seconds the channel's epoch and offset live.
        wait_replicas: the durable mode (the servers' ``--redis-wait-replicas``): return
            only once Redis ``WAIT`` confirms that this many replicas keep it.
        wait_timeout: seconds ``WAIT`` may wait.

    Returns:
        The publication's position, or None without ``history``.

    Raises:
        redis.exceptions.RedisError: from the client.
        broadcaster.backends.base.NotReplicated: with ``wait_replicas``, fewer replicas
            confirmed it in time (it may still be in the primary's history).
    """
    if history and wait_replicas:
        positions = await publish_many_via_redis(
            client,
            prefix,
            [publication],
            history_size=history_size,
            history_ttl=history_ttl,
            history_meta_ttl=history_meta_ttl,
            wait_replicas=wait_replicas,
            wait_timeout=wait_timeout,
        )
        return positions[0]
    if not history:
        p = publication
        await client.publish(
            publication_channel(prefix, p.app_id, p.channel), encode_publication(p)
        )
        return None
    keys, args = publish_script_args(
        prefix, publication, history_size, history_ttl, history_meta_ttl
    )
    return position_of(await scripts.PUBLISH.run(client, keys, args))


async def publish_many_via_redis(
    client: Redis,
    prefix: str,
    publications: Sequence[Publication],
    *,
    history_size: int = DEFAULT_HISTORY_SIZE,
    history_ttl: float = DEFAULT_HISTORY_TTL,
    history_meta_ttl: float = DEFAULT_HISTORY_META_TTL,
    wait_replicas: int = 0,
    wait_timeout: float = 1.0,
) -> list[Position]:
    """:func:`publish_via_redis` (with history) for many publications in one round trip
    (a pipeline), in order; for agent processes publishing many sessions at once. With
    ``wait_replicas``, a ``WAIT`` ends the round trip (see :func:`publish_via_redis`).

    A connection lost during the round trip raises: Redis may have taken some of the
    publications, so trying the batch again may publish those twice.

    Raises:
        redis.exceptions.RedisError: from the client, or the first publication Redis
            refused (nothing after it was refused for another reason).
        broadcaster.backends.base.NotReplicated: fewer than ``wait_replicas`` replicas
            confirmed the batch in time.
    """
    return await publish_many_with(
        lambda packed, replies: round_trip(client, packed, replies, wait_timeout),
        client,
        prefix,
        publications,
        history_size=history_size,
        history_ttl=history_ttl,
        history_meta_ttl=history_meta_ttl,
        wait_replicas=wait_replicas,
        wait_timeout=wait_timeout,
    )


async def publish_many_with(
    send: Callable[[bytes, int], Awaitable[list[Any]]],
    client: Redis,
    prefix: str,
    publications: Sequence[Publication],
    *,
    history_size: int = DEFAULT_HISTORY_SIZE,
    history_ttl: float = DEFAULT_HISTORY_TTL,
    history_meta_ttl: float = DEFAULT_HISTORY_META_TTL,
    wait_replicas: int = 0,
    wait_timeout: float = 1.0,
) -> list[Position]:
    """:func:`publish_many_via_redis` with the round trip made by ``send(packed,
    replies)`` (the replies to the packed commands, each command's error as its reply),
    e.g. on a connection of the caller's own; ``client`` loads the script into a Redis
    that lacks it."""
    check_wait(wait_replicas, wait_timeout)
    if not publications:
        return []
    commands = publish_commands(
        prefix,
        publications,
        history_size=history_size,
        history_ttl=history_ttl,
        history_meta_ttl=history_meta_ttl,
        wait_replicas=wait_replicas,
        wait_timeout=wait_timeout,
    )
    # The commands are packed by hiredis and sent as one write (redis-py's pipeline
    # costs several times more per command).
    packed = pack_commands(commands)
    for attempt in (1, 2):
        results = await send(packed, len(commands))
        if attempt == 1 and isinstance(results[0], NoScriptError):
            # A restarted or flushed Redis: nothing ran (every call is the same script).
            await client.script_load(scripts.PUBLISH.source)
            continue
        break
    return published_positions(results, wait_replicas, wait_timeout)


def publish_commands(
    prefix: str,
    publications: Sequence[Publication],
    *,
    history_size: int = DEFAULT_HISTORY_SIZE,
    history_ttl: float = DEFAULT_HISTORY_TTL,
    history_meta_ttl: float = DEFAULT_HISTORY_META_TTL,
    wait_replicas: int = 0,
    wait_timeout: float = 1.0,
) -> list[tuple[str | int | bytes, ...]]:
    """The commands of :func:`publish_many_via_redis`: an ``EVALSHA`` of the publish
    script per publication, then ``WAIT`` with ``wait_replicas``; read their replies
    with :func:`published_positions`."""
    script = scripts.PUBLISH
    # One epoch for the batch (a random draw is a system call): it only serves a channel
    # that the batch creates.
    epoch = new_epoch()
    commands: list[tuple[str | int | bytes, ...]] = []
    for p in publications:
        keys, args = publish_script_args(
            prefix, p, history_size, history_ttl, history_meta_ttl, epoch
        )
        commands.append(("EVALSHA", script.sha, len(keys), *keys, *args))
    if wait_replicas:  # on the same connection: it confirms the writes sent before it
        commands.append(("WAIT", wait_replicas, ms(wait_timeout)))
    return commands


def published_positions(
    results: list[Any], wait_replicas: int, wait_timeout: float
) -> list[Position]:
    """The positions from the replies to :func:`publish_commands`.

    Raises:
        redis.exceptions.RedisError: the first publication Redis refused.
        broadcaster.backends.base.NotReplicated: ``WAIT`` confirmed fewer replicas.
    """
    kept = results.pop() if wait_replicas else None
    for result in results:
        if isinstance(result, Exception):
            raise result
    if wait_replicas and (isinstance(kept, Exception) or int(cast(int, kept)) < wait_replicas):
        why = f"WAIT failed: {kept}" if isinstance(kept, Exception) else f"{kept} confirmed it"
        raise NotReplicated(
            f"not acknowledged: {wait_replicas} Redis replica(s) must keep it and {why} "
            f"within {wait_timeout:g} s; it may still be in the primary's history"
        )
    return [position_of(result) for result in results]


def publish_script_args(
    prefix: str,
    publication: Publication,
    history_size: int,
    history_ttl: float,
    history_meta_ttl: float,
    epoch: str | None = None,
    *,
    sharded: bool = False,
) -> Call:
    """``KEYS`` and ``ARGV`` of :data:`broadcaster.backends.redis.scripts.PUBLISH`;
    ``epoch`` is the one a new channel gets (a fresh :func:`new_epoch` unless given);
    ``sharded``: on Redis Cluster (``SPUBLISH``)."""
    p = publication
    keys = (
        channel_key(prefix, p.app_id, p.channel, "meta"),
        channel_key(prefix, p.app_id, p.channel, "stream"),
    )
    before, after = script_payload(p)
    name = publication_channel(prefix, p.app_id, p.channel)
    command = "SPUBLISH" if sharded else "PUBLISH"
    args = (name, before, history_size, ms(history_ttl), ms(history_meta_ttl))
    return keys, (*args, epoch or new_epoch(), after, FRAME_END, command)


class PublishPacker:
    """The publish script's ``EVALSHA`` commands, packed in the Redis protocol as
    :func:`~broadcaster.backends.redis.resp.pack_commands` packs
    ``("EVALSHA", sha, 2, *keys, *args)`` of :func:`publish_script_args` (the same
    bytes), with what is the same for every publication of a channel (its keys, its
    pub/sub channel, its routing header and the history options) packed once per
    channel: a publication adds its epoch, its frame and the end."""

    __slots__ = ("_heads", "_history", "_tail")

    MAX_CHANNELS = 4096
    """Channels whose packed head is kept (all are dropped when one more comes)."""

    def __init__(
        self,
        prefix: str,
        history_size: int,
        history_ttl: float,
        history_meta_ttl: float,
        *,
        sharded: bool = False,
    ) -> None:
        self._history = (prefix, history_size, history_ttl, history_meta_ttl)
        self._tail = _bulk(FRAME_END) + _bulk(b"SPUBLISH" if sharded else b"PUBLISH")
        self._heads: dict[tuple[str, str], bytes] = {}

    def evalsha(self, publication: Publication, epoch: str) -> bytes:
        """The packed ``EVALSHA`` of ``publication``; ``epoch`` for a new channel.

        Raises:
            ValueError: as :func:`~broadcaster.backends.redis.codec.encode_publication`.
        """
        p = publication
        head = self._heads.get((p.app_id, p.channel))
        if head is None:
            head = self._head(p)
        exclude = p.exclude_socket_id
        if exclude is None:
            routing = b" -\n"
        elif not exclude or " " in exclude or "\n" in exclude:
            why = f"cannot publish with the socket id {exclude!r}: empty or with a space"
            raise ValueError(why)
        else:
            routing = b" %b\n" % exclude.encode()
        frame = frame_head(p.event, p.channel, p.data, p.user_id)
        # Joined, not %-formatted: this runs for every publication.
        after = routing + frame + FRAME_POSITION
        return b"".join((head, _bulk(epoch.encode()), _bulk(after), self._tail))

    def _head(self, p: Publication) -> bytes:
        prefix, size, ttl, meta_ttl = self._history
        keys, args = publish_script_args(prefix, p, size, ttl, meta_ttl, "-")
        # Everything before the epoch: EVALSHA, the sha, the keys and the first args.
        first = ("EVALSHA", scripts.PUBLISH.sha, len(keys), *keys, *args[:5])
        head = b"*%d\r\n%b" % (len(first) + 4, b"".join(_bulk(_arg(a)) for a in first))
        if len(self._heads) >= self.MAX_CHANNELS:
            self._heads.clear()
        self._heads[(p.app_id, p.channel)] = head
        return head


def _arg(value: str | int | bytes) -> bytes:
    if isinstance(value, bytes):
        return value
    return str(value).encode() if isinstance(value, int) else value.encode()


def _bulk(value: bytes) -> bytes:
    return b"$%d\r\n" % len(value) + value + b"\r\n"


async def publish_via_redis_cluster(
    client: RedisCluster,
    prefix: str,
    publication: Publication,
    history: bool = True,
    *,
    history_size: int = DEFAULT_HISTORY_SIZE,
    history_ttl: float = DEFAULT_HISTORY_TTL,
    history_meta_ttl: float = DEFAULT_HISTORY_META_TTL,
    wait_replicas: int = 0,
    wait_timeout: float = 1.0,
) -> Position | None:
    """Publish as :class:`RedisClusterBackend` does, for processes that run no node (see
    :func:`broadcaster.backends.redis.publish_via_redis`; with ``wait_replicas``, the
    ``WAIT`` goes to the shard that took the write, on the same connection).

    Raises:
        redis.exceptions.RedisError: from the client.
        broadcaster.backends.base.NotReplicated: fewer than ``wait_replicas`` replicas of
            the shard confirmed it in time.
    """
    p = publication
    name = publication_channel(prefix, p.app_id, p.channel)
    if not history:
        await client.spublish(name, encode_publication(p))
        return None
    keys, args = publish_script_args(
        prefix, p, history_size, history_ttl, history_meta_ttl, sharded=True
    )
    if not wait_replicas:
        return position_of(await scripts.PUBLISH.run(client, keys, args))
    check_wait(wait_replicas, wait_timeout)
    await client.initialize()
    node = client.get_node_from_key(keys[0])
    if node is None:
        raise RedisClusterException(f"no shard serves {keys[0]!r} now")
    reply, kept = await publish_and_wait(node, [(keys, args)], wait_replicas, wait_timeout)
    if isinstance(reply[0], Exception):
        raise reply[0]
    if isinstance(kept, Exception) or int(kept) < wait_replicas:
        raise NotReplicated(
            f"not acknowledged: {wait_replicas} Redis replica(s) of its shard must keep it "
            f"and {kept} confirmed it within {wait_timeout:g} s; it may still be in the "
            "primary's history"
        )
    return position_of(reply[0])


async def publish_and_wait(
    node: ClusterNode,
    calls: list[Call],
    wait_replicas: int,
    wait_timeout: float,
) -> tuple[list[Any], Any]:
    """Run the publish script for ``calls`` (keys of ``node``'s slots) then ``WAIT`` on
    one connection to ``node``: each call's reply (or error), and ``WAIT``'s."""
    script = scripts.PUBLISH
    commands: list[tuple[str | int | bytes, ...]] = [
        ("EVALSHA", script.sha, len(keys), *keys, *args) for keys, args in calls
    ]
    commands.append(("WAIT", wait_replicas, ms(wait_timeout)))
    conn = node.acquire_connection()
    try:
        replies = await replies_on(conn, pack_commands(commands), len(commands), wait_timeout)
        if isinstance(replies[0], NoScriptError):  # a new primary: nothing ran
            commands.insert(0, ("SCRIPT", "LOAD", script.source))
            packed = pack_commands(commands)
            replies = (await replies_on(conn, packed, len(commands), wait_timeout))[1:]
    except BaseException:
        await conn.disconnect()
        raise
    finally:
        node.release(conn)
    return replies[:-1], replies[-1]


async def claim_via_redis(
    client: Redis | RedisCluster, prefix: str, app_id: str, key: str, owner: str, ttl: float
) -> bool:
    """Claim (or renew) as the Redis backend does, for processes that run no node.

    Raises:
        ValueError: ``ttl`` is not positive.
        redis.exceptions.RedisError: from the client.
    """
    if not ttl > 0:
        raise ValueError(f"ttl must be a positive number of seconds, got {ttl!r}")
    held = await scripts.CLAIM.run(client, (claim_key(prefix, app_id, key),), (owner, ms(ttl)))
    return bool(held)


async def release_via_redis(
    client: Redis | RedisCluster, prefix: str, app_id: str, key: str, owner: str
) -> bool:
    """Release a claim as the Redis backend does (only ``owner``'s).

    Raises:
        redis.exceptions.RedisError: from the client.
    """
    released = await scripts.RELEASE.run(client, (claim_key(prefix, app_id, key),), (owner,))
    return bool(released)


def check_wait(wait_replicas: int, wait_timeout: float) -> None:
    """Raises:
    ValueError: ``wait_replicas`` or ``wait_timeout`` out of range."""
    if wait_replicas < 0:
        raise ValueError(f"wait_replicas must be 0 or more, got {wait_replicas!r}")
    if not 0 < wait_timeout <= 60:
        raise ValueError(f"wait_timeout must be 0-60 seconds (not 0), got {wait_timeout!r}")
