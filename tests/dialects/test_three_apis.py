"""One journey for three APIs: a long agent loop in each, read into the neutral view, counted, indexed, planned and
spliced by the same core steps, goes back to its API valid, smaller, with the tail the client's own items."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from proxy.core.budget import Limits
from proxy.core.history_index import HistoryIndex
from proxy.core.messages import Message
from proxy.core.plan import plan_compaction, splice
from proxy.core.tokens import TokenCounter
from proxy.core.view import View
from proxy.dialects import messages_blocks, responses_items
from proxy.summarizer.transcript import format_transcript
from tests.dialects.test_messages_blocks import assert_valid
from tests.dialects.test_responses_items import problems

ROUNDS = 40
SECRET = "gAAAA-encrypted-reasoning-"  # opaque reasoning: must never reach a summariser, must travel verbatim
SUMMARY: Message = {"role": "user", "content": "<summary>the work so far</summary>"}
CONTINUATION: Message = {"role": "assistant", "content": "Understood; continuing from the summary."}


def listing(round_: int) -> str:
    return "\n".join(f"src/module_{round_}_{line}.py  {line * 37} bytes" for line in range(40))


def chat_loop() -> list[Any]:
    items: list[Any] = [{"role": "system", "content": "You are a coding agent."},
                        {"role": "user", "content": "Fix the failing test."}]
    for n in range(ROUNDS):
        items += [{"role": "assistant", "content": None, "reasoning_content": f"{SECRET}{n}",
                   "tool_calls": [{"id": f"c{n}", "type": "function",
                                   "function": {"name": "ls", "arguments": json.dumps({"dir": f"src/{n}"})}}]},
                  {"role": "tool", "tool_call_id": f"c{n}", "content": listing(n)}]
    return items


def responses_loop() -> list[Any]:
    items: list[Any] = [{"type": "message", "role": "user", "content": "Fix the failing test."}]
    for n in range(ROUNDS):
        items += [{"type": "reasoning", "id": f"rs_{n}", "summary": [], "encrypted_content": f"{SECRET}{n}"},
                  {"type": "function_call", "call_id": f"c{n}", "name": "ls",
                   "arguments": json.dumps({"dir": f"src/{n}"})},
                  {"type": "function_call_output", "call_id": f"c{n}", "output": listing(n)}]
    return items


def messages_loop() -> list[Any]:
    items: list[Any] = [{"role": "user", "content": "Fix the failing test."}]
    for n in range(ROUNDS):
        items += [{"role": "assistant", "content": [
                      {"type": "thinking", "thinking": f"{SECRET}{n}", "signature": f"sig{n}"},
                      {"type": "tool_use", "id": f"c{n}", "name": "ls", "input": {"dir": f"src/{n}"}}]},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"c{n}", "content": listing(n)}]}]
    return items


@dataclass(frozen=True)
class Api:
    loop: Callable[[], list[Any]]
    view: Callable[[Any], View | None]
    back: Callable[[View, list[Message]], list[Any]]
    check: Callable[[list[Any]], None]
    round_items: int  # items one tool round adds


def chat_check(items: list[Any]) -> None:
    calls = {call["id"] for item in items for call in item.get("tool_calls") or []}
    assert all(item["tool_call_id"] in calls for item in items if item["role"] == "tool")


def responses_check(items: list[Any]) -> None:
    assert problems(items) == []


API = {
    "chat": Api(chat_loop, lambda items: View(items), lambda view, history: view.back(history, list),
                chat_check, 2),
    "responses": Api(responses_loop, responses_items.view_of_input,
                     lambda view, history: responses_items.as_input_items(view.back(history, responses_items.render)),
                     responses_check, 3),
    "messages": Api(messages_loop, messages_blocks.view_of_messages,
                    lambda view, history: messages_blocks.alternate(view.back(history, messages_blocks.render)),
                    assert_valid, 2),
}


@pytest.mark.parametrize("name", list(API))
def test_the_same_core_steps_compact_each_api(name: str) -> None:
    api = API[name]
    items = api.loop()
    view = api.view(items)
    assert view is not None
    counter = TokenCounter()
    history = HistoryIndex(counter).read(view.messages, "tenant")  # the chain reuse keys on, and the counts
    before = sum(history.tokens)
    limits = Limits(window=before // 2, threshold=0.8, target=0.5, reserve=512)
    plan = plan_compaction(view.messages, counter.count_message, limits)
    assert plan is not None and plan.prefix_len > 0
    # The summariser sees the conversation, never the opaque reasoning.
    transcript = format_transcript(plan.to_summarise)
    assert "ls" in transcript and SECRET not in transcript
    compacted = api.back(view, splice(plan, SUMMARY, CONTINUATION))
    api.check(compacted)
    read_again = api.view(compacted)
    assert read_again is not None and sum(counter.count_each(read_again.messages)) < limits.window
    # The client's items that stay are the very objects, in order: the instruction, and the latest rounds whole,
    # reasoning and all, ending the list as the client's did.
    positions = [next((i for i, original in enumerate(items) if item is original), None) for item in compacted]
    own = [position for position in positions if position is not None]
    instruction = next(i for i, item in enumerate(items) if "Fix the failing test." in json.dumps(item))
    assert own == sorted(own) and instruction in own
    tail = 0
    while tail < len(positions) and positions[-1 - tail] == len(items) - 1 - tail:
        tail += 1
    assert tail >= api.round_items and f"{SECRET}{ROUNDS - 1}" in json.dumps(compacted[-tail:])
    assert len(compacted) < len(items) // 2 and "the work so far" in json.dumps(compacted[:4])


@pytest.mark.parametrize("name", list(API))
def test_the_chain_is_the_same_on_every_turn(name: str) -> None:
    """Reuse keys on the chain: the neutral view of a resent history must hash as it did, message for message."""
    api = API[name]
    items = api.loop()
    first, second = api.view(items[:-api.round_items]), api.view(items)
    assert first is not None and second is not None
    index = HistoryIndex(TokenCounter())
    shorter, longer = index.read(first.messages, "t"), index.read(second.messages, "t")
    assert longer.chain[:len(shorter.chain)] == shorter.chain
