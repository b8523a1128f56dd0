"""The summary store a config names: memory, a SQLite file, or Redis shared by replicas."""

from __future__ import annotations

from collections.abc import Callable

from proxy.config import StoreConfig
from proxy.store.sqlite_store import SqliteStore
from proxy.store.store import MemoryStore, SummaryStore


def open_store(config: StoreConfig, on_error: Callable[[str], None] | None = None,
               on_health: Callable[[bool], None] | None = None) -> SummaryStore:
    """The store a config names; opening is lazy, so a bad path or an absent Redis shows up in ping() rather
    than here. `on_error(operation)` counts a failure the store caught itself (Redis and sqlite degrade to "no
    record"); `on_health(up)` reports a shared store going down and up."""
    if config.kind == "redis":
        # Imported here: redis-py and the tracing hooks it loads cost ~7 MB of RSS that a proxy without Redis
        # does not pay (the import-graph test still counts this arrow, and allows only this one).
        from proxy.store.redis_store import RedisStore

        return RedisStore.from_config(config, on_error=on_error, on_health=on_health)
    if config.kind == "sqlite":
        if config.path is None:
            raise ValueError("a sqlite store needs a path")
        return SqliteStore(config.path, config.ttl_seconds, timeout_seconds=config.timeout_seconds, on_error=on_error)
    return MemoryStore(config.max_entries, config.ttl_seconds, max_bytes=config.max_bytes)
