"""Anthropic's context management as a Messages request asks for it, read and checked: every knob the proxy honours,
and a 400 naming the field for anything it cannot (so none is silently ignored).

Shapes follow Anthropic's API reference for `context_management.edits` (`clear_tool_uses_20250919`,
`clear_thinking_20251015`, `compact_20260112`) and the top-level `compaction: {"type": "summarize"}`; defaults are
Anthropic's: clearing triggers past 100,000 input tokens and keeps 3 tool uses; thinking keeps 1 turn; compaction
triggers past 150,000 input tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from proxy.dialects.call import is_positive
from proxy.errors import BadRequest

CLEAR_TOOL_USES = "clear_tool_uses_20250919"
CLEAR_THINKING = "clear_thinking_20251015"
COMPACT = "compact_20260112"
_KNOBS = {CLEAR_TOOL_USES: {"type", "trigger", "keep", "clear_at_least", "exclude_tools", "clear_tool_inputs"},
          CLEAR_THINKING: {"type", "keep"},
          COMPACT: {"type", "trigger", "pause_after_compaction", "instructions"}}
# Instructions go into the summariser's prompt: bounded, as any client text that reaches a model on its behalf.
MAX_INSTRUCTIONS_CHARS = 16_000


@dataclass(frozen=True)
class ClearToolUses:
    """Old tool results (and, if asked, the calls' inputs) replaced by a placeholder once the trigger is passed."""

    trigger_kind: str = "input_tokens"  # or "tool_uses"
    trigger: int = 100_000
    keep: int = 3
    clear_at_least: int = 0
    exclude_tools: frozenset[str] = frozenset()
    clear_inputs: bool | frozenset[str] = False  # all inputs, none, or those of the named tools

    def clears_input(self, tool: str) -> bool:
        return self.clear_inputs if isinstance(self.clear_inputs, bool) else tool in self.clear_inputs


@dataclass(frozen=True)
class ClearThinking:
    """Thinking blocks kept in the last `keep` assistant turns only; None keeps them all."""

    keep: int | None = 1


@dataclass(frozen=True)
class Compact:
    """Compaction past `trigger` input tokens, announced as a `compaction` block; paused there if asked."""

    trigger: int = 150_000
    pause: bool = False
    instructions: str | None = None


@dataclass(frozen=True)
class ContextEdits:
    """The edits a request asks for, in the order Anthropic applies them; `summarize` is an on-demand compaction."""

    clear_thinking: ClearThinking | None = None
    clear_tool_uses: ClearToolUses | None = None
    compact: Compact | None = None
    summarize: bool = False
    instructions: str | None = None  # for the summary: the compaction edit's, or the on-demand request's

    @property
    def clears(self) -> bool:
        return self.clear_thinking is not None or self.clear_tool_uses is not None


def read_context_edits(payload: dict[str, Any]) -> ContextEdits | None:
    """The request's `context_management` and `compaction`, checked; None when it has neither."""
    management, compaction = payload.get("context_management"), payload.get("compaction")
    if compaction is not None:
        if management is not None:
            raise BadRequest("compaction cannot be combined with context_management", param="compaction")
        return _summarize(compaction)
    if management is None:
        return None
    if not isinstance(management, dict) or set(management) - {"edits"}:
        raise BadRequest("context_management must be an object with one field, edits", param="context_management")
    edits = management.get("edits", [])
    if not isinstance(edits, list):
        raise BadRequest("context_management.edits must be a list", param="context_management.edits")
    return _edits(edits)


def _summarize(compaction: Any) -> ContextEdits:
    if not isinstance(compaction, dict) or compaction.get("type") != "summarize" \
            or set(compaction) - {"type", "instructions"}:
        raise BadRequest('compaction must be {"type": "summarize"} with optional instructions', param="compaction")
    return ContextEdits(summarize=True, instructions=_instructions(compaction.get("instructions"), "compaction"))


def _edits(edits: list[Any]) -> ContextEdits:
    read: dict[str, Any] = {}
    for index, edit in enumerate(edits):
        where = f"context_management.edits[{index}]"
        kind = edit.get("type") if isinstance(edit, dict) else None
        if kind not in _KNOBS:
            raise BadRequest(f"{where}.type must be one of {', '.join(sorted(_KNOBS))}", param=f"{where}.type")
        unknown = sorted(set(edit) - _KNOBS[kind])
        if unknown:
            raise BadRequest(f"{where} has fields this proxy does not know: {', '.join(unknown)}", param=where)
        if kind in read:
            raise BadRequest(f"{where}: {kind} is given twice", param=where)
        if kind == CLEAR_THINKING and read:
            # Anthropic's rule, kept so a request means here what it means there: thinking is cleared first.
            raise BadRequest(f"{where}: {CLEAR_THINKING} must come first in edits", param=where)
        read[kind] = _EDIT_READERS[kind](edit, where)
    compact = read.get(COMPACT)
    return ContextEdits(read.get(CLEAR_THINKING), read.get(CLEAR_TOOL_USES), compact,
                        instructions=compact.instructions if compact is not None else None)


def _clear_tool_uses(edit: dict[str, Any], where: str) -> ClearToolUses:
    kind, trigger = _amount(edit.get("trigger"), ("input_tokens", "tool_uses"), f"{where}.trigger",
                            ("input_tokens", 100_000), minimum=1)
    _, keep = _amount(edit.get("keep"), ("tool_uses",), f"{where}.keep", ("tool_uses", 3), minimum=0)
    _, least = _amount(edit.get("clear_at_least"), ("input_tokens",), f"{where}.clear_at_least", ("input_tokens", 0),
                       minimum=0)
    exclude = _names(edit.get("exclude_tools"), f"{where}.exclude_tools")
    inputs = edit.get("clear_tool_inputs")
    clear_inputs: bool | frozenset[str] = inputs if isinstance(inputs, bool) else \
        False if inputs is None else _names(inputs, f"{where}.clear_tool_inputs")
    return ClearToolUses(kind, trigger, keep, least, exclude, clear_inputs)


def _clear_thinking(edit: dict[str, Any], where: str) -> ClearThinking:
    keep = edit.get("keep")
    if keep in ("all", {"type": "all"}):
        return ClearThinking(None)
    _, turns = _amount(keep, ("thinking_turns",), f"{where}.keep", ("thinking_turns", 1), minimum=1)
    return ClearThinking(turns)


def _compact(edit: dict[str, Any], where: str) -> Compact:
    _, trigger = _amount(edit.get("trigger"), ("input_tokens",), f"{where}.trigger", ("input_tokens", 150_000),
                         minimum=1)
    pause = edit.get("pause_after_compaction", False)
    if not isinstance(pause, bool):
        where = f"{where}.pause_after_compaction"
        raise BadRequest(f"{where} must be true or false", param=where)
    return Compact(trigger, pause, _instructions(edit.get("instructions"), f"{where}.instructions"))


_EDIT_READERS = {CLEAR_TOOL_USES: _clear_tool_uses, CLEAR_THINKING: _clear_thinking, COMPACT: _compact}


def _amount(value: Any, kinds: tuple[str, ...], where: str, default: tuple[str, int], *,
            minimum: int) -> tuple[str, int]:
    """A `{"type": kind, "value": n}` amount, or the default when absent or null."""
    if value is None:
        return default
    kind = value.get("type") if isinstance(value, dict) else None
    number = value.get("value") if isinstance(value, dict) else None
    if isinstance(kind, str) and kind in kinds and set(value) == {"type", "value"} \
            and (is_positive(number) or (number == 0 and not isinstance(number, bool))) and number >= minimum:
        return kind, number
    shapes = " or ".join(f'{{"type": "{known}", "value": n}}' for known in kinds)
    raise BadRequest(f"{where} must be {shapes} with a whole number n of at least {minimum}", param=where)


def _names(value: Any, where: str) -> frozenset[str]:
    if value is None:
        return frozenset()
    if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
        raise BadRequest(f"{where} must be a list of tool names", param=where)
    return frozenset(value)


def _instructions(value: Any, where: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > MAX_INSTRUCTIONS_CHARS:
        raise BadRequest(f"{where} must be a string of at most {MAX_INSTRUCTIONS_CHARS} characters", param=where)
    return value if value.strip() else None  # empty or blank counts as absent, as Anthropic reads it
