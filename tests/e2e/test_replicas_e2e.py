"""Two proxy processes sharing one real redis-server: reuse across replicas, one summary, takeover, Redis outages."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import openai
import pytest
import redis.asyncio as aioredis
from aiohttp import web

from proxy.app import RunningServer
from proxy.store.store import CompactedPrefix
from tests.conftest import ProxyFactory
from tests.fakes.openai_upstream import FakeUpstream
from tests.fakes.summariser_requests import is_summarizer_request
from tests.fakes.windowed import Received, WindowedModel
from tests.redis_server import RedisServer, redis_server  # noqa: F401  (fixture)
from tests.replicas import ProxyProcess, ReplicaFactory, replicas  # noqa: F401  (fixture)
from tests.sdk import async_client

WINDOW = 8192
SYSTEM = {"role": "system", "content": "You keep a list of facts. Answer briefly."}
LOCK_TTL_SECONDS = 2.0  # how long a dead holder's lease outlives it (renewed every third of it while alive)
REQUEST_TIMEOUT_SECONDS = 20.0  # any one request of these tests; a hang fails the test instead of stalling it
RECOVERY_SECONDS = 15.0  # Redis back: the store's back-off (0.25 s doubling to 10 s) lets it in well before this


@dataclass
class Model(WindowedModel):
    """The windowed fake, able to hold the next summariser request open (as a slow summariser does) and to count
    tokens exactly as the proxy does (so calibration stays at 1 and runs with different histories compare)."""

    hold_next_summary: bool = False
    exact: bool = False
    holding: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)

    def prompt_tokens(self, body: dict[str, Any]) -> int:
        return self.counter.count_request(body) if self.exact else super().prompt_tokens(body)

    async def __call__(self, request: web.Request, body: dict[str, Any],
                       state: FakeUpstream) -> web.StreamResponse:
        if self.hold_next_summary and is_summarizer_request(body.get("messages") or []):
            self.hold_next_summary = False
            self.received.append(Received(time.monotonic(), body, self.prompt_tokens(body), True))
            self.holding.set()
            await self.release.wait()
            return web.json_response({"error": {"message": "released", "type": "server_error"}}, status=503)
        return await super().__call__(request, body, state)


@pytest.fixture
async def model(fake: FakeUpstream) -> AsyncIterator[Model]:
    windowed = Model(window=WINDOW)
    fake.chat_hook = windowed
    yield windowed
    windowed.release.set()  # a held summariser request ends before the fake's server does


@pytest.fixture
async def raw_redis(redis_server: RedisServer) -> AsyncIterator[aioredis.Redis]:  # noqa: F811
    client = aioredis.from_url(redis_server.url)
    yield client
    await client.aclose()


ADMIN_KEY = "admin-key-replicas-81c5"  # an operator's: /readyz shows the store's details to it alone


def replica_config(fake: FakeUpstream, redis: RedisServer | None, **compaction: Any) -> dict[str, Any]:
    store: dict[str, Any] = {"kind": "memory"} if redis is None else {
        "kind": "redis", "url": redis.url, "lock_ttl_seconds": LOCK_TTL_SECONDS}
    return {"server": {"admin_keys": [ADMIN_KEY]}, "upstream": {"base_url": f"{fake.url}/v1"},
            "models": {"default": {"context_window": WINDOW}},
            # background off: a summary is built only when a request is over the threshold, never for the next turn
            "compaction": {"threshold": 0.8, "target": 0.5, "tail_budget": 0.25, "background": False, **compaction},
            "store": store, "logging": {"level": "INFO"}}


async def pair(replicas: ReplicaFactory, fake: FakeUpstream, redis: RedisServer,  # noqa: F811
               model: Model) -> tuple[ProxyProcess, ProxyProcess]:
    a, b = await asyncio.gather(replicas("A", replica_config(fake, redis)), replicas("B", replica_config(fake, redis)))
    for replica in (a, b):
        await calibrate(replica.url, model)
    return a, b


def turn(tag: str, index: int) -> dict[str, Any]:
    filler = " ".join(f"{tag}{index}x{n}" for n in range(60))
    return {"role": "user", "content": f"Remember FACT-{index}. {filler}"}


def conversation(tag: str, turns: int = 20) -> list[dict[str, Any]]:
    """A history over the threshold at 20 turns; each tag is a different conversation (a different hash chain)."""
    history: list[dict[str, Any]] = [SYSTEM]
    for index in range(turns):
        history += [turn(tag, index), {"role": "assistant", "content": f"Noted FACT-{index}. " + "ok " * 60}]
    return [*history, turn(tag, turns)]


@dataclass
class Reply:
    status: int
    compaction: str
    body: dict[str, Any]

    @property
    def message(self) -> dict[str, Any]:
        message: dict[str, Any] = self.body["choices"][0]["message"]
        return {key: value for key, value in message.items() if value is not None}


async def chat(base: str, messages: list[dict[str, Any]]) -> Reply:
    """One chat completion through the official SDK; any error status or broken connection raises."""
    client = async_client(base, timeout=REQUEST_TIMEOUT_SECONDS)
    try:
        raw = await client.chat.completions.with_raw_response.create(model="fake-small", messages=messages)
        return Reply(raw.status_code, raw.headers["x-compaction"], json.loads(raw.text))
    finally:
        await client.close()


async def calibrate(base: str, model: Model) -> None:
    """One small turn first, as every conversation has, so the replica learns how the upstream counts tokens."""
    await chat(base, conversation("calibration", 1))
    model.received.clear()


async def readiness(base: str) -> dict[str, Any]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        async with session.get(f"{base}/readyz", headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as response:
            assert response.status == 200, "a replica whose shared store is down stays in the load balancer"
            body: dict[str, Any] = await response.json()
            return body


async def stored_records(raw_redis: aioredis.Redis) -> list[CompactedPrefix]:
    keys = sorted([key async for key in raw_redis.scan_iter("compaction-proxy:r:*")])
    return [CompactedPrefix.from_json(await raw_redis.get(key)) for key in keys]


def forwarded(model: Model) -> list[dict[str, Any]]:
    """The messages of the last chat request (not a summary request) the upstream received."""
    messages: list[dict[str, Any]] = model.chat_calls[-1].body["messages"]
    return messages


# --- 1. built through A, reused through B ----------------------------------------------------------------------

async def test_a_summary_built_through_one_replica_is_reused_through_the_other(
        replicas: ReplicaFactory, fake: FakeUpstream, model: Model, redis_server: RedisServer,  # noqa: F811
        raw_redis: aioredis.Redis) -> None:
    a, b = await pair(replicas, fake, redis_server, model)
    history = conversation("reuse")
    built = await chat(a.url, history)
    assert built.compaction == "proactive" and len(model.summarizer_calls) == 1
    [record] = await stored_records(raw_redis)
    assert forwarded(model) == [*record.replacement, *history[record.prefix_len:]]

    model.received.clear()
    history += [built.message, turn("reuse", 21)]
    reused = await chat(b.url, history)
    assert reused.status == 200 and reused.compaction == "reused"
    assert model.summarizer_calls == [], "replica B called the summariser for a summary replica A had stored"
    # B sent A's summary in place of the prefix it covers, and everything after it verbatim.
    assert forwarded(model) == [*record.replacement, *history[record.prefix_len:]]
    assert len(forwarded(model)) < len(history)
    assert reused.message["content"].startswith("Noted: Remember FACT-21.")


# --- 2. one summary for twenty concurrent requests on two replicas ---------------------------------------------

async def test_twenty_concurrent_requests_over_two_replicas_make_one_summary(
        replicas: ReplicaFactory, fake: FakeUpstream, model: Model, redis_server: RedisServer,  # noqa: F811
        raw_redis: aioredis.Redis) -> None:
    a, b = await pair(replicas, fake, redis_server, model)
    model.summary_delay = 0.5  # every request arrives while the one summary is being built
    history = conversation("crowd")
    results = await asyncio.wait_for(asyncio.gather(*(chat((a, b)[i % 2].url, history) for i in range(20))),
                                     REQUEST_TIMEOUT_SECONDS)
    assert [result.status for result in results] == [200] * 20
    assert len(model.summarizer_calls) == 1, f"{len(model.summarizer_calls)} summaries for one history"
    # The summary's builder and those that joined it say proactive; those that found it in flight through the
    # other replica's lookup waited for it and say reused.
    assert {result.compaction for result in results} <= {"proactive", "reused"}
    [record] = await stored_records(raw_redis)
    expected = [*record.replacement, *history[record.prefix_len:]]
    assert len(model.chat_calls) == 20 and all(call.body["messages"] == expected for call in model.chat_calls)
    assert {json.dumps(result.body, sort_keys=True) for result in results} == {json.dumps(results[0].body,
                                                                                          sort_keys=True)}
    assert int(await raw_redis.get("compaction-proxy:fence")) == 1, "more than one lease was granted"


# --- 3. the holder dies mid-summary ------------------------------------------------------------------------------

@pytest.mark.parametrize("waiting", [True, False], ids=["request-waiting-on-B", "request-after-the-kill"])
async def test_a_holder_killed_mid_summary_is_taken_over_by_the_other_replica(
        waiting: bool, replicas: ReplicaFactory, fake: FakeUpstream, model: Model,  # noqa: F811
        redis_server: RedisServer, raw_redis: aioredis.Redis) -> None:  # noqa: F811
    a, b = await pair(replicas, fake, redis_server, model)
    history = conversation("takeover")
    model.hold_next_summary = True
    doomed = asyncio.create_task(chat(a.url, history))
    await asyncio.wait_for(model.holding.wait(), REQUEST_TIMEOUT_SECONDS)
    [lock] = [key async for key in raw_redis.scan_iter("compaction-proxy:l:*")]
    assert (await raw_redis.get(lock)).startswith(b"1:")  # A's lease, the first one granted
    survivor = asyncio.create_task(chat(b.url, history))
    if waiting:  # B's request waits for A's summary, past A's lease TTL since A renews it, and builds nothing
        await asyncio.sleep(LOCK_TTL_SECONDS + 0.5)
        assert not survivor.done() and len(model.received) == 1
    a.kill()
    killed_at = time.monotonic()
    lease_left = await raw_redis.pttl(lock) / 1000

    answer = await asyncio.wait_for(survivor, REQUEST_TIMEOUT_SECONDS)
    assert answer.status == 200 and answer.compaction == "proactive"
    assert answer.message["content"].startswith("Noted: Remember FACT-20.")
    held, new = model.summarizer_calls
    assert held.body["messages"] == new.body["messages"], "B summarised what A was summarising"
    # B did not build beside a live-looking lease: it waited for A's to expire, then took it over (token 2).
    assert new.at - killed_at >= lease_left - 0.05, (new.at - killed_at, lease_left)
    assert new.at - killed_at < LOCK_TTL_SECONDS + 5.0, "B took long to notice the lease had expired"
    assert int(await raw_redis.get("compaction-proxy:fence")) == 2
    assert not [key async for key in raw_redis.scan_iter("compaction-proxy:l:*")], "B's lease was not released"
    [record] = await stored_records(raw_redis)
    assert forwarded(model) == [*record.replacement, *history[record.prefix_len:]]
    with pytest.raises(openai.APIConnectionError):
        await doomed


# --- 4. Redis killed and restarted under two replicas --------------------------------------------------------------

async def test_replicas_serve_through_a_redis_outage_and_reuse_again_after_it(
        replicas: ReplicaFactory, fake: FakeUpstream, model: Model, redis_server: RedisServer,  # noqa: F811
        make_proxy: ProxyFactory) -> None:
    model.exact = True  # calibration stays at 1 on every replica, whatever each one forwarded before
    a, b = await pair(replicas, fake, redis_server, model)
    # Two replicas without Redis (each its own memory): what the same requests get when nothing is shared.
    alone: list[RunningServer] = [await make_proxy(replica_config(fake, None)) for _ in range(2)]
    for proxy in alone:
        await calibrate(proxy.url, model)
    turns = 24  # over the threshold with exact counting too

    history = conversation("before", turns)  # with Redis: shared as usual
    built = await chat(a.url, history)
    reused = await chat(b.url, [*history, built.message, turn("before", turns + 1)])
    assert (built.compaction, reused.compaction) == ("proactive", "reused")

    redis_server.kill()
    outage = conversation("outage", turns)
    follow_up = [*outage, {"role": "assistant", "content": "Noted: FACT-outage."}, turn("outage", turns + 1)]
    # A summarises the outage conversation, B its next turn, which it cannot find A's summary of.
    compactions = []
    for replica, reference, sent in ((a, alone[0], outage), (b, alone[1], follow_up)):
        for messages in (conversation("small", 1), sent):
            model.received.clear()
            seen = await chat(replica.url, messages)
            compactions.append(seen.compaction)
            with_redis_down = (model.summarizer_calls[:], forwarded(model))
            model.received.clear()
            expected = await chat(reference.url, messages)
            assert seen == expected, f"replica {replica.name} answered otherwise than a replica without Redis"
            assert [c.body for c in with_redis_down[0]] == [c.body for c in model.summarizer_calls]
            assert with_redis_down[1] == forwarded(model)
    assert compactions == ["none", "proactive", "none", "proactive"]  # B could not reuse A's: it summarised again
    for replica in (a, b):
        ready = await readiness(replica.url)
        assert (ready["status"], ready["store"], ready["store_detail"]["reachable"]) == ("degraded", "unreachable",
                                                                                         False)

    redis_server.start()  # the same port, empty (no persistence), as a restarted cache
    deadline = time.monotonic() + RECOVERY_SECONDS
    attempt = 0
    while True:  # traffic alone, no /readyz probe: each replica's store tries again when its back-off allows
        attempt += 1
        history = conversation(f"after{attempt}", turns)
        built = await chat(a.url, history)
        model.received.clear()
        again = await chat(b.url, [*history, built.message, turn(f"after{attempt}", turns + 1)])
        if again.compaction == "reused":
            break
        assert time.monotonic() < deadline, f"no reuse within {RECOVERY_SECONDS}s of Redis coming back"
        await asyncio.sleep(0.2)
    assert model.summarizer_calls == []
    for replica in (a, b):
        ready = await readiness(replica.url)
        assert (ready["status"], ready["store"], ready["store_detail"]["reachable"]) == ("ready", "ok", True)
        assert replica.running
