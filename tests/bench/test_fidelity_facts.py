"""The fidelity benchmark's generator and grading, and that every planted fact reaches the summariser's input."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from bench.fidelity import header, parse_args, stale_counts, write_json
from bench.fidelity_drive import NEW_SUMMARY, drive, planted_by
from bench.fidelity_facts import (
    KINDS,
    SHAPES,
    STALE_SEP,
    Conversation,
    Fact,
    contains,
    drive_points,
    facts_in,
    generate,
    grade,
    message_text,
    request_text,
)
from bench.fidelity_report import aggregate, recall_table
from proxy.core.tokens import TokenCounter
from tests.conftest import ProxyFactory
from tests.fakes.openai_upstream import FakeUpstream
from tests.fakes.windowed import OPENAI_OVERFLOW, WindowedModel
from tests.sdk import async_client

SEEDS = range(1, 13)


def test_the_generator_is_deterministic_for_a_seed() -> None:
    first, again, other = generate(7), generate(7), generate(8)
    assert first.messages == again.messages and first.facts == again.facts
    assert first.messages != other.messages
    assert {fact.value for fact in first.facts}.isdisjoint({fact.value for fact in other.facts})


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("seed", SEEDS)
def test_every_fact_first_appears_where_it_is_said_to_be_planted(seed: int, shape: str) -> None:
    conversation = generate(seed, shape=shape)
    assert {fact.kind for fact in conversation.facts} >= set(KINDS)
    for fact in conversation.facts:
        assert contains(message_text(conversation.messages[fact.index]), fact.value), fact
        earlier = [index for index in range(fact.index) if contains(message_text(conversation.messages[index]),
                                                                     fact.value)]
        assert earlier == [], (fact, earlier)


@pytest.mark.parametrize("result_tokens", [0, 120, 400])
@pytest.mark.parametrize("seed", [1, 2, 5])
def test_grown_tool_results_keep_what_they_said_first_and_the_same_facts(seed: int, result_tokens: int) -> None:
    counter = TokenCounter()
    plain, grown = generate(seed, 3072, 2), generate(seed, 3072, 2, result_tokens=result_tokens)
    assert [fact.value for fact in grown.facts] == [fact.value for fact in plain.facts]
    results = [message["content"] for message in grown.messages if message["role"] == "tool"]
    if result_tokens == 0:
        assert grown.messages == plain.messages
        return
    assert all(counter.count_text(text) >= result_tokens for text in results if "LEDGER_PORT=" not in text)
    assert [text for text in results if "LEDGER_PORT=" in text] == [  # a settings file prints nothing else
        message["content"] for message in plain.messages if "LEDGER_PORT=" in str(message["content"])]
    assert all(counter.count_text(text) < result_tokens + 60 or "--- build log ---" not in text for text in results)
    added = [text.split("--- build log ---", 1)[1] for text in results if "--- build log ---" in text]
    assert added and all(int(number) < 2000 for text in added for number in re.findall(r"\d+", text))
    for fact in grown.facts:  # still planted where it is said to be, and nowhere before
        assert contains(message_text(grown.messages[fact.index]), fact.value), fact
        assert not any(contains(message_text(message), fact.value) for message in grown.messages[:fact.index])


def test_the_stages_arm_is_asked_for_not_run_by_default() -> None:
    assert "stages" not in parse_args([]).arms
    options = parse_args(["--arms", "proxy,stages", "--result-tokens", "300"])
    assert options.arms == ["proxy", "stages"] and options.result_tokens == 300
    assert options.stages_config["compaction"]["tool_results"]["summarize_pairs"]["enabled"] is True
    assert header(options, "m")["stages_config"] == options.stages_config
    with pytest.raises(SystemExit):
        parse_args(["--arms", "proxy,stage"])


@pytest.mark.parametrize("cycles", [1, 2, 3])
def test_facts_are_spread_over_the_conversation_and_tool_calls_are_answered(cycles: int) -> None:
    conversation = generate(3, window=1536, cycles=cycles)
    indices = [fact.index for fact in conversation.facts]
    assert indices == sorted(indices) and indices[-1] < len(conversation.messages) - 2
    calls = {call["id"] for message in conversation.messages for call in message.get("tool_calls") or ()}
    results = {message["tool_call_id"] for message in conversation.messages if message["role"] == "tool"}
    assert calls == results
    assert drive_points(conversation.messages)[-1] == len(conversation.messages) - 1


@pytest.mark.parametrize("window", [1536, 3072, 8192])
def test_the_front_shape_plants_every_fact_before_the_first_compaction(window: int) -> None:
    front, spread = generate(4, window, 3, shape="front"), generate(4, window, 3)
    count = TokenCounter().count_messages
    before = max(fact.index for fact in front.facts) + 1
    assert count(front.messages[:before]) < 0.72 * window, "the last fact is planted well under the 0.8 threshold"
    assert [f.key for f in front.facts] == [f.key for f in spread.facts] and front.facts != spread.facts
    assert abs(front.tokens - spread.tokens) < 0.05 * spread.tokens, "the same length, only the facts moved"
    spread_before = max(fact.index for fact in spread.facts) + 1
    assert count(spread.messages[:spread_before]) > 0.8 * window, "the spread shape plants after the first"


def test_an_unknown_shape_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown conversation shape 'middle'"):
        generate(1, shape="middle")


def test_overridden_decisions_are_graded_by_the_new_value_and_the_old_one_is_stale() -> None:
    fact = Fact("override", "overridden", "snapfmt_raven_7b7", "?", 9, stale="snapfmt_amber_7ef")
    assert grade("We use SNAPFMT_raven_7b7.", fact) == {"correct": True, "stale": False}
    assert grade("snapfmt_amber_7ef", fact) == {"correct": False, "stale": True}
    assert grade("no idea", fact) == {"correct": False, "stale": False}


def test_the_decisions_shape_asks_for_current_values_and_knows_every_replaced_one() -> None:
    conversation = generate(3, window=3072, cycles=3, shape="decisions")
    facts = {fact.key: fact for fact in conversation.facts}
    assert {"prohibition", "people", "override2", "constraint"} <= set(facts) and "override" not in facts
    final = facts["override2"]
    first, second = (final.stale or "").split(STALE_SEP)
    assert grade(f"We use {final.value}.", final) == {"correct": True, "stale": False}
    for replaced in (first, second):
        assert grade(f"{replaced}, I think", final) == {"correct": False, "stale": True}
    people = facts["people"]
    assert grade(people.stale or "", people) == {"correct": False, "stale": True}  # the other, similar name



@pytest.mark.parametrize(("shape", "digest"), [("spread", "b9067b9d53918676"), ("front", "0f1d704fa89d0052")])
def test_the_other_shapes_are_what_they_were_for_a_seed(shape: str, digest: str) -> None:
    """The published fidelity runs stay reproducible: the decisions shape's values come from a generator of their
    own (these digests were taken before it was added)."""
    conversation = generate(3, window=3072, cycles=3, shape=shape)
    assert hashlib.sha256(json.dumps(conversation.to_json(), sort_keys=True).encode()).hexdigest()[:16] == digest


@pytest.mark.parametrize(("answer", "value", "expected"), [
    ("The error was `E4721:  checksum mismatch\nin shard 12`.", "E4721: checksum mismatch in shard 12", True),
    ("E4721: checksum mismatch in shard 1", "E4721: checksum mismatch in shard 12", False),
    ("port 48213.", "48213", True),
    ("port 148213", "48213", False),
    ("src/Billing/LEDGER_7f3a.py", "src/billing/ledger_7f3a.py", True),
])
def test_grading_is_an_exact_value_match(answer: str, value: str, expected: bool) -> None:
    assert contains(answer, value) is expected


def test_the_report_gives_recall_per_kind_and_arm_with_its_spread() -> None:
    probes = [{"replicate": r, "cycle": 1, "arm": arm, "kind": kind, "correct": correct}
              for r, arm, kind, correct in [(0, "proxy", "path", True), (0, "proxy", "number", False),
                                            (0, "proxy", "number", True), (1, "proxy", "path", False),
                                            (1, "proxy", "number", True), (0, "full", "path", True),
                                            (1, "full", "path", True)]]
    table = aggregate(probes)
    assert table[1]["proxy"]["path"] == {"mean": 0.5, "min": 0.0, "max": 1.0, "n": 2}
    assert table[1]["proxy"]["number"] == {"mean": 0.75, "min": 0.5, "max": 1.0, "n": 3}
    assert table[1]["proxy"]["overall"] == {"mean": pytest.approx((2 / 3 + 1 / 2) / 2), "min": 0.5,
                                            "max": pytest.approx(2 / 3), "n": 5}
    assert table[1]["full"]["overall"]["mean"] == 1.0
    assert "truncated" not in table[1]["proxy"]  # no probe says what truncation dropped


def test_the_report_compares_the_arms_on_the_facts_truncation_dropped() -> None:
    # The tail arm reads the facts still in its window: only on the others does it show what truncation loses.
    probes = [{"replicate": 0, "cycle": 3, "arm": arm, "kind": "number", "correct": correct, "truncated": dropped}
              for arm, correct, dropped in [("proxy", True, True), ("proxy", True, True), ("proxy", True, False),
                                            ("tail", False, True), ("tail", True, True), ("tail", True, False),
                                            ("full", True, True), ("full", True, True), ("full", True, False)]]
    table = aggregate(probes)
    assert table[3]["tail"]["overall"]["mean"] == pytest.approx(2 / 3)
    assert table[3]["tail"]["truncated"] == {"mean": 0.5, "min": 0.5, "max": 0.5, "n": 2}
    lines = recall_table(table, ["proxy", "full", "tail"])
    assert "| dropped by truncation | 1.00 (n 2) | 1.00 (n 2) | 0.50 (n 2) |" in lines
    assert any("proxy/tail 1.50" in line and "on facts dropped by truncation proxy/full 1.00; "
               "on facts dropped by truncation proxy/tail 2.00" in line for line in lines)
    lost = [{**probe, "correct": False} if probe["arm"] == "tail" and probe["truncated"] else probe
            for probe in probes]
    assert any(line.endswith("on facts dropped by truncation proxy 1.00 vs tail 0.00")
               for line in recall_table(aggregate(lost), ["proxy", "full", "tail"]))


def test_the_report_counts_each_kind_of_wrong_value_apart() -> None:
    """A replaced decision, a forbidden value and a similar name are different failures: counted apart, per arm."""
    probes = [{"arm": arm, "key": key, "stale": stale} for arm, key, stale in [
        ("proxy", "override", False), ("proxy", "override2", True), ("full", "override2", False),
        ("proxy", "people", True), ("proxy", "people", True), ("full", "people", True),
        ("proxy", "path", True)]]  # no wrong value to give: not counted
    assert stale_counts(probes, ["proxy", "full"]) == ("a replaced value given as current: proxy 1, full 0; "
                                                      "the similarly named person: proxy 2, full 1")
    assert stale_counts([{"arm": "proxy", "key": "path", "stale": False}], ["proxy"]) == "none asked"


@dataclass
class FactSummariser:
    """A windowed fake whose summariser repeats every planted value of its input: a lossless summariser.

    Requests are told apart by their last message: a chat turn ends with what the client sent last, a summary
    request with the proxy's own instruction (whatever its layout).
    """

    window: int
    facts: list[Fact]
    # Summary requests longer than this share of a compaction's first one overflow, as on a server whose window
    # is a little smaller than the proxy believes: the proxy then goes down its tool-result removal ladder.
    shrink: float | None = None
    model: WindowedModel = field(init=False)
    last_sent: dict[str, Any] | None = None
    step: int = -1
    summaries: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    chats: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    firsts: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.model = WindowedModel(window=self.window)

    async def __call__(self, request: web.Request, body: dict[str, Any], state: FakeUpstream) -> web.StreamResponse:
        if body["messages"][-1] == self.last_sent:
            self.chats.append((self.step, body))
            return await self.model(request, body, state)
        prompt = self.model.prompt_tokens(body)
        first = self.firsts.setdefault(self.step, prompt)
        if prompt + int(body.get("max_tokens") or 0) > self.window or (self.shrink and prompt > self.shrink * first):
            overflow = json.dumps(OPENAI_OVERFLOW).replace("{window}", str(self.window)).replace("{prompt}",
                                                                                                str(prompt))
            return web.Response(status=400, text=overflow, content_type="application/json")
        self.summaries.append((self.step, body))
        kept = [fact.value for fact in self.facts if contains(request_text(body), fact.value)]
        summary = {"user_intent": ["fix the reconciliation tests"], "technical_concepts": kept}
        reply = f"<analysis>{len(kept)} facts.</analysis>\n```json\n{json.dumps(summary)}\n```"
        return web.json_response({"id": "chatcmpl-facts", "object": "chat.completion", "created": 1700000000,
                                  "model": body.get("model"), "choices": [{"index": 0, "finish_reason": "stop",
                                  "message": {"role": "assistant", "content": reply}}],
                                  "usage": {"prompt_tokens": prompt, "completion_tokens": 60,
                                            "total_tokens": prompt + 60}})


def lost_facts(conversation: Conversation, fake: FactSummariser, points: list[int]) -> list[str]:
    """Facts that reached neither a summariser request nor, verbatim, the compacted request of each compaction."""
    lost = []
    for point in points:
        facts = planted_by(conversation, point)
        forwarded = [body for step, body in fake.chats if step == point][-1]
        kept = [message for message in forwarded["messages"] if message in conversation.messages]
        summarised = "\n".join(request_text(body) for step, body in fake.summaries if step == point)
        for fact in facts:
            verbatim = conversation.messages[fact.index] in kept
            if not verbatim and fact.key not in facts_in(summarised, facts):
                lost.append(f"compaction at message {point}: {fact.key} ({fact.value}) not in the summariser input")
            if fact.key not in facts_in(request_text(forwarded), facts):
                lost.append(f"compaction at message {point}: {fact.key} ({fact.value}) not in the compacted request")
    return lost


async def run_through_proxy(fake: FakeUpstream, make_proxy: ProxyFactory, window: int,
                            shrink: float | None = None, layout: str = "transcript", shape: str = "spread") \
        -> tuple[Conversation, FactSummariser, list[int]]:
    conversation = generate(5, window=window, cycles=3, shape=shape)
    model = FactSummariser(window, conversation.facts, shrink)
    fake.chat_hook = model
    proxy = await make_proxy({"models": {"default": {"context_window": window}},
                              "upstream": {"discover_windows": False},
                              "compaction": {"background": False, "summarizer": {"temperature": 0, "layout": layout}}})
    client = async_client(proxy.url)

    def on_turn(point: int) -> None:
        model.step, model.last_sent = point, conversation.messages[point]

    points = [turn.point async for turn in drive(client, "fidelity", conversation, 3, on_turn)
              if turn.compaction in NEW_SUMMARY]
    return conversation, model, points


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("layout", ["transcript", "prefix"])
@pytest.mark.parametrize("window", [1024, 1536, 4096])
async def test_every_planted_fact_reaches_the_summariser_or_stays_verbatim(fake: FakeUpstream,
                                                                           make_proxy: ProxyFactory,
                                                                           window: int, layout: str,
                                                                           shape: str) -> None:
    conversation, model, points = await run_through_proxy(fake, make_proxy, window, layout=layout, shape=shape)
    assert len(points) == 3, "the conversation must compact three times"
    assert all(len([b for s, b in model.summaries if s == point]) >= 1 for point in points)
    assert lost_facts(conversation, model, points) == []


async def test_the_check_fails_when_the_summariser_input_loses_tool_results(fake: FakeUpstream,
                                                                           make_proxy: ProxyFactory) -> None:
    # The transcript layout: the ladder rewrites the transcript it sends (the prefix layout has no ladder rung
    # that keeps the conversation's own messages, so it is not the case this control exercises).
    conversation, model, points = await run_through_proxy(fake, make_proxy, 4096, shrink=0.9)
    assert len(points) == 3
    assert any("not in the summariser input" in problem for problem in lost_facts(conversation, model, points))


def test_a_run_stopped_early_records_the_seeds_it_ran(tmp_path: Any) -> None:
    options = parse_args(["--replicates", "3", "--seed", "7"])
    replicate = {"seed": 7, "seconds": 1.0, "probes": [], "summaries": [], "failed_summaries": []}
    path = tmp_path / "run.json"
    write_json(path, header(options, "qwen-1.5b"), [replicate])
    written = json.loads(path.read_text())
    assert (written["header"]["replicates"], written["header"]["seeds"]) == (1, [7])
    assert "1 replicate(s), seeds [7]" in written["report"][2]
