"""The Anthropic Messages API (`POST /v1/messages`), as Claude Code and the `anthropic` SDK speak it: a dialect of the
journey."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from proxy.core.messages import Message
from proxy.core.tokens import TokenCounter
from proxy.core.usage import Usage, token_count
from proxy.core.view import View
from proxy.dialects.body import encode_json
from proxy.dialects.kept_reads import Reads
from proxy.dialects.messages_blocks import alternate, alternating, read_plainly, render, view_of_messages
from proxy.dialects.messages_clearing import cleared
from proxy.dialects.messages_compaction import (
    FAILED_BLOCK,
    AnnouncingTap,
    Block,
    announced_body,
    compaction_block,
    compaction_message,
    message_events,
    with_compactions_opened,
)
from proxy.dialects.messages_context import read_context_edits
from proxy.dialects.messages_request import MessagesCall
from proxy.errors import ProxyError
from proxy.upstream.answer import StreamTap
from proxy.upstream.overflow import overflow_in_answer
from proxy.upstream.streaming import EventWatcher, SseEvent

# The usage fields whose sum is the prompt the model read: cached parts are reported apart from the rest.
_INPUT_KEYS = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
# Anthropic's error types for the proxy's own statuses (its API reference, "Errors").
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 408: "timeout_error", 413: "request_too_large", 429: "rate_limit_error",
                529: "overloaded_error"}


def messages_usage(usage: Any) -> Usage | None:
    """A Messages `usage` in the neutral form: the prompt is every input count together (cache reads and writes
    included, as the window counts them)."""
    if not isinstance(usage, dict) or not usage:
        return None
    inputs = [token_count(usage.get(key)) for key in _INPUT_KEYS]
    counted = inputs[0] is not None  # the prompt's own count; cache counts alone are not a prompt size
    return Usage(sum(count or 0 for count in inputs) if counted else None, token_count(usage.get("output_tokens")))


class MessagesTap(EventWatcher):
    """A Messages stream's usage and stop reason: the input from `message_start`, the output (cumulative) and
    `stop_reason` from `message_delta`; every byte passes on unchanged (usage is always in the stream)."""

    def __init__(self) -> None:
        super().__init__()
        self._input: int | None = None
        self._output: int | None = None
        self.finish_reasons: list[str] = []

    @property
    def usage(self) -> Usage | None:
        return Usage(self._input, self._output) if self._input is not None else None

    def read(self, events: list[SseEvent]) -> None:
        for event in events:
            payload = event.json()
            kind = payload.get("type") if isinstance(payload, dict) else None
            if kind == "message_start" and isinstance(payload.get("message"), dict):
                usage = messages_usage(payload["message"].get("usage"))
                self._input = usage.input_tokens if usage is not None else self._input
            elif kind == "message_delta":
                usage = payload.get("usage")  # the output so far; the input was in message_start
                output = token_count(usage.get("output_tokens")) if isinstance(usage, dict) else None
                self._output = output if output is not None else self._output
                delta = payload.get("delta")
                reason = delta.get("stop_reason") if isinstance(delta, dict) else None
                if isinstance(reason, str):
                    self.finish_reasons.append(reason)


# The request fields of Anthropic's context management: read by the proxy where it applies them, never forwarded.
_MANAGEMENT_FIELDS = ("context_management", "compaction")
# Announced in a good answer: the compaction block (or None), and the `applied_edits` report (or None).
Announcement = tuple[Block | None, list[dict[str, Any]] | None]


def read_call(body: bytes, headers: Mapping[str, str], query: str, *, upstream_manages: bool,
              payload: dict[str, Any] | None = None, reads: Reads | None = None) -> MessagesCall:
    """A Messages request read. Where the upstream has no context management of its own, the proxy applies it:
    the request's edits are read and checked (400 for anything it cannot honour) and kept off the body the
    upstream sees, and a `compaction` block in `messages` is replaced by what it stands for."""
    call = MessagesCall.parse(body, headers, query, payload)
    if upstream_manages:
        return call
    payload = call.payload
    edits = read_context_edits(payload)
    history = payload.get("messages")
    messages = with_compactions_opened(history, read_plainly(history, reads))
    if messages is None and not any(key in payload for key in _MANAGEMENT_FIELDS):
        return call
    payload = {key: value for key, value in payload.items() if key not in _MANAGEMENT_FIELDS}
    if messages is not None:
        payload["messages"] = messages
    return replace(call, payload=payload, body=encode_json(payload), edits=edits,
                   compaction_requested=edits is not None and edits.summarize)


class MessagesDialect:
    """The Anthropic Messages API: `messages` are compacted, `system` and tools kept as they are."""

    name = "messages"
    path = "/messages"
    # Compaction blocks and on-demand compaction, context-management edits.
    quick_markers: tuple[bytes, ...] | None = (b'"compaction', b'"context_management"')
    uncounted_markers: tuple[bytes, ...] = (b'"image"', b'"document"')
    alone_markers: tuple[bytes, ...] = ()  # what the upstream manages is told by the edits the proxy reads anyway
    history_key = "messages"
    forwards_history_as_read = False

    def __init__(self, *, upstream_manages_context: bool = False) -> None:
        self.upstream_manages_context = upstream_manages_context

    def parse(self, body: bytes, headers: Mapping[str, str], query: str,
              payload: dict[str, Any] | None = None, reads: Reads | None = None) -> MessagesCall:
        return read_call(body, headers, query, upstream_manages=self.upstream_manages_context, payload=payload,
                         reads=reads)

    def history(self, call: MessagesCall, reads: Reads | None = None) -> View | None:
        if self.left_alone(call) is not None:
            return None
        return view_of_messages(call.payload.get("messages"), reads)

    def left_alone(self, call: MessagesCall) -> str | None:
        """Anthropic's own context management, asked of an upstream that runs it: not the proxy's to do behind it
        — unless it asks for nothing to be done (Claude Code sends `clear_thinking` keeping all thinking on every
        request). Where the upstream has none, the proxy applies it (read_call) and nothing is left alone."""
        if not self.upstream_manages_context:
            return None
        management = call.payload.get("context_management")
        if call.payload.get("compaction") is not None:
            return "upstream_manages_context"
        return None if management is None or _changes_nothing(management) else "upstream_manages_context"

    def edited(self, call: MessagesCall, prompt_tokens: Callable[[], int], count: Callable[[Any], int]) \
            -> MessagesCall:
        """The request with its clearing edits applied to what is forwarded, and what they did recorded."""
        edits = call.edits
        messages = call.payload.get("messages")
        if edits is None or not edits.clears or not isinstance(messages, list):
            return call
        clearing = cleared(messages, edits, prompt_tokens, count)
        if not clearing.applied:
            return replace(call, outcomes=clearing.outcomes)
        payload = {**call.payload, "messages": clearing.messages}
        return replace(call, payload=payload, body=encode_json(payload), applied_edits=tuple(clearing.applied),
                       outcomes=clearing.outcomes)

    def forwarded(self, call: MessagesCall, view: View, history: list[Message], *, ask_usage: bool) -> bytes:
        return encode_json({**call.payload, "messages": alternate(view.back(history, render))})

    def rendered(self, made: list[Message]) -> list[Any]:
        return render(made)

    def splices(self, call: MessagesCall, view: View, front: list[Any], kept_from: int,
                reads: Reads | None = None) -> bool:
        # forwarded merges neighbours of one role (alternate): spliced only where it would merge none.
        return view.source is not None and alternating(front, view.source, kept_from, reads)

    def overhead(self, call: MessagesCall, counter: TokenCounter) -> int:
        return counter.count_aside(call.payload.get("system"), call.payload.get("tools"))

    def tools(self, call: MessagesCall) -> Any:
        """The custom tools in chat's shape, for a summariser asked with the conversation's own tools."""
        tools = call.payload.get("tools")
        if not isinstance(tools, list):
            return None
        functions = [{"type": "function", "function": {"name": tool["name"], "description": tool.get("description"),
                                                       "parameters": tool.get("input_schema")}}
                     for tool in tools if isinstance(tool, dict) and isinstance(tool.get("name"), str)
                     and isinstance(tool.get("input_schema"), dict)]
        return functions or None

    def asks_usage(self, call: MessagesCall) -> bool:
        return True  # a Messages stream always reports usage (message_start, message_delta)

    def overflow(self, payload: Any) -> bool:
        return overflow_in_answer(payload)

    def usage(self, payload: Any) -> Usage | None:
        return messages_usage(payload.get("usage")) if isinstance(payload, dict) else None

    def announced(self, call: MessagesCall, view: View, history: list[Message] | None, synthetic: frozenset[int],
                  *, failed: bool = False) -> Announcement | None:
        """For a request whose context management the proxy applied: the compaction block that stands for
        `history` when it was compacted under a compaction edit (a null one when that compaction failed), and the
        `applied_edits` report."""
        edits = call.edits
        if edits is None:
            return None
        block = None
        if edits.compact is not None and history is not None:
            block = compaction_block(view, history, synthetic)
        elif edits.compact is not None and failed:
            block = FAILED_BLOCK
        return block, list(call.applied_edits)

    def compaction_answer(self, call: MessagesCall, view: View, history: list[Message], synthetic: frozenset[int],
                          usage: Usage) -> tuple[bytes, str]:
        """The answer that is the compaction alone (on-demand, or paused after one): JSON or a stream."""
        message = compaction_message(call.model, compaction_block(view, history, synthetic), usage)
        applied = list(call.applied_edits) if call.edits is not None and not call.edits.summarize else None
        if call.stream:
            return message_events(message, applied), "text/event-stream"
        if applied is not None:
            message["context_management"] = {"applied_edits": applied}
        return encode_json(message), "application/json"

    def tap(self, call: MessagesCall, *, hide_usage: bool, announce: Any = None) -> StreamTap:
        return AnnouncingTap(MessagesTap(), *announce) if announce is not None else MessagesTap()

    def answer_body(self, call: MessagesCall, status: int, body: bytes, announce: Any = None) -> bytes:
        return announced_body(body, *announce) if announce is not None and 200 <= status < 300 else body

    def error_body(self, error: ProxyError) -> dict[str, Any]:
        """The proxy's own error as Anthropic shapes errors: `{"type": "error", "error": {"type", "message"}}`."""
        kind = _ERROR_TYPES.get(error.status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": error.message}}


def _changes_nothing(management: Any) -> bool:
    """Edits that leave the conversation as it is: thinking cleared while keeping all of it."""
    edits = management.get("edits") if isinstance(management, dict) and set(management) == {"edits"} else None
    return isinstance(edits, list) and all(
        isinstance(edit, dict) and edit.get("type") == "clear_thinking_20251015"
        and edit.get("keep") in ("all", {"type": "all"}) and set(edit) <= {"type", "keep"} for edit in edits)


MESSAGES = MessagesDialect()
MESSAGES_MANAGING_UPSTREAM = MessagesDialect(upstream_manages_context=True)
