"""The journal's read API through real sockets: what a compaction recorded, who may read it, and its bounds."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from proxy.compaction.recorder import conversation_of
from proxy.core.tenants import journal_owner
from tests.conftest import ProxyFactory
from tests.e2e.test_compaction_e2e import WINDOW, big_history, compaction_config
from tests.fakes.agent import AgentModel, run_agent
from tests.fakes.hostile_summariser import HostileSummariser, Reply, answering
from tests.fakes.openai_upstream import FakeUpstream
from tests.fakes.windowed import WindowedModel
from tests.ports import free_port
from tests.redis_server import RedisServer, redis_server  # noqa: F401  (fixture)
from tests.replicas import ReplicaFactory, replicas  # noqa: F401  (fixture)
from tests.sdk import async_client

API = "/_proxy/api"
TENANT_HEADER = "x-tenant"
KEY = "sk-journal-owner-0123456789"
OTHER_KEY = "sk-journal-other-0123456789"
ADMIN_KEY = "admin-journal-0123456789"
PROXY_KEY = "proxy-journal-0123456789"


@pytest.fixture
def model(fake: FakeUpstream) -> WindowedModel:
    windowed = WindowedModel(window=WINDOW)
    fake.chat_hook = windowed
    return windowed


def journal_config(**server: Any) -> dict[str, Any]:
    return {**compaction_config(background=False),
            "server": {"tenant_header": TENANT_HEADER, "admin_keys": [ADMIN_KEY], **server}}


async def compacted(url: str, key: str = KEY, tenant: str | None = "acme", turns: int = 20,
                    extra: dict[str, str] | None = None) -> dict[str, str]:
    """A calibration turn, then one long conversation that compacts; the long answer's headers."""
    headers = {**({TENANT_HEADER: tenant} if tenant is not None else {}), **(extra or {})}
    client = async_client(url, api_key=key, default_headers=headers)
    try:
        await client.chat.completions.create(model="fake-small", messages=big_history(1))
        raw = await client.chat.completions.with_raw_response.create(model="fake-small",
                                                                     messages=big_history(turns))
        return dict(raw.headers)
    finally:
        await client.close()


async def read(url: str, path: str, headers: dict[str, str]) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.get(f"{url}{API}{path}", headers=headers) as response:
        text = await response.text()
        return response.status, json.loads(text) if text else None


def bearer(key: str, tenant: str | None = "acme") -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", **({TENANT_HEADER: tenant} if tenant is not None else {})}


async def settled(url: str, headers: dict[str, str], conversations: int = 1) -> list[dict[str, Any]]:
    """The caller's conversations once the journal's writes (tasks of their own) have landed."""
    for _ in range(100):
        status, body = await read(url, "/conversations", headers)
        assert status == 200, body
        if len(body["conversations"]) >= conversations and all(c["compactions"] for c in body["conversations"]):
            return list(body["conversations"])
        await asyncio.sleep(0.02)
    raise AssertionError(f"the journal never showed {conversations} compacted conversation(s): {body}")


async def test_a_compaction_is_recorded_with_its_summary_and_numbers(model: WindowedModel,
                                                                    make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy(journal_config())
    answer = await compacted(proxy.url)
    assert answer["x-compaction"] == "proactive"
    event_id = answer["x-compaction-id"]
    [listed] = await settled(proxy.url, bearer(KEY))
    assert listed["requests"] == 2 and listed["compactions"] == 1 and "owner" not in listed
    status, event = await read(proxy.url, f"/events/{event_id}", bearer(KEY))
    assert status == 200
    sent = model.chat_calls[-1].body["messages"]
    # The summary is what the model was sent in place of the early history, word for word.
    assert any(message["content"] == event["summary"] for message in sent)
    assert (event["kind"], event["outcome"], event["trigger"], event["dialect"]) == \
        ("summary", "applied", "proactive", "chat")
    assert event["window"] == WINDOW and 0 < event["threshold_tokens"] < WINDOW
    assert event["tokens_after"] < event["tokens_before"]
    assert event["replacement_tokens"] < event["replaced_tokens"]
    assert event["span"]["count"] > 10 and event["span"]["roles"]["user"] >= 5
    assert event["summarizer"]["calls"] == 1 and event["summarizer"]["completion_tokens"] > 0


async def test_the_conversation_has_one_point_per_request_and_the_compaction_marked(
        model: WindowedModel, make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy(journal_config())
    answer = await compacted(proxy.url)
    [listed] = await settled(proxy.url, bearer(KEY))
    owner = journal_owner(bearer(KEY), TENANT_HEADER)
    status, detail = await read(proxy.url, f"/conversations/{listed['id']}", bearer(KEY))
    assert status == 200 and detail["conversation"]["id"] == listed["id"]
    assert listed["id"] != conversation_of(owner, "")  # a conversation is named by its first message too
    first, second = detail["points"]
    assert (first["outcome"], first["event_id"]) == ("none", None)
    assert (second["outcome"], second["event_id"]) == ("proactive", answer["x-compaction-id"])
    assert second["tokens_before"] == int(answer["x-compaction-tokens-before"])
    assert second["tokens_after"] == int(answer["x-compaction-tokens-after"])
    assert [event["id"] for event in detail["events"]] == [answer["x-compaction-id"]]
    assert "summary" not in detail["events"][0] and detail["events"][0]["has_summary"] is True


# Every way the caller's headers could differ from the owner's, and whether the caller is the owner.
VARIANTS = [
    ("another key", bearer(OTHER_KEY), False),
    ("another tenant", bearer(KEY, "globex"), False),
    ("no tenant", bearer(KEY, None), False),
    ("a blank tenant", bearer(KEY, ""), False),
    ("the key as x-api-key", {"x-api-key": KEY, TENANT_HEADER: "acme"}, True),
    ("lower-case names and scheme", {"authorization": f"bearer {KEY}", "X-TENANT": "acme"}, True),
    ("spaces around the key", {"Authorization": f"Bearer   {KEY}  ", TENANT_HEADER: "acme"}, True),
    ("a prefix of the key", bearer(KEY[:-1]), False),
    ("the key and one more credential", {**bearer(KEY), "x-api-key": OTHER_KEY}, False),
    ("the tenant's value in another case", bearer(KEY, "ACME"), False),
    ("the key without a scheme", {"Authorization": KEY, TENANT_HEADER: "acme"}, True),
    ("the key under another scheme", {"Authorization": f"Basic {KEY}", TENANT_HEADER: "acme"}, False),
    ("the tenant header twice", {**bearer(KEY), "X-Tenant": "globex"}, False),
]


@pytest.mark.parametrize(("name", "headers", "owner"), VARIANTS, ids=[variant[0] for variant in VARIANTS])
async def test_a_caller_reads_only_its_own_tenant(model: WindowedModel, make_proxy: ProxyFactory, name: str,
                                                 headers: dict[str, str], owner: bool) -> None:
    proxy = await make_proxy(journal_config())
    event_id = (await compacted(proxy.url))["x-compaction-id"]
    [listed] = await settled(proxy.url, bearer(KEY))
    status, body = await read(proxy.url, "/conversations", headers)
    assert status == 200 and len(body["conversations"]) == (1 if owner else 0), name
    statuses = [(await read(proxy.url, path, headers))[0]
                for path in (f"/conversations/{listed['id']}", f"/events/{event_id}")]
    assert statuses == ([200, 200] if owner else [404, 404]), name


async def test_without_credentials_the_api_is_401_and_the_dashboard_asks_for_a_key(
        model: WindowedModel, make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy(journal_config())
    await compacted(proxy.url)
    for path in ("/conversations", "/events/abc", "/metrics"):
        status, body = await read(proxy.url, path, {TENANT_HEADER: "acme"})
        assert status == 401 and body["error"]["code"] == "invalid_api_key"
    async with aiohttp.ClientSession() as session, session.get(f"{proxy.url}/_proxy/dashboard/") as page:
        assert page.status == 200 and "default-src 'self'" in page.headers["Content-Security-Policy"]
        assert "<form" in await page.text()


async def test_an_operator_sees_every_tenant_and_no_secret_or_history_is_returned(
        model: WindowedModel, make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy(journal_config(api_keys=[PROXY_KEY]))
    headers = {"x-proxy-api-key": PROXY_KEY}
    await compacted(proxy.url, KEY, "acme", extra=headers)
    await compacted(proxy.url, OTHER_KEY, "globex", extra=headers)
    operator = {"Authorization": f"Bearer {ADMIN_KEY}"}
    listed = await settled(proxy.url, operator, conversations=2)
    assert len({conversation["owner"] for conversation in listed}) == 2
    texts, summaries = [], []
    for conversation in listed:
        status, detail = await read(proxy.url, f"/conversations/{conversation['id']}", operator)
        assert status == 200
        texts.append(json.dumps(detail))
        [event] = detail["events"]
        status, full = await read(proxy.url, f"/events/{event['id']}", operator)
        assert status == 200 and full["summary"]
        summaries.append(full.pop("summary"))
        texts.append(json.dumps(full))
    everything = "\n".join(texts)
    for secret in (KEY, OTHER_KEY, PROXY_KEY, ADMIN_KEY):
        assert secret not in everything and not any(secret in summary for summary in summaries)
    # The client's messages (their filler words) appear nowhere but in what the proxy wrote: the summary itself.
    assert "word" not in everything and "FACT-" not in everything
    # A tenant's caller must hold the proxy key too; the operator's key is no proxy key on /v1.
    status, _ = await read(proxy.url, "/conversations", bearer(KEY))
    assert status == 401
    status, body = await read(proxy.url, "/conversations", {**bearer(KEY), **headers})
    assert status == 200 and len(body["conversations"]) == 1 and body["operator"] is False


async def test_a_journal_at_its_limit_evicts_the_oldest_event_first(model: WindowedModel,
                                                                    make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy({**journal_config(), "journal": {"max_events": 2}})
    ids = []
    for tenant in ("one", "two", "three"):
        ids.append((await compacted(proxy.url, tenant=tenant))["x-compaction-id"])
        await asyncio.sleep(0.05)  # each write lands before the next: eviction is by age
    operator = {"Authorization": f"Bearer {ADMIN_KEY}"}
    await settled(proxy.url, operator, conversations=3)
    found = [(await read(proxy.url, f"/events/{event_id}", operator))[0] for event_id in ids]
    assert found == [404, 200, 200]


async def test_points_per_conversation_keep_the_newest(model: WindowedModel, make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy({**journal_config(), "journal": {"max_points": 2}})
    client = async_client(proxy.url, api_key=KEY, default_headers={TENANT_HEADER: "acme"})
    for turns in (1, 2, 3, 4):
        await client.chat.completions.create(model="fake-small", messages=big_history(turns))
    await client.close()
    for _ in range(100):
        _, body = await read(proxy.url, "/conversations", bearer(KEY))
        if body["conversations"] and body["conversations"][0]["requests"] == 4:
            break
        await asyncio.sleep(0.02)
    [listed] = body["conversations"]
    _, detail = await read(proxy.url, f"/conversations/{listed['id']}", bearer(KEY))
    befores = [point["tokens_before"] for point in detail["points"]]
    assert len(befores) == 2 and befores[0] < befores[1]  # turns 3 and 4, oldest first


async def test_concurrent_conversations_of_two_keys_stay_apart(model: WindowedModel,
                                                              make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy(journal_config())
    await asyncio.gather(*(compacted(proxy.url, key, tenant=f"t{index}")
                           for index in range(3) for key in (KEY, OTHER_KEY)))
    for key in (KEY, OTHER_KEY):
        for index in range(3):
            listed = await settled(proxy.url, bearer(key, f"t{index}"))
            assert len(listed) == 1


async def test_bad_ids_and_limits_are_answered_not_crashed(model: WindowedModel, make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy(journal_config())
    await compacted(proxy.url)
    for path in ("/events/not-hex", "/events/" + "a" * 65, "/conversations/%00", "/conversations/ABC"):
        status, _ = await read(proxy.url, path, bearer(KEY))
        assert status in ((400, 404) if "%00" in path else (404,)), path  # aiohttp refuses a NUL in a path itself
    for limit in ("abc", "-5", "100000"):
        status, body = await read(proxy.url, f"/conversations?limit={limit}", bearer(KEY))
        assert status == 200 and len(body["conversations"]) == 1


async def test_the_live_counters_follow_metrics(model: WindowedModel, make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy(journal_config())
    await compacted(proxy.url)
    status, counters = await read(proxy.url, "/metrics", bearer(KEY))
    assert status == 200
    assert counters["compactions"] == {"proactive": 1} and counters["failures"] == 0
    assert counters["requests"] >= 2 and counters["summarizer_seconds"]["count"] == 1


async def test_with_the_journal_off_nothing_is_recorded(model: WindowedModel, make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy({**journal_config(), "journal": {"enabled": False}})
    answer = await compacted(proxy.url)
    assert answer["x-compaction"] == "proactive" and "x-compaction-id" not in answer
    status, body = await read(proxy.url, "/conversations", bearer(KEY))
    assert status == 404 and "journal.enabled" in body["error"]["message"]


@pytest.mark.parametrize("journal", [True, False], ids=["journal on", "journal off"])
async def test_a_failed_summary_is_named_on_the_answer_it_failed(journal: bool, fake: FakeUpstream,
                                                                 make_proxy: ProxyFactory) -> None:
    summariser = HostileSummariser(WindowedModel(window=WINDOW), answering(""))  # an empty summary is none
    fake.chat_hook = summariser
    proxy = await make_proxy({**journal_config(), "journal": {"enabled": journal}})
    answer = await compacted(proxy.url)
    assert answer["x-compaction"] == "failed"
    if not journal:
        assert "x-compaction-id" not in answer
        return
    status, event = await read(proxy.url, f"/events/{answer['x-compaction-id']}", bearer(KEY))
    assert status == 200, event
    assert (event["kind"], event["outcome"], event["trigger"]) == ("summary", "failed", "proactive")
    assert event["reason"] and event["summarizer"]["calls"] >= 1
    [listed] = await settled_requests(proxy.url, bearer(KEY), 2)
    assert listed["requests"] == 2


def slowly(reply: Reply, seconds: float) -> Reply:
    """`reply`, after `seconds`: long enough for a second request to join the summary in flight."""
    async def delayed(request: web.Request, body: dict[str, Any], fake: HostileSummariser) -> web.StreamResponse:
        await asyncio.sleep(seconds)
        return await reply(request, body, fake)
    return delayed


async def test_requests_that_waited_on_one_failed_summary_all_name_its_event(fake: FakeUpstream,
                                                                           make_proxy: ProxyFactory) -> None:
    summariser = HostileSummariser(WindowedModel(window=WINDOW), slowly(answering(""), 2.0))
    fake.chat_hook = summariser
    proxy = await make_proxy(journal_config())
    client = async_client(proxy.url, api_key=KEY, default_headers={TENANT_HEADER: "acme"})
    try:
        await client.chat.completions.create(model="fake-small", messages=big_history(1))
        answers = await asyncio.gather(*(client.chat.completions.with_raw_response.create(
            model="fake-small", messages=big_history(20)) for _ in range(2)))
    finally:
        await client.close()
    # The second waited on the first's summary (in flight when it arrived) and was then skipped by the back-off
    # that failure began, or joined the flight itself: either way it names the one failure.
    assert [answer.headers["x-compaction"] for answer in answers] == ["failed", "failed"]
    assert {answer.headers.get("x-compaction-id") for answer in answers} == {answers[0].headers["x-compaction-id"]}
    assert sum(received.summarizer for received in summariser.model.received) == 1  # one flight, not two
    status, event = await read(proxy.url, f"/events/{answers[0].headers['x-compaction-id']}", bearer(KEY))
    assert status == 200, event
    assert (event["kind"], event["outcome"]) == ("summary", "failed")


async def settled_requests(url: str, headers: dict[str, str], requests: int) -> list[dict[str, Any]]:
    """The caller's conversations once `requests` requests have landed in the journal."""
    for _ in range(100):
        status, body = await read(url, "/conversations", headers)
        assert status == 200, body
        if sum(conversation["requests"] for conversation in body["conversations"]) >= requests:
            return list(body["conversations"])
        await asyncio.sleep(0.02)
    raise AssertionError(f"the journal never showed {requests} requests: {body}")


async def test_an_agent_loop_records_its_clearings_as_stage_events(fake: FakeUpstream,
                                                                   make_proxy: ProxyFactory) -> None:
    fake.chat_hook = AgentModel(window=16_000)
    proxy = await make_proxy({"models": {"default": {"context_window": 16_000}}})
    run = await run_agent(async_client(proxy.url, api_key=KEY), 30, words=40)
    cleared = [headers for headers in run.headers if "x-compaction-cleared" in headers]
    assert cleared, "the loop never cleared: the test drives too little"
    for _ in range(100):
        _, body = await read(proxy.url, "/conversations", bearer(KEY, None))
        if body["conversations"] and body["conversations"][0]["requests"] == len(run.headers):
            break
        await asyncio.sleep(0.02)
    [listed] = body["conversations"]
    _, detail = await read(proxy.url, f"/conversations/{listed['id']}", bearer(KEY, None))
    clearings = [event for event in detail["events"] if event["kind"] == "clearing"]
    # One event for each request that cleared more than the one before it, and that request's header names it.
    told = {headers["x-compaction-id"] for headers in cleared if "x-compaction-id" in headers}
    assert clearings and {event["id"] for event in clearings} == told
    assert all(event["replaced_tokens"] > 0 and event["span"]["roles"]["tool"] > 0 for event in clearings)
    assert [point["cleared"] for point in detail["points"]] == \
        [int(headers.get("x-compaction-cleared", 0)) for headers in run.headers]


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
async def test_two_replicas_share_one_journal(kind: str, model: WindowedModel, fake: FakeUpstream,
                                              replicas: ReplicaFactory, redis_server: RedisServer,  # noqa: F811
                                              tmp_path: Path) -> None:
    """Two proxy processes on one store: a conversation compacted through one is read, whole, through the other."""
    store = {"kind": "redis", "url": redis_server.url} if kind == "redis" else \
        {"kind": "sqlite", "path": str(tmp_path / "shared.sqlite3")}
    config = {**journal_config(), "upstream": {"base_url": f"{fake.url}/v1"}, "store": store}
    a, b = await asyncio.gather(replicas("A", config), replicas("B", config))
    answer = await compacted(a.url)
    await compacted(b.url, tenant="globex")
    [listed] = await settled(b.url, bearer(KEY))
    assert listed["compactions"] == 1 and listed["requests"] == 2
    status, event = await read(b.url, f"/events/{answer['x-compaction-id']}", bearer(KEY))
    assert status == 200 and event["request_id"] == answer["x-request-id"]
    operator = {"Authorization": f"Bearer {ADMIN_KEY}"}
    assert len(await settled(a.url, operator, conversations=2)) == 2
    status, _ = await read(a.url, f"/events/{answer['x-compaction-id']}", bearer(KEY, "globex"))
    assert status == 404


async def test_a_journal_that_cannot_be_read_is_503_and_serving_goes_on(model: WindowedModel,
                                                                         make_proxy: ProxyFactory) -> None:
    unreachable = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens: the store and the journal are down
    proxy = await make_proxy({**journal_config(), "store": {"kind": "redis", "url": unreachable,
                                                            "timeout_seconds": 0.2}})
    answer = await compacted(proxy.url)
    assert answer["x-compaction"] == "proactive"  # a journal write that fails costs the request nothing
    status, body = await read(proxy.url, "/conversations", bearer(KEY))
    assert status == 503 and body["error"]["code"] == "journal_unavailable"
