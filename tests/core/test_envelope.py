"""proxy.core.envelope: a compacted conversation sealed and opened again exactly; anything not the proxy's, or not
well formed, is not opened."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.envelope import MAX_ENVELOPE_CHARS, PREFIX, PREFIX_V1, Sealed, opened, seal

json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
                           max_leaves=10)
items = st.lists(st.dictionaries(st.text(max_size=8), json_values, max_size=4), max_size=4).map(tuple)


@given(items, st.none() | st.text(), items)
def test_a_sealed_conversation_opens_to_itself(before: tuple[Any, ...], summary: str | None,
                                               after: tuple[Any, ...]) -> None:
    sealed = seal(Sealed(before, summary, after))
    assert sealed.startswith(PREFIX) and opened(sealed) == Sealed(before, summary, after)


def encoded(payload: Any, prefix: str = PREFIX) -> str:
    return prefix + base64.urlsafe_b64encode(json.dumps(payload).encode()).decode()


def test_a_version_1_envelope_still_opens_to_its_summary() -> None:
    """Items issued before version 2 held the summary alone: a client resending one keeps its summary."""
    assert opened(encoded({"v": 1, "summary": "the facts"}, PREFIX_V1)) == Sealed((), "the facts", ())


@pytest.mark.parametrize("value", [
    "gAAAAABo-openai-ciphertext", "", None, 5, PREFIX, PREFIX + "!!!", PREFIX + "e30",  # {} names no version
    encoded({"v": 1, "summary": "x"}),  # a version-1 payload behind the version-2 prefix
    encoded({"v": 2, "summary": "x"}, PREFIX_V1),
    encoded({"v": 2, "summary": 3}), encoded({"v": 2, "before": "x"}), encoded({"v": 2, "after": [1, 2]}),
    encoded({"v": 2, "before": [["not", "an", "item"]]}), encoded(["v", 2]),
    encoded({"v": 1, "summary": 3}, PREFIX_V1), encoded({"v": 1}, PREFIX_V1),
    PREFIX + "A" * MAX_ENVELOPE_CHARS,
])
def test_what_is_not_the_proxys_envelope_is_not_opened(value: Any) -> None:
    assert opened(value) is None


@given(st.sampled_from([PREFIX, PREFIX_V1]), st.text(max_size=200))
def test_any_text_after_the_prefix_opens_or_not_but_never_raises(prefix: str, noise: str) -> None:
    result = opened(prefix + noise)
    assert result is None or isinstance(result, Sealed)


def test_a_deeply_nested_envelope_is_refused_not_raised() -> None:
    nested = PREFIX + base64.urlsafe_b64encode(b'{"v":2,"before":[' + b"[" * 100_000 + b"]" * 100_000 + b"]}").decode()
    assert opened(nested) is None
