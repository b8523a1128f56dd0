"""The compaction journal in Redis, shared by replicas: one atomic script per write, a TTL on every key."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from proxy.config import StoreConfig
from proxy.store.flights import ErrorCounter
from proxy.store.journal import (
    Clock,
    ConversationDetail,
    ConversationInfo,
    Event,
    JournalBounds,
    Point,
    counts_as_compaction,
    detail_of,
    parse_entry,
)
from proxy.store.redis_calls import RedisCalls, Wording, redis_client

log = logging.getLogger("proxy.redis_journal")

_WORDING = Wording("redis journal", "the journal is closed", "journal entries are not kept until it answers")
Argument = str | int | float
_INFO_FIELDS = ("owner", "dialect", "model", "first_at", "last_at", "requests", "compactions")

# Keys under <prefix>j: — e:<id> an event (string), events (zset of "<id> <conversation>" by the event's time),
# c:<id> a conversation (hash), p:<id> its points (list), ce:<id> its event ids (list), convs and o:<owner> its
# indexes (zsets by last_at). The scripts build the keys of evicted entries themselves, so they need a standalone
# Redis (or one hash slot), as the summary store's single prefix does anyway.
# ARGV: 1 prefix, 2 ttl ms, 3 cutoff (entries at or before it are expired), 4 max conversations, 5 max points,
# 6 max events, 7 owner, 8 conversation, 9 dialect, 10 model, 11 at, 12 entry (JSON) [, 13 event id, 14 applied]
_TOUCH = """
local p, ttl, cutoff = ARGV[1], ARGV[2], ARGV[3]
local owner, cid, at = ARGV[7], ARGV[8], ARGV[11]
local meta, points, listed = p .. 'c:' .. cid, p .. 'p:' .. cid, p .. 'ce:' .. cid
local convs, mine, events = p .. 'convs', p .. 'o:' .. owner, p .. 'events'
-- A key of another type (a hand edit, another version) is dropped rather than failing every write after it.
local function heal(key, want)
  local kind = redis.call('TYPE', key).ok
  if kind ~= 'none' and kind ~= want then redis.call('DEL', key) end
end
local function forget(id)
  local key = p .. 'c:' .. id
  local held = redis.pcall('HGET', key, 'owner')
  redis.call('DEL', key, p .. 'p:' .. id, p .. 'ce:' .. id)
  if type(held) == 'string' then redis.pcall('ZREM', p .. 'o:' .. held, id) end
end
local function bump(field)
  local value = redis.call('HGET', meta, field)
  if not (value and string.match(value, '^%d+$')) then redis.call('HSET', meta, field, 0) end
  redis.call('HINCRBY', meta, field, 1)
end
heal(meta, 'hash') heal(points, 'list') heal(listed, 'list') heal(convs, 'zset') heal(mine, 'zset')
heal(events, 'zset')
for _, id in ipairs(redis.call('ZRANGEBYSCORE', convs, '-inf', cutoff)) do forget(id) end
redis.call('ZREMRANGEBYSCORE', convs, '-inf', cutoff)
redis.call('ZREMRANGEBYSCORE', mine, '-inf', cutoff)
-- Another owner's conversation of the same id starts over (as MemoryJournal's does).
local held = redis.call('HGET', meta, 'owner')
if held and held ~= owner then forget(cid) end
redis.call('HSETNX', meta, 'owner', owner)
redis.call('HSETNX', meta, 'dialect', ARGV[9])
redis.call('HSETNX', meta, 'first_at', at)
redis.call('HSETNX', meta, 'requests', 0)
redis.call('HSETNX', meta, 'compactions', 0)
redis.call('HSET', meta, 'model', ARGV[10])
local last = tonumber(redis.call('HGET', meta, 'last_at'))
if not last or tonumber(at) > last then
  redis.call('HSET', meta, 'last_at', at)
  last = tonumber(at)
end
redis.call('ZADD', convs, last, cid)
redis.call('ZADD', mine, last, cid)
local function settle()
  local n = redis.call('ZCARD', convs) - tonumber(ARGV[4])
  if n > 0 then
    for _, id in ipairs(redis.call('ZRANGE', convs, 0, n - 1)) do forget(id) end
    redis.call('ZREMRANGEBYRANK', convs, 0, n - 1)
  end
  for _, key in ipairs({meta, points, listed, convs, mine, events}) do redis.call('PEXPIRE', key, ttl) end
end
"""
_POINT = _TOUCH + """
bump('requests')
redis.call('RPUSH', points, ARGV[12])
redis.call('LTRIM', points, -tonumber(ARGV[5]), -1)
settle()
return 1
"""
_RECORD = _TOUCH + """
local id = ARGV[13]
local key = p .. 'e:' .. id
-- The same event recorded again (by another replica: ids are shared) is not a second compaction.
if ARGV[14] == '1' and redis.call('EXISTS', key) == 0 then bump('compactions') end
redis.call('SET', key, ARGV[12], 'PX', ttl)
redis.call('LREM', listed, 0, id)
redis.call('RPUSH', listed, id)
redis.call('LTRIM', listed, -tonumber(ARGV[6]), -1)
redis.call('ZADD', events, at, id .. ' ' .. cid)
local function drop(members)
  for _, member in ipairs(members) do
    local gone, from = string.match(member, '^(%S+) (%S+)$')
    if gone then
      redis.call('DEL', p .. 'e:' .. gone)
      redis.pcall('LREM', p .. 'ce:' .. from, 0, gone)
    end
  end
end
drop(redis.call('ZRANGEBYSCORE', events, '-inf', cutoff))
redis.call('ZREMRANGEBYSCORE', events, '-inf', cutoff)
local n = redis.call('ZCARD', events) - tonumber(ARGV[6])
if n > 0 then
  drop(redis.call('ZRANGE', events, 0, n - 1))
  redis.call('ZREMRANGEBYRANK', events, 0, n - 1)
end
settle()
return 1
"""
# KEYS index; ARGV prefix, owner ('' = every owner), cutoff, limit: {{id, hash fields}, ...} newest first.
_LIST = """
local p, owner, limit = ARGV[1], ARGV[2], tonumber(ARGV[4])
local found, offset = {}, 0
if redis.call('TYPE', KEYS[1]).ok ~= 'zset' then return found end
while #found < limit do
  local ids = redis.call('ZREVRANGEBYSCORE', KEYS[1], '+inf', '(' .. ARGV[3], 'LIMIT', offset, limit)
  if #ids == 0 then break end
  offset = offset + #ids
  for _, id in ipairs(ids) do
    local key = p .. 'c:' .. id
    if #found < limit and redis.call('TYPE', key).ok == 'hash'
        and (owner == '' or redis.call('HGET', key, 'owner') == owner) then
      found[#found + 1] = {id, redis.call('HGETALL', key)}
    end
  end
end
return found
"""
# ARGV prefix, conversation: {hash fields, points, event values} ({} when there is no such conversation).
_DETAIL = """
local p, cid = ARGV[1], ARGV[2]
local meta, points, listed = p .. 'c:' .. cid, p .. 'p:' .. cid, p .. 'ce:' .. cid
if redis.call('TYPE', meta).ok ~= 'hash' then return {} end
local found = {redis.call('HGETALL', meta), {}, {}}
if redis.call('TYPE', points).ok == 'list' then found[2] = redis.call('LRANGE', points, 0, -1) end
if redis.call('TYPE', listed).ok == 'list' then
  for _, id in ipairs(redis.call('LRANGE', listed, 0, -1)) do
    local value = redis.pcall('GET', p .. 'e:' .. id)
    if type(value) == 'string' then found[3][#found[3] + 1] = value end
  end
end
return found
"""
_GET = "local value = redis.pcall('GET', KEYS[1]) if type(value) == 'string' then return value end return false"


def _info(conversation: str, flat: object) -> ConversationInfo | None:
    """A conversation from its hash's fields (HGETALL's flat list), or None when they do not make one."""
    if not isinstance(flat, list):
        return None
    try:
        fields = {bytes(flat[i]).decode(): bytes(flat[i + 1]).decode() for i in range(0, len(flat) - 1, 2)}
        return ConversationInfo.model_validate({"id": conversation} | {name: fields[name] for name in _INFO_FIELDS})
    except (ValueError, KeyError, TypeError):  # ValidationError, UnicodeDecodeError are ValueErrors
        return None


class RedisJournal:
    """Journal on Redis, shared by replicas. Each write is one Lua script (atomic between replicas); a failed write
    is counted through `on_error(operation)`, logged at most once per 30 s (password masked) and dropped; a read
    raises StoreUnavailable while Redis does not answer, and fails fast between probes."""

    def __init__(self, url: str, bounds: JournalBounds, *, key_prefix: str = "compaction-proxy:",
                 timeout_seconds: float = 1.0, username: str | None = None, password: str | None = None,
                 on_error: ErrorCounter | None = None, clock: Clock = time.time,
                 retry_delays: tuple[float, float] = (0.25, 10.0)) -> None:
        self.bounds = bounds
        # Its outages are timed by the monotonic clock; `clock` is the entries' (wall) time.
        self._calls = RedisCalls(url, password, _WORDING, log, on_error=on_error, clock=time.monotonic,
                                 retry_delays=retry_delays)
        self.url = self._calls.url
        self._prefix = f"{key_prefix}j:"
        self._ttl_ms = max(1, round(bounds.ttl_seconds * 1000))
        self._clock = clock
        self._client = redis_client(url, username, password, timeout_seconds)
        self._scripts = {name: self._client.register_script(source) for name, source in
                         (("point", _POINT), ("record", _RECORD), ("list", _LIST), ("detail", _DETAIL),
                          ("get", _GET))}

    @classmethod
    def from_config(cls, config: StoreConfig, bounds: JournalBounds,
                    on_error: ErrorCounter | None = None) -> RedisJournal:
        if config.url is None:
            raise ValueError("a redis journal needs a url")
        return cls(config.url.get_secret_value(), bounds, key_prefix=config.key_prefix,
                   timeout_seconds=config.timeout_seconds, username=config.username,
                   password=config.password.get_secret_value() if config.password else None, on_error=on_error)

    def __repr__(self) -> str:
        return f"RedisJournal({self.url!r}, prefix={self._prefix!r})"

    # --- writes ------------------------------------------------------------------------------------------------

    def _arguments(self, owner: str, conversation: str, dialect: str, model: str, at: float,
                   entry: str) -> list[Argument]:
        bounds = self.bounds
        return [self._prefix, self._ttl_ms, self._clock() - bounds.ttl_seconds, bounds.max_conversations,
                bounds.max_points, bounds.max_events, owner, conversation, dialect, model, at, entry]

    async def record(self, event: Event) -> None:
        arguments = self._arguments(event.owner, event.conversation, event.dialect, event.model, event.at,
                                    event.model_dump_json())
        arguments += [event.id, "1" if counts_as_compaction(event) else "0"]
        await self._write("journal_record", lambda: self._scripts["record"](keys=[], args=arguments))

    async def point(self, point: Point) -> None:
        arguments = self._arguments(point.owner, point.conversation, point.dialect, point.model, point.at,
                                    point.model_dump_json())
        await self._write("journal_point", lambda: self._scripts["point"](keys=[], args=arguments))

    async def _write(self, operation: str, work: Callable[[], Awaitable[Any]]) -> None:
        await self._calls.quietly(operation, work)  # a failure is counted and logged there: the entry is not kept

    # --- reads -------------------------------------------------------------------------------------------------

    def _fresh(self, at: float) -> bool:
        return self._clock() - at < self.bounds.ttl_seconds

    async def conversations(self, owner: str | None, limit: int) -> list[ConversationInfo]:
        if limit <= 0:
            return []
        index = f"{self._prefix}convs" if owner is None else f"{self._prefix}o:{owner}"
        arguments: list[Argument] = [self._prefix, owner or "", self._clock() - self.bounds.ttl_seconds, limit]
        rows = await self._calls.attempt("journal_read", lambda: self._scripts["list"](keys=[index], args=arguments))
        found: list[ConversationInfo] = []
        for row in rows:
            info = _info(bytes(row[0]).decode(errors="replace"), row[1])
            if info is not None and (owner is None or info.owner == owner) and self._fresh(info.last_at):
                found.append(info)
        return found

    async def conversation(self, owner: str | None, conversation: str) -> ConversationDetail | None:
        reply = await self._calls.attempt("journal_read", lambda: self._scripts["detail"](
            keys=[], args=[self._prefix, conversation]))
        if len(reply) != 3:
            return None
        info = _info(conversation, reply[0])
        if info is None or (owner is not None and info.owner != owner) or not self._fresh(info.last_at):
            return None
        return detail_of(info, reply[1], reply[2], self._fresh)

    async def event(self, owner: str | None, event_id: str) -> Event | None:
        key = f"{self._prefix}e:{event_id}"
        event = parse_entry(Event, await self._calls.attempt("journal_read", lambda: self._scripts["get"](keys=[key])))
        if event is None or event.id != event_id or (owner is not None and event.owner != owner) \
                or not self._fresh(event.at):
            return None
        return event

    async def close(self) -> None:
        self._calls.closed = True
        await self._client.aclose()
