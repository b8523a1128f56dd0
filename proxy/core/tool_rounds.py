"""Tool rounds of the neutral conversation: found, fingerprinted, and swapped for a summary with pairing kept."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.core.fingerprint import canonical_json
from proxy.core.messages import Message, answered_call_id, content_text, makes_tool_calls, role, with_text

Count = Callable[[Message], int]
# One round's swap: the round, the text its first result becomes, the text each of its other results becomes.
Swap = tuple["ToolRound", str, str]


@dataclass(frozen=True)
class ToolRound:
    """One assistant message's tool calls and the tool messages right after it that answer them, each once.

    `key` names the round (its call ids and names: the same round on every later turn of the conversation);
    `fingerprint` is what it holds (every call, arguments included, and every result, in call order), so a summary
    made of it is used only while not one byte of either changed.
    """

    call_index: int
    result_indices: tuple[int, ...]  # the answering tool messages, in the order they stand
    call_ids: tuple[str, ...]  # in the order of the calls
    names: tuple[str, ...]  # each call's tool, in the order of the calls
    key: str
    fingerprint: str
    result_tokens: int | None = None  # the results' tokens, when counted

    @property
    def tools(self) -> tuple[str, ...]:
        """The round's tools, each once, in the order of the calls."""
        return tuple(dict.fromkeys(self.names))


def call_name(call: Any) -> str | None:
    """A call's tool: `function.name`, or `custom.name` for a Responses custom tool; None when it has none."""
    spec = _spec(call)
    name = spec.get("name") if spec is not None else None
    return name if isinstance(name, str) else None


def call_arguments(call: Any) -> str:
    """What a call asked, as text: its `function.arguments` or `custom.input`, else its spec as JSON."""
    spec = _spec(call)
    if spec is None:
        return ""
    body = spec.get("input" if call.get("type") == "custom" else "arguments")
    if isinstance(body, str):
        return body
    return canonical_json(body).decode("utf-8", "replace") if body is not None else ""


def _spec(call: Any) -> dict[str, Any] | None:
    if not isinstance(call, dict):
        return None
    spec = call.get("custom") if call.get("type") == "custom" else call.get("function")
    return spec if isinstance(spec, dict) else None


def digest(value: Any) -> str:
    """sha256 of a JSON value's canonical form, as hex."""
    return hashlib.sha256(canonical_json(value)).hexdigest()


def tool_rounds(messages: Sequence[Any], count: Count | None = None) -> list[ToolRound]:
    """The complete rounds of `messages`, oldest first; `count` (a message's tokens) fills `result_tokens`.

    Anything else is passed over, never raised on: calls without a string id or a tool name, ids used twice,
    a call left unanswered, a result that answers no call of the round or answers one twice, legacy `function`
    results (they carry no call id to pair by).
    """
    rounds = []
    for index, message in enumerate(messages):
        if makes_tool_calls(message):
            found = _round_at(messages, index, count)
            if found is not None:
                rounds.append(found)
    return rounds


def _round_at(messages: Sequence[Any], index: int, count: Count | None) -> ToolRound | None:
    calls = messages[index]["tool_calls"]
    ids = [call.get("id") if isinstance(call, dict) else None for call in calls]
    names = [call_name(call) for call in calls]
    wanted = {call_id for call_id in ids if isinstance(call_id, str) and call_id}
    if len(wanted) != len(ids) or None in names:
        return None
    answers: dict[str, int] = {}
    position = index + 1
    while position < len(messages) and role(messages[position]) == "tool":
        answered = answered_call_id(messages[position])
        if answered not in wanted or answered in answers:
            return None  # a stray or repeated result: the upstream would refuse it, so it is not ours to touch
        answers[answered] = position
        position += 1
    if len(answers) != len(ids):
        return None
    call_ids = tuple(str(call_id) for call_id in ids)
    results = [messages[answers[call_id]] for call_id in call_ids]
    indices = tuple(range(index + 1, position))
    tokens = sum(count(messages[i]) for i in indices) if count is not None else None
    return ToolRound(index, indices, call_ids, tuple(str(name) for name in names),
                     key=digest([call_ids, names]), fingerprint=digest({"calls": calls, "results": results}),
                     result_tokens=tokens)


def answers_round(messages: Sequence[Any], tool_round: ToolRound) -> bool:
    """Whether `messages` still hold the round where it was found: its call message, then one result per call."""
    indices = tool_round.result_indices
    if not indices or tool_round.call_index >= len(messages) or indices[-1] >= len(messages):
        return False
    answered = [answered_call_id(messages[i]) for i in indices]
    return (makes_tool_calls(messages[tool_round.call_index]) and len(answered) == len(tool_round.call_ids)
            and set(answered) == set(tool_round.call_ids))


def round_results(messages: Sequence[Message], tool_round: ToolRound) -> list[Message]:
    """The round's result messages, in the order they stand."""
    return [messages[i] for i in tool_round.result_indices]


def described(messages: Sequence[Message], tool_round: ToolRound) -> dict[str, list[dict[str, str]]]:
    """The round as a summariser is shown it: each call's tool and arguments, each result's tool and text."""
    calls = messages[tool_round.call_index]["tool_calls"]
    answering = dict(zip(tool_round.call_ids, tool_round.names, strict=True))
    return {"calls": [{"name": name, "arguments": call_arguments(call)}
                      for call, name in zip(calls, tool_round.names, strict=True)],
            "results": [{"name": answering[str(message["tool_call_id"])], "text": content_text(message.get("content"))}
                        for message in round_results(messages, tool_round)]}


def textual(messages: Sequence[Message], tool_round: ToolRound) -> bool:
    """Whether the round's results are all text (a string, or text parts only): nothing a summary would lose
    beside words, such as an image."""
    return all(_textual(message.get("content")) for message in round_results(messages, tool_round))


def _textual(content: Any) -> bool:
    return isinstance(content, str) or (isinstance(content, list) and all(
        isinstance(part, dict) and part.get("type") == "text" for part in content))


def swapped_results(messages: Sequence[Message], tool_round: ToolRound, summary: str,
                    pointer: str) -> list[Message]:
    """The round's results as they are sent once summarised: the first carries `summary`, each other `pointer`;
    every other field of each (its `tool_call_id` above all) kept."""
    first, *others = tool_round.result_indices
    return [with_text(messages[first], summary), *(with_text(messages[i], pointer) for i in others)]


def with_round_summaries(messages: Sequence[Message], swaps: Sequence[Swap]) -> list[Message]:
    """A copy of `messages` with each round's results swapped (see `swapped_results`): no message added, dropped or
    moved, so every call keeps its own result right after it. ValueError when a round is not in `messages`."""
    sent = list(messages)
    for tool_round, summary, pointer in swaps:
        if not answers_round(messages, tool_round):
            raise ValueError("the round is not where it was found in these messages")
        for index, message in zip(tool_round.result_indices,
                                  swapped_results(messages, tool_round, summary, pointer), strict=True):
            sent[index] = message
    return sent


def with_round_summary(messages: Sequence[Message], tool_round: ToolRound, summary: str,
                       pointer: str) -> list[Message]:
    """A copy of `messages` with one round's results swapped for its summary."""
    return with_round_summaries(messages, [(tool_round, summary, pointer)])
