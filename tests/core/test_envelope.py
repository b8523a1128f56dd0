"""proxy.core.envelope: a summary sealed and opened again exactly; anything not the proxy's is not opened."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.envelope import MAX_ENVELOPE_CHARS, PREFIX, opened, seal


@given(st.text())
def test_a_sealed_summary_opens_to_itself(summary: str) -> None:
    sealed = seal(summary)
    assert sealed.startswith(PREFIX) and opened(sealed) == summary


def encoded(payload: Any) -> str:
    return PREFIX + base64.urlsafe_b64encode(json.dumps(payload).encode()).decode()


@pytest.mark.parametrize("value", [
    "gAAAAABo-openai-ciphertext", "", None, 5, PREFIX, PREFIX + "!!!", PREFIX + "e30",  # {} has no summary
    encoded({"v": 2, "summary": "x"}), encoded({"v": 1, "summary": 3}), encoded(["v", 1]),
    PREFIX + "A" * MAX_ENVELOPE_CHARS,
])
def test_what_is_not_the_proxys_envelope_is_not_opened(value: Any) -> None:
    assert opened(value) is None


@given(st.text(max_size=200))
def test_any_text_after_the_prefix_opens_or_not_but_never_raises(noise: str) -> None:
    result = opened(PREFIX + noise)
    assert result is None or isinstance(result, str)
