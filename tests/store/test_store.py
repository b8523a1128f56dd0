"""Tests for summary stores (memory and SQLite), the record format and single-flight."""

from __future__ import annotations

import asyncio
import gc
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.config import StoreConfig
from proxy.core.fingerprint import hash_chain
from proxy.core.tenants import tenant_namespace
from proxy.store.single_flight import SingleFlight
from proxy.store.sqlite_store import SqliteStore
from proxy.store.store import CompactedPrefix, MemoryStore, SummaryStore
from proxy.store.stores import open_store

TTL = 100.0
TENANT = tenant_namespace("sk-one")
OTHER_TENANT = tenant_namespace("sk-two")


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def history(n: int, salt: str = "") -> list[dict[str, Any]]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"{salt}message {i}"} for i in range(n)]


def record_for(chain: list[str], prefix_len: int, model: str = "m") -> CompactedPrefix:
    summary = {"role": "user", "content": f"summary of {prefix_len}"}
    note = {"role": "assistant", "content": "continuing"}
    return CompactedPrefix(chain[prefix_len - 1], prefix_len, (summary, note), 1000 * prefix_len, 50, model, 1.5)


StoreMaker = Callable[[FakeClock], SummaryStore]


@pytest.fixture(params=["memory", "sqlite"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> StoreMaker:
    if request.param == "memory":
        return lambda clock: MemoryStore(max_entries=1000, ttl_seconds=TTL, clock=clock)
    return lambda clock: SqliteStore(tmp_path / "summaries.sqlite3", ttl_seconds=TTL, clock=clock)


async def test_put_then_get(make_store: StoreMaker) -> None:
    store = make_store(FakeClock())
    chain = hash_chain(history(4), TENANT)
    record = record_for(chain, 3)
    await store.put(TENANT, record)
    assert await store.get(TENANT, chain[2]) == record
    assert await store.get(TENANT, chain[1]) is None
    assert await store.ping() is True
    await store.close()


async def test_put_replaces_same_prefix(make_store: StoreMaker) -> None:
    store = make_store(FakeClock())
    chain = hash_chain(history(4), TENANT)
    await store.put(TENANT, record_for(chain, 3, model="old"))
    await store.put(TENANT, record_for(chain, 3, model="new"))
    found = await store.get(TENANT, chain[2])
    assert found is not None and found.model == "new"
    await store.close()


async def test_longest_match_picks_longest(make_store: StoreMaker) -> None:
    store = make_store(FakeClock())
    chain = hash_chain(history(10), TENANT)
    for prefix_len in (2, 8, 5):
        await store.put(TENANT, record_for(chain, prefix_len))
    assert (await store.longest_match(TENANT, chain)) == record_for(chain, 8)
    assert (await store.longest_match(TENANT, chain[:7])) == record_for(chain, 5)
    assert (await store.longest_match(TENANT, chain[:1])) is None
    assert (await store.longest_match(TENANT, [])) is None
    await store.close()


async def test_edited_history_does_not_match(make_store: StoreMaker) -> None:
    store = make_store(FakeClock())
    messages = history(6)
    await store.put(TENANT, record_for(hash_chain(messages, TENANT), 4))
    edited = [*messages[:2], {**messages[2], "content": "message 2 (edited)"}, *messages[3:]]
    assert await store.longest_match(TENANT, hash_chain(edited, TENANT)) is None
    assert await store.longest_match(TENANT, hash_chain(history(6, salt="x"), TENANT)) is None
    await store.close()


async def test_record_whose_length_does_not_line_up_is_never_returned(make_store: StoreMaker) -> None:
    store = make_store(FakeClock())
    chain = hash_chain(history(8), TENANT)
    good = record_for(chain, 2)
    misplaced = CompactedPrefix(chain[5], 3, good.replacement, 1, 1, "m", 0.0)
    beyond = CompactedPrefix(chain[6], 20, good.replacement, 1, 1, "m", 0.0)
    for record in (good, misplaced, beyond):
        await store.put(TENANT, record)
    assert await store.longest_match(TENANT, chain) == good
    await store.close()


@pytest.mark.parametrize(("hash_at", "prefix_len", "found"), [
    (3, 4, True),  # the one record held, where it belongs
    (3, 2, False),  # its hash is in the chain, elsewhere than its length says
    (3, 9, False),  # its length runs past the chain
])
async def test_a_lone_record_is_returned_only_where_it_lines_up(make_store: StoreMaker, hash_at: int,
                                                                 prefix_len: int, found: bool) -> None:
    store = make_store(FakeClock())
    chain = hash_chain(history(8), TENANT)
    record = CompactedPrefix(chain[hash_at], prefix_len, record_for(chain, 2).replacement, 1, 1, "m", 0.0)
    await store.put(TENANT, record)
    assert await store.longest_match(TENANT, chain) == (record if found else None)
    await store.close()


async def test_entries_expire_after_ttl(make_store: StoreMaker) -> None:
    clock = FakeClock()
    store = make_store(clock)
    chain = hash_chain(history(3), TENANT)
    await store.put(TENANT, record_for(chain, 2))
    clock.now += TTL - 1
    assert await store.get(TENANT, chain[1]) is not None
    clock.now += 2
    assert await store.get(TENANT, chain[1]) is None
    assert await store.longest_match(TENANT, chain) is None
    await store.close()


async def test_namespaces_are_isolated(make_store: StoreMaker) -> None:
    store = make_store(FakeClock())
    chain = hash_chain(history(3), TENANT)
    await store.put(TENANT, record_for(chain, 2))
    assert await store.get(OTHER_TENANT, chain[1]) is None
    assert await store.longest_match(OTHER_TENANT, chain) is None
    assert await store.longest_match(TENANT, chain) is not None
    await store.close()


async def test_concurrent_puts_and_gets(make_store: StoreMaker) -> None:
    store = make_store(FakeClock())
    chains = [hash_chain(history(3, salt=str(i)), TENANT) for i in range(40)]
    await asyncio.gather(*(store.put(TENANT, record_for(chain, 2)) for chain in chains))
    found = await asyncio.gather(*(store.longest_match(TENANT, chain) for chain in chains))
    assert found == [record_for(chain, 2) for chain in chains]
    await store.close()


async def test_memory_store_evicts_least_recently_used() -> None:
    store = MemoryStore(max_entries=2, ttl_seconds=TTL, clock=FakeClock())
    chains = [hash_chain(history(2, salt=s), TENANT) for s in "abc"]
    await store.put(TENANT, record_for(chains[0], 1))
    await store.put(TENANT, record_for(chains[1], 1))
    assert await store.get(TENANT, chains[0][0]) is not None
    await store.put(TENANT, record_for(chains[2], 1))
    assert len(store) == 2
    assert await store.get(TENANT, chains[1][0]) is None
    assert await store.get(TENANT, chains[0][0]) is not None
    assert await store.get(TENANT, chains[2][0]) is not None


@pytest.mark.parametrize(("max_entries", "ttl"), [(0, 10.0), (5, 0.0), (5, -1.0)])
def test_memory_store_rejects_bad_limits(max_entries: int, ttl: float) -> None:
    with pytest.raises(ValueError):
        MemoryStore(max_entries=max_entries, ttl_seconds=ttl)


async def test_sqlite_survives_reopen(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "store.sqlite3"
    chain = hash_chain(history(5), TENANT)
    first = SqliteStore(path, ttl_seconds=TTL)
    await first.put(TENANT, record_for(chain, 4))
    await first.close()
    second = SqliteStore(path, ttl_seconds=TTL)
    assert await second.longest_match(TENANT, chain) == record_for(chain, 4)
    await second.close()
    with sqlite3.connect(path) as connection:
        assert connection.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


async def test_sqlite_purges_expired_rows(tmp_path: Path) -> None:
    clock = FakeClock()
    path = tmp_path / "store.sqlite3"
    store = SqliteStore(path, ttl_seconds=TTL, clock=clock)
    chain = hash_chain(history(3), TENANT)
    await store.put(TENANT, record_for(chain, 1))
    clock.now += TTL * 10
    await store.put(TENANT, record_for(chain, 2))
    await store.close()
    with sqlite3.connect(path) as connection:
        assert connection.execute("SELECT prefix_len FROM summaries").fetchall() == [(2,)]


async def test_sqlite_long_chain_is_queried_in_chunks(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "store.sqlite3", ttl_seconds=TTL)
    chain = hash_chain(history(2500), TENANT)
    await store.put(TENANT, record_for(chain, 7))
    assert await store.longest_match(TENANT, chain) == record_for(chain, 7)
    await store.put(TENANT, record_for(chain, 1700))
    assert await store.longest_match(TENANT, chain) == record_for(chain, 1700)
    await store.close()


async def test_sqlite_ignores_unreadable_rows(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite3"
    store = SqliteStore(path, ttl_seconds=TTL, clock=FakeClock())
    chain = hash_chain(history(3), TENANT)
    await store.put(TENANT, record_for(chain, 1))
    await store.put(TENANT, record_for(chain, 2))
    with sqlite3.connect(path) as connection:
        connection.execute("UPDATE summaries SET record = '{broken' WHERE prefix_len = 2")
    assert await store.get(TENANT, chain[1]) is None
    assert await store.longest_match(TENANT, chain) == record_for(chain, 1)
    await store.close()


async def test_sqlite_closed_or_unusable(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    assert await SqliteStore(blocker / "store.sqlite3", ttl_seconds=TTL).ping() is False
    store = SqliteStore(tmp_path / "store.sqlite3", ttl_seconds=TTL)
    assert await store.ping() is True
    await store.close()
    assert await store.ping() is False
    with pytest.raises(RuntimeError):
        await store.get(TENANT, "abc")


def test_record_json_round_trip() -> None:
    record = record_for(hash_chain(history(3), TENANT), 2)
    assert CompactedPrefix.from_json(record.to_json()) == record
    assert CompactedPrefix.from_json(record.to_json().encode()) == record


@pytest.mark.parametrize(
    "text",
    [
        "{broken",
        "[]",
        '{"prefix_hash": "h", "prefix_len": 1}',
        '{"prefix_hash": "h", "prefix_len": "1", "replacement": [], "tokens_before": 1, "tokens_after": 1,'
        ' "model": "m", "created_at": 1}',
        '{"prefix_hash": "h", "prefix_len": true, "replacement": [], "tokens_before": 1, "tokens_after": 1,'
        ' "model": "m", "created_at": 1}',
        '{"prefix_hash": "h", "prefix_len": 1, "replacement": ["x"], "tokens_before": 1, "tokens_after": 1,'
        ' "model": "m", "created_at": 1}',
        '{"prefix_hash": "h", "prefix_len": 0, "replacement": [], "tokens_before": 1, "tokens_after": 1,'
        ' "model": "m", "created_at": 1}',
        '{"prefix_hash": "", "prefix_len": 1, "replacement": [], "tokens_before": 1, "tokens_after": 1,'
        ' "model": "m", "created_at": 1}',
    ],
)
def test_record_from_bad_json(text: str) -> None:
    with pytest.raises(ValueError):
        CompactedPrefix.from_json(text)


def test_open_store_follows_config(tmp_path: Path) -> None:
    memory = open_store(StoreConfig(kind="memory", max_entries=3))
    sqlite = open_store(StoreConfig(kind="sqlite", path=tmp_path / "s.sqlite3"))
    assert isinstance(memory, MemoryStore) and isinstance(memory, SummaryStore)
    assert isinstance(sqlite, SqliteStore) and isinstance(sqlite, SummaryStore)


async def test_single_flight_shares_one_call() -> None:
    flights = SingleFlight()
    calls = 0
    release = asyncio.Event()

    async def summarise() -> str:
        nonlocal calls
        calls += 1
        await release.wait()
        return "summary"

    waiters = [asyncio.create_task(flights.run("k", summarise)) for _ in range(20)]
    await asyncio.sleep(0)
    assert flights.in_flight("k")
    release.set()
    assert await asyncio.gather(*waiters) == ["summary"] * 20
    assert calls == 1
    assert not flights.in_flight("k")


async def test_single_flight_shares_the_exception() -> None:
    flights = SingleFlight()
    calls = 0

    async def fail() -> str:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.01)
        raise RuntimeError("summariser down")

    results = await asyncio.gather(*(flights.run("k", fail) for _ in range(5)), return_exceptions=True)
    assert calls == 1
    assert all(isinstance(result, RuntimeError) and str(result) == "summariser down" for result in results)
    assert not flights.in_flight("k")


async def test_cancelled_waiter_does_not_cancel_the_others() -> None:
    flights = SingleFlight()
    release = asyncio.Event()

    async def summarise() -> str:
        await release.wait()
        return "summary"

    first = asyncio.create_task(flights.run("k", summarise))
    second = asyncio.create_task(flights.run("k", summarise))
    await asyncio.sleep(0)
    first.cancel()
    await asyncio.sleep(0)
    release.set()
    assert await second == "summary"
    with pytest.raises(asyncio.CancelledError):
        await first


async def test_abandoned_call_still_finishes() -> None:
    flights = SingleFlight()
    release = asyncio.Event()
    finished = asyncio.Event()

    async def summarise() -> str:
        await release.wait()
        finished.set()
        raise RuntimeError("nobody is listening")

    unhandled: list[dict[str, Any]] = []
    asyncio.get_running_loop().set_exception_handler(lambda loop, context: unhandled.append(context))
    waiter = asyncio.create_task(flights.run("k", summarise))
    await asyncio.sleep(0)
    waiter.cancel()
    release.set()
    await asyncio.wait_for(finished.wait(), timeout=1)
    await asyncio.sleep(0)
    assert not flights.in_flight("k")
    del waiter
    gc.collect()
    assert unhandled == []


async def test_key_is_reusable_and_keys_are_independent() -> None:
    flights = SingleFlight()
    calls: list[str] = []

    def factory(value: str) -> Callable[[], Any]:
        async def produce() -> str:
            calls.append(value)
            await asyncio.sleep(0)
            return value

        return produce

    assert await flights.run("k", factory("one")) == "one"
    assert await flights.run("k", factory("two")) == "two"
    assert await asyncio.gather(flights.run("a", factory("a")), flights.run("b", factory("b"))) == ["a", "b"]
    assert calls == ["one", "two", "a", "b"]


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 30), st.lists(st.tuples(st.integers(1, 30), st.booleans(), st.booleans()), max_size=40),
       st.integers(0, 30))
def test_memory_longest_match_finds_what_a_walk_of_the_chain_finds(
        length: int, records: list[tuple[int, bool, bool]], others: int) -> None:
    """Records at random prefixes (of this chain or another's; this tenant's or another's, some expired), and as
    many unrelated ones: the store meets the chain with the hashes it holds, with the walk's answer, and the hashes
    it holds are its records' at every step (replaced, expired, evicted)."""
    clock = FakeClock()
    store = MemoryStore(max_entries=40, ttl_seconds=TTL, clock=clock)
    chain, other_chain = hash_chain(history(length), TENANT), hash_chain(history(30, salt="x"), TENANT)

    async def fill() -> None:
        for prefix, ours, own_tenant in records:
            target = chain if ours and prefix <= length else other_chain
            await store.put(TENANT if own_tenant else OTHER_TENANT, record_for(target, min(prefix, len(target))))
        clock.now += TTL / 2
        for index in range(others):
            await store.put(TENANT, record_for(other_chain, index % 30 + 1, model=f"other {index}"))

    async def reference() -> CompactedPrefix | None:
        for prefix_hash in reversed(chain):
            record = await store.get(TENANT, prefix_hash)
            if record is not None and record.matches(chain):
                return record
        return None

    def held() -> dict[str, set[str]]:
        by_namespace: dict[str, set[str]] = {}
        for namespace, prefix_hash in store._entries:
            by_namespace.setdefault(namespace, set()).add(prefix_hash)
        return by_namespace

    async def check() -> None:
        await fill()
        assert store._hashes == held()
        assert await store.longest_match(TENANT, chain) == await reference()
        assert store._hashes == held()
        clock.now += TTL  # every record expired: nothing matches
        assert await store.longest_match(TENANT, chain) is None
        assert store._hashes == held()

    asyncio.run(check())


@pytest.mark.parametrize("stored", [1, 16, 17, 30])
async def test_memory_longest_match_orders_few_and_many_hits_longest_first(stored: int) -> None:
    """However many prefixes of the chain are stored (ordered by a scan each up to a few, by a walk past that), the
    longest that matches is the one returned; with the longest edited away, the next."""
    store = MemoryStore(max_entries=100, ttl_seconds=TTL, clock=FakeClock())
    chain = hash_chain(history(30), TENANT)
    for prefix in range(30 - stored + 1, 31):
        await store.put(TENANT, record_for(chain, prefix))
    assert await store.longest_match(TENANT, chain) == record_for(chain, 30)
    edited = [*chain[:29], "0" * 64]  # the last message changed: its link differs
    assert await store.longest_match(TENANT, edited) == (record_for(chain, 29) if stored > 1 else None)
