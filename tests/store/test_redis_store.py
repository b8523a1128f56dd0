"""RedisStore against a real redis-server: the store contract, TTLs, bounds, leases, outages and secrets."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import pytest
import redis.asyncio as aioredis

from proxy.config import ConfigError, StoreConfig, settings_from_mapping
from proxy.core.fingerprint import hash_chain
from proxy.log_filters import mask_url
from proxy.store.flights import DROPPED, STORED, Held, Lease, LeaseStore, StoreUnavailable
from proxy.store.redis_store import RedisStore
from proxy.store.store import CompactedPrefix, SummaryStore
from proxy.store.stores import open_store
from tests.redis_server import PASSWORD, RedisServer, redis_server, secured_redis  # noqa: F401  (fixtures)
from tests.store import test_store as contract
from tests.store.test_store import OTHER_TENANT, TENANT, TTL, history, record_for

FAST_RETRY = (0.05, 0.2)


class Errors(Counter[str]):
    """An on_error callback that remembers what it was told."""

    def __call__(self, operation: str) -> None:
        self[operation] += 1


def make(server: RedisServer, **options: Any) -> RedisStore:
    options.setdefault("ttl_seconds", TTL)
    options.setdefault("retry_delays", FAST_RETRY)
    return RedisStore(options.pop("url", server.url), **options)


async def listening(store: RedisStore) -> None:
    """Until the store's subscriber hears announcements (a wait on nothing returns once it does)."""
    assert await store.wait(TENANT, "nothing", "nobody", timeout=5) is None


@pytest.fixture
async def store(redis_server: RedisServer) -> AsyncIterator[RedisStore]:  # noqa: F811
    opened = make(redis_server)
    yield opened
    await opened.close()


# --- the contract every store passes (tests/store/test_store.py), run against Redis ------------------------------

CONTRACT: list[Callable[[contract.StoreMaker], Coroutine[Any, Any, None]]] = [
    contract.test_put_then_get,
    contract.test_put_replaces_same_prefix,
    contract.test_longest_match_picks_longest,
    contract.test_edited_history_does_not_match,
    contract.test_record_whose_length_does_not_line_up_is_never_returned,
    contract.test_namespaces_are_isolated,
    contract.test_concurrent_puts_and_gets,
]  # test_entries_expire_after_ttl drives a fake clock; Redis keeps its own (see test_records_expire_after_their_ttl)


@pytest.mark.parametrize("case", CONTRACT, ids=lambda case: case.__name__.removeprefix("test_"))
async def test_redis_passes_the_store_contract(
        case: Callable[[contract.StoreMaker], Coroutine[Any, Any, None]], redis_server: RedisServer) -> None:  # noqa: F811
    await case(lambda clock: make(redis_server))


async def test_redis_store_is_a_summary_store_and_a_lease_store(store: RedisStore) -> None:
    assert isinstance(store, SummaryStore) and isinstance(store, LeaseStore)


async def test_records_expire_after_their_ttl(redis_server: RedisServer) -> None:  # noqa: F811
    store = make(redis_server, ttl_seconds=1.0)
    chain = hash_chain(history(3), TENANT)
    await store.put(TENANT, record_for(chain, 2))
    assert await store.get(TENANT, chain[1]) is not None
    await asyncio.sleep(1.2)
    assert await store.get(TENANT, chain[1]) is None
    assert await store.longest_match(TENANT, chain) is None
    await store.close()


async def test_key_prefixes_keep_deployments_apart(redis_server: RedisServer) -> None:  # noqa: F811
    blue, green = make(redis_server, key_prefix="blue:"), make(redis_server, key_prefix="green:")
    chain = hash_chain(history(3), TENANT)
    await blue.put(TENANT, record_for(chain, 2))
    assert await green.longest_match(TENANT, chain) is None
    assert await blue.longest_match(OTHER_TENANT, chain) is None
    assert await blue.longest_match(TENANT, chain) == record_for(chain, 2)
    raw = aioredis.from_url(redis_server.url)
    assert [key async for key in raw.scan_iter("*")] == [f"blue:r:{TENANT}:{chain[1]}".encode()]
    await raw.aclose()
    await blue.close()
    await green.close()


async def misses_and_hits(raw: aioredis.Redis) -> tuple[int, int]:
    stats = await raw.info("stats")
    return int(stats["keyspace_misses"]), int(stats["keyspace_hits"])


async def test_a_known_record_is_decoded_once_and_only_the_links_since_it_are_asked(
        redis_server: RedisServer) -> None:  # noqa: F811
    """Redis counts a miss for every key of an MGET it does not hold: the second lookup asks 11 keys, not 50."""
    store, raw = make(redis_server), aioredis.from_url(redis_server.url)
    chain = hash_chain(history(50), "ns-known")
    await store.put("ns-known", record_for(chain, 40))
    before = await misses_and_hits(raw)
    first = await store.longest_match("ns-known", chain)
    middle = await misses_and_hits(raw)
    second = await store.longest_match("ns-known", chain)
    after = await misses_and_hits(raw)
    assert first == record_for(chain, 40) and second is first  # the same object: what is made of it is kept
    assert (middle[0] - before[0], middle[1] - before[1]) == (49, 1)
    assert (after[0] - middle[0], after[1] - middle[1]) == (10, 1)
    await raw.aclose()
    await store.close()


async def test_what_other_replicas_did_since_is_seen(redis_server: RedisServer) -> None:  # noqa: F811
    """A longer record put by another replica is found; a known record replaced is read anew; one deleted sends
    the lookup to the links before it."""
    here, there = make(redis_server), make(redis_server)
    raw = aioredis.from_url(redis_server.url)
    chain = hash_chain(history(50), "ns-others")
    await here.put("ns-others", record_for(chain, 30))
    assert await here.longest_match("ns-others", chain) == record_for(chain, 30)
    await there.put("ns-others", record_for(chain, 45))
    assert await here.longest_match("ns-others", chain) == record_for(chain, 45)
    newer = CompactedPrefix(chain[44], 45, ({"role": "user", "content": "a newer summary"},), 9, 1, "m", 2.0)
    await there.put("ns-others", newer)
    assert await here.longest_match("ns-others", chain) == newer
    await there.put("ns-others", record_for(chain, 10))
    await raw.delete(f"compaction-proxy:r:ns-others:{chain[44]}", f"compaction-proxy:r:ns-others:{chain[29]}")
    assert await here.longest_match("ns-others", chain) == record_for(chain, 10)
    await raw.aclose()
    await here.close()
    await there.close()


async def test_a_garbled_value_under_a_known_key_is_a_miss_counted_once_a_lookup(
        redis_server: RedisServer) -> None:  # noqa: F811
    errors = Errors()
    store, raw = make(redis_server, on_error=errors), aioredis.from_url(redis_server.url)
    chain = hash_chain(history(20), "ns-garbled")
    await store.put("ns-garbled", record_for(chain, 15))
    assert await store.longest_match("ns-garbled", chain) == record_for(chain, 15)
    await raw.set(f"compaction-proxy:r:ns-garbled:{chain[14]}", b"{not json")
    assert await store.longest_match("ns-garbled", chain) is None
    assert errors == {"decode": 1}
    await raw.aclose()
    await store.close()


@pytest.mark.parametrize("reply, expected", [
    ([b"h2", b"two", b"h5", b"five"], [("h2", b"two"), ("h5", b"five")]),
    ([], []),
    ([b"h2", b"two", b"h9", b"not asked"], [("h2", b"two")]),
    ([b"h2", b"two", b"h5"], []),             # odd: not pairs
    ([b"h2", 2], []),                         # not all strings
    (b"h2 two", []),                          # not a list
    (None, []),
    ([b"\xff\xfe", b"garbled hash"], []),
])
def test_only_pairs_of_hashes_asked_for_are_taken_from_a_lookup_reply(reply: object,
                                                                      expected: list[tuple[str, bytes]]) -> None:
    from proxy.store.redis_store import _found

    assert _found(reply, ["h1", "h2", "h5"]) == expected


async def test_a_chain_longer_than_one_mget_is_looked_up_whole(redis_server: RedisServer) -> None:  # noqa: F811
    """The lookup script asks Redis 1,000 keys at a time (Lua's unpack has a bound): records in the first and the
    last part of a 2,500-link chain are both found."""
    store = make(redis_server)
    chain = hash_chain(history(2500), "ns-long")
    await store.put("ns-long", record_for(chain, 5))
    assert await store.longest_match("ns-long", chain) == record_for(chain, 5)
    await store.put("ns-long", record_for(chain, 2400))
    other = make(redis_server)  # knows nothing yet: asks the whole chain
    assert await other.longest_match("ns-long", chain) == record_for(chain, 2400)
    assert await store.longest_match("ns-long", chain) == record_for(chain, 2400)
    await store.close()
    await other.close()


def big_record(chain: list[str], size: int) -> CompactedPrefix:
    return CompactedPrefix(chain[1], 2, ({"role": "user", "content": "x" * size},), 1, 1, "m", 0.0)


async def test_records_over_the_size_bound_are_refused(redis_server: RedisServer) -> None:  # noqa: F811
    errors = Errors()
    store = make(redis_server, max_value_bytes=1000, on_error=errors)
    chain = hash_chain(history(3), TENANT)
    await store.put(TENANT, big_record(chain, 2000))
    assert await store.get(TENANT, chain[1]) is None
    await store.put(TENANT, big_record(chain, 500))
    assert await store.get(TENANT, chain[1]) == big_record(chain, 500)
    assert errors == {"oversize": 1}
    await store.close()


async def test_an_oversized_summary_is_dropped_but_its_lease_released(redis_server: RedisServer) -> None:  # noqa: F811
    store = make(redis_server, max_value_bytes=1000)
    chain = hash_chain(history(3), "ns-big")
    lease = await store.acquire("ns-big", chain[1])
    assert isinstance(lease, Lease)
    await listening(store)
    waiter = asyncio.create_task(store.wait("ns-big", chain[1], lease.value, timeout=5))
    await asyncio.sleep(0.05)
    assert await store.complete(lease, big_record(chain, 2000)) is True
    assert await waiter == DROPPED
    assert await store.holder("ns-big", chain[1]) is None
    assert await store.get("ns-big", chain[1]) is None
    await store.close()


async def test_unreadable_records_are_ignored_and_cleared(store: RedisStore, redis_server: RedisServer) -> None:  # noqa: F811
    chain = hash_chain(history(3), TENANT)
    await store.put(TENANT, record_for(chain, 1))
    raw = aioredis.from_url(redis_server.url)
    await raw.set(f"compaction-proxy:r:{TENANT}:{chain[1]}", b"{broken")
    assert await store.get(TENANT, chain[1]) is None
    assert await store.longest_match(TENANT, chain) == record_for(chain, 1)
    assert isinstance(await store.acquire(TENANT, chain[1]), Lease)  # unreadable: cleared, then claimed
    assert await raw.exists(f"compaction-proxy:r:{TENANT}:{chain[1]}") == 0
    await raw.aclose()



# --- announcements -------------------------------------------------------------------------------------------

JUNK_ANNOUNCEMENTS = [
    b"stored",                                      # one field
    b"stored ns:only-a-key",                        # two fields
    b"stored ns:key holder extra",                  # four fields
    b"",                                            # empty
    b"\xff\xfe \xc0\xae holder",                    # not UTF-8
    b"stored ns:key " + b"h" * (1024 * 1024),       # huge
    b"x" * (1024 * 1024),                           # huge, no field at all
]


async def test_malformed_announcements_are_ignored_and_the_subscriber_keeps_listening(
        redis_server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:  # noqa: F811
    errors = Errors()
    store = make(redis_server, on_error=errors)
    await listening(store)
    caplog.set_level(logging.WARNING, logger="proxy.redis_store")
    raw = aioredis.from_url(redis_server.url)
    for junk in JUNK_ANNOUNCEMENTS:
        assert await raw.publish("compaction-proxy:done", junk) == 1
    # Published after the junk, on the same channel: heard only if the subscriber outlived every piece of it.
    assert await raw.publish("compaction-proxy:done", f"{STORED} {TENANT}:p1 7:owner") == 1
    assert await store.wait(TENANT, "p1", "7:owner", timeout=5) == STORED
    assert await raw.publish("compaction-proxy:done", f"{DROPPED} {TENANT}:p2 8:owner") == 1
    assert await store.wait(TENANT, "p2", "8:owner", timeout=5) == DROPPED
    await raw.aclose()
    await store.close()
    assert errors == {"announcement": len(JUNK_ANNOUNCEMENTS)}
    warnings = [record.getMessage() for record in caplog.records if "announcement" in record.getMessage()]
    assert len(warnings) == 1 and "ignoring a malformed announcement" in warnings[0]  # rate-limited
    assert "Task exception was never retrieved" not in caplog.text

# --- leases --------------------------------------------------------------------------------------------------

async def test_only_one_of_twenty_concurrent_acquirers_wins(redis_server: RedisServer) -> None:  # noqa: F811
    replicas = [make(redis_server) for _ in range(20)]
    claims = await asyncio.gather(*(replica.acquire(TENANT, "prefix") for replica in replicas))
    leases = [claim for claim in claims if isinstance(claim, Lease)]
    assert len(leases) == 1 and claims.count(Held(leases[0].value)) == 19
    assert {await replica.holder(TENANT, "prefix") for replica in replicas} == {leases[0].value}
    await asyncio.gather(*(replica.close() for replica in replicas))


async def test_a_store_adopts_its_own_lease(store: RedisStore) -> None:
    """As when redis-py resends a claim whose reply was lost: the lease the first send took is ours."""
    first = await store.acquire(TENANT, "p")
    assert isinstance(first, Lease) and await store.acquire(TENANT, "p") == first


async def test_acquire_hands_out_the_stored_record_instead_of_a_lease(store: RedisStore) -> None:
    chain = hash_chain(history(3), TENANT)
    await store.put(TENANT, record_for(chain, 2))
    assert await store.acquire(TENANT, chain[1]) == record_for(chain, 2)
    assert await store.holder(TENANT, chain[1]) is None


async def test_complete_stores_releases_and_announces(store: RedisStore) -> None:
    chain = hash_chain(history(3), TENANT)
    lease = await store.acquire(TENANT, chain[1])
    assert isinstance(lease, Lease) and lease.token >= 1
    assert await store.in_flight(TENANT) == {chain[1]}
    await listening(store)
    waiter = asyncio.create_task(store.wait(TENANT, chain[1], lease.value, timeout=5))
    await asyncio.sleep(0.05)
    started = time.monotonic()
    assert await store.complete(lease, record_for(chain, 2)) is True
    assert await waiter == STORED
    assert time.monotonic() - started < 3
    assert await store.get(TENANT, chain[1]) == record_for(chain, 2)
    assert await store.in_flight(TENANT) == frozenset()
    assert await store.wait(TENANT, chain[1], lease.value, timeout=0.05) == STORED  # heard already: kept
    assert await store.wait(TENANT, chain[1], "another-holder", timeout=0.05) is None


async def test_an_expired_lease_passes_on_and_its_stale_holder_is_fenced(redis_server: RedisServer) -> None:  # noqa: F811
    stale, taker = make(redis_server, lock_ttl_seconds=0.2), make(redis_server, lock_ttl_seconds=5)
    chain = hash_chain(history(3), TENANT)
    old = await stale.acquire(TENANT, chain[1])
    assert isinstance(old, Lease)
    assert await taker.acquire(TENANT, chain[1]) == Held(old.value)
    await asyncio.sleep(0.3)  # the holder stopped renewing (it died, or stalled)
    assert await stale.in_flight(TENANT) == frozenset()
    new = await taker.acquire(TENANT, chain[1])
    assert isinstance(new, Lease) and new.token > old.token
    assert await stale.renew(old) is False
    assert await stale.complete(old, record_for(chain, 2, model="stale")) is False
    assert await stale.release(old, "failed") is False
    assert await stale.get(TENANT, chain[1]) is None
    assert await taker.holder(TENANT, chain[1]) == new.value
    assert await taker.complete(new, record_for(chain, 2, model="fresh")) is True
    found = await stale.get(TENANT, chain[1])
    assert found is not None and found.model == "fresh"
    await stale.close()
    await taker.close()


async def test_a_renewed_lease_outlives_its_ttl(redis_server: RedisServer) -> None:  # noqa: F811
    holder, other = make(redis_server, lock_ttl_seconds=1.0), make(redis_server, lock_ttl_seconds=1.0)
    lease = await holder.acquire(TENANT, "p")
    assert isinstance(lease, Lease)
    for _ in range(5):  # 1.25 s in all, past the TTL
        await asyncio.sleep(0.25)
        assert await holder.renew(lease) is True
    assert await other.acquire(TENANT, "p") == Held(lease.value)
    assert await holder.in_flight(TENANT) == {"p"}
    assert await holder.release(lease, "failed") is True
    assert isinstance(await other.acquire(TENANT, "p"), Lease)
    await holder.close()
    await other.close()


async def test_fencing_tokens_are_unique_across_a_restart(redis_server: RedisServer) -> None:  # noqa: F811
    first, second = make(redis_server), make(redis_server)
    before = await first.acquire(TENANT, "p")
    redis_server.restart()  # no persistence: the counter starts again
    assert await second.ping()
    after = await second.acquire(TENANT, "p")
    assert isinstance(before, Lease) and isinstance(after, Lease) and before.token == after.token
    assert await first.complete(before, record_for(hash_chain(history(2), TENANT), 1)) is False  # owner differs
    await first.close()
    await second.close()


# --- outages -------------------------------------------------------------------------------------------------

async def test_killed_redis_fails_fast_and_is_reported_not_raised(
        redis_server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:  # noqa: F811
    errors, health = Errors(), list[bool]()
    store = make(redis_server, on_error=errors, on_health=health.append, timeout_seconds=0.5)
    chain = hash_chain(history(4), TENANT)
    await store.put(TENANT, record_for(chain, 2))
    redis_server.kill()
    caplog.set_level(logging.WARNING, logger="proxy.redis_store")
    started = time.monotonic()
    for _ in range(20):
        assert await store.get(TENANT, chain[1]) is None
        assert await store.longest_match(TENANT, chain) is None
        await store.put(TENANT, record_for(chain, 3))
        with pytest.raises(StoreUnavailable):
            await store.acquire(TENANT, chain[2])
    assert time.monotonic() - started < 5  # 80 calls, each failing at once (and the first within the timeout)
    assert await store.ping() is False
    assert not store.healthy and store.status()["reachable"] is False and "last_error" in store.status()
    assert health == [False]
    assert errors["get"] == 20 and errors["lookup"] == 20 and errors["put"] == 20 and errors["acquire"] == 20
    assert sum("serving without summary reuse" in record.getMessage() for record in caplog.records) == 1
    assert len(caplog.records) <= 5  # rate-limited, not one line per failure
    await store.close()


async def test_restarted_redis_is_used_again_by_the_same_store(
        redis_server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:  # noqa: F811
    health: list[bool] = []
    store = make(redis_server, on_health=health.append)
    chain = hash_chain(history(3), TENANT)
    await store.put(TENANT, record_for(chain, 1))
    redis_server.kill()
    assert await store.get(TENANT, chain[0]) is None
    redis_server.start()
    caplog.set_level(logging.WARNING, logger="proxy.redis_store")
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not store.healthy:  # no ping: the back-off's probe reconnects
        await store.put(TENANT, record_for(chain, 2))
        await asyncio.sleep(0.05)
    assert store.healthy and health == [False, True]
    await store.put(TENANT, record_for(chain, 2))
    assert await store.longest_match(TENANT, chain) == record_for(chain, 2)
    assert await store.ping() is True
    assert any("reachable again" in record.getMessage() for record in caplog.records)
    await store.close()


async def test_ping_probes_even_while_backing_off(redis_server: RedisServer) -> None:  # noqa: F811
    store = make(redis_server, retry_delays=(60.0, 60.0))
    redis_server.kill()
    assert await store.ping() is False
    redis_server.start()
    assert await store.ping() is True
    assert await store.acquire(TENANT, "p") is not None
    await store.close()


async def test_a_closed_store_answers_nothing_and_raises_nothing(store: RedisStore) -> None:
    await store.close()
    assert await store.get(TENANT, "p") is None
    assert await store.ping() is False
    assert await store.wait(TENANT, "p", "holder", 1) == "closed"
    with pytest.raises(StoreUnavailable):
        await store.acquire(TENANT, "p")


# --- secrets -------------------------------------------------------------------------------------------------

async def test_password_in_the_url_works_and_is_never_shown(
        secured_redis: RedisServer, caplog: pytest.LogCaptureFixture) -> None:  # noqa: F811
    caplog.set_level(logging.DEBUG)
    url = f"redis://:{PASSWORD}@127.0.0.1:{secured_redis.port}/0"
    store = make(secured_redis, url=url)
    chain = hash_chain(history(3), TENANT)
    await store.put(TENANT, record_for(chain, 2))
    assert await store.get(TENANT, chain[1]) == record_for(chain, 2)
    secured_redis.kill()
    assert await store.get(TENANT, chain[1]) is None
    assert await store.ping() is False
    shown = [repr(store), str(store), store.url, str(store.status()), caplog.text]
    assert all(PASSWORD not in text for text in shown)
    assert store.url == f"redis://:***@127.0.0.1:{secured_redis.port}/0"
    await store.close()


async def test_a_wrong_password_is_unhealthy_and_not_shown(
        secured_redis: RedisServer, caplog: pytest.LogCaptureFixture) -> None:  # noqa: F811
    caplog.set_level(logging.DEBUG)
    store = make(secured_redis, password="not-" + PASSWORD)
    assert await store.ping() is False
    assert await store.get(TENANT, "p") is None
    assert PASSWORD not in caplog.text and "not-" + PASSWORD not in caplog.text
    await store.close()


async def test_acl_user_and_password_come_from_the_environment(secured_redis: RedisServer) -> None:  # noqa: F811
    tree = {"store": {"kind": "redis", "url": "${REDIS_URL}", "username": "${REDIS_USERNAME:-}",
                      "password": "${REDIS_PASSWORD:-}"}}
    env = {"REDIS_URL": secured_redis.url, "REDIS_USERNAME": "proxy", "REDIS_PASSWORD": PASSWORD + "-acl"}
    settings = settings_from_mapping(tree, env=env)
    assert PASSWORD not in repr(settings) and PASSWORD not in str(settings.model_dump(mode="json"))
    store = open_store(settings.store)
    assert isinstance(store, RedisStore)
    chain = hash_chain(history(2), TENANT)
    await store.put(TENANT, record_for(chain, 1))
    assert await store.get(TENANT, chain[0]) == record_for(chain, 1)
    assert await store.ping() is True
    await store.close()


@pytest.mark.parametrize(("url", "shown"), [
    ("redis://localhost:6379/0", "redis://localhost:6379/0"),
    ("redis://:pw@localhost:6379/0", "redis://:***@localhost:6379/0"),
    ("rediss://user:p%40ss@cache.internal:6380/2", "rediss://user:***@cache.internal:6380/2"),
    ("redis://user@localhost", "redis://user@localhost"),
    ("redis://localhost/0?password=pw&db=1", "redis://localhost/0?password=***&db=1"),
    ("unix://:pw@/run/redis.sock?db=0", "unix://:***@/run/redis.sock?db=0"),
])
def test_mask_url(url: str, shown: str) -> None:
    assert mask_url(url) == shown


# --- config --------------------------------------------------------------------------------------------------

def test_open_store_builds_a_redis_store_from_config() -> None:
    config = StoreConfig(kind="redis", url="redis://127.0.0.1:1/0", key_prefix="x:", lock_ttl_seconds=2)
    store = open_store(config)
    assert isinstance(store, RedisStore) and store.lock_ttl_seconds == 2 and "127.0.0.1:1" in repr(store)


@pytest.mark.parametrize(("store", "fragment"), [
    ({"kind": "redis"}, "kind 'redis' needs a url"),
    ({"kind": "redis", "url": "${REDIS_URL:-}"}, "kind 'redis' needs a url"),
    ({"kind": "redis", "url": "http://cache:6379"}, "store.url: Value error, must start with redis://"),
    ({"kind": "redis", "url": "redis://:a@cache", "password": "b"}, "in the url or in password, not both"),
    ({"kind": "redis", "url": "redis://cache", "max_value_bytes": 0}, "store.max_value_bytes"),
    ({"kind": "redis", "url": "redis://cache", "lock_ttl_seconds": 0}, "store.lock_ttl_seconds"),
    ({"kind": "redis", "url": "redis://cache", "timeout_seconds": 0}, "store.timeout_seconds"),
])
def test_redis_store_config_is_validated(store: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ConfigError) as caught:
        settings_from_mapping({"store": store}, env={})
    assert fragment in str(caught.value)


def test_blank_credentials_from_an_unset_environment_are_none() -> None:
    store = settings_from_mapping({"store": {"kind": "redis", "url": "redis://cache:6379/0",
                                             "username": "${U:-}", "password": "${P:-}"}}, env={}).store
    assert store.username is None and store.password is None
    assert store.model_dump(mode="json")["url"] == "**********"
