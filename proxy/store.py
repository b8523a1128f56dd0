"""Summary records for stateless clients: stores keyed by tenant namespace and prefix hash, plus single-flight."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import sqlite3
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
    """A bounded LRU of records with a TTL, local to one process."""

    def __init__(self, max_entries: int, ttl_seconds: float, clock: Clock = time.monotonic) -> None:
        if max_entries < 1 or ttl_seconds <= 0:
            raise ValueError("max_entries must be at least 1 and ttl_seconds positive")
        self._max_entries = max_entries
        self._ttl = ttl_seconds
        self._clock = clock
        self._entries: OrderedDict[tuple[str, str], tuple[CompactedPrefix, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def _lookup(self, key: tuple[str, str]) -> CompactedPrefix | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        record, expires_at = entry
        if self._clock() >= expires_at:
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return record

    async def get(self, namespace: str, prefix_hash: str) -> CompactedPrefix | None:
        return self._lookup((namespace, prefix_hash))

    async def put(self, namespace: str, record: CompactedPrefix) -> None:
        key = (namespace, record.prefix_hash)
        self._entries[key] = (record, self._clock() + self._ttl)
        self._entries.move_to_end(key)
        while len(self._entries) > self._max_entries:
            self._entries.popitem(last=False)

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
"""


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
        self._closed = False
        self._last_purge = float("-inf")

    def _connect(self) -> sqlite3.Connection:
        """The shared connection, opened on first use; the caller holds the lock."""
        if self._closed:
            raise RuntimeError("the summary store is closed")
        if self._connection is None:
            self._path.parent.mkdir(parents=True, exist_ok=True)
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

    async def ping(self) -> bool:
        try:
            await self._run(lambda connection: connection.execute("SELECT 1").fetchone())
        except (sqlite3.Error, OSError, RuntimeError):
            return False
        return True

    async def close(self) -> None:
        def shut() -> None:
            with self._lock:
                self._closed = True
                if self._connection is not None:
                    self._connection.close()
                    self._connection = None

        await asyncio.to_thread(shut)


def open_store(config: StoreConfig) -> SummaryStore:
    """The store a config names; opening is lazy, so a bad path shows up in ping() rather than here."""
    if config.kind == "sqlite":
        if config.path is None:
            raise ValueError("a sqlite store needs a path")
        return SqliteStore(config.path, config.ttl_seconds)
    return MemoryStore(config.max_entries, config.ttl_seconds)
