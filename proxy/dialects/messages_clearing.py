"""Anthropic's clearing edits done by the proxy, on the Messages request it forwards: old tool results (and inputs)
replaced by a placeholder, old thinking blocks dropped. Deterministic, no model call; the client's copy stays whole.

What each edit did is reported as Anthropic reports it (`applied_edits` entries: the uses or turns cleared and the
input tokens freed); an edit that was asked for and did nothing says why (not triggered, too little to clear).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from proxy.dialects.messages_context import CLEAR_THINKING, CLEAR_TOOL_USES, ClearThinking, ClearToolUses, ContextEdits

Count = Callable[[Any], int]
_THINKING = frozenset({"thinking", "redacted_thinking"})


@dataclass
class Clearing:
    """The messages to forward, what was applied (Anthropic's `applied_edits` entries) and what was not, and why."""

    messages: list[Any]
    applied: list[dict[str, Any]] = field(default_factory=list)
    outcomes: dict[str, str] = field(default_factory=dict)  # edit type → applied / not_triggered / too_little / …


@dataclass(frozen=True)
class _Use:
    message: int
    block: int
    id: str
    name: str


def cleared(messages: list[Any], edits: ContextEdits, prompt_tokens: Callable[[], int], count: Count) -> Clearing:
    """`messages` with the request's clearing edits applied, thinking first (Anthropic's order)."""
    clearing = Clearing(list(messages))
    if edits.clear_thinking is not None:
        _clear_thinking(clearing, edits.clear_thinking, count)
    if edits.clear_tool_uses is not None:
        _clear_tool_uses(clearing, edits.clear_tool_uses, prompt_tokens, count)
    return clearing


def _clear_thinking(clearing: Clearing, edit: ClearThinking, count: Count) -> None:
    if edit.keep is None:
        clearing.outcomes[CLEAR_THINKING] = "keeps_all"
        return
    assistants = [index for index, message in enumerate(clearing.messages) if _role(message) == "assistant"]
    turns = freed = 0
    for index in assistants[:max(len(assistants) - edit.keep, 0)]:
        content = clearing.messages[index]["content"]
        if not isinstance(content, list):
            continue
        kept = [block for block in content if not _is_thinking(block)]
        if len(kept) == len(content) or not kept:  # nothing to clear, or nothing would be left of the turn
            continue
        freed += sum(count(block) for block in content if _is_thinking(block))
        clearing.messages[index] = {**clearing.messages[index], "content": kept}
        turns += 1
    applied = {"cleared_thinking_turns": turns, "cleared_input_tokens": freed} if turns else None
    _report(clearing, CLEAR_THINKING, applied, "nothing_to_clear")


def _clear_tool_uses(clearing: Clearing, edit: ClearToolUses, prompt_tokens: Callable[[], int], count: Count) -> None:
    uses = _tool_uses(clearing.messages)
    reached = len(uses) if edit.trigger_kind == "tool_uses" else prompt_tokens()
    if reached <= edit.trigger:
        clearing.outcomes[CLEAR_TOOL_USES] = "not_triggered"
        return
    older = uses[:max(len(uses) - edit.keep, 0)]
    candidates = {use.id: use for use in older if use.name not in edit.exclude_tools}
    messages = list(clearing.messages)
    results = _clear_results(messages, candidates, count)
    freed = sum(results.values())
    for use in candidates.values():
        if use.id in results and edit.clears_input(use.name):
            freed += _clear_input(messages, use, count)
    if not results:
        clearing.outcomes[CLEAR_TOOL_USES] = "nothing_to_clear"
    elif freed < edit.clear_at_least:  # clearing busts the upstream's prompt cache: not for less than asked
        clearing.outcomes[CLEAR_TOOL_USES] = "too_little"
    else:
        clearing.messages = messages
        _report(clearing, CLEAR_TOOL_USES, {"cleared_tool_uses": len(results), "cleared_input_tokens": freed}, "")


def _tool_uses(messages: list[Any]) -> list[_Use]:
    return [_Use(index, position, block["id"], block["name"])
            for index, message in enumerate(messages) if _role(message) == "assistant"
            for position, block in enumerate(_blocks(message))
            if isinstance(block, dict) and block.get("type") == "tool_use" and isinstance(block.get("id"), str)
            and isinstance(block.get("name"), str)]


def _clear_results(messages: list[Any], candidates: dict[str, _Use], count: Count) -> dict[str, int]:
    """Each candidate's result replaced by a placeholder, in place in `messages`; the tokens each one freed."""
    freed: dict[str, int] = {}
    for index, message in enumerate(messages):
        if _role(message) != "user" or not candidates:
            continue
        blocks = _blocks(message)
        changed = False
        for position, block in enumerate(blocks):
            answered = block.get("tool_use_id") if isinstance(block, dict) and block.get("type") == "tool_result" \
                else None
            use = candidates.get(answered) if isinstance(answered, str) else None
            if use is None or use.id in freed:
                continue
            before = count(block.get("content"))
            placeholder = f"[cleared to save context: the result of {use.name}, {before} tokens]"
            blocks = blocks if changed else list(blocks)
            blocks[position] = {**block, "content": placeholder}
            freed[use.id] = max(before - count(placeholder), 0)
            changed = True
        if changed:
            messages[index] = {**message, "content": blocks}
    return freed


def _clear_input(messages: list[Any], use: _Use, count: Count) -> int:
    message = messages[use.message]
    blocks = list(_blocks(message))
    block = blocks[use.block]
    blocks[use.block] = {**block, "input": {}}
    messages[use.message] = {**message, "content": blocks}
    return max(count(block.get("input")) - count({}), 0)


def _report(clearing: Clearing, kind: str, applied: dict[str, int] | None, otherwise: str) -> None:
    if applied is None:
        clearing.outcomes[kind] = otherwise
        return
    clearing.applied.append({"type": kind, **applied})
    clearing.outcomes[kind] = "applied"


def _role(message: Any) -> Any:
    return message.get("role") if isinstance(message, dict) else None


def _blocks(message: Any) -> list[Any]:
    """A message's content blocks as sent (a string content has none to clear)."""
    content = message.get("content") if isinstance(message, dict) else None
    return content if isinstance(content, list) else []


def _is_thinking(block: Any) -> bool:
    return isinstance(block, dict) and block.get("type") in _THINKING
