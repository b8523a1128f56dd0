"""The proxy in front of a real llama.cpp server (SmolLM2-135M, n_ctx 2048), driven by the official openai SDK."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Awaitable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import openai
import pytest

from proxy.app import RunningServer, start_server
from proxy.config import settings_from_mapping
from tests.e2e_real.conversation import SYSTEM, TurnResult, ask, converse, long_history
from tests.e2e_real.model_server import LlamaServer, count_prompt_tokens
from tests.e2e_real.recorder import Exchange, Recorder
from tests.e2e_real.report import print_report, turn_lines
from tests.sdk import async_client

pytestmark = pytest.mark.real_model

PROMPTS_DIR = Path(__file__).resolve().parent / "prompts"
MAX_TOKENS = 48
ANSWERED = {"stop", "length"}
COMPACTION_HEADERS = {"none", "proactive", "reactive", "reused"}
COMPACTIONS_METRIC = re.compile(r'^compaction_proxy_compactions_total\{trigger="(\w+)"\} (\S+)$', re.MULTILINE)


@dataclass
class Rig:
    """Client -> proxy -> recording pass-through -> model server, all on loopback sockets."""

    proxy: RunningServer
    recorder: Recorder
    server: LlamaServer

    def client(self, api_key: str = "sk-real-model") -> openai.AsyncOpenAI:
        return async_client(self.proxy.url, api_key=api_key, timeout=600)


class RigFactory(Protocol):
    def __call__(self, compaction: dict[str, Any], *, recorded: bool = True) -> Awaitable[Rig]: ...


def proxy_config(upstream: str, n_ctx: int, compaction: dict[str, Any]) -> dict[str, Any]:
    return {"upstream": {"base_url": upstream, "idle_timeout": 600},
            "models": {"default": {"context_window": n_ctx}},
            # Greedy summaries, like the chat turns (conversation.py): every reply is a function of its request, so
            # a run repeats whatever ran before it, with no sampling seed involved. A cut-off reply is never
            # accepted as a summary; asked the one-sentence question of prompts/, this 135M model ends its reply
            # within 40 tokens, where a summary in five sentences made it loop to the limit (see compaction.md).
            "compaction": {"threshold": 0.8, "target": 0.5, "tail_budget": 0.25, "prompts_dir": str(PROMPTS_DIR),
                           # Plain replies: constrained output is measured by the fidelity benchmark, not here.
                           "summarizer": {"timeout": 300, "temperature": 0, "structured_output": "off",
                                          # This suite's prompts are written for the transcript layout.
                                          "layout": "transcript"},
                           **compaction}}


@pytest.fixture
async def start_rig(llama_server: LlamaServer) -> AsyncIterator[RigFactory]:
    async with AsyncExitStack() as stack:
        async def start(compaction: dict[str, Any], *, recorded: bool = True) -> Rig:
            """`recorded=False` points the proxy straight at the server; the recorder then sees nothing."""
            recorder = Recorder(llama_server.url)
            upstream = await stack.enter_async_context(recorder.serving()) if recorded else llama_server.base_url
            settings = settings_from_mapping(proxy_config(upstream, llama_server.n_ctx, compaction), env={})
            proxy = await start_server(settings, host="127.0.0.1", port=0)
            stack.push_async_callback(proxy.stop)
            return Rig(proxy, recorder, llama_server)

        yield start


async def measure(rig: Rig) -> None:
    """Fill in each request's prompt size as the server's tokenizer counts it; streams report no usage."""
    for exchange in rig.recorder.exchanges:
        if not exchange.is_chat or exchange.disconnected is not None:
            continue
        counted = await asyncio.to_thread(count_prompt_tokens, rig.server.url, exchange.request["messages"])
        reported = (exchange.usage or {}).get("prompt_tokens")
        if reported is not None:
            assert counted == reported, "the tokenizer count must match the server's own usage"
        exchange.prompt_tokens = counted


def assert_fits(exchange: Exchange, n_ctx: int) -> None:
    """The server took the request and had room for all the output it was asked for."""
    assert exchange.status == 200, (exchange.status, exchange.answer)
    assert exchange.prompt_tokens is not None
    assert exchange.prompt_tokens + (exchange.requested_output or 0) <= n_ctx, \
        (exchange.prompt_tokens, exchange.requested_output)
    if exchange.streamed:
        assert exchange.events, "an empty 200 stream is how this server says the prompt was too long"
    assert exchange.finish_reason in ANSWERED


def assert_summaries_complete(rig: Rig) -> None:
    """Every summary the proxy asked for was answered in full: a reply cut off by its output limit is no summary,
    and the turn that needed it would carry `x-compaction: failed`."""
    summaries = rig.recorder.summaries()
    cut_off = [(call.completion_tokens, call.requested_output) for call in summaries if call.finish_reason != "stop"]
    assert summaries and not cut_off, f"summariser replies cut off at their output limit: {cut_off}"


def assert_turns_answered(turns: list[TurnResult]) -> None:
    for turn in turns:
        assert turn.compaction in COMPACTION_HEADERS, turn
        assert turn.finish_reason in ANSWERED, turn
    assert sum(1 for turn in turns if turn.content.strip()) >= len(turns) - 1, "the model stopped answering"


def assert_forwarded_conversations(rig: Rig, turns: list[TurnResult], history: list[dict[str, Any]]) -> None:
    """One request per turn reached the server, each keeping the system message and the client's last message."""
    chats = rig.recorder.chats()
    assert len(chats) == len(turns)
    user_messages = [message for message in history if message["role"] == "user"]
    for chat, expected_last in zip(chats, user_messages, strict=True):
        assert chat.request["messages"][0] == SYSTEM
        assert chat.request["messages"][-1] == expected_last
        assert chat.request["max_tokens"] == MAX_TOKENS


async def compactions_by_trigger(rig: Rig) -> dict[str, int]:
    """Summaries the proxy built, by trigger, from its own /metrics."""
    async with aiohttp.ClientSession() as session, session.get(f"{rig.proxy.url}/metrics") as response:
        text = await response.text()
    counts: dict[str, int] = {}
    for match in COMPACTIONS_METRIC.finditer(text):
        counts[match.group(1)] = int(float(match.group(2)))
    return counts


async def full_history_tokens(rig: Rig, history: list[dict[str, Any]]) -> int:
    return await asyncio.to_thread(count_prompt_tokens, rig.server.url, history)


async def test_real_overflow_errors_trigger_reactive_compaction(start_rig: RigFactory) -> None:
    """Three clients send the same over-long history at once: each overflow is compacted away with one summary."""
    rig = await start_rig({"threshold": 0})
    history = long_history(turns=7, sentences=30, seed=11)
    client = rig.client()
    turns = await asyncio.gather(*(ask(client, history, index=index, stream=False, max_tokens=MAX_TOKENS)
                                   for index in range(3)))
    await measure(rig)
    print_report("reactive, three concurrent non-streaming requests", turns, rig.recorder, n_ctx=rig.server.n_ctx,
                 full_history_tokens=await full_history_tokens(rig, history))
    overflows = [chat for chat in rig.recorder.chats() if chat.status != 200]
    retries = [chat for chat in rig.recorder.chats() if chat.status == 200]
    assert len(overflows) == 3 and len(retries) == 3
    for overflow in overflows:
        assert overflow.status == 400 and overflow.error_code == "context_length_exceeded"
        assert "maximum context length is 2048 tokens" in str(overflow.answer)
        assert overflow.prompt_tokens is not None and overflow.prompt_tokens > rig.server.n_ctx
    for turn in turns:
        assert turn.compaction == "reactive" and turn.finish_reason in ANSWERED
        assert turn.tokens_before is not None and turn.tokens_after is not None
        assert turn.tokens_after < rig.server.n_ctx < turn.tokens_before
    for retry in retries:
        assert_fits(retry, rig.server.n_ctx)
        assert retry.request["messages"] == retries[0].request["messages"]
        assert retry.request["messages"][0] == SYSTEM and retry.request["messages"][-1] == history[-1]
    requests = [repr(call.request["messages"]) for call in rig.recorder.summaries()]
    assert requests and len(set(requests)) == len(requests), "the same summary was asked for twice"
    assert all(call.status == 200 for call in rig.recorder.summaries())
    assert_summaries_complete(rig)


async def test_real_empty_overflow_stream_triggers_reactive_compaction(start_rig: RigFactory) -> None:
    # Straight at the server: its connection handling is part of what is tested here.
    rig = await start_rig({"threshold": 0}, recorded=False)
    history = long_history(turns=7, sentences=30, seed=11)
    assert await full_history_tokens(rig, history) > rig.server.n_ctx
    turn = await ask(rig.client(), history, index=0, stream=True, max_tokens=MAX_TOKENS)
    print("\n=== reactive, streaming (no recorder) ===", *turn_lines([turn]), sep="\n")
    assert turn.compaction == "reactive", turn
    # Content at all proves the retry fitted: over its window this server streams nothing.
    assert turn.content.strip() and turn.finish_reason in ANSWERED
    assert turn.tokens_after is not None and turn.tokens_after < rig.server.n_ctx


@pytest.mark.parametrize(("stream", "turns", "times_window"), [(False, 17, 2.5), (True, 11, 1.6)],
                         ids=["non-streaming", "streaming"])
async def test_long_conversation_completes_every_turn(start_rig: RigFactory, stream: bool, turns: int,
                                                      times_window: float) -> None:
    rig = await start_rig({})
    results, history = await converse(rig.client(), turns, sentences=30, seed=5, stream=stream,
                                      max_tokens=MAX_TOKENS)
    await measure(rig)
    total = await full_history_tokens(rig, history)
    triggers = await compactions_by_trigger(rig)
    print_report(f"multi-turn, {'streaming' if stream else 'non-streaming'}", results, rig.recorder,
                 n_ctx=rig.server.n_ctx, full_history_tokens=total)
    print(f"summaries built, by trigger: {triggers}")
    assert total > times_window * rig.server.n_ctx
    assert_summaries_complete(rig)
    assert_turns_answered(results)
    assert_forwarded_conversations(rig, results, history)
    for exchange in rig.recorder.chats() + rig.recorder.summaries():
        assert_fits(exchange, rig.server.n_ctx)
    seen = {result.compaction for result in results}
    assert "reused" in seen, seen
    if stream:
        # This server reports no usage in streams (include_usage is ignored): only the estimate can act.
        assert "proactive" in seen and triggers.get("proactive", 0) >= 1, (seen, triggers)
    else:
        assert triggers.get("background", 0) >= 1, triggers
