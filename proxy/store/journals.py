"""The compaction journal a config names: in memory, in the SQLite file, or in Redis shared by replicas."""

from __future__ import annotations

from proxy.config import JournalConfig, StoreConfig
from proxy.store.flights import ErrorCounter
from proxy.store.journal import Journal, JournalBounds, MemoryJournal
from proxy.store.sqlite_journal import SqliteJournal


def bounds_of(store: StoreConfig, journal: JournalConfig) -> JournalBounds:
    """The journal's bounds; its TTL is the store's unless the journal sets its own."""
    return JournalBounds(max_events=journal.max_events, max_conversations=journal.max_conversations,
                         max_points=journal.max_points, ttl_seconds=journal.ttl_seconds or store.ttl_seconds,
                         max_bytes=journal.max_bytes)


def open_journal(store: StoreConfig, journal: JournalConfig, on_error: ErrorCounter | None = None) -> Journal:
    """The journal kept where the summary store is (the same file, the same Redis); opening is lazy, as the store's.
    `on_error(operation)` counts a failure the journal caught itself."""
    bounds = bounds_of(store, journal)
    if store.kind == "redis":
        # Imported here, as stores.py does for RedisStore: a proxy without Redis does not load redis-py.
        from proxy.store.redis_journal import RedisJournal

        return RedisJournal.from_config(store, bounds, on_error=on_error)
    if store.kind == "sqlite":
        if store.path is None:
            raise ValueError("a sqlite journal needs a path")
        return SqliteJournal(store.path, bounds, timeout_seconds=store.timeout_seconds, on_error=on_error)
    return MemoryJournal(bounds)
