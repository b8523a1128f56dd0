"""Property tests: whatever the summariser answers (any bytes, any JSON, any text, any length up to the bound and
past it), the client never gets a 5xx, the answer is never read past its bound, and a stored summary is valid text."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.app import RunningServer, start_server
from proxy.config import settings_from_mapping
from proxy.summarizer.model_client import reply_bound
from proxy.summarizer.summary import FIELD_NAMES
from tests.e2e.test_hostile_summariser import IN_FLIGHT_SLACK
from tests.fakes.hostile_summariser import ENDLESS_CAP, HostileSummariser, history
from tests.fakes.openai_upstream import FakeUpstream, FakeUpstreamApp
from tests.fakes.serving import serve_app
from tests.fakes.windowed import WindowedModel

T = TypeVar("T")
WINDOW = 8192
MAX_OUTPUT_TOKENS = 512  # a small ask keeps the bound (~80 KB) small enough to pass often
BOUND = reply_bound(MAX_OUTPUT_TOKENS)
PROPERTY = settings(max_examples=120, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example,
    HealthCheck.function_scoped_fixture])


@dataclass
class Answer:
    """One way the summariser answers: a status, a content type and a body (None: endless)."""

    status: int
    content_type: str
    body: bytes | None


@dataclass
class Scripted:
    """The summariser's answer for the example being run, and what it sent for it."""

    answer: Answer = field(default_factory=lambda: Answer(200, "application/json", b"{}"))
    sent: list[int] = field(default_factory=list)

    async def __call__(self, request: web.Request, body: dict[str, Any], fake: HostileSummariser) -> web.StreamResponse:
        answer = self.answer
        response = web.StreamResponse(status=answer.status, headers={"Content-Type": answer.content_type})
        await response.prepare(request)
        self.sent.append(0)
        piece = answer.body if answer.body is not None else b"a" * 65536
        try:
            while True:
                await response.write(piece)
                self.sent[-1] += len(piece)
                if answer.body is not None or self.sent[-1] >= ENDLESS_CAP:
                    break
            await response.write_eof()
        except (ConnectionError, RuntimeError):
            pass  # the proxy stopped reading
        return response


class BackgroundLoop:
    """An event loop in a thread of its own, serving the fake and the proxy while hypothesis drives examples from
    the test's thread (hypothesis runs a plain function per example)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, work: Coroutine[Any, Any, T], timeout: float = 120) -> T:
        return asyncio.run_coroutine_threadsafe(work, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


@dataclass
class Stack:
    loop: BackgroundLoop
    script: Scripted
    proxy: RunningServer
    store: Path
    tenant: int = 0


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    loop, script = BackgroundLoop(), Scripted()
    store = tmp_path_factory.mktemp("store") / "summaries.db"

    async def start() -> tuple[web.AppRunner, RunningServer]:
        state = FakeUpstream()
        state.chat_hook = HostileSummariser(WindowedModel(window=WINDOW), script)
        runner, url = await serve_app(FakeUpstreamApp(state).build())
        settings = settings_from_mapping({
            "upstream": {"base_url": f"{url}/v1"}, "models": {"default": {"context_window": WINDOW}},
            "store": {"kind": "sqlite", "path": str(store)},
            "compaction": {"threshold": 0, "background": False,
                           "summarizer": {"max_output_tokens": MAX_OUTPUT_TOKENS, "timeout": 30}}}, env={})
        return runner, await start_server(settings, host="127.0.0.1", port=0)

    runner, proxy = loop.run(start())
    yield Stack(loop, script, proxy, store)
    loop.run(proxy.stop())
    loop.run(runner.cleanup())
    loop.close()


def completion(content: Any, finish_reason: Any = "stop") -> bytes:
    return json.dumps({"id": "x", "object": "chat.completion", "choices": [
        {"index": 0, "finish_reason": finish_reason, "message": {"role": "assistant", "content": content}}]}).encode()


ANY_TEXT = st.text(st.characters(exclude_categories=()), max_size=2000)  # lone surrogates included
JSON_VALUE = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | ANY_TEXT,
                          lambda inner: st.lists(inner, max_size=6) | st.dictionaries(ANY_TEXT, inner, max_size=6),
                          max_leaves=40)
SUMMARY = st.dictionaries(st.sampled_from(FIELD_NAMES) | ANY_TEXT, JSON_VALUE, max_size=9).map(
    lambda fields: f"<analysis>x</analysis>\n```json\n{json.dumps(fields)}\n```")
SIZES = st.sampled_from([0, 1, 100, BOUND // 2, BOUND - 4096, BOUND + 1, 4 * BOUND, 5 * 1024 * 1024])
# Replies that pass for a summary (words enough, no loop) with anything inside: lone surrogates, control
# characters, markup; these are the ones that get stored.
PLAUSIBLE = st.builds(lambda inside, words: f"The user keeps a list of facts, FACT-0 first. {inside} {words}",
                      ANY_TEXT, st.lists(st.sampled_from(["notes", "each", "fact", "as", "it", "comes", "in", "order"]),
                                         min_size=8, max_size=40).map(" ".join))
PLAUSIBLE_SUMMARY = st.builds(
    lambda intent, inside: "```json\n" + json.dumps({"user_intent": [intent], "current_work": inside,
                                                      "user_messages": ["Remember FACT-0 and every later fact"]})
    + "\n```", PLAUSIBLE, ANY_TEXT)
ANSWERS = st.one_of(
    st.builds(Answer, st.just(200), st.just("application/json"), st.builds(completion, PLAUSIBLE | PLAUSIBLE_SUMMARY)),
    st.builds(Answer, st.just(200), st.just("application/json"), st.builds(completion, PLAUSIBLE | PLAUSIBLE_SUMMARY)),
    st.builds(Answer, st.just(200), st.just("application/json"), st.binary(max_size=4000)),
    st.builds(Answer, st.sampled_from([200, 400, 413, 429, 500, 503]), st.just("application/json"),
              st.builds(completion, ANY_TEXT | SUMMARY, st.sampled_from(["stop", "length", None, 7]))),
    st.builds(Answer, st.just(200), st.just("application/json"), st.builds(completion, JSON_VALUE)),
    st.builds(Answer, st.just(200), st.just("application/json"),
              SIZES.map(lambda size: completion("The user keeps a list of facts. " + "x" * size))),
    st.builds(Answer, st.just(200), st.sampled_from(["text/event-stream", "text/plain"]),
              st.binary(max_size=2000) | st.just(b'data: {"choices": []}\n\n' * 100)),
    st.builds(Answer, st.just(200), st.sampled_from(["application/json", "text/event-stream"]), st.none()),
)


async def chat(url: str, tenant: int) -> int:
    body = {"model": "fake-small", "messages": history(30)}
    headers = {"Authorization": f"Bearer sk-tenant-{tenant}"}  # a tenant per example: no reuse, no back-off between
    async with aiohttp.ClientSession() as session, session.post(
            f"{url}/v1/chat/completions", json=body, headers=headers) as response:
        await response.read()
        return response.status


def stored_summaries(path: Path) -> list[str]:
    """Every stored summary message's text, each decoded strictly: stored bytes that are not UTF-8 fail here."""
    if not path.exists():
        return []
    with sqlite3.connect(path) as connection:
        rows = connection.execute("SELECT CAST(record AS BLOB) FROM summaries").fetchall()
    texts = []
    for (raw,) in rows:
        record = json.loads(bytes(raw).decode("utf-8"))
        texts += [str(message["content"]) for message in record["replacement"] if message.get("role") == "user"]
    return texts


@PROPERTY
@given(answer=ANSWERS)
def test_no_summariser_answer_breaks_a_request(stack: Stack, answer: Answer) -> None:
    stack.script.answer, stack.script.sent, stack.tenant = answer, [], stack.tenant + 1
    status = stack.loop.run(chat(stack.proxy.url, stack.tenant))
    # The upstream's own refusal (400) when no summary could be made, its answer (200) when one was.
    assert status in (200, 400), status
    if answer.body is None:  # endless: what was sent before the proxy hung up is what it read, and socket buffers
        assert max(stack.script.sent, default=0) < BOUND + IN_FLIGHT_SLACK
    for text in stored_summaries(stack.store):
        text.encode("utf-8")  # strict: a summary that is not valid text never reaches the store
