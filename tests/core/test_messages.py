"""The OpenAI message shape, read totally: any JSON in, an answer out, never an exception."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core import messages as shape


@pytest.mark.parametrize(
    ("message", "role", "instruction", "tool_result", "calls"),
    [
        ({"role": "system"}, "system", True, False, None),
        ({"role": "developer"}, "developer", True, False, None),
        ({"role": "user", "content": "x"}, "user", False, False, None),
        ({"role": "tool", "tool_call_id": "a"}, "tool", False, True, None),
        ({"role": "function", "name": "f"}, "function", False, True, None),
        ({"role": "assistant", "tool_calls": [{"id": "a"}, {"id": "b"}]}, "assistant", False, False, ["a", "b"]),
        ({"role": "assistant", "tool_calls": []}, "assistant", False, False, None),
        ({"role": "assistant", "tool_calls": ["junk"]}, "assistant", False, False, [None]),
        ({"role": ["user"]}, None, False, False, None),
        ("not a message", None, False, False, None),
    ],
)
def test_shape(message: Any, role: str | None, instruction: bool, tool_result: bool, calls: list[Any] | None) -> None:
    assert shape.role(message) == role
    assert shape.is_instruction(message) is instruction
    assert shape.is_tool_result(message) is tool_result
    assert shape.call_ids(message) == calls


@pytest.mark.parametrize(
    ("content", "text"),
    [("plain", "plain"), ([{"type": "text", "text": "a"}, {"type": "image_url"}, {"text": "b"}], "ab"),
     (None, ""), (5, ""), ([1, "x", {"text": 3}], "")],
)
def test_content_text(content: Any, text: str) -> None:
    assert shape.content_text(content) == text


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(),
                           lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner), max_leaves=20)


@given(json_values)
def test_any_json_is_read_without_error(value: Any) -> None:
    shape.role(value)
    shape.call_ids(value)
    shape.answered_call_id(value)
    shape.content_text(value)


@pytest.mark.parametrize(("text", "valid"), [
    ("plain", "plain"),
    ("emoji \U0001f600 and é", "emoji \U0001f600 and é"),
    ("lone high \ud800 here", "lone high \ufffd here"),
    ("lone low \udfff", "lone low \ufffd"),
    ("\udfff\ud800", "\ufffd\ufffd"),  # a low then a high surrogate are two lone ones, not a pair
    ("", ""),
])
def test_valid_text(text: str, valid: str) -> None:
    assert shape.valid_text(text) == valid
    shape.valid_text(text).encode("utf-8")  # strict


@given(st.text(st.characters(exclude_categories=())))
def test_valid_text_always_encodes_and_keeps_valid_text_as_it_is(text: str) -> None:
    made = shape.valid_text(text)
    made.encode("utf-8")
    assert len(made) == len(text)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return
    assert made is text
