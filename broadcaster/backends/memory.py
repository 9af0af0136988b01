"""The in-memory backend: one process, no network.

Everything lives in this process, so this backend is single-node: two instances never
see each other's publications or presence. It is the default for development and for a
server that runs one process.

Delivery is synchronous: :meth:`MemoryBackend.publish` calls the publication handler
before it returns, so per-channel order is the order of the ``publish`` calls and no
task or callback is scheduled per publication.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from broadcaster.backends._runs import MemoryRunIndex
from broadcaster.backends.base import (
    DEFAULT_HISTORY_META_TTL,
    DEFAULT_HISTORY_SIZE,
    DEFAULT_HISTORY_TTL,
    BackendUnavailable,
    ControlHandler,
    EncodedHandler,
    HistoryResult,
    PresenceFull,
    PresenceMember,
    PublicationHandler,
    check_history_options,
    new_epoch,
)
from broadcaster.publication import Position, Publication

__all__ = ["MemoryBackend"]

log = logging.getLogger(__name__)

_Key = tuple[str, str]


def _check_ttl(ttl: float) -> None:
    if not ttl > 0:
        raise ValueError(f"ttl must be a positive number of seconds, got {ttl!r}")


@dataclass(slots=True)
class _Stream:
    """One channel's history: its epoch, last offset and last publications."""

    epoch: str
    entries: deque[Publication]
    offset: int = 0
    expires_at: float = 0.0
    meta_expires_at: float = 0.0


@dataclass(slots=True)
class _Presence:
    sockets: dict[str, PresenceMember] = field(default_factory=dict)
    users: dict[str, int] = field(default_factory=dict)


class MemoryBackend:
    """A single-process :class:`~broadcaster.backends.base.Backend`.

    Args:
        history_size: publications kept per channel (a ring buffer).
        history_ttl: seconds after a channel's last publication until its history is
            dropped.
        history_meta_ttl: seconds after a channel's last publication until its epoch
            and offset are forgotten (positions of that epoch then cannot resume).
        node_id: this node's id; random by default.
        apps: accepted for parity with the Redis backend; control messages of every app
            reach the local handler.
        clock: monotonic seconds, replaceable in tests.

    Raises:
        ValueError: for an invalid option.
    """

    def __init__(
        self,
        *,
        history_size: int = DEFAULT_HISTORY_SIZE,
        history_ttl: float = DEFAULT_HISTORY_TTL,
        history_meta_ttl: float = DEFAULT_HISTORY_META_TTL,
        node_id: str | None = None,
        apps: Sequence[str] = (),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        check_history_options(history_size, history_ttl, history_meta_ttl)
        self.history_size = history_size
        self.history_ttl = history_ttl
        self.history_meta_ttl = history_meta_ttl
        self.reconnects = 0
        self.breaks = 0  # one process: nothing is published where this node cannot hear
        self._node_id = node_id or secrets.token_hex(8)
        self._clock = clock
        self._ready = False
        self._on_publication: PublicationHandler | None = None
        self._on_control: ControlHandler | None = None
        self._subscribed: set[_Key] = set()
        self._streams: dict[_Key, _Stream] = {}
        self._presence: dict[_Key, _Presence] = {}
        self._counts: dict[str, dict[str, int]] = {}
        self._values: dict[_Key, tuple[bytes, float]] = {}
        self._connections: dict[str, int] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self._runs = MemoryRunIndex(self._kept, clock)

    @property
    def node_id(self) -> str:
        return self._node_id

    @property
    def ready(self) -> bool:
        return self._ready

    @property
    def problem(self) -> str | None:
        return None if self._ready else "stopped"

    async def start(
        self,
        on_publication: PublicationHandler,
        on_control: ControlHandler,
        on_encoded: EncodedHandler | None = None,
    ) -> None:
        """Start delivering to the handlers (publications stay objects here: never to
        ``on_encoded``); never fails."""
        self._on_publication = on_publication
        self._on_control = on_control
        if self._sweeper is None:
            self._sweeper = asyncio.create_task(self._sweep_forever(), name="memory-sweeper")
        self._ready = True

    async def stop(self) -> None:
        """Stop delivering and forget everything; idempotent."""
        self._ready = False
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
            self._sweeper = None
        self._subscribed.clear()

    async def subscribe(self, app_id: str, channel: str) -> None:
        self._subscribed.add((app_id, channel))

    async def unsubscribe(self, app_id: str, channel: str) -> None:
        self._subscribed.discard((app_id, channel))

    async def publish(self, publication: Publication, *, history: bool = True) -> Position | None:
        """Deliver ``publication`` to the handler (if its channel is subscribed) before
        returning; with ``history``, first give it the channel's next position and keep
        it.

        Raises:
            BackendUnavailable: the backend is not started.
        """
        if not self._ready:
            raise BackendUnavailable("the memory backend is stopped (or not started yet)")
        position = None
        if history:
            publication, position = self._append(publication)
        if (publication.app_id, publication.channel) in self._subscribed:
            self._deliver(publication)
        return position

    async def history(
        self, app_id: str, channel: str, since: Position, limit: int | None = None
    ) -> HistoryResult:
        stream = self._live_stream((app_id, channel))
        if stream is None:
            return HistoryResult((), recovered=False, position=None)
        latest = Position(stream.offset, stream.epoch)
        missed = stream.offset - since.offset
        if since.epoch != stream.epoch or missed < 0 or missed > len(stream.entries):
            return HistoryResult((), recovered=False, position=latest)
        kept = len(stream.entries)
        stop = kept if limit is None else min(kept, kept - missed + limit)
        return HistoryResult(tuple(islice(stream.entries, kept - missed, stop)), True, latest)

    async def latest(self, app_id: str, channel: str) -> Position | None:
        stream = self._live_stream((app_id, channel))
        return None if stream is None else Position(stream.offset, stream.epoch)

    async def position(self, app_id: str, channel: str) -> Position:
        stream = self._stream((app_id, channel))
        return Position(stream.offset, stream.epoch)

    async def presence_add(
        self,
        app_id: str,
        channel: str,
        socket_id: str,
        member: PresenceMember,
        limit: int | None = None,
    ) -> bool:
        # One synchronous step (no await): the limit check and the addition cannot be
        # interleaved with another join.
        presence = self._presence.get((app_id, channel))
        if presence is None:
            presence = self._presence[(app_id, channel)] = _Presence()
        users = presence.users
        if limit is not None and member.user_id not in users and len(users) >= limit:
            if not presence.sockets:
                del self._presence[(app_id, channel)]
            raise PresenceFull(limit)
        previous = presence.sockets.get(socket_id)
        if previous is not None and previous.user_id == member.user_id:
            presence.sockets[socket_id] = member
            return False
        if previous is not None:
            self._forget(presence, previous.user_id)
        presence.sockets[socket_id] = member
        count = presence.users.get(member.user_id, 0)
        presence.users[member.user_id] = count + 1
        return count == 0

    async def presence_remove(
        self, app_id: str, channel: str, socket_id: str
    ) -> PresenceMember | None:
        key = (app_id, channel)
        presence = self._presence.get(key)
        if presence is None or socket_id not in presence.sockets:
            return None
        member = presence.sockets.pop(socket_id)
        last = self._forget(presence, member.user_id)
        if not presence.sockets:
            del self._presence[key]
        return member if last else None

    async def presence_members(self, app_id: str, channel: str) -> list[PresenceMember]:
        presence = self._presence.get((app_id, channel))
        if presence is None:
            return []
        unique: dict[str, PresenceMember] = {}
        for member in presence.sockets.values():
            unique.setdefault(member.user_id, member)
        return list(unique.values())

    async def add_subscriptions(self, app_id: str, channel: str, delta: int) -> None:
        counts = self._counts.setdefault(app_id, {})
        count = counts.get(channel, 0) + delta
        if count > 0:
            counts[channel] = count
        else:
            counts.pop(channel, None)

    async def subscription_counts(
        self, app_id: str, channels: Collection[str] | None = None
    ) -> dict[str, int]:
        counts = self._counts.get(app_id, {})
        if channels is None:
            return dict(counts)
        return {name: counts[name] for name in channels if name in counts}

    async def store_value(self, app_id: str, key: str, value: bytes, ttl: float) -> None:
        _check_ttl(ttl)
        self._values[(app_id, key)] = (value, self._clock() + ttl)

    async def load_value(self, app_id: str, key: str) -> bytes | None:
        found = self._values.get((app_id, key))
        if found is None:
            return None
        if found[1] <= self._clock():
            del self._values[(app_id, key)]
            return None
        return found[0]

    async def send_control(self, app_id: str, message: Mapping[str, Any]) -> None:
        """Call the control handler with ``message`` before returning."""
        if self._on_control is not None:
            try:
                self._on_control(app_id, message)
            except Exception:
                log.exception("control handler failed on a message of app %s", app_id)

    # -- internals ---------------------------------------------------------------------

    def _append(self, publication: Publication) -> tuple[Publication, Position]:
        stream = self._stream((publication.app_id, publication.channel))
        now = self._clock()
        stream.offset += 1
        position = Position(stream.offset, stream.epoch)
        p = publication
        stored = Publication(
            p.app_id, p.channel, p.event, p.data, p.exclude_socket_id, p.user_id, position
        )
        stream.entries.append(stored)
        stream.expires_at = now + self.history_ttl
        stream.meta_expires_at = now + self.history_meta_ttl
        return stored, position

    def _live_stream(self, key: _Key) -> _Stream | None:
        """The channel's stream if it has one (read-only: creates nothing), its history
        emptied when expired."""
        now = self._clock()
        stream = self._streams.get(key)
        if stream is None or stream.meta_expires_at <= now:
            return None
        if stream.expires_at <= now:
            stream.entries.clear()
        return stream

    def _stream(self, key: _Key) -> _Stream:
        """The channel's live stream, created (with a new epoch) when missing or
        forgotten, and emptied when its history expired."""
        now = self._clock()
        stream = self._streams.get(key)
        if stream is None or stream.meta_expires_at <= now:
            stream = _Stream(new_epoch(), deque(maxlen=self.history_size))
            stream.meta_expires_at = now + self.history_meta_ttl
            self._streams[key] = stream
        elif stream.expires_at <= now:
            stream.entries.clear()
        return stream

    def _deliver(self, publication: Publication) -> None:
        if self._on_publication is None:
            return
        try:
            self._on_publication(publication)
        except Exception:
            log.exception("publication handler failed on channel %s", publication.channel)

    @staticmethod
    def _forget(presence: _Presence, user_id: str) -> bool:
        """Drop one connection of ``user_id``; True when it was the user's last."""
        count = presence.users.get(user_id, 0) - 1
        if count > 0:
            presence.users[user_id] = count
            return False
        presence.users.pop(user_id, None)
        return True

    @property
    def runs(self) -> MemoryRunIndex:
        """The run index of this process (:mod:`broadcaster.run_index`)."""
        return self._runs

    def _kept(self, app_id: str, channel: str) -> list[Publication]:
        stream = self._live_stream((app_id, channel))
        return [] if stream is None else list(stream.entries)

    def _sweep(self) -> None:
        """Free expired histories, forgotten channels and expired runs."""
        self._runs.sweep()
        now = self._clock()
        for key, stream in list(self._streams.items()):
            if stream.meta_expires_at <= now:
                del self._streams[key]
            elif stream.expires_at <= now:
                stream.entries.clear()
        for key, (_, expires_at) in list(self._values.items()):
            if expires_at <= now:
                del self._values[key]

    async def _sweep_forever(self) -> None:
        interval = min(max(self.history_ttl / 2, 1.0), 60.0)
        while True:
            await asyncio.sleep(interval)
            self._sweep()

    # -- claims (leases), kept among the stored values so that the sweep frees them -----

    async def claim_value(self, app_id: str, key: str, owner: str, ttl: float) -> bool:
        """See :meth:`broadcaster.backends.base.Backend.claim_value`."""
        _check_ttl(ttl)
        slot = (app_id, _CLAIM + key)
        held = self._values.get(slot)
        now = self._clock()
        if held is not None and held[1] > now and held[0] != owner.encode():
            return False
        self._values[slot] = (owner.encode(), now + ttl)
        return True

    async def release_value(self, app_id: str, key: str, owner: str) -> bool:
        """See :meth:`broadcaster.backends.base.Backend.release_value`."""
        slot = (app_id, _CLAIM + key)
        held = self._values.get(slot)
        if held is None or held[0] != owner.encode():
            return False
        del self._values[slot]
        return held[1] > self._clock()

    async def claim_holder(self, app_id: str, key: str) -> str | None:
        """See :meth:`broadcaster.backends.base.Backend.claim_holder`."""
        held = self._values.get((app_id, _CLAIM + key))
        if held is None or held[1] <= self._clock():
            return None
        return held[0].decode()

    # -- connection counts: one process sees every connection -----------------------------

    counts_across_nodes = False
    """The node's own count is the whole count: it never asks (no await per connect)."""

    async def admit_connection(self, app_id: str, limit: int) -> bool:
        """See :meth:`broadcaster.backends.base.Backend.admit_connection`."""
        count = self._connections.get(app_id, 0)
        if count >= limit:
            return False
        self._connections[app_id] = count + 1
        return True

    async def release_connection(self, app_id: str) -> None:
        """See :meth:`broadcaster.backends.base.Backend.release_connection`."""
        count = self._connections.get(app_id, 0) - 1
        if count > 0:
            self._connections[app_id] = count
        else:
            self._connections.pop(app_id, None)


_CLAIM = "\0claim:"  # a NUL never appears in a stored value's key
