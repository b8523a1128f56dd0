"""The tokens an answer reports it used, in one form whichever client API reported them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Usage:
    """Prompt (input) and answer (output) tokens; None where the answer did not say, or said nonsense."""

    input_tokens: int | None = None
    output_tokens: int | None = None


def token_count(value: Any) -> int | None:
    """`value` when it is a token count (a whole number, 0 or more), else None: bool is an int to Python, never a
    token count to an API."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def usage_from(record: Any, input_key: str, output_key: str) -> Usage | None:
    """The usage in a record such as `{"prompt_tokens": 10, "completion_tokens": 5}`; None when it is not one."""
    if not isinstance(record, dict) or not record:
        return None
    return Usage(token_count(record.get(input_key)), token_count(record.get(output_key)))
