"""Tool-round summaries against a real fake summariser over a socket, with a memory and a SQLite store: made in
the background, stored, swapped in on a later request only while the round matches exactly; hostile replies and
stores change nothing."""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from proxy.compaction.pair_summaries import RECORD_PREFIX, PairSummaries
from proxy.core.messages import Message
from proxy.core.pair_policy import PairSummaryPolicy
from proxy.core.tokens import TokenCounter
from proxy.core.tool_rounds import tool_rounds
from proxy.dialects import responses_items
from proxy.dialects.responses_items import view_of_input
from proxy.metrics import Metrics
from proxy.store.sqlite_store import SqliteStore
from proxy.store.store import CompactedPrefix, MemoryStore, SummaryStore
from proxy.summarizer.model_client import ModelClient
from proxy.summarizer.templates import Templates
from proxy.upstream.upstream import Upstream
from tests.fakes.openai_upstream import FakeUpstream, completion

WINDOW = 8000
POLICY = PairSummaryPolicy(batch_size=10, keep_recent=2, cutoff=0.1, max_summary_tokens=48, min_result_tokens=32)
COUNTER = TokenCounter()
SECRET_WORD = "zebracorn"  # in every tool result: it must never reach a log line
_ROUND = re.compile(r"^## Round (\d+)$", re.MULTILINE)
_PATH = re.compile(r"/work/src/mod_\d+\.py")

Answer = Callable[[list[str]], str]


def faithful(sections: list[str]) -> str:
    """A good summariser: one short summary per round, quoting the path its result names."""
    return json.dumps([f"listed {' '.join(dict.fromkeys(_PATH.findall(section)))}: exit 0" for section in sections])


@dataclass
class Summariser:
    """The fake summariser behind the fake upstream's chat route: answers with `answer(round sections)`."""

    answer: Answer = faithful
    finish_reason: str = "stop"
    gate: asyncio.Event | None = None
    seen: list[dict[str, Any]] = field(default_factory=list)

    async def __call__(self, request: web.Request, body: dict[str, Any], state: FakeUpstream) -> web.Response:
        self.seen.append(body)
        if self.gate is not None:
            await self.gate.wait()
        prompt = body["messages"][-1]["content"]
        sections = _ROUND.split(prompt)[2::2]  # the text after each "## Round n" heading
        return web.json_response(completion(body, self.answer(sections), finish_reason=self.finish_reason))


@pytest.fixture
def summariser(fake: FakeUpstream) -> Summariser:
    server = Summariser()
    fake.chat_hook = server
    return server


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[SummaryStore]:
    made: SummaryStore = MemoryStore(1000, 3600) if request.param == "memory" \
        else SqliteStore(tmp_path / "summaries.db", 3600)
    yield made
    await made.close()


@dataclass
class Stage:
    """What a test builds PairSummaries from, so it can build a second one over the same store."""

    store: SummaryStore
    upstream: Upstream
    templates: Templates
    metrics: Metrics = field(default_factory=Metrics)

    def build(self, policy: PairSummaryPolicy = POLICY) -> PairSummaries:
        def model(name: str, headers: Any, max_tokens: int, whole: int) -> ModelClient:
            return ModelClient(self.upstream, name, headers, max_output_tokens=max_tokens, whole_output_tokens=whole,
                               context_window=None, timeout=10, structured_output="off",
                               estimate=COUNTER.count_messages)
        return PairSummaries(self.store, model, self.templates, COUNTER, self.metrics, policy)

    def sample(self, name: str, **labels: str) -> float:
        return self.metrics.registry.get_sample_value(name, labels) or 0.0


@pytest.fixture
def stage(store: SummaryStore, upstream: Upstream, summariser: Summariser, tmp_path: Path) -> Stage:
    return Stage(store, upstream, Templates(user_dir=tmp_path / "no-user-prompts"))


def output(index: int, lines: int = 6) -> str:
    return "\n".join([f"$ ls /work/src # {SECRET_WORD}", f"/work/src/mod_{index}.py"] +
                     [f"drwxr-xr-x  2 agent agent 4096 Jan {day % 28 + 1} notes_{day}.txt" for day in range(lines)])


def conversation(rounds: int, *, parallel_every: int = 4) -> list[Message]:
    """An agent's history: `rounds` tool rounds (every `parallel_every`-th one with two parallel calls)."""
    messages: list[Message] = [{"role": "system", "content": "You are a coding agent."},
                               {"role": "user", "content": "Tidy up /work/src."}]
    for index in range(rounds):
        ids = [f"call_{index}_a", f"call_{index}_b"] if index % parallel_every == parallel_every - 1 \
            else [f"call_{index}_a"]
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function",
             "function": {"name": "shell", "arguments": json.dumps({"cmd": f"ls /work/src # {index}"})}}
            for call_id in ids]})
        messages.extend({"role": "tool", "tool_call_id": call_id, "content": output(index * 10 + n)}
                        for n, call_id in enumerate(reversed(ids)))
    return messages


async def made(stage: Stage, messages: list[Message], namespace: str = "tenant") -> int:
    pairs = stage.build()
    task = pairs.start(messages, namespace, window=WINDOW, model="summariser", headers={})
    assert task is not None
    rounds: int = await task
    await pairs.close()
    return rounds


# --- made, stored, applied ------------------------------------------------------------------------------------

async def test_made_in_one_call_stored_and_applied_by_a_later_request(stage: Stage, summariser: Summariser) -> None:
    messages = conversation(12)
    rounds = tool_rounds(messages)
    assert await made(stage, messages) == 10  # a batch: the ten oldest of the twelve rounds

    assert len(summariser.seen) == 1
    body = summariser.seen[0]
    assert body["model"] == "summariser" and "response_format" not in body
    assert "/work/src/mod_0.py" in body["messages"][0]["content"]
    assert stage.sample("compaction_proxy_pair_summaries_total", outcome="made") == 10
    assert stage.sample("compaction_proxy_pair_summary_calls_total", result="ok") == 1
    assert stage.sample("compaction_proxy_pair_summary_tokens_total", kind="prompt") > 0
    record = await stage.store.get("tenant", RECORD_PREFIX + rounds[0].key)
    assert record is not None and record.replacement[0]["fingerprint"] == rounds[0].fingerprint

    later = [*messages, {"role": "user", "content": "and now?"}]
    swapped = await stage.build().applied(later, "tenant")  # a new instance: it knows only what the store holds
    assert swapped.applied == 10 and swapped.mismatches == 0 and swapped.tokens_freed > 0
    sent = swapped.messages
    first = sent[rounds[0].result_indices[0]]
    assert first["tool_call_id"] == "call_0_a" and first["content"].startswith(
        "[Summary of this round's tool results (shell)")
    assert "/work/src/mod_0.py" in first["content"]
    parallel = rounds[3]  # two calls answered together: one summary, then a pointer
    assert "/work/src/mod_31.py" in sent[parallel.result_indices[0]]["content"]
    assert "summarised with the other results of this round" in sent[parallel.result_indices[1]]["content"]
    assert [m.get("tool_call_id") for m in sent] == [m.get("tool_call_id") for m in later]
    assert swapped.indices == {i for r in rounds[:10] for i in r.result_indices}
    assert [i for i, m in enumerate(sent) if m is not later[i]] == sorted(swapped.indices)
    assert all(sent[i] is later[i] for r in rounds[10:] for i in r.result_indices)  # the recent rounds whole
    assert sum(COUNTER.count_each(later)) - sum(COUNTER.count_each(sent)) == swapped.tokens_freed
    assert stage.sample("compaction_proxy_pair_summaries_total", outcome="applied") == 10
    assert stage.sample("compaction_proxy_tool_result_tokens_freed_total", stage="pair_summaries") == \
        swapped.tokens_freed


async def test_a_summary_goes_with_the_error_lines_its_result_printed(stage: Stage) -> None:
    """The summariser may paraphrase an error; the lines a result reported go after its summary verbatim."""
    messages = conversation(12)
    first, parallel = tool_rounds(messages)[0], tool_rounds(messages)[3]
    error = "E   ReconcileError: E1464: duplicate journal key cd0e87"
    for index in (first.result_indices[0], parallel.result_indices[1]):
        messages[index] = {**messages[index], "content": messages[index]["content"] + f"\n{error}"}
    await made(stage, messages)
    swapped = await stage.build().applied(messages, "tenant")
    for index in (first.result_indices[0], parallel.result_indices[1]):  # a summary, and a pointer to one
        assert swapped.messages[index]["content"].startswith("[")
        assert swapped.messages[index]["content"].endswith(f"(The output reported `{error}`.)")
    assert "reported" not in swapped.messages[tool_rounds(messages)[1].result_indices[0]]["content"]
    assert sum(COUNTER.count_each(messages)) - sum(COUNTER.count_each(swapped.messages)) == swapped.tokens_freed


async def test_a_result_changed_by_one_byte_is_not_replaced(stage: Stage) -> None:
    messages = conversation(12)
    await made(stage, messages)
    changed = copy.deepcopy(messages)
    index = tool_rounds(messages)[1].result_indices[0]
    changed[index]["content"] = changed[index]["content"][:-1] + "Y"
    swapped = await stage.build().applied(changed, "tenant")
    assert swapped.applied == 9 and swapped.mismatches == 1
    assert swapped.messages[index] is changed[index]
    assert stage.sample("compaction_proxy_pair_summaries_total", outcome="mismatch") == 1


async def test_changed_arguments_are_a_mismatch_too(stage: Stage) -> None:
    messages = conversation(12)
    await made(stage, messages)
    changed = copy.deepcopy(messages)
    changed[2]["tool_calls"][0]["function"]["arguments"] = json.dumps({"cmd": "ls /work/src # 00"})
    swapped = await stage.build().applied(changed, "tenant")
    assert (swapped.applied, swapped.mismatches) == (9, 1)


@pytest.mark.parametrize(("within", "swapped_rounds"), [
    (None, list(range(10))),  # every old round that matches
    ("rounds 0-3", [0, 1, 2, 3]),  # only the rounds whose results all stand where clearing replaces
    ("round 3, one result of two", []),  # a parallel round half inside is left whole: one summary serves both
    ("nothing", []),
], ids=["all", "within", "half-a-round", "none"])
async def test_within_swaps_only_the_rounds_whose_results_all_stand_there(
        stage: Stage, within: str | None, swapped_rounds: list[int]) -> None:
    messages = conversation(12)
    await made(stage, messages)
    rounds = tool_rounds(messages)
    indices = {None: None, "rounds 0-3": {i for r in rounds[:4] for i in r.result_indices},
               "round 3, one result of two": {rounds[3].result_indices[0]}, "nothing": set()}[within]
    swapped = await stage.build().applied(messages, "tenant", within=indices)
    assert swapped.indices == {i for n in swapped_rounds for i in rounds[n].result_indices}
    assert swapped.applied == len(swapped_rounds)


async def test_rounds_passed_over_are_not_summarised(stage: Stage, summariser: Summariser) -> None:
    messages = conversation(12)
    passed = [call_id for r in tool_rounds(messages)[:3] for call_id in r.call_ids]
    pairs = stage.build()
    task = pairs.start(messages, "tenant", window=WINDOW, model="summariser", headers={}, passed=passed)
    assert task is not None and await task == 7  # the ten old rounds less the three passed over
    await pairs.close()
    assert "/work/src/mod_0.py" not in summariser.seen[0]["messages"][0]["content"]
    assert "/work/src/mod_30.py" in summariser.seen[0]["messages"][0]["content"]
    assert await stage.store.get("tenant", RECORD_PREFIX + tool_rounds(messages)[0].key) is None


async def test_another_tenant_sees_nothing(stage: Stage) -> None:
    messages = conversation(12)
    await made(stage, messages, namespace="one")
    swapped = await stage.build().applied(messages, "two")
    assert swapped.applied == 0 and swapped.messages is messages


async def test_a_responses_conversation_goes_back_as_items_with_the_summary(stage: Stage) -> None:
    items: list[Any] = [{"type": "message", "role": "user", "content": "Tidy up /work/src."}]
    for index in range(12):
        items += [{"type": "function_call", "call_id": f"c{index}", "name": "shell", "arguments": "{}"},
                  {"type": "function_call_output", "call_id": f"c{index}", "output": output(index)}]
    view = view_of_input(items)
    assert view is not None
    assert await made(stage, view.messages) == 10
    swapped = await stage.build().applied(view.messages, "tenant")
    sent = view.back(swapped.messages, responses_items.render)
    outputs = [item for item in sent if item.get("type") == "function_call_output"]
    assert [item["call_id"] for item in outputs] == [f"c{index}" for index in range(12)]
    assert all(item["output"].startswith("[Summary of this round") for item in outputs[:10])
    assert outputs[10:] == items[-3::2]  # the last two rounds as the client sent them


# --- what is never touched -------------------------------------------------------------------------------

async def test_the_current_round_is_never_summarised_nor_swapped(stage: Stage, summariser: Summariser) -> None:
    policy = replace(POLICY, keep_recent=0)
    messages = conversation(6)
    last = tool_rounds(messages)[-1]
    pairs = stage.build(policy)
    task = pairs.start(messages, "tenant", window=WINDOW, model="summariser", headers={})
    assert task is not None and await task == 5
    assert "/work/src/mod_50.py" not in summariser.seen[0]["messages"][0]["content"]
    assert await stage.store.get("tenant", RECORD_PREFIX + last.key) is None
    # Even a stored summary that matches it exactly is not used for the current round.
    forged = CompactedPrefix(RECORD_PREFIX + last.key, 1, ({"role": "tool", "content": "short",
                                                            "fingerprint": last.fingerprint},), 1, 1, "m", 0.0)
    await stage.store.put("tenant", forged)
    swapped = await stage.build(policy).applied(messages, "tenant")
    assert swapped.applied == 5 and swapped.messages[last.result_indices[0]] is messages[last.result_indices[0]]


async def test_forwarded_messages_are_not_summarised_again(stage: Stage, summariser: Summariser) -> None:
    """Given what was forwarded (summaries in place) rather than the client's messages, no summary of a summary is
    made: the rounds are recognised as swapped, by this process and by one that knows only the store."""
    messages = conversation(12)
    await made(stage, messages)
    eager = replace(POLICY, cutoff=0.001, min_result_tokens=0)  # anything unsummarised would be due
    pairs = stage.build(eager)
    forwarded = (await pairs.applied(messages, "tenant")).messages
    assert pairs.start(forwarded, "tenant", window=WINDOW, model="summariser", headers={}) is None
    fresh = stage.build(eager)
    task = fresh.start(forwarded, "tenant", window=WINDOW, model="summariser", headers={})
    assert task is not None and await task == 0  # its store lookups show the rounds swapped
    assert len(summariser.seen) == 1


async def test_rounds_that_share_their_call_ids_are_left_alone(stage: Stage, summariser: Summariser) -> None:
    """A client that numbers its calls afresh each turn ("call_0" every time) gives rounds one key: a record per
    key could not tell them apart, so none of them is summarised (nor swapped)."""
    messages = conversation(12, parallel_every=100)
    for message in messages:
        if message.get("tool_calls"):
            message["tool_calls"][0]["id"] = "call_0"
        elif message.get("role") == "tool":
            message["tool_call_id"] = "call_0"
    assert len({r.key for r in tool_rounds(messages)}) == 1
    pairs = stage.build()
    assert pairs.start(messages, "tenant", window=WINDOW, model="summariser", headers={}) is None
    assert (await pairs.applied(messages, "tenant")).messages is messages
    assert summariser.seen == []


async def test_below_the_cutoff_or_switched_off_nothing_starts(stage: Stage, summariser: Summariser) -> None:
    messages = conversation(12)
    assert stage.build().start(messages, "t", window=10**6, model="m", headers={}) is None  # a window that big
    off = stage.build(replace(POLICY, enabled=False))
    assert off.start(messages, "t", window=WINDOW, model="m", headers={}) is None
    assert (await off.applied(messages, "t")).messages is messages
    assert stage.build().start(conversation(2), "t", window=WINDOW, model="m", headers={}) is None
    assert summariser.seen == []


# --- hostile replies, hostile stores ----------------------------------------------------------------------

HOSTILE: dict[str, tuple[Answer, str]] = {
    "wrong count": (lambda sections: json.dumps(["one"] * (len(sections) - 1)), "wrong_count"),
    "empty strings": (lambda sections: json.dumps([""] + ["fine"] * (len(sections) - 1)), "empty_summary"),
    "blank string": (lambda sections: json.dumps(["   "] * len(sections)), "empty_summary"),
    "not strings": (lambda sections: json.dumps([{"s": 1}] * len(sections)), "empty_summary"),
    "not JSON": (lambda sections: "[Here are your summaries: one, two]", "not_json"),
    "no list": (lambda sections: "I summarised them all.", "not_a_list"),
    "an object": (lambda sections: json.dumps({"summary": "x"}), "not_a_list"),
    "a huge string": (lambda sections: json.dumps(["x" * 400_000] * len(sections)), ""),  # past the reply bound
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
async def test_a_hostile_reply_stores_nothing(name: str, stage: Stage, summariser: Summariser,
                                              caplog: pytest.LogCaptureFixture) -> None:
    summariser.answer, reason = HOSTILE[name]
    messages = conversation(12)
    with caplog.at_level(logging.INFO, logger="proxy"):
        assert await made(stage, messages) == 0
    assert (await stage.build().applied(messages, "tenant")).applied == 0
    assert stage.sample("compaction_proxy_pair_summaries_total", outcome="failed") == 10
    assert stage.sample("compaction_proxy_pair_summaries_total", outcome="made") == 0
    (line,) = [json.loads(r.getMessage()) for r in caplog.records if "pair_summaries_failed" in r.getMessage()]
    assert line["rounds"] == 10 and line["reason"] == (reason or None)
    assert line["error"] == ("BadReply" if reason else "SummarizerError")
    assert not any(SECRET_WORD in r.getMessage() or "mod_1.py" in r.getMessage() for r in caplog.records)


async def test_a_reply_cut_off_by_its_limit_stores_nothing(stage: Stage, summariser: Summariser) -> None:
    summariser.finish_reason = "length"
    assert await made(stage, conversation(12)) == 0
    assert stage.sample("compaction_proxy_pair_summaries_total", outcome="failed") == 10


async def test_a_long_summary_is_cut_and_one_no_shorter_than_its_results_is_left_whole(
        stage: Stage, summariser: Summariser) -> None:
    messages = conversation(12)
    rounds = tool_rounds(messages)
    small = rounds[0].result_indices[0]
    messages[small]["content"] = f"/work/src/mod_0.py {SECRET_WORD} " + "ok " * 30  # ~40 tokens of result

    def wordy(sections: list[str]) -> str:
        return json.dumps(["/work/src/mod_x.py " + "and more detail " * 200 for _ in sections])

    summariser.answer = wordy
    rounds = tool_rounds(messages)
    pairs = stage.build(replace(POLICY, cutoff=0.001))  # the round left whole would be due on its own
    task = pairs.start(messages, "tenant", window=WINDOW, model="summariser", headers={})
    assert task is not None and await task == 9
    assert await stage.store.get("tenant", RECORD_PREFIX + rounds[0].key) is None
    record = await stage.store.get("tenant", RECORD_PREFIX + rounds[1].key)
    assert record is not None
    summary = record.replacement[0]["content"]
    assert summary.endswith("…") and COUNTER.count_text(summary) <= POLICY.max_summary_tokens
    assert stage.sample("compaction_proxy_pair_summaries_total", outcome="failed") == 1
    # The round left whole is remembered: it is not sent to the summariser again.
    assert pairs.start(messages, "tenant", window=WINDOW, model="summariser", headers={}) is None
    assert len(summariser.seen) == 1
    await pairs.close()


@pytest.mark.parametrize("forge", [
    lambda r: CompactedPrefix("round:someone-else", 1, ({"role": "tool", "content": "s",
                                                         "fingerprint": r.fingerprint},), 1, 1, "m", 0.0),
    lambda r: CompactedPrefix(RECORD_PREFIX + r.key, 1, ({"role": "tool", "content": "s " * 5000,
                                                          "fingerprint": r.fingerprint},), 1, 1, "m", 0.0),
    lambda r: CompactedPrefix(RECORD_PREFIX + r.key, 1, ({"role": "tool", "content": ["s"],
                                                          "fingerprint": r.fingerprint},), 1, 1, "m", 0.0),
    lambda r: CompactedPrefix(RECORD_PREFIX + r.key, 1, ({"role": "tool", "content": "s"},), 1, 1, "m", 0.0),
    lambda r: CompactedPrefix(RECORD_PREFIX + r.key, 1, ({"role": "tool", "content": " ",
                                                          "fingerprint": r.fingerprint},), 1, 1, "m", 0.0),
    lambda r: CompactedPrefix(RECORD_PREFIX + r.key, 2, ({"content": "s", "fingerprint": r.fingerprint},) * 2,
                              1, 1, "m", 0.0),
], ids=["another key", "too long", "not text", "no fingerprint", "blank", "two messages"])
async def test_a_hostile_store_record_is_not_applied(forge: Any, stage: Stage) -> None:
    messages = conversation(6)
    target = tool_rounds(messages)[0]

    class Forged(MemoryStore):
        async def get(self, namespace: str, prefix_hash: str) -> CompactedPrefix | None:
            return forge(target) if prefix_hash == RECORD_PREFIX + target.key else None

    stage.store = Forged(10, 60)
    swapped = await stage.build().applied(messages, "tenant")
    assert swapped.applied == 0 and swapped.messages is messages


async def test_a_broken_store_is_counted_and_serving_goes_on(stage: Stage, caplog: pytest.LogCaptureFixture) -> None:
    class Broken(MemoryStore):
        async def get(self, namespace: str, prefix_hash: str) -> CompactedPrefix | None:
            raise OSError("disk gone")

    stage.store = Broken(10, 60)
    messages = conversation(12)
    with caplog.at_level(logging.WARNING, logger="proxy.pair_summaries"):
        swapped = await stage.build().applied(messages, "tenant")
    assert swapped.messages is messages
    assert stage.sample("compaction_proxy_store_errors_total", operation="lookup") == 10
    assert len([r for r in caplog.records if "pair_summaries_store_failed" in r.getMessage()]) == 1


# --- one task per conversation, backoff, close ----------------------------------------------------------

async def test_concurrent_starts_make_one_summariser_call(stage: Stage, summariser: Summariser) -> None:
    summariser.gate = asyncio.Event()
    messages = conversation(12)
    pairs = stage.build()
    tasks = [pairs.start(history, "tenant", window=WINDOW, model="summariser", headers={})
             for history in (messages, messages, [*messages, {"role": "user", "content": "more"}], conversation(13))]
    assert tasks[0] is not None and all(task is tasks[0] for task in tasks)
    await asyncio.sleep(0.05)
    summariser.gate.set()
    assert await tasks[0] == 10
    assert len(summariser.seen) == 1
    # Another tenant's conversation is its own flight.
    other = pairs.start(messages, "other", window=WINDOW, model="summariser", headers={})
    assert other is not None and other is not tasks[0] and await other == 10
    # Once made, the same conversation has nothing more due.
    assert pairs.start(messages, "tenant", window=WINDOW, model="summariser", headers={}) is None
    assert len(summariser.seen) == 2
    await pairs.close()


async def test_a_failed_batch_backs_the_conversation_off(stage: Stage, summariser: Summariser) -> None:
    summariser.answer = HOSTILE["not JSON"][0]
    messages = conversation(12)
    pairs = stage.build()
    first = pairs.start(messages, "tenant", window=WINDOW, model="summariser", headers={})
    assert first is not None and await first == 0
    assert pairs.start(messages, "tenant", window=WINDOW, model="summariser", headers={}) is None  # skipped once
    summariser.answer = faithful
    again = pairs.start(messages, "tenant", window=WINDOW, model="summariser", headers={})
    assert again is not None and await again == 10
    assert len(summariser.seen) == 2
    await pairs.close()


async def test_close_cancels_a_running_batch(stage: Stage, summariser: Summariser) -> None:
    summariser.gate = asyncio.Event()  # never set: the summariser never answers
    messages = conversation(12)
    pairs = stage.build()
    task = pairs.start(messages, "tenant", window=WINDOW, model="summariser", headers={})
    assert task is not None
    for _ in range(100):
        if summariser.seen:
            break
        await asyncio.sleep(0.01)
    await asyncio.wait_for(pairs.close(), 5)
    assert task.cancelled()
    assert (await stage.build().applied(messages, "tenant")).applied == 0
    assert stage.sample("compaction_proxy_pair_summaries_total", outcome="failed") == 0
    summariser.gate.set()  # the fake's handler ends, so the fake's server stops at once


async def test_a_model_policy_shares_what_is_known_and_running(stage: Stage, summariser: Summariser) -> None:
    summariser.gate = asyncio.Event()
    pairs = stage.build()
    assert pairs.under(POLICY) is pairs
    own = pairs.under(replace(POLICY, keep_recent=3))
    task = own.start(conversation(12), "tenant", window=WINDOW, model="summariser", headers={})
    assert task is not None
    assert pairs.start(conversation(12), "tenant", window=WINDOW, model="summariser", headers={}) is task
    await asyncio.wait_for(pairs.close(), 5)
    assert task.cancelled()
    summariser.gate.set()


