"""Markdown code fences and code spans that no text inside them can close early."""

from __future__ import annotations

import re

_BACKTICK_RUN = re.compile(r"`+")


def code_fence(code: str) -> str:
    """Fence `code` in backticks one longer than its longest backtick run (at least three)."""
    longest = max((len(run) for run in _BACKTICK_RUN.findall(code)), default=0)
    fence = "`" * max(3, longest + 1)
    body = code if code.endswith("\n") else code + "\n"
    return f"{fence}\n{body}{fence}"


def inline_code(text: str) -> str:
    """`text` as one inline code span: delimited by a backtick run longer than any inside it, padded with a space
    where it starts or ends with a backtick (CommonMark strips one such space from each end)."""
    longest = max((len(run) for run in _BACKTICK_RUN.findall(text)), default=0)
    fence = "`" * (longest + 1)
    padded = f" {text} " if text.startswith("`") or text.endswith("`") else text
    return f"{fence}{padded}{fence}"
