"""compaction-proxy: an OpenAI-compatible reverse proxy that compacts long conversations.

The public library API is importable from here; each name loads its module on first use, so importing one
submodule (the CLI, a store) does not load tiktoken and jinja2 with it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "Calibration": "proxy.core.calibration",
    "ChatModel": "proxy.summarizer.summarizer",
    "FileNote": "proxy.summarizer.summary",
    "StructuredSummary": "proxy.summarizer.summary",
    "SummarizerError": "proxy.summarizer.summarizer",
    "SummarizerOverflow": "proxy.summarizer.summarizer",
    "Summary": "proxy.summarizer.summarizer",
    "SummaryTruncated": "proxy.summarizer.summarizer",
    "Templates": "proxy.summarizer.templates",
    "TokenCounter": "proxy.core.tokens",
    "code_fence": "proxy.summarizer.fence",
    "context_limit_from_error": "proxy.upstream.overflow",
    "detect_context_overflow": "proxy.upstream.overflow",
    "format_message_for_compacting": "proxy.summarizer.transcript",
    "format_transcript": "proxy.summarizer.transcript",
    "summarize": "proxy.summarizer.summarizer",
    "summary_text": "proxy.summarizer.summary",
}

__all__ = [
    "Calibration",
    "ChatModel",
    "FileNote",
    "StructuredSummary",
    "SummarizerError",
    "SummarizerOverflow",
    "Summary",
    "SummaryTruncated",
    "Templates",
    "TokenCounter",
    "code_fence",
    "context_limit_from_error",
    "detect_context_overflow",
    "format_message_for_compacting",
    "format_transcript",
    "summarize",
    "summary_text",
]

if TYPE_CHECKING:
    from proxy.core.calibration import Calibration
    from proxy.core.tokens import TokenCounter
    from proxy.summarizer.fence import code_fence
    from proxy.summarizer.summarizer import (
        ChatModel,
        SummarizerError,
        SummarizerOverflow,
        Summary,
        SummaryTruncated,
        summarize,
    )
    from proxy.summarizer.summary import FileNote, StructuredSummary, summary_text
    from proxy.summarizer.templates import Templates
    from proxy.summarizer.transcript import format_message_for_compacting, format_transcript
    from proxy.upstream.overflow import context_limit_from_error, detect_context_overflow


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'proxy' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
