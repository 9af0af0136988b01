"""The Redis backend's Lua scripts: each one is a single atomic step, written once for
one slot, and run unchanged on every topology (standalone, Sentinel, Cluster).

Every key a script touches is declared in ``KEYS`` and shares one hash tag
(:mod:`broadcaster.backends.redis.layout`). Node liveness lives in one sorted set (id ->
heartbeat deadline, :data:`BEAT`, :data:`LIVE`) in a slot of its own, so the presence
and count scripts take the live nodes as an argument (``,id,id,``, read first with
:data:`LIVE`). The publish script takes the pub/sub command as an argument (``PUBLISH``,
or ``SPUBLISH`` on Redis Cluster) and the end of the frame from
:data:`broadcaster.publication.FRAME_END`, its one definition.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import NoScriptError

__all__ = [
    "BEAT",
    "CLAIM",
    "CONNECTION_ADMIT",
    "CONNECTION_BEAT",
    "CONNECTION_RELEASE",
    "HISTORY",
    "LIVE",
    "POSITION",
    "PRESENCE_ADD",
    "PRESENCE_MEMBERS",
    "PRESENCE_REMOVE",
    "PRESENCE_RESTORE",
    "PUBLISH",
    "RELEASE",
    "SUBSCRIPTION_COUNTS",
    "Script",
]


@dataclass(frozen=True)
class Script:
    """A Lua script run by SHA, sent in full only when Redis does not know it yet (a
    restarted or flushed Redis)."""

    source: str
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        digest = hashlib.sha1(self.source.encode(), usedforsecurity=False).hexdigest()
        object.__setattr__(self, "sha", digest)

    async def run(
        self, client: Redis | RedisCluster, keys: Sequence[str], args: Sequence[str | int | bytes]
    ) -> Any:
        try:
            return await client.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            return await client.eval(self.source, len(keys), *keys, *args)


# Epoch and offset live in the channel's meta hash (e, o); the stream's entry ids are
# "<offset>-0", so history after an offset is an XRANGE from "<offset + 1>-0". A new epoch
# drops any stream left over from the old one.
#
# The meta also records (r) the replication id of the primary that started the epoch.
# Redis replicates asynchronously: a replica promoted after its primary died may miss the
# last publications, and then holds the epoch with a lower offset. Continuing it would hand
# out the lost offsets again (live copies dropped, resumes "recovered" without the lost
# ones), so a publication or position on a primary with another replication id starts a
# new epoch (history continuity can no longer be proven). A promoted replica always takes
# a new id, so this happens after every failover, lossy or not, and after a cluster slot
# moved to another shard. A meta without ``r`` (an older version wrote it) adopts the
# current id. ``ROLE`` may not run in scripts; ``INFO replication`` may.
_REPLID = """
local replid = string.match(redis.call('INFO', 'replication'), 'master_replid:(%w+)') or ''
"""

_EPOCH = (
    _REPLID
    + """
local meta = redis.call('HMGET', KEYS[1], 'e', 'r')
local epoch = meta[1]
if not epoch or (meta[2] and meta[2] ~= replid) then
  epoch = NEW_EPOCH
  -- HSET first: a script's first write is the one Redis refuses when out of memory
  -- (maxmemory), and DEL is not refused.
  redis.call('HSET', KEYS[1], 'e', epoch, 'o', 0, 'r', replid)
  redis.call('DEL', KEYS[2])
  redis.call('PEXPIRE', KEYS[1], META_TTL)
elseif not meta[2] then
  redis.call('HSET', KEYS[1], 'r', replid)
end
"""
)

PUBLISH = Script(
    """
-- KEYS: meta, stream. ARGV: pubsub channel, the payload before its position, history
-- size, history ttl ms, meta ttl ms, new epoch, the payload between the position in the
-- header and the one in the frame, the end of the frame after its position (see
-- broadcaster.backends.redis.codec.script_payload), the pub/sub command (PUBLISH or
-- SPUBLISH).
"""
    + _EPOCH.replace("NEW_EPOCH", "ARGV[6]").replace("META_TTL", "ARGV[5]")
    + """
local offset = redis.call('HINCRBY', KEYS[1], 'o', 1)
redis.call('PEXPIRE', KEYS[1], ARGV[5])
local payload = ARGV[2] .. offset .. ' ' .. epoch .. ARGV[7] .. epoch .. ':' .. offset .. ARGV[8]
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[3], offset .. '-0', 'p', payload)
redis.call('PEXPIRE', KEYS[2], ARGV[4])
redis.call(ARGV[9], ARGV[1], payload)
return {offset, epoch}
"""
)

HISTORY = Script(
    """
-- KEYS: meta, stream. ARGV: since offset, since epoch, history size, most publications
-- to return (0: all). Reads only: a channel nobody published to stays absent.
-- Returns {epoch ('' when none), top offset, recovered (0/1), payloads...}. Not
-- recovered either when the epoch was started on a primary with another replication id
-- (a failover since: what the old primary accepted last may be lost, see _EPOCH); the
-- next publication starts a new epoch.
local meta = redis.call('HMGET', KEYS[1], 'e', 'o', 'r')
local epoch = meta[1]
if not epoch then return {'', 0, 0} end
local top = tonumber(meta[2] or '0')
if epoch ~= ARGV[2] then return {epoch, top, 0} end
"""
    + _REPLID
    + """
if meta[3] and meta[3] ~= replid then return {epoch, top, 0} end
local missed = top - tonumber(ARGV[1])
if missed < 0 or missed > tonumber(ARGV[3]) then return {epoch, top, 0} end
if missed == 0 then return {epoch, top, 1} end
local want = missed
local limit = tonumber(ARGV[4])
if limit > 0 and limit < want then want = limit end
local first = (top - missed + 1) .. '-0'
local entries = redis.call('XRANGE', KEYS[2], first, '+', 'COUNT', want)
if #entries ~= want or entries[1][1] ~= first then return {epoch, top, 0} end
local out = {epoch, top, 1}
for i = 1, #entries do out[i + 3] = entries[i][2][2] end
return out
"""
)

POSITION = Script(
    """
-- KEYS: meta, stream. ARGV: meta ttl ms, new epoch. Returns {epoch, top offset}; the
-- epoch is created when missing (a position handed out must stay valid).
"""
    + _EPOCH.replace("NEW_EPOCH", "ARGV[2]").replace("META_TTL", "ARGV[1]")
    + """
return {epoch, tonumber(redis.call('HGET', KEYS[1], 'o') or '0')}
"""
)

# Presence entries are socket_id -> {"n": node id, "u": user id, "i": user info}. An
# entry whose node is not in the list of live nodes (",id,id,") is dead: it is ignored
# and deleted.
_ALIVE = """
local alive = {}
local function is_alive(node)
  local live = alive[node]
  if live == nil then
    live = string.find(LIVE_NODES, ',' .. node .. ',', 1, true) ~= nil
    alive[node] = live
  end
  return live
end
"""

PRESENCE_ADD = Script(
    """
-- KEYS: presence. ARGV: socket id, entry, user id, the live nodes, node ttl ms, this
-- node's id, most distinct users (0: no limit).
-- Returns 1 when the user is new, 0 when not, -1 (nothing added) when the user is new
-- and the channel is full: the check and the addition are one atomic step.
"""
    + _ALIVE.replace("LIVE_NODES", "ARGV[4]")
    + """
alive[ARGV[6]] = true
local existed = 0
local users, count = {}, 0
local entries = redis.call('HGETALL', KEYS[1])
for i = 1, #entries, 2 do
  local m = cjson.decode(entries[i + 1])
  if not is_alive(m.n) then
    redis.call('HDEL', KEYS[1], entries[i])
  else
    if m.u == ARGV[3] then existed = 1 end
    if not users[m.u] then
      users[m.u] = true
      count = count + 1
    end
  end
end
local limit = tonumber(ARGV[7])
if existed == 0 and limit > 0 and count >= limit then return -1 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return 1 - existed
"""
)

PRESENCE_REMOVE = Script(
    """
-- KEYS: presence. ARGV: socket id, the entry as this node knows it, the live nodes,
-- this node's id. Returns 1 when the user has no live connection left.
"""
    + _ALIVE.replace("LIVE_NODES", "ARGV[3]")
    + """
alive[ARGV[4]] = true
redis.call('HDEL', KEYS[1], ARGV[1])
local user = cjson.decode(ARGV[2]).u
local entries = redis.call('HGETALL', KEYS[1])
for i = 1, #entries, 2 do
  local m = cjson.decode(entries[i + 1])
  if m.u == user and is_alive(m.n) then return 0 end
end
return 1
"""
)

PRESENCE_MEMBERS = Script(
    """
-- KEYS: presence. ARGV: the live nodes. Returns the entries of live nodes.
"""
    + _ALIVE.replace("LIVE_NODES", "ARGV[1]")
    + """
local out = {}
local entries = redis.call('HGETALL', KEYS[1])
for i = 1, #entries, 2 do
  if is_alive(cjson.decode(entries[i + 1]).n) then out[#out + 1] = entries[i + 1] end
end
return out
"""
)

PRESENCE_RESTORE = Script(
    """
-- KEYS: presence. ARGV: this node's id, ttl ms, then socket id / entry pairs: replaces
-- this node's entries with the given ones.
local entries = redis.call('HGETALL', KEYS[1])
for i = 1, #entries, 2 do
  if cjson.decode(entries[i + 1]).n == ARGV[1] then redis.call('HDEL', KEYS[1], entries[i]) end
end
for i = 3, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
if #ARGV > 2 then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 1
"""
)

SUBSCRIPTION_COUNTS = Script(
    """
-- KEYS: the app's set of counting nodes. ARGV: per-node count hash prefix, the live
-- nodes, then the channels to count (none: every channel). Returns channel / total
-- pairs over live nodes; forgets dead nodes. Named channels are read with HMGET: a
-- query about a few channels does not walk every channel of the app.
local totals, names = {}, {}
local wanted = {}
for i = 3, #ARGV do wanted[#wanted + 1] = ARGV[i] end
for _, node in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  if string.find(ARGV[2], ',' .. node .. ',', 1, true) ~= nil then
    local counts
    if #wanted > 0 then
      local values = redis.call('HMGET', ARGV[1] .. node, unpack(wanted))
      counts = {}
      for i, name in ipairs(wanted) do
        if values[i] then
          counts[#counts + 1] = name
          counts[#counts + 1] = values[i]
        end
      end
    else
      counts = redis.call('HGETALL', ARGV[1] .. node)
    end
    for i = 1, #counts, 2 do
      local name = counts[i]
      if totals[name] == nil then
        names[#names + 1] = name
        totals[name] = 0
      end
      totals[name] = totals[name] + tonumber(counts[i + 1])
    end
  else
    redis.call('SREM', KEYS[1], node)
    redis.call('DEL', ARGV[1] .. node)
  end
end
local out = {}
for _, name in ipairs(names) do
  if totals[name] > 0 then
    out[#out + 1] = name
    out[#out + 1] = totals[name]
  end
end
return out
"""
)

# Connection counts of apps with ``max_connections``: per app, a hash node -> its count
# of open connections and a sorted set node -> deadline (Redis time, ms) refreshed by the
# node's heartbeat. Both keys of an app share its hash tag, and the scripts read nothing
# else: liveness is in the same slot, so one round trip per connect.
_CONNECTIONS_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function keep(ttl)
  for _, key in ipairs(KEYS) do
    if redis.call('PTTL', key) < ttl then redis.call('PEXPIRE', key, ttl) end
  end
end
"""

CONNECTION_ADMIT = Script(
    """
-- KEYS: counts hash, deadlines set. ARGV: node id, node ttl ms, limit, the node's own
-- count (written when Redis lost it). Returns 1 (counted) or 0 (the app is at its limit
-- on the live nodes); the check and the count are one atomic step.
"""
    + _CONNECTIONS_NOW
    + """
local dead = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
for _, node in ipairs(dead) do redis.call('HDEL', KEYS[1], node) end
if #dead > 0 then redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now) end
if not redis.call('ZSCORE', KEYS[2], ARGV[1]) then
  if tonumber(ARGV[4]) > 0 then
    redis.call('HSET', KEYS[1], ARGV[1], ARGV[4])
  else
    redis.call('HDEL', KEYS[1], ARGV[1])
  end
end
local ttl = tonumber(ARGV[2])
redis.call('ZADD', KEYS[2], now + ttl, ARGV[1])
keep(ttl)
local total = 0
for _, count in ipairs(redis.call('HVALS', KEYS[1])) do total = total + tonumber(count) end
if total >= tonumber(ARGV[3]) then return 0 end
redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
return 1
"""
)

CONNECTION_RELEASE = Script(
    """
-- KEYS: counts hash, deadlines set. ARGV: node id. One connection of the node closed.
if not redis.call('ZSCORE', KEYS[2], ARGV[1]) then return 0 end
if redis.call('HINCRBY', KEYS[1], ARGV[1], -1) <= 0 then redis.call('HDEL', KEYS[1], ARGV[1]) end
return 1
"""
)

CONNECTION_BEAT = Script(
    """
-- KEYS: counts hash, deadlines set. ARGV: node id, node ttl ms, the node's count, 1 to
-- write the count even if Redis has one. The count is written when Redis lost it (the
-- node was taken for dead, or Redis restarted empty) or when asked.
"""
    + _CONNECTIONS_NOW
    + """
local count = tonumber(ARGV[3])
local deadline = tonumber(redis.call('ZSCORE', KEYS[2], ARGV[1]) or '0')
if deadline <= now or ARGV[4] == '1' then
  if count > 0 then
    redis.call('HSET', KEYS[1], ARGV[1], count)
  else
    redis.call('HDEL', KEYS[1], ARGV[1])
  end
end
local ttl = tonumber(ARGV[2])
redis.call('ZADD', KEYS[2], now + ttl, ARGV[1])
keep(ttl)
return 1
"""
)

# Node liveness: one sorted set id -> heartbeat deadline, from Redis's own clock.
BEAT = Script(
    """
-- KEYS: the nodes' sorted set. ARGV: node id, ttl ms. Returns 1 when the node was alive.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local deadline = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1]) or '0')
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
return deadline > now and 1 or 0
"""
)

LIVE = Script(
    """
-- KEYS: the nodes' sorted set. Returns the ids of the nodes whose deadline is ahead.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')
"""
)

# Claims (leases): a key holding its owner, with a ttl.
CLAIM = Script(
    """
-- KEYS: the claim. ARGV: owner, ttl ms. Returns 1 when held by the owner now.
local held = redis.call('GET', KEYS[1])
if held and held ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""
)

RELEASE = Script(
    """
-- KEYS: the claim. ARGV: owner. Returns 1 when the owner's claim was deleted.
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
)
