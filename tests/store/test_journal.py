"""The compaction journal's contract, run against memory, a SQLite file and a real redis-server; then each one's own."""

from __future__ import annotations

import asyncio
import sqlite3
import stat
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from proxy.config import JournalConfig, StoreConfig
from proxy.store.flights import StoreUnavailable
from proxy.store.journal import POINT_BYTES, Event, Journal, JournalBounds, MemoryJournal, Point, event_bytes, event_id
from proxy.store.journals import bounds_of, open_journal
from proxy.store.redis_journal import RedisJournal
from proxy.store.sqlite_journal import SqliteJournal
from tests.ports import free_port
from tests.redis_server import RedisServer, redis_server  # noqa: F401  (fixture)

TTL = 100.0
START = 1_000.0
OWNER, OTHER = "a1" * 8, "b2" * 8
PREFIX = "compaction-proxy:j:"


class FakeClock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now


class Errors(Counter[str]):
    """An on_error callback that remembers what it was told."""

    def __call__(self, operation: str) -> None:
        self[operation] += 1


def conversation_id(n: int) -> str:
    return f"c{n:07x}"


def event(n: int, *, conversation: str = conversation_id(0), owner: str = OWNER, at: float | None = None,
          outcome: str = "applied") -> Event:
    return Event.model_validate({
        "id": event_id(str(n)), "kind": "summary", "outcome": outcome, "at": START + n if at is None else at,
        "owner": owner, "conversation": conversation, "dialect": "openai", "model": f"model-{n}",
        "trigger": "threshold", "window": 8000, "threshold_tokens": 6000, "tokens_before": 1000 + n,
        "tokens_after": 100, "replaced_tokens": 900, "replacement_tokens": 50, "summary": f"summary {n}"})


def point(n: int, *, conversation: str = conversation_id(0), owner: str = OWNER, at: float | None = None) -> Point:
    return Point(at=START + n if at is None else at, owner=owner, conversation=conversation, dialect="openai",
                 model=f"model-{n}", tokens_before=1000 + n, tokens_after=100, window=8000, threshold_tokens=6000,
                 outcome="forwarded", cleared=0, pair_summaries=0)


Opener = Callable[..., Journal]


@dataclass
class Backend:
    """One kind of journal: `open(bounds, clock)` opens one more on the same storage (memory: a fresh one)."""

    name: str
    opener: Opener
    corrupt: Callable[[str, str], Awaitable[None]] | None = None  # (what, id) garbage written beside the journal
    opened: list[Journal] = field(default_factory=list)
    errors: Errors = field(default_factory=Errors)

    def open(self, bounds: JournalBounds | None = None, clock: FakeClock | None = None) -> Journal:
        journal = self.opener(bounds or JournalBounds(ttl_seconds=TTL), clock or FakeClock(), self.errors)
        self.opened.append(journal)
        return journal


def sqlite_backend(path: Path) -> Backend:
    async def corrupt(what: str, key: str) -> None:
        with sqlite3.connect(path) as connection:
            if what == "event":
                connection.execute("UPDATE journal_events SET entry = 'garbage' WHERE id = ?", (key,))
            elif what == "conversation":
                connection.execute("UPDATE journal_conversations SET entry = x'ff00' WHERE id = ?", (key,))
            else:  # a point that is not JSON, and one of another owner's slipped into this conversation
                foreign = point(99, conversation=key, owner=OTHER).model_dump_json()
                connection.executemany("INSERT INTO journal_points (conversation, at, entry) VALUES (?, ?, ?)",
                                       [(key, START, "{not json"), (key, START, foreign), (key, START, 42)])
        connection.close()

    # A generous lock wait: by design a write that waits past it is dropped and counted, and these tests count
    # writes (two journals on one file, on a busy 2-core machine, waited past the default second once).
    return Backend("sqlite", lambda bounds, clock, errors: SqliteJournal(
        path, bounds, clock=clock, on_error=errors, timeout_seconds=10.0), corrupt)


def redis_backend(server: RedisServer) -> Backend:
    async def corrupt(what: str, key: str) -> None:
        client = aioredis.from_url(server.url)
        if what == "event":
            await client.set(f"{PREFIX}e:{key}", b"\xffgarbage")
        elif what == "conversation":
            await client.hset(f"{PREFIX}c:{key}", "last_at", "not a time")
        else:
            foreign = point(99, conversation=key, owner=OTHER).model_dump_json()
            await client.rpush(f"{PREFIX}p:{key}", "{not json", foreign)
        await client.aclose()

    return Backend("redis", lambda bounds, clock, errors: RedisJournal(
        server.url, bounds, clock=clock, on_error=errors, retry_delays=(0.05, 0.2)), corrupt)


@pytest.fixture(params=["memory", "sqlite", "redis"])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    if request.param == "memory":
        chosen = Backend("memory", lambda bounds, clock, errors: MemoryJournal(bounds, clock))
    elif request.param == "sqlite":
        chosen = sqlite_backend(tmp_path / "store.sqlite3")
    else:  # started only for the Redis cases
        chosen = redis_backend(request.getfixturevalue("redis_server"))
    yield chosen
    for journal in chosen.opened:
        await journal.close()


shared = pytest.mark.parametrize("backend", ["sqlite", "redis"], indirect=True)


# --- the contract ---------------------------------------------------------------------------------------------------


async def test_record_and_points_read_back(backend: Backend) -> None:
    journal = backend.open()
    assert isinstance(journal, Journal)
    await journal.point(point(0))
    await journal.record(event(1))
    await journal.record(event(2, outcome="failed"))
    await journal.point(point(3))
    [info] = await journal.conversations(OWNER, 10)
    assert (info.id, info.owner, info.dialect, info.model) == (conversation_id(0), OWNER, "openai", "model-3")
    assert (info.first_at, info.last_at, info.requests, info.compactions) == (START, START + 3, 2, 1)
    detail = await journal.conversation(OWNER, conversation_id(0))
    assert detail is not None and detail.info == info
    assert detail.points == [point(0), point(3)]
    assert detail.events == [event(1), event(2, outcome="failed")]
    assert await journal.event(OWNER, event(1).id) == event(1)
    assert await journal.event(OWNER, event_id("absent")) is None
    assert await journal.conversation(OWNER, conversation_id(9)) is None
    assert await journal.conversations(OWNER, 0) == []
    assert not backend.errors


async def test_another_owner_sees_nothing(backend: Backend) -> None:
    journal = backend.open()
    await journal.point(point(0))
    await journal.record(event(1))
    assert await journal.conversations(OTHER, 10) == []
    assert await journal.conversation(OTHER, conversation_id(0)) is None
    assert await journal.event(OTHER, event(1).id) is None
    assert await journal.event(OWNER, event(1).id) == event(1)


async def test_an_operator_sees_every_owner_most_recent_first(backend: Backend) -> None:
    journal = backend.open()
    await journal.point(point(0, conversation=conversation_id(1), owner=OWNER))
    await journal.record(event(1, conversation=conversation_id(2), owner=OTHER))
    await journal.point(point(2, conversation=conversation_id(3), owner=OWNER))
    listed = await journal.conversations(None, 10)
    assert [(info.id, info.owner) for info in listed] == [
        (conversation_id(3), OWNER), (conversation_id(2), OTHER), (conversation_id(1), OWNER)]
    assert [info.id for info in await journal.conversations(None, 2)] == [conversation_id(3), conversation_id(2)]
    assert [info.id for info in await journal.conversations(OWNER, 10)] == [conversation_id(3), conversation_id(1)]
    detail = await journal.conversation(None, conversation_id(2))
    assert detail is not None and detail.events == [event(1, conversation=conversation_id(2), owner=OTHER)]
    assert await journal.event(None, event(1).id) is not None


async def test_past_max_events_the_oldest_go_first(backend: Backend) -> None:
    journal = backend.open(JournalBounds(max_events=3, ttl_seconds=TTL))
    for n in range(5):
        await journal.record(event(n))
    assert [await journal.event(OWNER, event(n).id) for n in range(5)] == [None, None, event(2), event(3), event(4)]
    detail = await journal.conversation(OWNER, conversation_id(0))
    assert detail is not None and detail.events == [event(2), event(3), event(4)]
    assert detail.info.compactions == 5  # what was counted stays counted


async def test_max_points_keeps_the_newest(backend: Backend) -> None:
    journal = backend.open(JournalBounds(max_points=3, ttl_seconds=TTL))
    for n in range(5):
        await journal.point(point(n))
    detail = await journal.conversation(OWNER, conversation_id(0))
    assert detail is not None and detail.points == [point(2), point(3), point(4)]
    assert detail.info.requests == 5


async def test_past_max_conversations_the_least_recently_touched_goes(backend: Backend) -> None:
    journal = backend.open(JournalBounds(max_conversations=2, ttl_seconds=TTL))
    await journal.point(point(0, conversation=conversation_id(1)))
    await journal.record(event(1, conversation=conversation_id(2), owner=OTHER))
    await journal.point(point(2, conversation=conversation_id(1)))  # 1 touched again: 2 is now the least recent
    await journal.point(point(3, conversation=conversation_id(3)))
    assert [info.id for info in await journal.conversations(None, 10)] == [conversation_id(3), conversation_id(1)]
    assert await journal.conversation(None, conversation_id(2)) is None
    assert await journal.conversations(OTHER, 10) == []
    kept = await journal.conversation(OWNER, conversation_id(1))
    assert kept is not None and kept.points == [point(0, conversation=conversation_id(1)),
                                                point(2, conversation=conversation_id(1))]


async def test_entries_older_than_the_ttl_are_not_read(backend: Backend) -> None:
    clock = FakeClock()
    journal = backend.open(clock=clock)
    await journal.point(point(0, at=START))
    await journal.record(event(1, at=START))
    clock.now = START + TTL - 1
    assert len(await journal.conversations(OWNER, 10)) == 1
    assert await journal.event(OWNER, event(1).id) is not None
    clock.now = START + TTL + 1
    assert await journal.conversations(OWNER, 10) == []
    assert await journal.conversations(None, 10) == []
    assert await journal.conversation(OWNER, conversation_id(0)) is None
    assert await journal.event(OWNER, event(1).id) is None
    await journal.point(point(1, at=clock.now))  # a new request starts the conversation over
    detail = await journal.conversation(OWNER, conversation_id(0))
    assert detail is not None and detail.points == [point(1, at=clock.now)] and detail.events == []


@shared
async def test_a_corrupt_stored_value_is_skipped(backend: Backend) -> None:
    assert backend.corrupt is not None
    journal = backend.open()
    for n in range(2):
        await journal.record(event(n))
    await journal.point(point(2))
    await journal.point(point(3, conversation=conversation_id(1)))
    await backend.corrupt("event", event(0).id)
    await backend.corrupt("point", conversation_id(0))
    await backend.corrupt("conversation", conversation_id(1))
    assert await journal.event(OWNER, event(0).id) is None
    assert await journal.event(OWNER, event(1).id) == event(1)
    detail = await journal.conversation(OWNER, conversation_id(0))
    assert detail is not None and detail.points == [point(2)] and detail.events == [event(1)]
    assert await journal.conversation(OWNER, conversation_id(1)) is None
    assert [info.id for info in await journal.conversations(OWNER, 10)] == [conversation_id(0)]
    await journal.point(point(4, conversation=conversation_id(1)))  # writing over a corrupt entry works
    assert await journal.conversation(OWNER, conversation_id(1)) is not None
    assert not backend.errors


@shared
async def test_concurrent_writes_from_two_journals_add_up(backend: Backend) -> None:
    first, second = backend.open(), backend.open()
    await asyncio.gather(*((first if n % 2 else second).point(point(n)) for n in range(50)),
                         *((second if n % 2 else first).record(event(n)) for n in range(20)))
    for journal in (first, second):
        detail = await journal.conversation(OWNER, conversation_id(0))
        assert detail is not None
        assert (detail.info.requests, detail.info.compactions) == (50, 20)
        assert sorted(p.at for p in detail.points) == [point(n).at for n in range(50)]
        assert len(detail.events) == 20
    assert not backend.errors


@shared
async def test_an_event_recorded_twice_is_one_compaction(backend: Backend) -> None:
    first, second = backend.open(), backend.open()
    await first.record(event(1))
    await second.record(event(1))  # another replica records the same summary (ids are shared)
    detail = await first.conversation(OWNER, conversation_id(0))
    assert detail is not None and detail.info.compactions == 1 and detail.events == [event(1)]


async def test_an_event_recorded_twice_by_one_journal_is_listed_once(backend: Backend) -> None:
    journal = backend.open()
    await journal.record(event(1))
    await journal.record(event(1))
    detail = await journal.conversation(OWNER, conversation_id(0))
    assert detail is not None and detail.info.compactions == 1 and detail.events == [event(1)]


# --- Redis ------------------------------------------------------------------------------------------------------


async def test_redis_is_shared_by_two_journals(redis_server: RedisServer) -> None:  # noqa: F811
    writer, reader = (RedisJournal(redis_server.url, JournalBounds(ttl_seconds=TTL), clock=FakeClock())
                      for _ in range(2))
    await writer.point(point(0))
    await writer.record(event(1))
    [info] = await reader.conversations(OWNER, 10)
    assert (info.requests, info.compactions) == (1, 1)
    assert await reader.event(OWNER, event(1).id) == event(1)
    await writer.close()
    await reader.close()


async def test_redis_sets_a_ttl_on_every_key(redis_server: RedisServer) -> None:  # noqa: F811
    journal = RedisJournal(redis_server.url, JournalBounds(ttl_seconds=TTL), clock=FakeClock())
    await journal.point(point(0))
    await journal.record(event(1))
    client = aioredis.from_url(redis_server.url, decode_responses=True)
    keys = sorted(await client.keys("*"))
    assert keys == sorted(f"{PREFIX}{key}" for key in (
        f"e:{event(1).id}", "events", f"c:{conversation_id(0)}", f"p:{conversation_id(0)}",
        f"ce:{conversation_id(0)}", "convs", f"o:{OWNER}"))
    for key in keys:
        assert 0 < await client.pttl(key) <= TTL * 1000, key
    await client.aclose()
    await journal.close()


async def test_redis_entries_expire(redis_server: RedisServer) -> None:  # noqa: F811
    journal = RedisJournal(redis_server.url, JournalBounds(ttl_seconds=0.3))
    await journal.point(point(0, at=time.time()))
    assert len(await journal.conversations(OWNER, 10)) == 1
    await asyncio.sleep(0.5)
    client = aioredis.from_url(redis_server.url)
    assert await client.keys("*") == []
    await client.aclose()
    assert await journal.conversations(OWNER, 10) == []
    await journal.close()


async def test_unreachable_redis_drops_writes_and_fails_reads() -> None:
    errors = Errors()
    journal = RedisJournal(f"redis://:hunter2@127.0.0.1:{free_port()}/0", JournalBounds(), timeout_seconds=0.5,
                           on_error=errors)
    await journal.point(point(0))
    await journal.record(event(1))
    with pytest.raises(StoreUnavailable):
        await journal.conversations(OWNER, 10)
    with pytest.raises(StoreUnavailable):
        await journal.event(OWNER, event(1).id)
    assert errors["journal_point"] == 1 and errors["journal_record"] == 1 and errors["journal_read"] == 2
    assert "hunter2" not in repr(journal)
    await journal.close()


# --- SQLite --------------------------------------------------------------------------------------------------------


async def test_sqlite_journal_shares_the_store_file_and_keeps_it_private(tmp_path: Path) -> None:
    path = tmp_path / "state" / "store.sqlite3"
    journal = SqliteJournal(path, JournalBounds())
    await journal.point(point(0))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    with sqlite3.connect(path) as connection:
        tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    connection.close()
    assert {"summaries", "journal_events", "journal_points", "journal_conversations"} <= tables
    await journal.close()


async def test_an_unreadable_sqlite_file_drops_writes_and_fails_reads(tmp_path: Path) -> None:
    errors = Errors()
    journal = SqliteJournal(tmp_path, JournalBounds(), timeout_seconds=0.2, on_error=errors)  # a directory
    await journal.point(point(0))
    await journal.record(event(1))
    with pytest.raises(StoreUnavailable):
        await journal.conversation(OWNER, conversation_id(0))
    assert errors == {"journal_point": 1, "journal_record": 1, "journal_read": 1}
    await journal.close()
    await journal.point(point(1))  # after close: dropped, not raised


# --- choosing one --------------------------------------------------------------------------------------------------


async def test_open_journal_follows_the_store(tmp_path: Path) -> None:
    config = JournalConfig(max_events=7, max_conversations=5, max_points=3)
    memory = StoreConfig(ttl_seconds=60)
    assert bounds_of(memory, config) == JournalBounds(7, 5, 3, 60)
    assert bounds_of(memory, JournalConfig(ttl_seconds=9)).ttl_seconds == 9
    opened: list[Any] = [
        open_journal(memory, config),
        open_journal(StoreConfig(kind="sqlite", path=tmp_path / "s.sqlite3"), config),
        open_journal(StoreConfig(kind="redis", url="redis://127.0.0.1:1/0", key_prefix="x:"), config)]
    assert [type(journal) for journal in opened] == [MemoryJournal, SqliteJournal, RedisJournal]
    assert all(journal.bounds == JournalBounds(7, 5, 3, 7 * 24 * 3600) for journal in opened[1:])
    assert "x:j:" in repr(opened[2])
    for journal in opened:
        await journal.close()


async def test_redis_keys_of_another_type_are_replaced_not_fatal(redis_server: RedisServer) -> None:  # noqa: F811
    errors = Errors()
    journal = RedisJournal(redis_server.url, JournalBounds(ttl_seconds=TTL), clock=FakeClock(), on_error=errors)
    client = aioredis.from_url(redis_server.url)
    for key in ("c", "p", "ce"):
        await client.set(f"{PREFIX}{key}:{conversation_id(0)}", b"not a hash nor a list")
    await client.set(f"{PREFIX}convs", b"not a zset")
    await client.rpush(f"{PREFIX}e:{event(1).id}", b"not a string")
    assert await journal.conversation(OWNER, conversation_id(0)) is None
    assert await journal.conversations(None, 10) == []
    assert await journal.event(OWNER, event(1).id) is None
    await journal.point(point(0))
    await journal.record(event(1))
    detail = await journal.conversation(OWNER, conversation_id(0))
    assert detail is not None and detail.points == [point(0)] and detail.events == [event(1)]
    assert [info.id for info in await journal.conversations(None, 10)] == [conversation_id(0)]
    assert not errors
    await client.aclose()
    await journal.close()


# --- memory: bytes ----------------------------------------------------------------------------------------------


async def test_the_memory_journal_keeps_to_its_bytes_evicting_the_oldest_event_first() -> None:
    big = 1024 * 1024  # each summary is charged about 4 MiB: its characters at up to four bytes
    journal = MemoryJournal(JournalBounds(max_bytes=10 * 1024 * 1024, ttl_seconds=TTL), FakeClock())
    events = [event(n).model_copy(update={"summary": "x" * big}) for n in range(5)]
    for each in events:
        await journal.record(each)
        assert journal.total_bytes <= 10 * 1024 * 1024
    kept = [each.id for each in events if await journal.event(None, each.id) is not None]
    assert kept == [events[3].id, events[4].id]
    await journal.record(events[4])  # the same event again is charged once
    assert journal.total_bytes == sum(event_bytes(each) for each in events[3:])


async def test_the_memory_journal_drops_the_least_recently_seen_conversation_when_points_fill_it() -> None:
    journal = MemoryJournal(JournalBounds(max_bytes=POINT_BYTES * 10, ttl_seconds=TTL), FakeClock())
    for n in range(6):
        await journal.point(point(n, conversation=conversation_id(1)))
    for n in range(6):
        await journal.point(point(n, conversation=conversation_id(2)))
    assert journal.total_bytes <= POINT_BYTES * 10
    assert [info.id for info in await journal.conversations(None, 10)] == [conversation_id(2)]
    detail = await journal.conversation(None, conversation_id(2))
    assert detail is not None and len(detail.points) == 6


async def test_bytes_are_given_back_when_points_roll_over() -> None:
    journal = MemoryJournal(JournalBounds(max_points=3, ttl_seconds=TTL), FakeClock())
    for n in range(10):
        await journal.point(point(n))
    assert journal.total_bytes == 3 * POINT_BYTES
