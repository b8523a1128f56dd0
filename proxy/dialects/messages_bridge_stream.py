"""A chat-completion stream as the Messages API's events, translated as the chunks arrive (upstream_api: chat)."""

from __future__ import annotations

import json
from typing import Any

from proxy.core.usage import Usage
from proxy.dialects.call import is_positive
from proxy.dialects.messages_bridge import (
    anthropic_error,
    anthropic_usage,
    dict_of,
    error_text,
    list_of,
    message_id,
    stop_of,
    tool_use_block,
)
from proxy.upstream.streaming import SseDecoder, SseEvent, sse_event


class MessagesFromChatStream:
    """Chat chunks in, Messages events out: `message_start` at the first chunk, text as it comes, then each tool
    call as a whole tool_use block once the choice finishes, `message_delta` (stop reason, usage) and `message_stop`
    at the end; an upstream error as Anthropic's `error` event, after which nothing more is said.

    Tool calls are held until the choice finishes: chat lets a server interleave the argument deltas of parallel
    calls, while Anthropic's blocks follow one another, so a block can only be closed once its call is known whole
    (an agent acts on a call only once the message is complete anyway). Only choice 0 is read (Messages has one)."""

    def __init__(self, request: dict[str, Any]) -> None:
        self._request = request
        self._decoder = SseDecoder()
        self._ident = message_id(None)
        self._started = False
        self._closed = False
        self._blocks = 0  # content blocks started: the index of the next
        self._text: int | None = None  # the open text block's index
        self._calls: dict[int, dict[str, Any]] = {}  # by the chat index: id, function name and arguments so far
        self._sent: set[int] = set()  # the calls already sent as blocks
        self._choice: dict[str, Any] = {}  # the finishing choice: its finish_reason (and vLLM's stop_reason)
        self._usage: dict[str, Any] | None = None
        self._stop: str | None = None

    @property
    def usage(self) -> Usage | None:
        usage = self._usage or {}
        prompt, output = usage.get("prompt_tokens"), usage.get("completion_tokens")
        return Usage(prompt, output if is_positive(output) else 0) if is_positive(prompt) else None

    @property
    def finish_reasons(self) -> list[str]:
        return [self._stop] if self._stop is not None else []

    def feed(self, chunk: bytes) -> bytes:
        return b"".join(self._events(event) for event in self._decoder.feed(chunk))

    def finish(self) -> bytes:
        out = b"".join(self._events(event) for event in self._decoder.flush())
        return out + self._close()

    def _events(self, event: SseEvent) -> bytes:
        if self._closed:
            return b""
        if (event.data or "").strip() == "[DONE]":
            return self._close()
        payload = event.json()
        if event.event == "error" or event.field("error") is not None or \
                (isinstance(payload, dict) and payload.get("error")):
            return self._fail(payload.get("error", payload) if isinstance(payload, dict) else payload)
        if not isinstance(payload, dict):
            return b""
        out = self._start(payload)
        self._usage = payload["usage"] if isinstance(payload.get("usage"), dict) else self._usage
        for choice in list_of(payload.get("choices")):
            if isinstance(choice, dict) and choice.get("index") in (0, None):
                out += self._delta(dict_of(choice.get("delta")))
                if choice.get("finish_reason"):
                    self._choice = choice
                    out += self._flush()
        return out

    def _start(self, payload: dict[str, Any]) -> bytes:
        if self._started:
            return b""
        self._started = True
        self._ident = message_id(payload.get("id"))
        model = payload.get("model")
        # Chat reports usage at the end: the input is 0 here unless this first chunk says it (vLLM can), and the
        # real count follows in message_delta, which Anthropic's clients read over message_start's.
        usage = anthropic_usage(payload.get("usage"))
        message: dict[str, Any] = {
            "id": self._ident, "type": "message", "role": "assistant", "content": [],
            "model": model if isinstance(model, str) else self._request.get("model"), "stop_reason": None,
            "stop_sequence": None, "usage": {**usage, "output_tokens": 0}}
        return sse_event({"type": "message_start", "message": message})

    def _delta(self, delta: dict[str, Any]) -> bytes:
        out = b""
        for text in (delta.get("content"), delta.get("refusal")):
            if isinstance(text, str) and text:
                if self._text is None:
                    self._text = self._open()
                    out += sse_event({"type": "content_block_start", "index": self._text,
                                      "content_block": {"type": "text", "text": ""}})
                out += sse_event({"type": "content_block_delta", "index": self._text,
                                  "delta": {"type": "text_delta", "text": text}})
        for call in list_of(delta.get("tool_calls")):
            if isinstance(call, dict):
                self._gather(call)
        return out

    def _gather(self, call: dict[str, Any]) -> None:
        given = call.get("index")
        index = given if isinstance(given, int) and not isinstance(given, bool) else len(self._calls)
        function = dict_of(call.get("function"))
        held = self._calls.setdefault(index, {"id": None, "name": None, "arguments": ""})
        for key, value in (("id", call.get("id")), ("name", function.get("name"))):
            if isinstance(value, str) and value and not held[key]:
                held[key] = value
        if isinstance(piece := function.get("arguments"), str):
            held["arguments"] += piece

    def _open(self) -> int:
        self._blocks += 1
        return self._blocks - 1

    def _flush(self) -> bytes:
        """Close the text block, and send every call gathered since the last flush as its tool_use block."""
        out = b""
        if self._text is not None:
            out += sse_event({"type": "content_block_stop", "index": self._text})
            self._text = None
        for index in sorted(set(self._calls) - self._sent):
            held = self._calls[index]
            call = {"id": held["id"], "function": {"name": held["name"], "arguments": held["arguments"]}}
            block = tool_use_block(call, self._ident, index)
            at = self._open()
            out += sse_event({"type": "content_block_start", "index": at, "content_block": {**block, "input": {}}})
            out += sse_event({"type": "content_block_delta", "index": at, "delta": {
                "type": "input_json_delta", "partial_json": json.dumps(block["input"], ensure_ascii=False)}})
            out += sse_event({"type": "content_block_stop", "index": at})
        self._sent.update(self._calls)
        return out

    def _close(self) -> bytes:
        if self._closed or not self._started:
            self._closed = True
            return b""
        out = self._flush()
        self._closed = True
        self._stop, sequence = stop_of(self._choice, self._request, calls=bool(self._calls))
        usage = anthropic_usage(self._usage)
        if self.usage is None:
            usage.pop("input_tokens")  # unknown: message_start's stands
        out += sse_event({"type": "message_delta", "delta": {"stop_reason": self._stop, "stop_sequence": sequence},
                          "usage": usage})
        return out + sse_event({"type": "message_stop"})

    def _fail(self, error: Any) -> bytes:
        """The upstream's error as Anthropic's `error` event: its status from the error's numeric code (vLLM and
        llama.cpp give one), a server error otherwise."""
        self._closed = True
        code = error.get("code") if isinstance(error, dict) else None
        status = code if isinstance(code, int) and 400 <= code <= 599 else 500
        return sse_event(anthropic_error(status, error_text(error)))
