"""The summary store the proxies under measure keep their summaries in: memory, a SQLite file each, or one Redis."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.fakes.redis_process import RedisServer

STORES = ("memory", "sqlite", "redis")


@contextmanager
def shared_store(kind: str, directory: Path) -> Iterator[str | None]:
    """The Redis url every proxy shares for `kind` "redis" (a redis-server running until the block ends; the one
    the tests run: $REDIS_SERVER, else on PATH), None for the others."""
    if kind not in STORES:
        raise ValueError(f"unknown store {kind!r}; choose from {', '.join(STORES)}")
    if kind != "redis":
        yield None
        return
    server = RedisServer(directory)
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


def store_section(kind: str, directory: Path, name: str, redis_url: str | None) -> dict[str, Any] | None:
    """One proxy's `store:` section: its own SQLite file, or its own key prefix in the shared Redis, so two roots
    measured together never read each other's summaries. None for memory (the default)."""
    if kind == "sqlite":
        return {"kind": "sqlite", "path": str(directory / f"{name}.sqlite3")}
    if kind == "redis":
        if redis_url is None:
            raise ValueError("a redis store needs the shared server's url")
        return {"kind": "redis", "url": redis_url, "key_prefix": f"bench-{name}:"}
    return None
