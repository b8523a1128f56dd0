"""proxy.core.usage: usage records of any API read into one form, and nonsense read as nothing."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.core.usage import Usage, usage_from


@pytest.mark.parametrize(("record", "expected"), [
    pytest.param({"prompt_tokens": 10, "completion_tokens": 5}, Usage(10, 5), id="chat usage"),
    pytest.param({"prompt_tokens": 10}, Usage(10, None), id="no output count"),
    pytest.param({"prompt_tokens": 0, "completion_tokens": 0}, Usage(0, 0), id="zeros are counts"),
    pytest.param({"prompt_tokens": -1, "completion_tokens": 3}, Usage(None, 3), id="negative is no count"),
    pytest.param({"prompt_tokens": True, "completion_tokens": 2.5}, Usage(None, None), id="bool and float are not"),
    pytest.param({"prompt_tokens": "10"}, Usage(None, None), id="a string is not a count"),
    pytest.param({"total_tokens": 15}, Usage(None, None), id="other keys only"),
    pytest.param({}, None, id="empty record"),
    pytest.param(None, None, id="absent"),
    pytest.param([10, 5], None, id="not a record"),
])
def test_usage_from_a_chat_record(record: Any, expected: Usage | None) -> None:
    assert usage_from(record, "prompt_tokens", "completion_tokens") == expected


def test_the_keys_are_the_dialects_to_name() -> None:
    record = {"input_tokens": 7, "output_tokens": 2, "prompt_tokens": 99}
    assert usage_from(record, "input_tokens", "output_tokens") == Usage(7, 2)
