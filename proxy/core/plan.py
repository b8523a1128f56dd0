"""What to keep and what to summarise: the verbatim tail, kept instructions, tool pairing, and the splice."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.core import budget
from proxy.core.budget import Allotment, Limits
from proxy.core.messages import (
    Message,
    answered_call_id,
    call_ids,
    is_instruction,
    is_tool_result,
    is_user,
    makes_tool_calls,
    role,
)

Count = Callable[[Message], int]
# Where a verbatim tail may begin: a cut before anything else would orphan a tool result or an instruction.
CUT_ROLES = frozenset({"user", "assistant"})


def _check_call_group(messages: Sequence[Any], start: int) -> tuple[list[str], int]:
    """Check the assistant tool-call message at `start` against the tool messages right after it.

    Returns the problems and the index of the first message after the group.
    """
    ids = call_ids(messages[start]) or []
    usable = [call_id for call_id in ids if isinstance(call_id, str) and call_id]
    problems: list[str] = []
    if len(usable) != len(ids):
        problems.append(f"message {start}: tool call without a usable id")
    pending = set(usable)
    if len(pending) != len(usable):
        problems.append(f"message {start}: duplicate tool call ids")
    index = start + 1
    while index < len(messages) and role(messages[index]) == "tool":
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
        elif makes_tool_calls(message):
            group_problems, index = _check_call_group(messages, index)
            problems.extend(group_problems)
        elif role(message) == "tool":
            problems.append(f"message {index}: tool message does not follow an assistant tool call")
            index += 1
        else:
            index += 1
    return problems


def unsafe_cuts(messages: Sequence[Any]) -> list[bool]:
    """unsafe[i] is True when cutting before message i would separate a tool call from its response.

    Ids are resolved to the most recent call carrying them, since some servers reuse ids across turns.
    """
    depth = [0] * (len(messages) + 1)
    latest_call: dict[str, int] = {}
    for index, message in enumerate(messages):
        for call_id in call_ids(message) or []:
            if isinstance(call_id, str):
                latest_call[call_id] = index
        answered = answered_call_id(message)
        if answered is not None and answered in latest_call:
            depth[latest_call[answered] + 1] += 1
            depth[index + 1] -= 1
    unsafe: list[bool] = []
    open_pairs = 0
    for index in range(len(messages)):
        open_pairs += depth[index]
        unsafe.append(open_pairs > 0)
    return unsafe


def splits_a_tool_pair(messages: Sequence[Any], cut: int) -> bool:
    """unsafe_cuts(messages)[cut], reading the messages from `cut` on and the ones before only when a result
    after the cut answers an id no call after the cut carries: a stored summary is checked on every request."""
    called: set[str] = set()
    orphans: set[str] = set()
    walk_results(messages[cut:], called, orphans)
    return makes_any_call(messages[:cut], orphans)


def walk_results(messages: Iterable[Any], called: set[str], orphans: set[str]) -> None:
    """Add to `called` the call ids `messages` carry, and to `orphans` the ids of results that no call before them
    carried (in `called` as given, or earlier in `messages`): a walk goes on from where another one stopped."""
    for message in messages:
        called.update(call_id for call_id in call_ids(message) or () if isinstance(call_id, str))
        answered = answered_call_id(message)
        if answered is not None and answered not in called:
            orphans.add(answered)


def makes_any_call(messages: Iterable[Any], ids: Collection[str]) -> bool:
    """Whether any of `messages` makes a tool call with one of `ids`."""
    return bool(ids) and any(isinstance(call_id, str) and call_id in ids
                             for message in messages for call_id in call_ids(message) or ())


@dataclass(frozen=True)
class Plan:
    """What to keep and what to summarise. The input is exactly `head + span + tail`.

    `kept_system` repeats the system/developer messages found inside `span` and `kept_users` the user messages of
    the span kept verbatim (the latest always, earlier ones within their allotment); both are re-inserted, in
    order, around the summary. The summariser is given `to_summarise`: the span without instructions.
    Messages are shared with the input, never copied: treat them as read-only.
    """

    head: tuple[Message, ...]
    span: tuple[Message, ...]
    kept_system: tuple[Message, ...]
    kept_users: tuple[Message, ...]
    tail: tuple[Message, ...]
    prefix_len: int
    tokens_before: int
    head_tokens: int
    span_tokens: int
    kept_system_tokens: int
    kept_user_tokens: int
    tail_tokens: int
    allotment: Allotment
    summary_tokens: int  # the output the summariser is asked for
    overhead: int = 0    # what the request costs besides its messages, as planned with

    @property
    def to_summarise(self) -> tuple[Message, ...]:
        return tuple(message for message in self.span if not is_instruction(message))

    @property
    def kept_tokens(self) -> int:
        """Tokens that survive compaction verbatim: head, kept instructions, kept user messages and tail."""
        return self.head_tokens + self.kept_system_tokens + self.kept_user_tokens + self.tail_tokens

    def tokens_after(self, inserted_tokens: int) -> int:
        """The estimated prompt once the summary and the fillers (`inserted_tokens` together) are in."""
        return self.kept_tokens + inserted_tokens

    def room_at_goal(self, replacement_tokens: int) -> int:
        """Tokens the allotment's goal leaves once the replacement (`replacement_tokens`) and the tail are in.

        The tail is extended by whole turns, so part of its share is often left over; an earlier user message
        too long for its share leaves that share unused.
        """
        return self.allotment.goal - self.overhead - replacement_tokens - self.tail_tokens

    def worthwhile(self, filler_tokens: int) -> bool:
        """Whether the summary makes the request smaller at all; if not, the summariser is not called."""
        replaced = self.span_tokens - self.kept_system_tokens - self.kept_user_tokens
        return budget.worth_summarizing(replaced, self.summary_tokens, filler_tokens)

    def as_log(self) -> dict[str, int]:
        return {"prefix_len": self.prefix_len, "head_tokens": self.head_tokens, "span_tokens": self.span_tokens,
                "kept_user_messages": len(self.kept_users), "kept_user_tokens": self.kept_user_tokens,
                "tail_messages": len(self.tail), "tail_tokens": self.tail_tokens,
                "summary_tokens_asked": self.summary_tokens, **self.allotment.as_log()}


def _head_length(messages: Sequence[Message]) -> int:
    length = 0
    while length < len(messages) and is_instruction(messages[length]):
        length += 1
    return length


def _cuts(messages: Sequence[Message], head_len: int) -> list[int]:
    """Where the tail may begin, latest first: before a user or assistant message, splitting no tool pair."""
    unsafe = unsafe_cuts(messages)
    return [i for i in range(len(messages) - 1, head_len, -1) if role(messages[i]) in CUT_ROLES and not unsafe[i]]


def _current_round(messages: Sequence[Message], cuts: Sequence[int]) -> int | None:
    """The start of the minimum tail: the last user message, or the tool round in progress (its call and results)."""
    end = len(messages) - 1
    if is_tool_result(messages[end]):
        while end > 0 and is_tool_result(messages[end]):
            end -= 1
    elif not is_user(messages[end]):
        # The client ends on something else (an assistant prefill): the tail holds its last exchange.
        users = [i for i in cuts if is_user(messages[i])]
        end = users[0] if users else end
    return next((cut for cut in cuts if cut <= end), None)


def _latest_user(messages: Sequence[Message], head_len: int, tail_start: int,
                 synthetic: frozenset[int]) -> int | None:
    """The latest user message before the tail, when the tail holds none (an agent's tool loop)."""
    if any(is_user(message) for message in messages[tail_start:]):
        return None
    return next((i for i in range(tail_start - 1, head_len - 1, -1)
                 if is_user(messages[i]) and i not in synthetic), None)


@dataclass(frozen=True)
class _Frame:
    """The pieces of a plan that do not depend on how far the tail is extended."""

    head_len: int
    counts: list[int]
    cuts: list[int]
    minimum: int
    latest_user: int | None
    synthetic: frozenset[int]

    def extension_cost(self, start: int, messages: Sequence[Message]) -> int:
        """Tokens an earlier cut adds beyond the fixed part (instructions and the latest user are in it already)."""
        return sum(self.counts[i] for i in range(start, self.minimum)
                   if not is_instruction(messages[i]) and i != self.latest_user)


def _frame(messages: Sequence[Message], count: Count, synthetic: frozenset[int]) -> _Frame | None:
    head_len = _head_length(messages)
    cuts = _cuts(messages, head_len)
    minimum = _current_round(messages, cuts) if cuts else None
    if minimum is None:
        return None
    counts = [count(message) for message in messages]
    return _Frame(head_len, counts, cuts, minimum, _latest_user(messages, head_len, minimum, synthetic), synthetic)


def _fixed_tokens(messages: Sequence[Message], frame: _Frame) -> int:
    counts = frame.counts
    instructions = sum(counts[i] for i in range(frame.head_len, frame.minimum) if is_instruction(messages[i]))
    latest = counts[frame.latest_user] if frame.latest_user is not None else 0
    return sum(counts[:frame.head_len]) + instructions + latest + sum(counts[frame.minimum:])


def _extend_tail(messages: Sequence[Message], frame: _Frame, tail_tokens: int) -> int:
    """The earliest cut whose extra turns fit `tail_tokens`, leaving something before it to summarise."""
    chosen = frame.minimum
    for cut in frame.cuts:
        if cut >= frame.minimum:
            continue
        if not any(not is_instruction(m) for m in messages[frame.head_len:cut]):
            break
        if frame.extension_cost(cut, messages) > tail_tokens:
            break
        chosen = cut
    return chosen


def _kept_users(messages: Sequence[Message], frame: _Frame, cut: int, allotted: int) -> list[int]:
    """User messages of the span kept verbatim: the latest always (unless the tail holds the user's own turn),
    earlier ones newest first within `allotted`, so the oldest are the first to go."""
    candidates = _span_users(messages, frame, cut)
    kept = [] if not candidates or any(is_user(m) for m in messages[cut:]) else [candidates.pop(0)]
    used = 0
    for index in candidates:
        if used + frame.counts[index] > allotted:
            break  # stop at the first that does not fit, so the kept ones are the most recent run
        kept.append(index)
        used += frame.counts[index]
    return sorted(kept)


def _span_users(messages: Sequence[Message], frame: _Frame, cut: int) -> list[int]:
    return [i for i in range(cut - 1, frame.head_len - 1, -1) if is_user(messages[i]) and i not in frame.synthetic]


def plan_compaction(messages: Sequence[Message], count: Count, limits: Limits, *, answer_tokens: int | None = None,
                    synthetic: frozenset[int] = frozenset(), overhead: int = 0) -> Plan | None:
    """Split a history into head, summarised span and verbatim tail; None when there is nothing to summarise.

    The tail is at least the current round (the last user message, or the last tool call and its results) even if
    that alone exceeds the budget. `overhead` is what the request costs besides its messages (tools, the reply
    primer). `synthetic` marks messages the proxy wrote (an earlier summary and its
    fillers): they are summarised, never kept as the user's instructions. `answer_tokens` is the size of the
    answer this request gets, when known (a background plan); the next-turn growth is predicted from it.
    """
    frame = _frame(messages, count, synthetic)
    if frame is None:
        return None
    last_input = last_input_tokens(messages, frame.counts)
    last_answer = next((frame.counts[i] for i in range(frame.minimum - 1, frame.head_len - 1, -1)
                        if role(messages[i]) == "assistant" and i not in synthetic), None)
    answer = answer_tokens if answer_tokens is not None else budget.expected_answer(limits, last_answer)
    allotment = budget.allot(limits, fixed=overhead + _fixed_tokens(messages, frame),
                             growth=budget.next_turn_growth(last_input, answer), carried=_carried_tokens(frame))
    cut = _extend_tail(messages, frame, allotment.tail_tokens)
    return _build(messages, frame, cut, allotment, overhead)


def _build(messages: Sequence[Message], frame: _Frame, cut: int, allotment: Allotment, overhead: int) -> Plan | None:
    head_len, counts = frame.head_len, frame.counts
    span = tuple(messages[head_len:cut])
    if all(is_instruction(message) for message in span):
        return None
    system_at = [i for i in range(head_len, cut) if is_instruction(messages[i])]
    users_at = _kept_users(messages, frame, cut, allotment.instruction_tokens)
    span_tokens = sum(counts[head_len:cut])
    summarised = span_tokens - sum(counts[i] for i in system_at)
    return Plan(
        head=tuple(messages[:head_len]), span=span,
        kept_system=tuple(messages[i] for i in system_at), kept_users=tuple(messages[i] for i in users_at),
        tail=tuple(messages[cut:]), prefix_len=cut, tokens_before=sum(counts),
        head_tokens=sum(counts[:head_len]), span_tokens=span_tokens,
        kept_system_tokens=sum(counts[i] for i in system_at), kept_user_tokens=sum(counts[i] for i in users_at),
        tail_tokens=sum(counts[cut:]), allotment=allotment,
        summary_tokens=budget.summary_ask(allotment, summarised, _carried_tokens(frame, cut)), overhead=overhead)


def _carried_tokens(frame: _Frame, end: int | None = None) -> int:
    """Tokens of what the proxy wrote (an earlier summary, its fillers) before `end` (the current round): a new
    summary carries them forward."""
    stop = frame.minimum if end is None else end
    return sum(frame.counts[i] for i in frame.synthetic if frame.head_len <= i < stop)


def last_input_tokens(messages: Sequence[Message], counts: Sequence[int]) -> int:
    """The client's latest input: the messages after the last assistant turn (a user message, or tool results)."""
    total = 0
    for message, tokens in zip(reversed(messages), reversed(counts), strict=True):
        if role(message) == "assistant":
            break
        total += tokens
    return total


def replacement(plan: Plan, summary_message: Message, continuation_message: Message,
                acknowledgement: Message | None = None) -> list[Message]:
    """The messages that stand in for `input[:plan.prefix_len]`.

    Head, kept instructions, the summary, then the kept user messages; assistant fillers go between two user
    messages (strict chat templates reject two in a row), the continuation note first, then acknowledgements.
    """
    for filler in (continuation_message, acknowledgement):
        if filler is not None and (role(filler) != "assistant" or makes_tool_calls(filler)):
            raise ValueError("a filler must be an assistant message without tool calls")
    if role(summary_message) != "user":
        raise ValueError("the summary message must have role 'user'")
    fillers = iter([continuation_message])
    acknowledge = acknowledgement or continuation_message
    messages: list[Message] = [*plan.head, *plan.kept_system, summary_message]
    for user in plan.kept_users:
        messages += [next(fillers, acknowledge), user]
    if plan.tail and role(plan.tail[0]) == "user":
        messages.append(next(fillers, acknowledge))
    return messages


def splice(plan: Plan, summary_message: Message, continuation_message: Message,
           acknowledgement: Message | None = None) -> list[Message]:
    """The compacted history: replacement followed by the verbatim tail, so it ends the way the input did."""
    return [*replacement(plan, summary_message, continuation_message, acknowledgement), *plan.tail]


def apply_replacement(
    messages: Sequence[Message], replacement_messages: Sequence[Message], prefix_len: int
) -> list[Message] | None:
    """Splice a stored replacement over `messages[:prefix_len]`; None when the rest cannot follow it.

    The caller has already matched the prefix by hash; what follows must still be a tail: a cut that splits no
    tool pair, whose first message alternates with the replacement's last.
    """
    if not replacement_applies(messages, replacement_messages, prefix_len):
        return None
    return [*replacement_messages, *messages[prefix_len:]]


def replacement_applies(messages: Sequence[Message], replacement_messages: Sequence[Message], prefix_len: int,
                        splits: Callable[[Sequence[Message], int], bool] = splits_a_tool_pair) -> bool:
    """Whether apply_replacement splices (`splits` tells whether a cut splits a tool pair, as splits_a_tool_pair
    does: a caller may remember where its last walk stopped)."""
    if not 0 < prefix_len < len(messages) or not replacement_messages:
        return False
    first = role(messages[prefix_len])
    return first in CUT_ROLES and first != role(replacement_messages[-1]) and not splits(messages, prefix_len)
