"""Anthropic's context management read and checked: every knob honoured with Anthropic's defaults, or a 400 that
names the field."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.dialects.messages_context import (
    MAX_INSTRUCTIONS_CHARS,
    ClearThinking,
    ClearToolUses,
    Compact,
    ContextEdits,
    read_context_edits,
)
from proxy.errors import BadRequest

TOOLS = "clear_tool_uses_20250919"
THINKING = "clear_thinking_20251015"
COMPACT = "compact_20260112"


def edits(*entries: Any) -> dict[str, Any]:
    return {"context_management": {"edits": list(entries)}}


@pytest.mark.parametrize(("payload", "expected"), [
    ({}, None),
    ({"context_management": {"edits": []}}, ContextEdits()),
    ({"context_management": {}}, ContextEdits()),
    # Anthropic's defaults: clearing past 100,000 input tokens keeping 3 uses; thinking keeps 1 turn; compaction
    # past 150,000 input tokens.
    (edits({"type": TOOLS}), ContextEdits(clear_tool_uses=ClearToolUses())),
    (edits({"type": THINKING}), ContextEdits(clear_thinking=ClearThinking(1))),
    (edits({"type": COMPACT}), ContextEdits(compact=Compact())),
    (edits({"type": TOOLS, "trigger": {"type": "tool_uses", "value": 5}, "keep": {"type": "tool_uses", "value": 0},
            "clear_at_least": {"type": "input_tokens", "value": 2000}, "exclude_tools": ["memory"],
            "clear_tool_inputs": True}),
     ContextEdits(clear_tool_uses=ClearToolUses("tool_uses", 5, 0, 2000, frozenset({"memory"}), True))),
    (edits({"type": TOOLS, "trigger": {"type": "input_tokens", "value": 30_000}, "clear_tool_inputs": ["bash"],
            "exclude_tools": None, "clear_at_least": None}),
     ContextEdits(clear_tool_uses=ClearToolUses("input_tokens", 30_000, clear_inputs=frozenset({"bash"})))),
    (edits({"type": THINKING, "keep": "all"}), ContextEdits(clear_thinking=ClearThinking(None))),
    (edits({"type": THINKING, "keep": {"type": "all"}}), ContextEdits(clear_thinking=ClearThinking(None))),
    (edits({"type": THINKING, "keep": {"type": "thinking_turns", "value": 3}}),
     ContextEdits(clear_thinking=ClearThinking(3))),
    (edits({"type": THINKING}, {"type": TOOLS}, {"type": COMPACT, "trigger": {"type": "input_tokens", "value": 9000},
                                                "pause_after_compaction": True, "instructions": "Keep paths."}),
     ContextEdits(ClearThinking(1), ClearToolUses(), Compact(9000, True, "Keep paths."), instructions="Keep paths.")),
    (edits({"type": COMPACT, "instructions": "   "}), ContextEdits(compact=Compact())),  # blank counts as absent
    ({"compaction": {"type": "summarize"}}, ContextEdits(summarize=True)),
    ({"compaction": {"type": "summarize", "instructions": "Only decisions."}},
     ContextEdits(summarize=True, instructions="Only decisions.")),
])
def test_every_knob_is_read(payload: dict[str, Any], expected: ContextEdits | None) -> None:
    assert read_context_edits(payload) == expected


@pytest.mark.parametrize(("payload", "param"), [
    ({"context_management": []}, "context_management"),
    ({"context_management": {"edits": [], "other": 1}}, "context_management"),
    ({"context_management": {"edits": {}}}, "context_management.edits"),
    (edits("clear"), "context_management.edits[0].type"),
    (edits({"type": "clear_everything"}), "context_management.edits[0].type"),
    (edits({"type": TOOLS, "placeholder": "x"}), "context_management.edits[0]"),  # a knob we do not have: refused
    (edits({"type": TOOLS}, {"type": TOOLS}), "context_management.edits[1]"),
    (edits({"type": TOOLS}, {"type": THINKING}), "context_management.edits[1]"),  # thinking must come first
    (edits({"type": TOOLS, "trigger": {"type": "fraction", "value": 1}}), "context_management.edits[0].trigger"),
    (edits({"type": TOOLS, "trigger": {"type": "input_tokens", "value": 0}}), "context_management.edits[0].trigger"),
    (edits({"type": TOOLS, "trigger": {"type": "input_tokens", "value": True}}),
     "context_management.edits[0].trigger"),
    (edits({"type": TOOLS, "trigger": {"type": "input_tokens", "value": 1.5}}),
     "context_management.edits[0].trigger"),
    (edits({"type": TOOLS, "trigger": 5000}), "context_management.edits[0].trigger"),
    (edits({"type": TOOLS, "keep": {"type": "tool_uses", "value": -1}}), "context_management.edits[0].keep"),
    (edits({"type": TOOLS, "keep": {"type": "input_tokens", "value": 3}}), "context_management.edits[0].keep"),
    (edits({"type": TOOLS, "keep": {"type": "tool_uses", "value": 3, "x": 1}}), "context_management.edits[0].keep"),
    (edits({"type": TOOLS, "clear_at_least": {"type": "tool_uses", "value": 3}}),
     "context_management.edits[0].clear_at_least"),
    (edits({"type": TOOLS, "exclude_tools": "bash"}), "context_management.edits[0].exclude_tools"),
    (edits({"type": TOOLS, "exclude_tools": [1]}), "context_management.edits[0].exclude_tools"),
    (edits({"type": TOOLS, "clear_tool_inputs": "yes"}), "context_management.edits[0].clear_tool_inputs"),
    (edits({"type": THINKING, "keep": {"type": "thinking_turns", "value": 0}}), "context_management.edits[0].keep"),
    (edits({"type": THINKING, "keep": "some"}), "context_management.edits[0].keep"),
    (edits({"type": COMPACT, "trigger": {"type": "tool_uses", "value": 5}}), "context_management.edits[0].trigger"),
    (edits({"type": COMPACT, "pause_after_compaction": "yes"}),
     "context_management.edits[0].pause_after_compaction"),
    (edits({"type": COMPACT, "instructions": 5}), "context_management.edits[0].instructions"),
    (edits({"type": COMPACT, "instructions": "x" * (MAX_INSTRUCTIONS_CHARS + 1)}),
     "context_management.edits[0].instructions"),
    ({"compaction": {"type": "summarize"}, "context_management": {"edits": []}}, "compaction"),
    ({"compaction": {"type": "auto"}}, "compaction"),
    ({"compaction": {"type": "summarize", "trigger": 5}}, "compaction"),
    ({"compaction": "summarize"}, "compaction"),
])
def test_what_cannot_be_honoured_is_refused_naming_the_field(payload: dict[str, Any], param: str) -> None:
    with pytest.raises(BadRequest) as raised:
        read_context_edits(payload)
    assert raised.value.param == param and raised.value.status == 400
    assert param.split(".")[-1].split("[")[0] in raised.value.message or param == "context_management"


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                      max_size=3), max_leaves=12)


@given(management=json_values, compaction=json_values)
def test_any_value_is_read_or_refused_never_anything_else(management: Any, compaction: Any) -> None:
    try:
        read = read_context_edits({"context_management": management, "compaction": compaction})
    except BadRequest as refused:
        assert refused.param is not None
    else:
        assert read is None or isinstance(read, ContextEdits)
