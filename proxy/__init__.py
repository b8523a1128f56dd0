"""compaction-proxy: an OpenAI-compatible reverse proxy that compacts long conversations."""

from proxy.overflow import context_limit_from_error, detect_context_overflow
from proxy.summarizer import ChatModel, SummarizerError, SummarizerOverflow, Summary, SummaryTruncated, summarize
from proxy.summary import FileNote, StructuredSummary, code_fence, summary_text
from proxy.templates import Templates
from proxy.tokens import Calibration, TokenCounter
from proxy.transcript import format_message_for_compacting, format_transcript

__version__ = "0.1.0"

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
