"""Stage 1 of tool-result management: old tool results replaced by a short placeholder in the request forwarded,
deterministically, with no model call — the small file before the sledgehammer of a whole-history summary.

The cut (how many of the oldest results are cleared) depends on the conversation alone: the conversation is read
from its start as the turns that built it were, and whenever what has been read passes `room` tokens, every result
but the last `keep` is cleared at once. So the cut stays where it is until the prompt passes the trigger again —
between two moves every request starts with the same bytes (an upstream's prompt cache keeps hitting) — and every
replica computes the same cut. The most recent `keep` results, results of excluded tools, and
anything compaction made are never touched; each call keeps its id and its own (short) result, so every dialect's
pairing rules still hold.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass

from proxy.core.messages import Message, content_text, role

Count = Callable[[Message], int]
# What a cleared result reported that its placeholder keeps (its error lines, say), as text; "" for nothing.
Reported = Callable[[str], str]
# Arguments shorter than this are quoted in the placeholder; longer ones by their start and a digest.
_QUOTED_ARGUMENTS = 80
# A clearing keeps whole at most this share of the room (the latest round always): the rest of the room is what
# the conversation grows back into before the next clearing, and each clearing busts the prompt cache once. Measured
# on a 200-call agent at 32,000 tokens (bench/agents.py --only tool-stages), a half kept made a clearing every 2.3
# turns; a quarter, every 2.9.
_KEPT_SHARE = 0.25


@dataclass(frozen=True)
class ClearingRule:
    """What stage 1 may clear: all but the last `keep` results, a move of the cut only if it frees at least
    `clear_at_least` tokens (half the room at least, whatever it says); `clear_inputs` replaces the calls' arguments
    too."""

    keep: int = 8
    clear_at_least: int = 0
    exclude_tools: frozenset[str] = frozenset()
    clear_inputs: bool = False


@dataclass(frozen=True)
class Cleared:
    """The messages to forward, the results cleared and the tokens that freed (0 and the same list: nothing)."""

    messages: list[Message]
    results: int = 0
    freed: int = 0
    indices: frozenset[int] = frozenset()  # positions of the results cleared


@dataclass(frozen=True)
class _Result:
    index: int  # of the tool message
    call: int  # index of the assistant message that made the call
    call_id: str
    name: str
    arguments: str


def cleared(messages: Sequence[Message], rule: ClearingRule, count: Count, *, room: int,
            untouchable: Collection[int] = (), reported: Reported | None = None,
            sizes: Sequence[int] | None = None) -> Cleared:
    """`messages` with the results before the cut replaced; `room` is what the messages may take (in `count`'s
    tokens) before a clearing is due; `untouchable` indexes (what compaction made) are kept; `reported` says what
    of a result its placeholder keeps; `sizes`, when given, are `count` of each message, counted in one pass."""
    sizes = [count(message) for message in messages] if sizes is None else sizes
    if sum(sizes) <= room:  # the replay never passes the room: no cut, and no placeholder need be made
        return Cleared(list(messages))
    results, replaced, saving = _clearable(messages, rule, count, untouchable, reported, sizes)
    cut = 0
    for step in _replay(results, sizes, saving, rule, room):
        cut = step[1]
    if cut == 0:
        return Cleared(list(messages))
    sent = list(messages)
    for result, made in zip(results[:cut], replaced, strict=False):
        sent[result.index] = made
    freed = sum(saving[:cut])
    if rule.clear_inputs:
        freed += _clear_inputs(sent, results[:cut], count)
    return Cleared(sent, cut, freed, frozenset(result.index for result in results[:cut]))


def weights(messages: Sequence[Message], rule: ClearingRule, count: Count, *, room: int, sizes: Sequence[int],
            ends: Collection[int], untouchable: Collection[int] = (), reported: Reported | None = None) -> list[int]:
    """What `messages[:end]` weighs as `cleared` would leave it, for each of `ends` (1 to len(messages)) in
    increasing order, in one replay: the clearing of a conversation's beginning is the clearing of the whole up to
    there (its inputs' savings aside)."""
    wanted = set(ends)
    if sum(sizes) <= room:
        return [sum(sizes[:end]) for end in sorted(wanted)]
    results, _, saving = _clearable(messages, rule, count, untouchable, reported, sizes)
    steps = enumerate(_replay(results, sizes, saving, rule, room), start=1)
    return [total for end, (total, _) in steps if end in wanted]


def _clearable(messages: Sequence[Message], rule: ClearingRule, count: Count, untouchable: Collection[int],
               reported: Reported | None, sizes: Sequence[int]) -> tuple[list[_Result], list[Message], list[int]]:
    """The results the rule may clear, their placeholders, and what each would free."""
    results = [result for result in _results(messages)
               if result.name not in rule.exclude_tools and result.index not in untouchable]
    replaced = [{**messages[result.index], "content": placeholder(
        result, sizes[result.index], reported(content_text(messages[result.index].get("content"))) if reported
        else "")} for result in results]
    saving = [sizes[result.index] - count(made) for result, made in zip(results, replaced, strict=True)]
    return results, replaced, saving


def _replay(results: list[_Result], sizes: Sequence[int], saving: list[int], rule: ClearingRule,
            room: int) -> Iterator[tuple[int, int]]:
    """The conversation replayed message by message, each step's tokens as cleared so far and how many of
    `results` are cleared: whenever the total passes `room`, the cut moves to all but the last results kept
    (`keep` at most, within a quarter of the room, the latest round's always), if that frees `clear_at_least` and
    half the room — so a clearing is a large step, and the conversation has half the room or more to grow back into
    before the next one."""
    saved = [0, *itertools.accumulate(saving)]  # saved[k]: what clearing the first k results frees
    least = max(rule.clear_at_least, room // 2, 1)
    cut = seen = total = 0
    for index, size in enumerate(sizes):
        total += size
        while seen < len(results) and results[seen].index <= index:
            seen += 1
        if total > room and seen:
            target = max(seen - _kept(results[:seen], sizes, rule.keep, int(room * _KEPT_SHARE)), cut)
            if saved[target] - saved[cut] >= least:
                total -= saved[target] - saved[cut]
                cut = target
        yield total, cut


def _kept(results: list[_Result], sizes: Sequence[int], keep: int, room: int) -> int:
    """How many of the latest `results` stay whole: up to `keep` within `room` tokens, the latest round's always."""
    kept = tokens = 0
    latest = results[-1].call
    for result in reversed(results):
        tokens += sizes[result.index]
        if result.call != latest and (kept >= keep or tokens > room):
            break
        kept += 1
    return kept


def placeholder(result: _Result, tokens: int, reported: str = "") -> str:
    """What stands in for a cleared result: the tool, its arguments (or their start and a digest), the size, and
    what it reported that must not be lost (an error line)."""
    arguments = result.arguments if len(result.arguments) <= _QUOTED_ARGUMENTS else \
        f"{result.arguments[:_QUOTED_ARGUMENTS // 2]}… sha256:{_digest(result.arguments)}"
    said = f"; it reported {reported}" if reported else ""
    return (f"[tool result cleared to save context: {result.name}({arguments}) returned {tokens} tokens{said}; "
            "call the tool again if it is needed]")


def _results(messages: Sequence[Message]) -> list[_Result]:
    """Each tool result that answers a call of the assistant message before its run of results, in order."""
    found: list[_Result] = []
    calls: dict[str, tuple[int, str, str]] = {}
    for index, message in enumerate(messages):
        speaker = role(message)
        if speaker == "assistant":
            calls = {call["id"]: (index, *_name_and_arguments(call)) for call in message.get("tool_calls") or ()
                     if isinstance(call, dict) and isinstance(call.get("id"), str)}
        elif speaker == "tool" and (answered := calls.pop(str(message.get("tool_call_id")), None)) is not None:
            if content_text(message.get("content")):  # an empty result has nothing to clear
                found.append(_Result(index, answered[0], str(message["tool_call_id"]), answered[1], answered[2]))
        elif speaker != "tool":
            calls = {}
    return found


def _name_and_arguments(call: dict[str, object]) -> tuple[str, str]:
    function = call.get("function")
    name = function.get("name") if isinstance(function, dict) else None
    arguments = function.get("arguments") if isinstance(function, dict) else None
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False, default=str)
    return (name if isinstance(name, str) else "tool"), text


def _clear_inputs(sent: list[Message], results: list[_Result], count: Count) -> int:
    """The cleared results' calls with their arguments replaced by `{}`; the tokens that freed."""
    freed = 0
    by_call: dict[int, set[str]] = {}
    for result in results:
        by_call.setdefault(result.call, set()).add(result.call_id)
    for index, ids in by_call.items():
        message = sent[index]
        before = count(message)
        calls = [{**call, "function": {**call["function"], "arguments": "{}"}}
                 if isinstance(call, dict) and call.get("id") in ids and isinstance(call.get("function"), dict)
                 else call for call in message["tool_calls"]]
        sent[index] = {**message, "tool_calls": calls}
        freed += before - count(sent[index])
    return freed


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:12]



AHEAD_ID = "~ahead"  # the call ids of rounds_ahead's rounds: no client's id starts so


def rounds_ahead(messages: Sequence[Message], rounds: int, answer: int,
                 following: int) -> tuple[list[Message], list[int]]:
    """`rounds` more turns after `messages`, each an answer of `answer` tokens and an input of `following`, shaped
    like the latest: a call of the same tool and its result when the latest input is a tool's (the clearing may
    clear those later), else an answer and a user's message. Returns the messages and their sizes, to replay a
    clearing on the conversation as it will have grown."""
    asked = next((message for message in reversed(messages) if role(message) != "tool"), None)
    calls = asked.get("tool_calls") if asked is not None and role(messages[-1]) == "tool" else None
    name = _name_and_arguments(calls[-1])[0] if isinstance(calls, list) and calls and isinstance(calls[-1], dict) \
        else None
    added: list[Message] = []
    for turn in range(max(0, rounds)):
        if name is None:
            added += [{"role": "assistant", "content": "…"}, {"role": "user", "content": "…"}]
            continue
        call_id = f"{AHEAD_ID}{turn}"
        added += [{"role": "assistant", "content": None,
                   "tool_calls": [{"id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}]},
                  {"role": "tool", "tool_call_id": call_id, "content": "…"}]
    return added, [max(0, answer), max(0, following)] * max(0, rounds)
