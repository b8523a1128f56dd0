"""The timed store: each operation observed once with its seconds, failures included; other attributes pass."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from proxy.config import StoreConfig
from proxy.store.store import CompactedPrefix, MemoryStore
from proxy.store.store_timing import TimedStore


def record(prefix_hash: str = "h2") -> CompactedPrefix:
    return CompactedPrefix(prefix_hash, 2, ({"role": "user", "content": "summary"},), 100, 10, "m", 0.0)


class SlowFailingStore(MemoryStore):
    async def longest_match(self, namespace: str, chain: Sequence[str]) -> CompactedPrefix | None:
        await asyncio.sleep(0.05)
        raise ConnectionError("store unreachable")


async def test_every_operation_is_observed_once_with_its_result_unchanged() -> None:
    seen: list[tuple[str, float]] = []
    store = TimedStore(MemoryStore(10, 60), lambda operation, seconds: seen.append((operation, seconds)))
    await store.put("ns", record())
    assert await store.get("ns", "h2") == record()
    assert await store.longest_match("ns", ["h1", "h2", "h3"]) == record()
    assert await store.ping() is True
    await store.close()
    assert [operation for operation, _ in seen] == ["put", "get", "longest_match", "ping"]
    assert all(0 <= seconds < 1 for _, seconds in seen)
    assert store.size_of("ns", record()) > 0  # what the wrapped store has beyond the protocol still answers


async def test_a_failed_operation_is_timed_and_still_raises() -> None:
    seen: list[tuple[str, float]] = []
    store = TimedStore(SlowFailingStore(10, 60), lambda operation, seconds: seen.append((operation, seconds)))
    with pytest.raises(ConnectionError):
        await store.longest_match("ns", ["h1"])
    [(operation, seconds)] = seen
    assert operation == "longest_match" and seconds >= 0.04


async def test_concurrent_operations_are_each_observed() -> None:
    seen: list[str] = []
    store = TimedStore(MemoryStore(100, 60), lambda operation, seconds: seen.append(operation))
    await asyncio.gather(*(store.put("ns", record(f"h{index}")) for index in range(20)))
    assert seen == ["put"] * 20


def test_a_timed_redis_store_still_grants_leases() -> None:
    from proxy.store.flights import LeaseStore
    from proxy.store.redis_store import RedisStore

    redis = RedisStore.from_config(StoreConfig(kind="redis", url="redis://127.0.0.1:1"))  # connects lazily: never
    assert isinstance(TimedStore(redis, lambda operation, seconds: None), LeaseStore)
    assert not isinstance(TimedStore(MemoryStore(10, 60), lambda operation, seconds: None), LeaseStore)
