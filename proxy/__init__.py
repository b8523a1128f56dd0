"""compaction-proxy: an OpenAI-compatible reverse proxy that compacts long conversations.

The public library API is importable from here; each name loads its module on first use, so importing one
submodule (the CLI, a store) does not load tiktoken and jinja2 with it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "Calibration": "proxy.calibration",
    "ChatModel": "proxy.summarizer",
    "FileNote": "proxy.summary",
    "StructuredSummary": "proxy.summary",
    "SummarizerError": "proxy.summarizer",
    "SummarizerOverflow": "proxy.summarizer",
    "Summary": "proxy.summarizer",
    "SummaryTruncated": "proxy.summarizer",
    "Templates": "proxy.templates",
    "TokenCounter": "proxy.tokens",
    "code_fence": "proxy.fence",
    "context_limit_from_error": "proxy.overflow",
    "detect_context_overflow": "proxy.overflow",
    "format_message_for_compacting": "proxy.transcript",
    "format_transcript": "proxy.transcript",
    "summarize": "proxy.summarizer",
    "summary_text": "proxy.summary",
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
    from proxy.calibration import Calibration
    from proxy.fence import code_fence
    from proxy.overflow import context_limit_from_error, detect_context_overflow
    from proxy.summarizer import ChatModel, SummarizerError, SummarizerOverflow, Summary, SummaryTruncated, summarize
    from proxy.summary import FileNote, StructuredSummary, summary_text
    from proxy.templates import Templates
    from proxy.tokens import TokenCounter
    from proxy.transcript import format_message_for_compacting, format_transcript


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'proxy' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
