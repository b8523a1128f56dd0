"""Summary records for stateless clients: stores keyed by tenant namespace and prefix hash, plus single-flight."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import sqlite3
import stat
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

from proxy.config import StoreConfig

log = logging.getLogger(__name__)

T = TypeVar("T")
Clock = Callable[[], float]
# Older SQLite builds cap bound parameters at 999; one slot goes to the namespace, one to the clock.
_SQLITE_CHUNK = 900
_PURGE_INTERVAL_SECONDS = 60.0
# Bytes counted for one memory entry beyond its record's JSON: the key tuple, the entry tuple, the dict slot.
_ENTRY_OVERHEAD_BYTES = 200
# Records hold system prompts verbatim: only the proxy's own user may read them.
_PRIVATE_FILE, _PRIVATE_DIRECTORY = 0o600, 0o700
_SQLITE_SIDECARS = ("-wal", "-shm", "-journal")


@dataclass(frozen=True)
class CompactedPrefix:
    """A summary that stands in for the first `prefix_len` messages of any history whose chain matches."""

    prefix_hash: str
    prefix_len: int
    replacement: tuple[dict[str, Any], ...]
    tokens_before: int
    tokens_after: int
    model: str
    created_at: float

    def __post_init__(self) -> None:
        if not self.prefix_hash or self.prefix_len < 1:
            raise ValueError("a summary record needs a prefix hash and a prefix length of at least 1")

    def matches(self, chain: Sequence[str]) -> bool:
        """True when the chain's entry for this record's prefix length is this record's hash."""
        return self.prefix_len <= len(chain) and chain[self.prefix_len - 1] == self.prefix_hash

    def to_json(self) -> str:
        return json.dumps(
            {
                "prefix_hash": self.prefix_hash,
                "prefix_len": self.prefix_len,
                "replacement": list(self.replacement),
                "tokens_before": self.tokens_before,
                "tokens_after": self.tokens_after,
                "model": self.model,
                "created_at": self.created_at,
            },
            ensure_ascii=False,
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> CompactedPrefix:
        """Parse a stored record; ValueError when anything is missing or of the wrong type."""
        data = json.loads(text)
        try:
            fields = (
                _typed(data, "prefix_hash", str),
                _typed(data, "prefix_len", int),
                _typed(data, "replacement", list),
                _typed(data, "tokens_before", int),
                _typed(data, "tokens_after", int),
                _typed(data, "model", str),
                float(_typed(data, "created_at", (int, float))),
            )
        except (TypeError, KeyError) as exc:
            raise ValueError(f"not a summary record: {exc}") from exc
        prefix_hash, prefix_len, replacement, before, after, model, created_at = fields
        if not all(isinstance(message, dict) for message in replacement):
            raise ValueError("not a summary record: replacement holds a non-object")
        return cls(prefix_hash, prefix_len, tuple(replacement), before, after, model, created_at)


def _typed(data: Any, key: str, kind: type | tuple[type, ...]) -> Any:
    value = data[key]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise TypeError(f"{key} has the wrong type")
    return value


def _longest_verified(candidates: Iterable[CompactedPrefix], chain: Sequence[str]) -> CompactedPrefix | None:
    verified = [record for record in candidates if record.matches(chain)]
    return max(verified, key=lambda record: record.prefix_len, default=None)


@runtime_checkable
class SummaryStore(Protocol):
    """Where summary records live; namespaces are tenant hashes, never raw keys."""

    async def get(self, namespace: str, prefix_hash: str) -> CompactedPrefix | None: ...

    async def put(self, namespace: str, record: CompactedPrefix) -> None: ...

    async def longest_match(self, namespace: str, chain: Sequence[str]) -> CompactedPrefix | None:
        """The record for the longest prefix of `chain` (chain[i] fingerprints messages[: i + 1])."""
        ...

    async def ping(self) -> bool: ...

    async def close(self) -> None: ...


class MemoryStore:
    """A bounded LRU of records with a TTL, local to one process: at most max_entries, and max_bytes in all."""

    def __init__(self, max_entries: int, ttl_seconds: float, clock: Clock = time.monotonic,
                 max_bytes: int = 64 * 1024 * 1024) -> None:
        if max_entries < 1 or ttl_seconds <= 0 or max_bytes < 1:
            raise ValueError("max_entries and max_bytes must be at least 1 and ttl_seconds positive")
        self._max_entries = max_entries
        self.max_bytes = max_bytes
        self._ttl = ttl_seconds
        self._clock = clock
        # key -> (record, expires_at, size in bytes)
        self._entries: OrderedDict[tuple[str, str], tuple[CompactedPrefix, float, int]] = OrderedDict()
        self.total_bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    @staticmethod
    def size_of(namespace: str, record: CompactedPrefix) -> int:
        """What one entry is charged: its record's UTF-8 JSON plus its key and a fixed overhead."""
        text = record.to_json() + namespace + record.prefix_hash
        return len(text.encode("utf-8", "surrogatepass")) + _ENTRY_OVERHEAD_BYTES

    def _remove(self, key: tuple[str, str]) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self.total_bytes -= entry[2]

    def _lookup(self, key: tuple[str, str]) -> CompactedPrefix | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        record, expires_at, _ = entry
        if self._clock() >= expires_at:
            self._remove(key)
            return None
        self._entries.move_to_end(key)
        return record

    async def get(self, namespace: str, prefix_hash: str) -> CompactedPrefix | None:
        return self._lookup((namespace, prefix_hash))

    async def put(self, namespace: str, record: CompactedPrefix) -> None:
        key = (namespace, record.prefix_hash)
        size = self.size_of(namespace, record)
        self._remove(key)
        if size > self.max_bytes:
            # Keeping it would evict everything else and still not fit; the summary is only not reusable.
            log.warning("not keeping a summary of %d bytes: store.max_bytes is %d", size, self.max_bytes)
            return
        self._entries[key] = (record, self._clock() + self._ttl, size)
        self.total_bytes += size
        while len(self._entries) > self._max_entries or self.total_bytes > self.max_bytes:
            self._remove(next(iter(self._entries)))

    async def longest_match(self, namespace: str, chain: Sequence[str]) -> CompactedPrefix | None:
        for prefix_hash in reversed(chain):
            record = self._lookup((namespace, prefix_hash))
            if record is not None and record.matches(chain):
                return record
        return None

    async def ping(self) -> bool:
        return True

    async def close(self) -> None:
        self._entries.clear()


_SCHEMA = """
CREATE TABLE IF NOT EXISTS summaries (
    namespace TEXT NOT NULL,
    prefix_hash TEXT NOT NULL,
    prefix_len INTEGER NOT NULL,
    record TEXT NOT NULL,
    expires_at REAL NOT NULL,
    PRIMARY KEY (namespace, prefix_hash)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS summaries_expiry ON summaries (expires_at);
CREATE TABLE IF NOT EXISTS health (id INTEGER PRIMARY KEY, checked_at REAL NOT NULL);
"""


def _create_private(path: Path) -> tuple[int, int]:
    """Create the store file and its missing directories for the owner only, tighten an existing file, and return
    the file's identity (device, inode) so a deleted or replaced file is noticed later."""
    for directory in reversed([parent for parent in path.parents if not parent.exists()]):
        directory.mkdir(mode=_PRIVATE_DIRECTORY, exist_ok=True)
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, _PRIVATE_FILE)
    try:
        status = os.fstat(descriptor)
        if not stat.S_ISREG(status.st_mode):
            raise IsADirectoryError(f"{path} is not a regular file")
        if stat.S_IMODE(status.st_mode) & ~_PRIVATE_FILE:
            os.fchmod(descriptor, _PRIVATE_FILE)
        identity = (status.st_dev, status.st_ino)
    finally:
        os.close(descriptor)
    for suffix in _SQLITE_SIDECARS:
        # SQLite gives new sidecars the database's mode; ones left by an older, laxer run are tightened.
        sidecar = path.with_name(path.name + suffix)
        if sidecar.exists() and stat.S_IMODE(sidecar.stat().st_mode) & ~_PRIVATE_FILE:
            sidecar.chmod(_PRIVATE_FILE)
    return identity


class SqliteStore:
    """Records in one SQLite file (WAL), so they survive restarts; blocking calls run off the event loop."""

    def __init__(self, path: str | Path, ttl_seconds: float, clock: Clock = time.time) -> None:
        if ttl_seconds <= 0:
            raise ValueError("ttl_seconds must be positive")
        self._path = Path(path)
        self._ttl = ttl_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._connection: sqlite3.Connection | None = None
        self._identity: tuple[int, int] | None = None
        self._closed = False
        self._last_purge = float("-inf")
        self._writable = True

    def _connect(self) -> sqlite3.Connection:
        """The shared connection, opened on first use; the caller holds the lock."""
        if self._closed:
            raise RuntimeError("the summary store is closed")
        if self._connection is None:
            self._identity = _create_private(self._path)
            connection = sqlite3.connect(self._path, check_same_thread=False, isolation_level=None)
            try:
                connection.execute("PRAGMA journal_mode=WAL")
                connection.execute("PRAGMA synchronous=NORMAL")
                connection.executescript(_SCHEMA)
            except sqlite3.Error:
                connection.close()
                raise
            self._connection = connection
        return self._connection

    async def _run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        def locked() -> T:
            with self._lock:
                return work(self._connect())

        return await asyncio.to_thread(locked)

    @staticmethod
    def _decode(text: str) -> CompactedPrefix | None:
        try:
            return CompactedPrefix.from_json(text)
        except ValueError:
            log.warning("ignoring an unreadable summary record")
            return None

    async def get(self, namespace: str, prefix_hash: str) -> CompactedPrefix | None:
        def select(connection: sqlite3.Connection) -> str | None:
            row = connection.execute(
                "SELECT record FROM summaries WHERE namespace = ? AND prefix_hash = ? AND expires_at > ?",
                (namespace, prefix_hash, self._clock()),
            ).fetchone()
            return None if row is None else row[0]

        text = await self._run(select)
        return None if text is None else self._decode(text)

    async def put(self, namespace: str, record: CompactedPrefix) -> None:
        def upsert(connection: sqlite3.Connection) -> None:
            now = self._clock()
            connection.execute(
                "INSERT OR REPLACE INTO summaries (namespace, prefix_hash, prefix_len, record, expires_at)"
                " VALUES (?, ?, ?, ?, ?)",
                (namespace, record.prefix_hash, record.prefix_len, record.to_json(), now + self._ttl),
            )
            if now - self._last_purge >= _PURGE_INTERVAL_SECONDS:
                self._last_purge = now
                connection.execute("DELETE FROM summaries WHERE expires_at <= ?", (now,))

        await self._run(upsert)

    async def longest_match(self, namespace: str, chain: Sequence[str]) -> CompactedPrefix | None:
        """One IN query per chunk of the chain, longest prefixes first; the first verified hit is the longest."""

        def select(connection: sqlite3.Connection, hashes: Sequence[str]) -> list[str]:
            placeholders = ",".join("?" * len(hashes))
            rows = connection.execute(
                f"SELECT record FROM summaries WHERE namespace = ? AND expires_at > ?"
                f" AND prefix_hash IN ({placeholders})",
                (namespace, self._clock(), *hashes),
            ).fetchall()
            return [row[0] for row in rows]

        for end in range(len(chain), 0, -_SQLITE_CHUNK):
            hashes = chain[max(0, end - _SQLITE_CHUNK) : end]
            texts = await self._run(functools.partial(select, hashes=hashes))
            decoded = (self._decode(text) for text in texts)
            best = _longest_verified((record for record in decoded if record is not None), chain)
            if best is not None:
                return best
        return None

    def _probe(self, connection: sqlite3.Connection) -> None:
        """Raise unless the store would keep a record now: its file is still the one open, and takes a commit."""
        try:
            status = os.stat(self._path)
        except FileNotFoundError:
            raise FileNotFoundError(f"{self._path} was deleted") from None
        if (status.st_dev, status.st_ino) != self._identity:
            raise FileNotFoundError(f"{self._path} was replaced")
        # A committed write, not a read or a rolled-back one: only a commit meets a full disk or a read-only mount.
        connection.execute("INSERT OR REPLACE INTO health (id, checked_at) VALUES (1, ?)", (self._clock(),))

    async def ping(self) -> bool:
        try:
            await self._run(self._probe)
        except (sqlite3.Error, OSError, RuntimeError) as error:
            if self._writable:
                log.warning("the summary store at %s cannot take writes: %s", self._path, error)
            self._writable = False
            return False
        self._writable = True
        return True

    async def close(self) -> None:
        def shut() -> None:
            with self._lock:
                self._closed = True
                if self._connection is not None:
                    self._connection.close()
                    self._connection = None

        await asyncio.to_thread(shut)


def open_store(config: StoreConfig, on_error: Callable[[str], None] | None = None,
               on_health: Callable[[bool], None] | None = None) -> SummaryStore:
    """The store a config names; opening is lazy, so a bad path or an absent Redis shows up in ping() rather
    than here. `on_error(operation)` and `on_health(up)` report a shared store's failures (Redis catches its own)."""
    if config.kind == "redis":
        # Imported here: redis_store imports this module, and memory or sqlite users need not load redis-py.
        from proxy.redis_store import RedisStore

        return RedisStore.from_config(config, on_error=on_error, on_health=on_health)
    if config.kind == "sqlite":
        if config.path is None:
            raise ValueError("a sqlite store needs a path")
        return SqliteStore(config.path, config.ttl_seconds)
    return MemoryStore(config.max_entries, config.ttl_seconds, max_bytes=config.max_bytes)
