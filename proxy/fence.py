"""Markdown code fences that no code inside them can close early."""

from __future__ import annotations

import re

_BACKTICK_RUN = re.compile(r"`+")


def code_fence(code: str) -> str:
    """Fence `code` in backticks one longer than its longest backtick run (at least three)."""
    longest = max((len(run) for run in _BACKTICK_RUN.findall(code)), default=0)
    fence = "`" * max(3, longest + 1)
    body = code if code.endswith("\n") else code + "\n"
    return f"{fence}\n{body}{fence}"
