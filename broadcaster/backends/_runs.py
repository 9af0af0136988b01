"""Where the run index lives (:mod:`broadcaster.run_index`): in memory, or in Redis.

Redis layout, for ``prefix`` P and app A, the same on a standalone Redis, Sentinel and
Redis Cluster (hash tags)::

    P:{A}:run-index                      sorted set "<channel>\\n<exec>" -> start (ms)
    P:{A}:run-summary:<channel>\\n<exec>  a run's summary (JSON), with the state's TTL
    P:{A}:run-session:<channel>          sorted set exec -> start (ms): a session's runs
    P:{A:<channel>}:trace:<exec>         a run's trace (JSON), in its channel's slot

(``P:{A}:runs`` is the worker's run queue, :mod:`agent_core.app.worker`.)

The index keys share the app's slot, so one script writes a run (summary, both sorted
sets, the bound of :data:`~broadcaster.run_index.RUN_INDEX_SIZE` runs per app) and one
reads a page. The sorted sets live as long as their newest run; a member whose summary
expired is dropped when a page meets it. Traces spread over the channels' slots.
"""

from __future__ import annotations

import contextlib
import time
from bisect import bisect_left, insort
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from broadcaster.backends.base import BackendUnavailable
from broadcaster.backends.redis import scripts as _lua
from broadcaster.backends.redis.layout import app_tag, channel_key
from broadcaster.publication import Publication
from broadcaster.run_index import RUN_INDEX_SIZE, SESSION_RUNS, IndexedRun, run_member

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from redis.asyncio.cluster import RedisCluster

__all__ = ["MemoryRunIndex", "RedisRunIndex"]

_PUT = _lua.Script(
    """
-- KEYS: the app's runs, the run's summary, the session's runs. ARGV: member, start ms,
-- summary, ttl ms, most runs per app, summary key prefix, session key prefix,
-- execution id, most runs per session. Returns the members dropped by the bound.
local ttl = tonumber(ARGV[4])
redis.call('SET', KEYS[2], ARGV[3], 'PX', ttl)
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
redis.call('ZADD', KEYS[3], ARGV[2], ARGV[8])
if redis.call('PTTL', KEYS[1]) < ttl then redis.call('PEXPIRE', KEYS[1], ttl) end
if redis.call('PTTL', KEYS[3]) < ttl then redis.call('PEXPIRE', KEYS[3], ttl) end
local dropped = {}
local over = redis.call('ZCARD', KEYS[1]) - tonumber(ARGV[5])
if over > 0 then
  dropped = redis.call('ZRANGE', KEYS[1], 0, over - 1)
  for _, member in ipairs(dropped) do
    redis.call('DEL', ARGV[6] .. member)
    local cut = string.find(member, '\\n', 1, true)
    if cut then
      redis.call('ZREM', ARGV[7] .. string.sub(member, 1, cut - 1), string.sub(member, cut + 1))
    end
  end
  redis.call('ZREMRANGEBYRANK', KEYS[1], 0, over - 1)
end
local extra = redis.call('ZCARD', KEYS[3]) - tonumber(ARGV[9])
if extra > 0 then redis.call('ZREMRANGEBYRANK', KEYS[3], 0, extra - 1) end
return dropped
"""
)

_PAGE = _lua.Script(
    """
-- KEYS: the app's runs. ARGV: summary key prefix, before start ms ('' for none),
-- before member, lowest start ms ('-inf'), highest start ms ('+inf'), count.
-- Returns {member, start, summary or false, ...} newest first, strictly before
-- (start, member); members whose summary expired are dropped from the set.
local top, skip = ARGV[5], 0
if ARGV[2] ~= '' then
  if top == '+inf' or tonumber(ARGV[2]) < tonumber(top) then top = ARGV[2] end
  if top == ARGV[2] then
    for _, member in ipairs(redis.call('ZREVRANGEBYSCORE', KEYS[1], top, top)) do
      if member >= ARGV[3] then skip = skip + 1 end
    end
  end
end
local found = redis.call('ZREVRANGEBYSCORE', KEYS[1], top, ARGV[4], 'WITHSCORES', 'LIMIT',
  skip, tonumber(ARGV[6]))
local out = {}
for i = 1, #found, 2 do
  local summary = redis.call('GET', ARGV[1] .. found[i])
  if not summary then redis.call('ZREM', KEYS[1], found[i]) end
  out[#out + 1] = found[i]
  out[#out + 1] = found[i + 1]
  out[#out + 1] = summary
end
return out
"""
)

_SESSION = _lua.Script(
    """
-- KEYS: the session's runs. ARGV: summary key prefix, the channel.
local out = {}
for _, id in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  local summary = redis.call('GET', ARGV[1] .. ARGV[2] .. '\\n' .. id)
  if summary then out[#out + 1] = summary end
end
return out
"""
)


@contextlib.contextmanager
def _unavailable(action: str) -> Iterator[None]:
    from redis.exceptions import RedisError

    try:
        yield
    except (RedisError, OSError) as exc:
        raise BackendUnavailable(f"cannot {action}: {exc}") from exc


class RedisRunIndex:
    """The run index in Redis, for a server's backend or a worker's own client, in the
    deployment's one key layout (:mod:`broadcaster.backends.redis.layout`).

    Args:
        client: returns the client (a backend replaces its client when it reconnects).
        prefix: the deployment's key prefix.
        size: runs kept per app.
    """

    def __init__(
        self,
        client: Callable[[], Redis | RedisCluster],
        prefix: str,
        *,
        size: int = RUN_INDEX_SIZE,
    ) -> None:
        self._client = client
        self._prefix = prefix
        self._size = size

    def _app(self, app_id: str) -> str:
        """``P:{A}``: what the index keys of app ``app_id`` start with."""
        return app_tag(self._prefix, app_id)

    def _trace_key(self, app_id: str, channel: str, execution_id: str) -> str:
        return channel_key(self._prefix, app_id, channel, f"trace:{execution_id}")

    def _stream_key(self, app_id: str, channel: str) -> str:
        return channel_key(self._prefix, app_id, channel, "stream")

    async def put_run(
        self,
        app_id: str,
        channel: str,
        execution_id: str,
        started_ms: int,
        summary: bytes,
        ttl: float,
    ) -> None:
        with _unavailable("index a run"):
            app, member = self._app(app_id), run_member(channel, execution_id)
            keys = (
                f"{app}:run-index",
                f"{app}:run-summary:{member}",
                f"{app}:run-session:{channel}",
            )
            args = (
                member,
                started_ms,
                summary,
                _ms(ttl),
                self._size,
                f"{app}:run-summary:",
                f"{app}:run-session:",
                execution_id,
                SESSION_RUNS,
            )
            client = self._client()
            dropped = await _PUT.run(cast("Redis", client), keys, args)
            for raw in dropped or ():
                text = raw.decode() if isinstance(raw, bytes) else str(raw)
                old_channel, _, old_id = text.partition("\n")
                await client.delete(self._trace_key(app_id, old_channel, old_id))

    async def page(
        self,
        app_id: str,
        *,
        before: tuple[int, str] | None,
        start_min: int | None,
        start_max: int | None,
        count: int,
    ) -> tuple[list[IndexedRun], tuple[int, str] | None]:
        with _unavailable("read the run index"):
            app = self._app(app_id)
            args = (
                f"{app}:run-summary:",
                "" if before is None else before[0],
                "" if before is None else before[1],
                "-inf" if start_min is None else start_min,
                "+inf" if start_max is None else start_max,
                count,
            )
            reply: list[Any] = await _PAGE.run(
                cast("Redis", self._client()), (f"{app}:run-index",), args
            )
            runs: list[IndexedRun] = []
            last: tuple[int, str] | None = None
            for i in range(0, len(reply), 3):
                member, started, summary = _text(reply[i]), int(float(reply[i + 1])), reply[i + 2]
                last = (started, member)
                if summary:
                    runs.append(IndexedRun(started, member, _bytes(summary)))
            return runs, (last if len(reply) // 3 >= count else None)

    async def session_runs(self, app_id: str, channel: str) -> list[bytes]:
        with _unavailable("read a session's runs"):
            app = self._app(app_id)
            args = (f"{app}:run-summary:", channel)
            reply = await _SESSION.run(
                cast("Redis", self._client()), (f"{app}:run-session:{channel}",), args
            )
            return [_bytes(item) for item in reply]

    async def load_run(self, app_id: str, channel: str, execution_id: str) -> bytes | None:
        with _unavailable("read a run"):
            key = f"{self._app(app_id)}:run-summary:{run_member(channel, execution_id)}"
            value = await self._client().get(key)
            return None if value is None else _bytes(value)

    async def put_trace(
        self, app_id: str, channel: str, execution_id: str, trace: bytes, ttl: float
    ) -> None:
        with _unavailable("store a run's trace"):
            key = self._trace_key(app_id, channel, execution_id)
            await self._client().set(key, trace, px=_ms(ttl))

    async def load_trace(self, app_id: str, channel: str, execution_id: str) -> bytes | None:
        with _unavailable("read a run's trace"):
            value = await self._client().get(self._trace_key(app_id, channel, execution_id))
            return None if value is None else _bytes(value)

    async def kept(self, app_id: str, channel: str) -> list[Publication]:
        with _unavailable("read a channel's history"):
            from broadcaster.backends.redis import decode_publication

            entries = await self._client().xrange(self._stream_key(app_id, channel))
            kept: list[Publication] = []
            for _, fields in entries or ():
                for payload in (fields or {}).values():
                    with contextlib.suppress(ValueError):
                        kept.append(decode_publication(payload))
            return kept


@dataclass(slots=True)
class _AppRuns:
    order: list[tuple[int, str]] = field(default_factory=list)  # sorted (started_ms, member)

    def discard(self, key: tuple[int, str]) -> None:
        i = bisect_left(self.order, key)
        if i < len(self.order) and self.order[i] == key:
            del self.order[i]

    runs: dict[str, tuple[int, bytes, float]] = field(default_factory=dict)
    sessions: dict[str, dict[str, int]] = field(default_factory=dict)


MEMORY_TRACE_BYTES = 256 * 1024 * 1024
"""The most trace bytes one memory backend keeps (all apps): beyond it the oldest
traces are dropped (their runs stay listed; opening one reads what the channel's
history still holds)."""


class MemoryRunIndex:
    """The run index of one process: the newest ``size`` runs per app, each kept for
    its TTL (the memory backend's clock), with its trace (at most ``trace_budget``
    bytes of traces in all)."""

    def __init__(
        self,
        kept: Callable[[str, str], list[Publication]],
        clock: Callable[[], float] = time.monotonic,
        *,
        size: int = RUN_INDEX_SIZE,
        trace_budget: int = MEMORY_TRACE_BYTES,
    ) -> None:
        self._kept = kept
        self._clock = clock
        self._size = size
        self._trace_budget = trace_budget
        self._trace_bytes = 0
        self._apps: dict[str, _AppRuns] = {}
        self._traces: dict[tuple[str, str], tuple[bytes, float]] = {}  # oldest first

    async def put_run(
        self,
        app_id: str,
        channel: str,
        execution_id: str,
        started_ms: int,
        summary: bytes,
        ttl: float,
    ) -> None:
        app = self._apps.setdefault(app_id, _AppRuns())
        member = run_member(channel, execution_id)
        old = app.runs.get(member)
        if old is not None:
            app.discard((old[0], member))
        app.runs[member] = (started_ms, summary, self._clock() + ttl)
        insort(app.order, (started_ms, member))
        session = app.sessions.setdefault(channel, {})
        session[execution_id] = started_ms
        if len(session) > SESSION_RUNS:
            del session[min(session, key=session.__getitem__)]
        while len(app.order) > self._size:
            _, dropped = app.order.pop(0)
            self._forget(app_id, app, dropped)

    def _forget(self, app_id: str, app: _AppRuns, member: str) -> None:
        app.runs.pop(member, None)
        channel, _, execution_id = member.partition("\n")
        session = app.sessions.get(channel)
        if session is not None:
            session.pop(execution_id, None)
            if not session:
                del app.sessions[channel]
        self._drop_trace((app_id, member))

    def _drop_trace(self, key: tuple[str, str]) -> None:
        found = self._traces.pop(key, None)
        if found is not None:
            self._trace_bytes -= len(found[0])

    def _live(self, app_id: str, app: _AppRuns, member: str) -> bytes | None:
        found = app.runs.get(member)
        if found is None:
            return None
        if found[2] <= self._clock():
            app.discard((found[0], member))
            self._forget(app_id, app, member)
            return None
        return found[1]

    async def page(
        self,
        app_id: str,
        *,
        before: tuple[int, str] | None,
        start_min: int | None,
        start_max: int | None,
        count: int,
    ) -> tuple[list[IndexedRun], tuple[int, str] | None]:
        app = self._apps.get(app_id)
        if app is None:
            return [], None
        top = len(app.order) if before is None else bisect_left(app.order, before)
        if start_max is not None:
            top = min(top, bisect_left(app.order, (start_max + 1, "")))
        found = [app.order[i] for i in range(top - 1, max(top - 1 - count, -1), -1)]
        runs: list[IndexedRun] = []
        last: tuple[int, str] | None = None
        for started, member in found:
            if start_min is not None and started < start_min:
                return runs, None
            last = (started, member)
            summary = self._live(app_id, app, member)
            if summary is not None:
                runs.append(IndexedRun(started, member, summary))
        return runs, (last if len(found) >= count else None)

    async def session_runs(self, app_id: str, channel: str) -> list[bytes]:
        app = self._apps.get(app_id)
        if app is None:
            return []
        session = sorted((s, e) for e, s in app.sessions.get(channel, {}).items())
        found = (self._live(app_id, app, run_member(channel, e)) for _, e in session)
        return [summary for summary in found if summary is not None]

    async def load_run(self, app_id: str, channel: str, execution_id: str) -> bytes | None:
        app = self._apps.get(app_id)
        return None if app is None else self._live(app_id, app, run_member(channel, execution_id))

    async def put_trace(
        self, app_id: str, channel: str, execution_id: str, trace: bytes, ttl: float
    ) -> None:
        key = (app_id, run_member(channel, execution_id))
        self._drop_trace(key)
        self._traces[key] = (trace, self._clock() + ttl)
        self._trace_bytes += len(trace)
        while self._trace_bytes > self._trace_budget and len(self._traces) > 1:
            self._drop_trace(next(iter(self._traces)))

    async def load_trace(self, app_id: str, channel: str, execution_id: str) -> bytes | None:
        key = (app_id, run_member(channel, execution_id))
        found = self._traces.get(key)
        if found is None or found[1] <= self._clock():
            self._drop_trace(key)
            return None
        return found[0]

    async def kept(self, app_id: str, channel: str) -> list[Publication]:
        return self._kept(app_id, channel)

    def sweep(self) -> None:
        """Forget expired runs and traces."""
        now = self._clock()
        for app_id, app in self._apps.items():
            for member, (started, _, expires_at) in list(app.runs.items()):
                if expires_at <= now:
                    app.discard((started, member))
                    self._forget(app_id, app, member)
        for key, (_, expires_at) in list(self._traces.items()):
            if expires_at <= now:
                self._drop_trace(key)


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _bytes(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()
