"""Liveness and admission: this node's heartbeat (one sorted set of live nodes), the
readiness probe, the state a heartbeat refreshes and a reconnection restores, the
per-app connection counts (``max_connections``) and claims.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from redis.exceptions import (
    ResponseError,
)

from broadcaster.backends.base import (
    BackendUnavailable,
)
from broadcaster.backends.redis import scripts
from broadcaster.backends.redis.codec import (
    ms,
    text,
)
from broadcaster.backends.redis.core import (
    ERRORS,
    PROBE_INTERVAL,
    PROBE_TTL_MS,
    BackendCore,
    refusal_of,
)
from broadcaster.backends.redis.layout import (
    claim_key,
    probe_key,
)
from broadcaster.backends.redis.publish import (
    claim_via_redis,
    release_via_redis,
)

__all__ = ["Liveness"]

log = logging.getLogger(__name__)

_ERRORS = ERRORS


class Liveness(BackendCore):
    """Heartbeats, readiness, admission and claims."""

    async def _liveness(self) -> str:
        """The live nodes (``,id,id,``), which the presence and count scripts take: a
        script may not read the nodes' sorted set, in a slot of its own."""
        live = await scripts.LIVE.run(self._client, (self._nodes_key,), ())
        ids = {text(node) for node in live} | {self._node_id}
        return "," + ",".join(sorted(ids)) + ","

    async def _beat(self) -> bool:
        """Refresh this node's heartbeat deadline; True when it was still alive."""
        args = (self._node_id, ms(self.node_ttl))
        return bool(await scripts.BEAT.run(self._client, (self._nodes_key,), args))

    async def _heartbeat_forever(self) -> None:
        while not self._stopped:
            await asyncio.sleep(self.heartbeat_interval)
            if not self._ready:
                continue
            try:
                await self._heartbeat()
            except _ERRORS as exc:
                log.debug("heartbeat failed (%s)", exc)
                if (refusal := refusal_of(exc)) is not None:
                    self._refused(refusal)

    async def _heartbeat(self) -> None:
        if await self._ping_pubsub():
            await self._beat_state()

    async def _beat_state(self) -> None:
        """Refresh this node's heartbeat, counts and presence entries (all of them when
        Redis lost some)."""
        ttl = ms(self.node_ttl)
        was_alive = await self._beat()
        if not was_alive or self._counts_dirty or self._presence_dirty:
            if not was_alive:
                log.warning("node %s was considered dead; restoring its state", self._node_id)
            await self._restore()
            return
        pipe = self._client.pipeline(transaction=False)
        for app_id in self._counts:
            self._refresh_counts(pipe, app_id)
        for key in self._presence:
            pipe.pexpire(key, ttl)
        await pipe.execute()
        await self._beat_connections()

    async def _restore(self) -> None:
        """Write this node's heartbeat, subscription counts and presence entries (after a
        reconnection, or when another node took this one for dead)."""
        ttl = ms(self.node_ttl)
        await self._beat()
        pipe = self._client.pipeline(transaction=False)
        for app_id, counts in self._counts.items():
            key = self._app_key(app_id, "subs", self._node_id)
            pipe.delete(key)
            if counts:
                pipe.hset(key, mapping=counts)  # type: ignore[arg-type]
            self._refresh_counts(pipe, app_id)
        await pipe.execute()
        self._counts_dirty = False
        for key in self._presence_dirty | set(self._presence):
            pairs = [item for pair in self._presence.get(key, {}).items() for item in pair]
            await scripts.PRESENCE_RESTORE.run(self._client, (key,), (self._node_id, ttl, *pairs))
            self._presence_dirty.discard(key)
        await self._beat_connections(force=True)

    async def _withdraw(self) -> None:
        """On stop: this node's counts and presence entries disappear at once."""
        pipe = self._client.pipeline(transaction=False)
        pipe.zrem(self._nodes_key, self._node_id)
        for app_id in self._counts:
            pipe.delete(self._app_key(app_id, "subs", self._node_id))
        for key, local in self._presence.items():
            if local:
                pipe.hdel(key, *local)
        self._withdraw_connections(pipe)
        async with asyncio.timeout(self.command_timeout):
            await pipe.execute()

    # -- readiness ---------------------------------------------------------------------------

    async def _probe_forever(self) -> None:
        # Every task loop of the backend also checks _stopped: on Python 3.11 a
        # cancellation that lands as an asyncio.timeout expires can be swallowed (turned
        # into TimeoutError), and stop() would then wait for the task for ever.
        while not self._stopped:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(PROBE_INTERVAL):
                    await self._suspect.wait()
            self._suspect.clear()
            if self._ready:
                await self._probe()
                if not self._responsive:
                    await self._after_probe()

    async def _probe(self) -> None:
        try:
            async with asyncio.timeout(self.command_timeout):
                await self._prober.ping()
                # Every time, not only once refusing: a Redis out of memory answers
                # PINGs and reads, and a node that publishes nothing itself (agents
                # publish straight to Redis) would otherwise learn of it only from its
                # heartbeat, a third of node_ttl later.
                key = probe_key(self.prefix, self._node_id)
                await self._prober.set(key, b"1", px=PROBE_TTL_MS)
        except ResponseError as exc:
            refusal = refusal_of(exc)
            if refusal is not None:
                self._responsive = True  # it answered, and still refuses writes
                self._refusing = refusal
                return
            log.debug("Redis at %s: the write probe failed (%s)", self.url, exc)
        except (TimeoutError, *_ERRORS) as exc:
            if self._responsive:
                log.warning("Redis at %s did not answer a PING (%s); not ready", self.url, exc)
            self._responsive = False
            return
        if not self._responsive or self._refusing is not None:
            log.info("Redis at %s answers and takes writes again; ready", self.url)
        self._responsive = True
        self._refusing = None

    # -- connection counts (apps with max_connections) ---------------------------------------

    counts_across_nodes = True
    """Every node's connections count: see :meth:`admit_connection`."""

    async def admit_connection(self, app_id: str, limit: int) -> bool:
        """See :meth:`broadcaster.backends.base.Backend.admit_connection`: one script
        (:data:`broadcaster.backends.scripts.CONNECTION_ADMIT`) on the app's two keys, which
        also forgets the counts of nodes whose heartbeat deadline passed.

        Raises:
            BackendUnavailable: Redis is unreachable or did not answer; nothing was
                counted (if the count went through unanswered, the next heartbeat
                writes this node's true count).
        """
        self._check_ready()
        if not self._responsive:  # a command just went unanswered: fail fast, not late
            raise BackendUnavailable(f"Redis at {self.url} does not answer; retry later")
        counted = self._connections.get(app_id, 0)
        args = (self._node_id, ms(self.node_ttl), limit, counted)
        self._admitting[app_id] = self._admitting.get(app_id, 0) + 1
        try:
            keys = self._connection_keys(app_id)
            admitted = await scripts.CONNECTION_ADMIT.run(self._client, keys, args)
        except _ERRORS as exc:
            self._connections_dirty.add(app_id)
            raise self._failed("count a connection", exc) from exc
        finally:
            self._admitting[app_id] -= 1
        if not admitted:
            return False
        self._connections[app_id] = self._connections.get(app_id, 0) + 1
        return True

    async def release_connection(self, app_id: str) -> None:
        """See :meth:`broadcaster.backends.base.Backend.release_connection`."""
        try:
            if not self.ready:
                raise BackendUnavailable("not connected, or not answering")
            await scripts.CONNECTION_RELEASE.run(
                self._client, self._connection_keys(app_id), (self._node_id,)
            )
        except (BackendUnavailable, *_ERRORS) as exc:
            self._connections_dirty.add(app_id)  # the heartbeat writes the true count
            log.debug("connection count of app %s not lowered (%s)", app_id, exc)
        finally:
            # Lowered only once Redis has (or could not): a heartbeat meanwhile writes
            # a count too high rather than too low.
            self._connections[app_id] = self._connections.get(app_id, 1) - 1

    async def _beat_connections(self, *, force: bool = False) -> None:
        """Refresh this node's deadline in the connection counts of every app it has
        counted connections of; write its count where Redis lost it (or everywhere with
        ``force``). Admissions still unanswered are included: a count written while
        commands are in flight errs on the high side."""
        ttl = ms(self.node_ttl)
        for app_id in set(self._connections) | self._connections_dirty:
            count = self._connections.get(app_id, 0) + self._admitting.get(app_id, 0)
            write = force or app_id in self._connections_dirty
            args = (self._node_id, ttl, count, 1 if write else 0)
            await scripts.CONNECTION_BEAT.run(self._client, self._connection_keys(app_id), args)
            self._connections_dirty.discard(app_id)
            self._connections.setdefault(app_id, 0)  # kept (one per app) even at zero

    def _withdraw_connections(self, pipe: Any) -> None:
        for app_id in self._connections:
            keys = self._connection_keys(app_id)
            pipe.hdel(keys[0], self._node_id)
            pipe.zrem(keys[1], self._node_id)

    def _connection_keys(self, app_id: str) -> tuple[str, str]:
        return (self._app_key(app_id, "conn-counts"), self._app_key(app_id, "conn-nodes"))

    # -- claims (leases) ---------------------------------------------------------------------

    async def claim_value(self, app_id: str, key: str, owner: str, ttl: float) -> bool:
        """See :meth:`broadcaster.backends.base.Backend.claim_value`."""
        self._check_ready()
        try:
            return await claim_via_redis(self._client, self.prefix, app_id, key, owner, ttl)
        except _ERRORS as exc:
            raise self._failed("claim a key", exc) from exc

    async def release_value(self, app_id: str, key: str, owner: str) -> bool:
        """See :meth:`broadcaster.backends.base.Backend.release_value`."""
        self._check_ready()
        try:
            return await release_via_redis(self._client, self.prefix, app_id, key, owner)
        except _ERRORS as exc:
            raise self._failed("release a claim", exc) from exc

    async def claim_holder(self, app_id: str, key: str) -> str | None:
        """See :meth:`broadcaster.backends.base.Backend.claim_holder`."""
        self._check_ready()
        try:
            held = await self._client.get(claim_key(self.prefix, app_id, key))
        except _ERRORS as exc:
            raise self._failed("read a claim", exc) from exc
        return held.decode() if isinstance(held, bytes) else held
