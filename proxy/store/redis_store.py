"""Summary records in Redis, shared by replicas, with leases for cross-replica single-flight; degrades, never raises."""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Sequence
from typing import Any

from redis.exceptions import RedisError

from proxy.config import MIB, StoreConfig
from proxy.store.flights import CLOSED, DROPPED, STORED, Announcements, ErrorCounter, Held, Lease, StoreUnavailable
from proxy.store.known_records import KnownRecords, lookup
from proxy.store.redis_calls import UNREACHABLE, HealthListener, RedisCalls, Wording, redis_client
from proxy.store.store import CompactedPrefix
from proxy.store.store_health import Clock

log = logging.getLogger("proxy.redis_store")

_WORDING = Wording("redis store", "the summary store is closed",
                   "serving without summary reuse, single-flight per process, until it answers again")
# Announcements are a word, two hashes and a token: anything this long on the channel is not one.
_MAX_ANNOUNCEMENT_BYTES = 1024

# Server time in milliseconds, so every replica scores in-flight leases by one clock.
_NOW = "local t = redis.call('TIME') local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) "
# Index the lease in the namespace's in-flight set (scored by expiry), dropping expired members.
_MARK = _NOW + """
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
redis.call('ZADD', KEYS[3], now + tonumber(ARGV[1]), ARGV[2])
if redis.call('PTTL', KEYS[3]) < tonumber(ARGV[1]) then redis.call('PEXPIRE', KEYS[3], ARGV[1]) end
"""
# KEYS record, lock, flying, fence; ARGV lock_ms, prefix_hash, owner
_ACQUIRE = """
local record = redis.call('GET', KEYS[1])
if record then return {0, record} end
local holder = redis.call('GET', KEYS[2])
if holder then return {-1, holder} end
local token = redis.call('INCR', KEYS[4])
redis.call('SET', KEYS[2], token .. ':' .. ARGV[3], 'PX', ARGV[1])
""" + _MARK + "return {token}"
# KEYS record (unused), lock, flying; ARGV lock_ms, prefix_hash, lease value
_RENEW = """
if redis.call('GET', KEYS[2]) ~= ARGV[3] then return 0 end
redis.call('PEXPIRE', KEYS[2], ARGV[1])
""" + _MARK + "return 1"
# KEYS record, lock, flying; ARGV prefix_hash, lease value, record ('' = none), record_ms, channel, message
_FINISH = """
if redis.call('GET', KEYS[2]) ~= ARGV[2] then return 0 end
if ARGV[3] ~= '' then redis.call('SET', KEYS[1], ARGV[3], 'PX', ARGV[4]) end
redis.call('DEL', KEYS[2])
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('PUBLISH', ARGV[5], ARGV[6])
return 1
"""
# ARGV record key's head (<prefix>r:<namespace>:), the hashes asked (space-separated). Returns each hash that holds
# a record and its value, alternately: the chain goes as one argument and the misses stay on the server (an MGET's
# keys each cost redis-py a Python encode, a quarter of a millisecond for a 400-message chain).
_LOOKUP = """
local head, hashes, found = ARGV[1], {}, {}
for hash in string.gmatch(ARGV[2], '%S+') do hashes[#hashes + 1] = hash end
for first = 1, #hashes, 1000 do
  local last, keys = math.min(first + 999, #hashes), {}
  for i = first, last do keys[#keys + 1] = head .. hashes[i] end
  local values = redis.call('MGET', unpack(keys))
  for i = 1, #keys do
    if values[i] then found[#found + 1] = hashes[first + i - 1]; found[#found + 1] = values[i] end
  end
end
return found
"""
# KEYS flying
_FLYING = _NOW + "return redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')"


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _found(reply: object, asked: Sequence[str]) -> list[tuple[str, bytes]]:
    """The lookup script's (hash, value) pairs, only of hashes asked for: anything else a broken server sends is
    dropped, as is the whole of a reply that is not a flat list of strings."""
    if not isinstance(reply, list) or len(reply) % 2 or not all(isinstance(item, bytes) for item in reply):
        return []
    wanted = set(asked)
    pairs = ((prefix_hash.decode("ascii", "replace"), value)
             for prefix_hash, value in zip(reply[::2], reply[1::2], strict=True))
    return [(prefix_hash, value) for prefix_hash, value in pairs if prefix_hash in wanted]


def _announcement(data: bytes | str) -> tuple[str, str, str] | None:
    """Outcome, key and holder of an announcement ("<outcome> <namespace>:<hash> <token>:<owner>"); None when the
    message is not one: too long, not UTF-8, or not exactly three non-empty fields."""
    if len(data) > _MAX_ANNOUNCEMENT_BYTES:
        return None
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
    except UnicodeDecodeError:
        return None
    fields = text.split(" ")
    if len(fields) != 3 or not all(fields):
        return None
    outcome, key, holder = fields
    return outcome, key, holder


class RedisStore:
    """SummaryStore and LeaseStore on Redis. Every Redis error is caught, counted, logged (rate-limited, masked)
    and turned into "no record" (or StoreUnavailable for lease calls); the client reconnects by itself."""

    def __init__(self, url: str, *, ttl_seconds: float, key_prefix: str = "compaction-proxy:",
                 max_value_bytes: int = MIB, lock_ttl_seconds: float = 30.0, timeout_seconds: float = 1.0,
                 username: str | None = None, password: str | None = None, on_error: ErrorCounter | None = None,
                 on_health: HealthListener | None = None, retry_delays: tuple[float, float] = (0.25, 10.0),
                 clock: Clock = time.monotonic) -> None:
        if ttl_seconds <= 0 or lock_ttl_seconds <= 0 or max_value_bytes < 1:
            raise ValueError("ttl_seconds and lock_ttl_seconds must be positive, max_value_bytes at least 1")
        self._calls = RedisCalls(url, password, _WORDING, log, on_error=on_error, clock=clock,
                                 retry_delays=retry_delays, on_health=on_health)
        self.url = self._calls.url
        self._failures = self._calls.failures  # the store's own (records, announcements) are reported as its calls'
        self._prefix = key_prefix
        self._ttl_ms = max(1, round(ttl_seconds * 1000))
        self._lock_ms = max(1, round(lock_ttl_seconds * 1000))
        self._max_value_bytes = max_value_bytes
        self._owner = secrets.token_hex(6)
        self._client = redis_client(url, username, password, timeout_seconds)
        self._scripts = {name: self._client.register_script(source) for name, source in
                         (("acquire", _ACQUIRE), ("renew", _RENEW), ("finish", _FINISH), ("flying", _FLYING),
                          ("lookup", _LOOKUP))}
        self._announcements = Announcements()
        self._listener: asyncio.Task[None] | None = None
        self._known = KnownRecords()

    @classmethod
    def from_config(cls, config: StoreConfig, on_error: ErrorCounter | None = None,
                    on_health: HealthListener | None = None) -> RedisStore:
        if config.url is None:
            raise ValueError("a redis store needs a url")
        return cls(config.url.get_secret_value(), ttl_seconds=config.ttl_seconds, key_prefix=config.key_prefix,
                   max_value_bytes=config.max_value_bytes, lock_ttl_seconds=config.lock_ttl_seconds,
                   timeout_seconds=config.timeout_seconds, username=config.username,
                   password=config.password.get_secret_value() if config.password else None,
                   on_error=on_error, on_health=on_health)

    def __repr__(self) -> str:
        return f"RedisStore({self.url!r}, prefix={self._prefix!r})"

    @property
    def lock_ttl_seconds(self) -> float:
        return self._lock_ms / 1000

    @property
    def healthy(self) -> bool:
        return self._calls.health.up and not self._calls.closed

    def status(self) -> dict[str, Any]:
        """For /readyz: where the store is and whether it answers (no secrets)."""
        state: dict[str, Any] = {"kind": "redis", "url": self.url, "reachable": self.healthy}
        health = self._calls.health
        if not health.up:
            state["unreachable_for_seconds"] = round(health.down_for(), 1)
            state["last_error"] = health.last_error
        return state

    # --- keys ----------------------------------------------------------------------------------------------

    def _keys(self, namespace: str, prefix_hash: str) -> list[str]:
        """Record, lock and the namespace's in-flight set."""
        p = self._prefix
        return [self._record_head(namespace) + prefix_hash, f"{p}l:{namespace}:{prefix_hash}", f"{p}f:{namespace}"]

    def _record_head(self, namespace: str) -> str:
        """A record's key but its prefix hash (the lookup script appends each hash on the server)."""
        return f"{self._prefix}r:{namespace}:"

    @property
    def _channel(self) -> str:
        return f"{self._prefix}done"

    # --- SummaryStore --------------------------------------------------------------------------------------

    async def get(self, namespace: str, prefix_hash: str) -> CompactedPrefix | None:
        key = self._keys(namespace, prefix_hash)[0]
        raw = await self._calls.quietly("get", lambda: self._client.get(key))
        return None if raw is None else self._known.decoded(namespace, prefix_hash, raw, self._decode)

    async def put(self, namespace: str, record: CompactedPrefix) -> None:
        value = self._encode(record)
        if value is not None:
            key = self._keys(namespace, record.prefix_hash)[0]
            await self._calls.quietly("put", lambda: self._client.set(key, value, px=self._ttl_ms))

    async def longest_match(self, namespace: str, chain: Sequence[str]) -> CompactedPrefix | None:
        """One script over the chain's links from its longest known record on (KnownRecords), or over all of them;
        a second over the links before it only when none from it on holds a record any more."""
        if not chain:
            return None
        head = self._record_head(namespace)

        async def fetch(hashes: Sequence[str]) -> list[CompactedPrefix] | None:
            reply = await self._calls.quietly("lookup", lambda: self._scripts["lookup"](
                keys=[], args=[head, " ".join(hashes)]))
            if reply is None:
                return None
            decoded = (self._known.decoded(namespace, prefix_hash, value, self._decode)
                       for prefix_hash, value in _found(reply, hashes))
            return [record for record in decoded if record is not None]

        return await lookup(self._known, namespace, chain, fetch)

    async def ping(self) -> bool:
        """Always asks Redis (the readiness probe is the recovery probe too); False while it does not answer."""
        if self._calls.closed:
            return False
        try:
            await self._client.ping()
        except (RedisError, *UNREACHABLE) as error:
            self._calls.failed("ping", error, count=False)
            return False
        self._calls.answered()
        return True

    async def close(self) -> None:
        self._calls.closed = True
        if self._listener is not None:
            self._listener.cancel()
            await asyncio.wait([self._listener])
        self._announcements.close()
        await self._client.aclose()

    # --- leases (LeaseStore) -------------------------------------------------------------------------------

    async def acquire(self, namespace: str, prefix_hash: str) -> Lease | CompactedPrefix | Held:
        keys = [*self._keys(namespace, prefix_hash), f"{self._prefix}fence"]
        for _ in range(2):  # a second go only after clearing an unreadable record
            reply = await self._calls.attempt("acquire", lambda: self._scripts["acquire"](
                keys=keys, args=[self._lock_ms, prefix_hash, self._owner]))
            code = int(reply[0])
            if code > 0:
                return Lease(namespace, prefix_hash, code, self._owner)
            if code < 0:
                return self._held(namespace, prefix_hash, _text(reply[1]))
            record = self._decode(reply[1])
            if record is not None:
                return record
            # Unreadable, it would stand in for a summary nobody can use until it expires: clear it, claim again.
            await self._calls.attempt("acquire", lambda: self._client.delete(keys[0]))
        raise StoreUnavailable("an unreadable summary record came back")

    def _held(self, namespace: str, prefix_hash: str, holder: str) -> Lease | Held:
        """Another holder's lease, or our own: a claim whose reply was lost and that redis-py sent again. It is safe
        to adopt, since RedisFlights runs one claim per key at a time in a store."""
        token, _, owner = holder.partition(":")
        if owner == self._owner and token.isdigit():
            return Lease(namespace, prefix_hash, int(token), self._owner)
        return Held(holder)

    async def renew(self, lease: Lease) -> bool:
        keys = self._keys(lease.namespace, lease.prefix_hash)
        return bool(await self._calls.attempt("renew", lambda: self._scripts["renew"](
            keys=keys, args=[self._lock_ms, lease.prefix_hash, lease.value])))

    async def complete(self, lease: Lease, record: CompactedPrefix) -> bool:
        value = self._encode(record)
        return await self._finish(lease, value or b"", STORED if value is not None else DROPPED)

    async def release(self, lease: Lease, outcome: str) -> bool:
        return await self._finish(lease, b"", outcome)

    async def _finish(self, lease: Lease, value: bytes, outcome: str) -> bool:
        keys = self._keys(lease.namespace, lease.prefix_hash)
        message = f"{outcome} {lease.namespace}:{lease.prefix_hash} {lease.value}"  # parsed in _subscriber
        return bool(await self._calls.attempt("finish", lambda: self._scripts["finish"](
            keys=keys, args=[lease.prefix_hash, lease.value, value, self._ttl_ms, self._channel, message])))

    async def in_flight(self, namespace: str) -> frozenset[str]:
        flying = self._keys(namespace, "")[2]
        members = await self._calls.attempt("in_flight", lambda: self._scripts["flying"](keys=[flying]))
        return frozenset(_text(member) for member in members)

    async def holder(self, namespace: str, prefix_hash: str) -> str | None:
        lock = self._keys(namespace, prefix_hash)[1]
        value = await self._calls.attempt("holder", lambda: self._client.get(lock))
        return None if value is None else _text(value)

    async def wait(self, namespace: str, prefix_hash: str, holder: str, timeout: float) -> str | None:
        if self._calls.closed:
            return CLOSED
        if self._listener is None or self._listener.done():
            self._listener = asyncio.get_running_loop().create_task(self._subscriber())
        return await self._announcements.wait(f"{namespace}:{prefix_hash}", holder, timeout)

    async def _subscriber(self) -> None:
        """Hear every replica's announcements until close(); resubscribe with back-off after a failure."""
        calls = self._calls
        delay = calls.health.first_delay
        while not calls.closed:
            pubsub = self._client.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self._channel)
                self._announcements.subscribed.set()
                delay = calls.health.first_delay
                while not calls.closed:  # checked, not only cancelled: see flights._stop
                    message = await pubsub.get_message(timeout=1.0)
                    if message is not None and message.get("type") == "message":
                        self._hear(message["data"])
            except (RedisError, *UNREACHABLE) as error:
                calls.failed("subscribe", error)
            finally:
                self._announcements.subscribed.clear()
                await self._close_quietly(pubsub)
            await asyncio.sleep(delay)  # waiters poll meanwhile
            delay = min(delay * 2, calls.health.max_delay)

    def _hear(self, data: bytes | str) -> None:
        """One announcement; anything else on the channel (a stray PUBLISH, another version) is counted and skipped,
        since one bad message must not silence every replica's subscriber."""
        fields = _announcement(data)
        if fields is None:
            self._failures.count("announcement")
            self._failures.warn("announcement", "ignoring a malformed announcement of %d bytes on %s", len(data),
                                self._channel)
            return
        outcome, key, holder = fields
        self._announcements.heard(key, holder, outcome)

    @staticmethod
    async def _close_quietly(pubsub: Any) -> None:
        try:
            await pubsub.aclose()
        except (RedisError, *UNREACHABLE):
            pass

    # --- records -------------------------------------------------------------------------------------------

    def _encode(self, record: CompactedPrefix) -> bytes | None:
        value = record.to_json().encode("utf-8")
        if len(value) > self._max_value_bytes:
            self._failures.count("oversize")
            self._failures.warn("oversize", "summary record of %d bytes is over the store's limit of %d; not shared",
                                len(value), self._max_value_bytes)
            return None
        return value

    def _decode(self, raw: bytes | str) -> CompactedPrefix | None:
        try:
            return CompactedPrefix.from_json(raw)
        except (ValueError, UnicodeDecodeError):
            self._failures.count("decode")
            self._failures.warn("decode", "ignoring an unreadable summary record")
            return None
