"""Presence and subscription counts: this node's part kept here and in Redis, and the
scripts that read every live node's (:data:`broadcaster.backends.redis.scripts.
PRESENCE_ADD`, :data:`~broadcaster.backends.redis.scripts.SUBSCRIPTION_COUNTS`...).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection
from typing import Any

import orjson

from broadcaster.backends.base import (
    BackendUnavailable,
    PresenceFull,
    PresenceMember,
)
from broadcaster.backends.redis import scripts
from broadcaster.backends.redis.codec import (
    ms,
    text,
)
from broadcaster.backends.redis.core import (
    ERRORS,
    BackendCore,
)

__all__ = ["PresenceAndCounts"]

log = logging.getLogger(__name__)

_ERRORS = ERRORS


class PresenceAndCounts(BackendCore):
    """Presence members and subscription counts across live nodes."""

    async def presence_add(
        self,
        app_id: str,
        channel: str,
        socket_id: str,
        member: PresenceMember,
        limit: int | None = None,
    ) -> bool:
        """See :meth:`broadcaster.backends.base.Backend.presence_add`.

        Raises:
            BackendUnavailable: Redis is unreachable; nothing was recorded.
            PresenceFull: over ``limit`` (checked in the same script as the addition).
            ValueError: ``member.user_info`` is not JSON-serialisable.
        """
        self._check_ready()
        key = self._channel_key(app_id, channel, "presence")
        entry = self._entry(member)
        self._presence.setdefault(key, {})[socket_id] = entry
        args = (socket_id, entry, member.user_id, await self._liveness())
        try:
            added = await scripts.PRESENCE_ADD.run(
                self._client,
                (key,),
                (*args, ms(self.node_ttl), self._node_id, limit or 0),
            )
        except _ERRORS as exc:
            self._forget_local(key, socket_id)
            self._presence_dirty.add(key)
            raise self._failed("record a presence member", exc) from exc
        if added == -1:
            self._forget_local(key, socket_id)
            raise PresenceFull(limit or 0)
        return bool(added)

    async def presence_remove(
        self, app_id: str, channel: str, socket_id: str
    ) -> PresenceMember | None:
        """See :meth:`broadcaster.backends.base.Backend.presence_remove`.

        Raises:
            BackendUnavailable: Redis is unreachable; the connection is forgotten here
                and removed from Redis on reconnection, but no ``member_removed`` can
                be decided now.
        """
        key = self._channel_key(app_id, channel, "presence")
        entry = self._forget_local(key, socket_id)
        if entry is None:
            return None
        member = self._member(entry)
        try:
            self._check_ready()
            alive = await self._liveness()
            last = await scripts.PRESENCE_REMOVE.run(
                self._client, (key,), (socket_id, entry, alive, self._node_id)
            )
        except (BackendUnavailable, *_ERRORS) as exc:
            self._presence_dirty.add(key)
            if isinstance(exc, BackendUnavailable):
                raise
            raise self._failed("remove a presence member", exc) from exc
        return member if last else None

    async def presence_members(self, app_id: str, channel: str) -> list[PresenceMember]:
        """Unique members (by user id) across live nodes.

        Raises:
            BackendUnavailable: Redis is unreachable.
        """
        self._check_ready()
        key = self._channel_key(app_id, channel, "presence")
        try:
            alive = await self._liveness()
            entries = await scripts.PRESENCE_MEMBERS.run(self._client, (key,), (alive,))
        except _ERRORS as exc:
            raise self._failed("read presence members", exc) from exc
        unique: dict[str, PresenceMember] = {}
        for entry in entries:
            member = self._member(entry)
            unique.setdefault(member.user_id, member)
        return list(unique.values())

    def _entry(self, member: PresenceMember) -> bytes:
        try:
            return orjson.dumps({"n": self._node_id, "u": member.user_id, "i": member.user_info})
        except TypeError as exc:
            raise ValueError(f"user_info of {member.user_id!r} is not JSON: {exc}") from None

    @staticmethod
    def _member(entry: bytes) -> PresenceMember:
        data = orjson.loads(entry)
        return PresenceMember(data["u"], data["i"])

    def _forget_local(self, key: str, socket_id: str) -> bytes | None:
        local = self._presence.get(key)
        if local is None:
            return None
        entry = local.pop(socket_id, None)
        if not local:
            del self._presence[key]
        return entry

    # -- subscription counts -----------------------------------------------------------------

    async def add_subscriptions(self, app_id: str, channel: str, delta: int) -> None:
        """Adjust this node's count. Never fails: while Redis is unreachable the count is
        kept here and written on reconnection."""
        counts = self._counts.setdefault(app_id, {})
        count = counts.get(channel, 0) + delta
        if count > 0:
            counts[channel] = count
        else:
            counts.pop(channel, None)
        if not self._ready:
            self._counts_dirty = True
            return
        # The counts changed in one tick (a reconnect storm: thousands) are written in
        # one pipeline, one write in flight at a time so the values arrive in order.
        written = self._counts_written
        if not self._counts_pending or written is None:
            loop = asyncio.get_running_loop()
            written = self._counts_written = loop.create_future()
            if self._counts_writer is None:
                loop.call_soon(self._write_counts_soon)
        self._counts_pending.add((app_id, channel))
        await asyncio.shield(written)

    def _write_counts_soon(self) -> None:
        if self._counts_writer is None and self._counts_pending:
            task = asyncio.get_running_loop().create_task(self._write_counts())
            self._counts_writer = task
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)

    async def _write_counts(self) -> None:
        """Write this node's count of every pending (app, channel); never fails (a
        failed write is retried by the heartbeat)."""
        pending, self._counts_pending = self._counts_pending, set()
        written = self._counts_written
        assert written is not None
        try:
            if self._ready:
                by_app: dict[str, list[str]] = {}
                for app_id, channel in pending:
                    by_app.setdefault(app_id, []).append(channel)
                pipe = self._client.pipeline(transaction=False)
                for app_id, channels in by_app.items():  # one HSET, one HDEL per app
                    key = self._app_key(app_id, "subs", self._node_id)
                    counts = self._counts.get(app_id, {})
                    kept = {c: counts[c] for c in channels if c in counts}
                    if kept:
                        pipe.hset(key, mapping=kept)  # type: ignore[arg-type]
                    if len(kept) < len(channels):
                        pipe.hdel(key, *(c for c in channels if c not in counts))
                    self._refresh_counts(pipe, app_id)
                await pipe.execute()
            else:
                self._counts_dirty = True
        except _ERRORS as exc:
            self._counts_dirty = True
            log.debug("subscription counts not written (%s); retried by the heartbeat", exc)
        finally:
            if not written.done():
                written.set_result(None)
            self._counts_writer = None
            self._write_counts_soon()  # what changed during this write

    async def subscription_counts(
        self, app_id: str, channels: Collection[str] | None = None
    ) -> dict[str, int]:
        """Raises:
        BackendUnavailable: Redis is unreachable."""
        self._check_ready()
        if channels is not None and not channels:
            return {}
        keys = (self._app_key(app_id, "subs-nodes"),)
        try:
            args = (self._app_key(app_id, "subs", ""), await self._liveness(), *(channels or ()))
            flat = await scripts.SUBSCRIPTION_COUNTS.run(self._client, keys, args)
        except _ERRORS as exc:
            raise self._failed("read subscription counts", exc) from exc
        return {text(flat[i]): int(flat[i + 1]) for i in range(0, len(flat), 2)}

    def _refresh_counts(self, pipe: Any, app_id: str) -> None:
        ttl = ms(self.node_ttl)
        pipe.pexpire(self._app_key(app_id, "subs", self._node_id), ttl)
        pipe.sadd(self._app_key(app_id, "subs-nodes"), self._node_id)
        pipe.pexpire(self._app_key(app_id, "subs-nodes"), ttl)
