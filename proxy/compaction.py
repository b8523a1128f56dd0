"""Compaction policy: choose the summarised span and the verbatim tail, check tool pairing, splice a summary in."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

Message = dict[str, Any]
INSTRUCTION_ROLES = frozenset({"system", "developer"})


def _role(message: Any) -> Any:
    return message.get("role") if isinstance(message, dict) else None


def _is_instruction(message: Any) -> bool:
    role = _role(message)
    return isinstance(role, str) and role in INSTRUCTION_ROLES


def _call_ids(message: Any) -> list[Any] | None:
    """The ids of an assistant message's tool calls, or None when it makes none (absent, null or empty)."""
    if _role(message) != "assistant":
        return None
    calls = message.get("tool_calls")
    if not isinstance(calls, list) or not calls:
        return None
    return [call.get("id") if isinstance(call, dict) else None for call in calls]


def _check_call_group(messages: Sequence[Any], start: int) -> tuple[list[str], int]:
    """Check the assistant tool-call message at `start` against the tool messages right after it.

    Returns the problems and the index of the first message after the group.
    """
    ids = _call_ids(messages[start]) or []
    usable = [call_id for call_id in ids if isinstance(call_id, str) and call_id]
    problems: list[str] = []
    if len(usable) != len(ids):
        problems.append(f"message {start}: tool call without a usable id")
    pending = set(usable)
    if len(pending) != len(usable):
        problems.append(f"message {start}: duplicate tool call ids")
    index = start + 1
    while index < len(messages) and _role(messages[index]) == "tool":
        answered = messages[index].get("tool_call_id")
        if isinstance(answered, str) and answered in pending:
            pending.discard(answered)
        else:
            problems.append(f"message {index}: tool_call_id {answered!r} answers no open call of message {start}")
        index += 1
    problems.extend(
        f"message {start}: tool call {call_id!r} has no tool response" for call_id in sorted(pending)
    )
    return problems, index


def check_tool_pairing(messages: Sequence[Any]) -> list[str]:
    """Every problem with tool pairing, as OpenAI judges it; an empty list means the history is valid.

    Each assistant tool call must be answered exactly once by a `tool` message in the run of tool messages that
    directly follows it, and every `tool` message must answer a call of the assistant message right before that run.
    An unanswered call at the very end is a problem too: the upstream rejects it.
    """
    problems: list[str] = []
    index = 0
    while index < len(messages):
        message = messages[index]
        if not isinstance(message, dict):
            problems.append(f"message {index}: not a JSON object")
            index += 1
        elif _call_ids(message) is not None:
            group_problems, index = _check_call_group(messages, index)
            problems.extend(group_problems)
        elif _role(message) == "tool":
            problems.append(f"message {index}: tool message does not follow an assistant tool call")
            index += 1
        else:
            index += 1
    return problems


def _unsafe_cuts(messages: Sequence[Any]) -> list[bool]:
    """unsafe[i] is True when cutting before message i would separate a tool call from its response.

    Ids are resolved to the most recent call carrying them, since some servers reuse ids across turns.
    """
    depth = [0] * (len(messages) + 1)
    latest_call: dict[str, int] = {}
    for index, message in enumerate(messages):
        for call_id in _call_ids(message) or []:
            if isinstance(call_id, str):
                latest_call[call_id] = index
        answered = message.get("tool_call_id") if _role(message) == "tool" else None
        if isinstance(answered, str) and answered in latest_call:
            depth[latest_call[answered] + 1] += 1
            depth[index + 1] -= 1
    unsafe: list[bool] = []
    open_pairs = 0
    for index in range(len(messages)):
        open_pairs += depth[index]
        unsafe.append(open_pairs > 0)
    return unsafe


@dataclass(frozen=True)
class Plan:
    """What to keep and what to summarise. The input is exactly `head + span + tail`.

    `kept_system` repeats the system/developer messages found inside `span`; they are re-inserted verbatim before
    the summary, so the summariser is given `to_summarise` (the span without them) and never restates them.
    Messages are shared with the input, never copied: treat them as read-only.
    """

    head: tuple[Message, ...]
    span: tuple[Message, ...]
    kept_system: tuple[Message, ...]
    tail: tuple[Message, ...]
    prefix_len: int
    tokens_before: int
    head_tokens: int
    span_tokens: int
    kept_system_tokens: int
    tail_tokens: int

    @property
    def to_summarise(self) -> tuple[Message, ...]:
        return tuple(message for message in self.span if not _is_instruction(message))

    @property
    def kept_tokens(self) -> int:
        """Tokens that survive compaction verbatim: head, kept system messages and tail."""
        return self.head_tokens + self.kept_system_tokens + self.tail_tokens

    def tokens_after(self, inserted_tokens: int) -> int:
        """The estimated prompt once the summary and continuation note (`inserted_tokens` together) are in."""
        return self.kept_tokens + inserted_tokens


def _head_length(messages: Sequence[Message]) -> int:
    length = 0
    while length < len(messages) and _is_instruction(messages[length]):
        length += 1
    return length


def _turn_starts(messages: Sequence[Message], head_len: int) -> list[int]:
    """Indices where the tail may begin: user messages after the head that split no tool pair, latest first."""
    unsafe = _unsafe_cuts(messages)
    starts = [i for i in range(head_len, len(messages)) if _role(messages[i]) == "user" and not unsafe[i]]
    return starts[::-1]


def _choose_tail_start(
    messages: Sequence[Message], counts: Sequence[int], head_len: int, tail_budget_tokens: int
) -> int | None:
    """The minimum tail, extended by whole turns while it fits the budget and something is left to summarise."""
    starts = _turn_starts(messages, head_len)
    if not starts:
        return None
    chosen = starts[0]
    tail_tokens = sum(counts[chosen:])
    first_summarisable = next((i for i in range(head_len, len(messages)) if not _is_instruction(messages[i])), None)
    for start in starts[1:]:
        if first_summarisable is None or start <= first_summarisable:
            break
        extended_tokens = tail_tokens + sum(counts[start:chosen])
        if extended_tokens > tail_budget_tokens:
            break
        chosen, tail_tokens = start, extended_tokens
    return chosen


def plan_compaction(
    messages: Sequence[Message], count: Callable[[Message], int], tail_budget_tokens: int
) -> Plan | None:
    """Split a history into head, summarised span and verbatim tail; None when there is nothing to summarise.

    The tail is at least the last user message and everything after it, even if that alone exceeds the budget.
    """
    head_len = _head_length(messages)
    counts = [count(message) for message in messages]
    tail_start = _choose_tail_start(messages, counts, head_len, tail_budget_tokens)
    if tail_start is None:
        return None
    span = tuple(messages[head_len:tail_start])
    if all(_is_instruction(message) for message in span):
        return None
    kept_indices = [i for i in range(head_len, tail_start) if _is_instruction(messages[i])]
    return Plan(
        head=tuple(messages[:head_len]),
        span=span,
        kept_system=tuple(messages[i] for i in kept_indices),
        tail=tuple(messages[tail_start:]),
        prefix_len=tail_start,
        tokens_before=sum(counts),
        head_tokens=sum(counts[:head_len]),
        span_tokens=sum(counts[head_len:tail_start]),
        kept_system_tokens=sum(counts[i] for i in kept_indices),
        tail_tokens=sum(counts[tail_start:]),
    )


def replacement(plan: Plan, summary_message: Message, continuation_message: Message) -> list[Message]:
    """The messages that stand in for `input[:plan.prefix_len]`: head, kept system messages, summary, note."""
    if _role(summary_message) != "user":
        raise ValueError("the summary message must have role 'user'")
    if _role(continuation_message) != "assistant" or _call_ids(continuation_message) is not None:
        raise ValueError("the continuation message must be an assistant message without tool calls")
    return [*plan.head, *plan.kept_system, summary_message, continuation_message]


def splice(plan: Plan, summary_message: Message, continuation_message: Message) -> list[Message]:
    """The compacted history: replacement followed by the verbatim tail, so it ends the way the input did."""
    return [*replacement(plan, summary_message, continuation_message), *plan.tail]


def apply_replacement(
    messages: Sequence[Message], replacement_messages: Sequence[Message], prefix_len: int
) -> list[Message] | None:
    """Splice a stored replacement over `messages[:prefix_len]`; None when the rest cannot follow it.

    The caller has already matched the prefix by hash; what follows must still be a tail: a user message that
    opens it and no tool response whose call was summarised away.
    """
    if not 0 < prefix_len < len(messages) or _role(messages[prefix_len]) != "user":
        return None
    if _unsafe_cuts(messages)[prefix_len]:
        return None
    return [*replacement_messages, *messages[prefix_len:]]
