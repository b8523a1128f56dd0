"""The Responses API (`POST /v1/responses`), as Codex and the OpenAI Agents SDK speak it: a dialect of the journey."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from proxy.core.messages import Message
from proxy.core.tokens import TokenCounter
from proxy.core.usage import Usage, usage_from
from proxy.core.view import View
from proxy.dialects.body import encode_json
from proxy.dialects.chat import CHAT
from proxy.dialects.kept_reads import Reads
from proxy.dialects.responses_bridge import ResponsesFromChatStream, chat_request, chat_tools, response_from_chat
from proxy.dialects.responses_compaction import (
    CLOSING_EVENTS,
    AnnouncingTap,
    announced_body,
    compaction_item,
    compaction_turn,
    turn_events,
    with_envelopes_opened,
)
from proxy.dialects.responses_items import as_input_items, read_plainly, render, view_of_input
from proxy.dialects.responses_request import ResponsesCall, without_trigger
from proxy.errors import BadRequest, ProxyError
from proxy.upstream.answer import StreamTap
from proxy.upstream.overflow import overflow_in_answer
from proxy.upstream.streaming import EventWatcher, SseEvent


def responses_usage(record: Any) -> Usage | None:
    """`{"input_tokens": .., "output_tokens": ..}` in the neutral form."""
    usage = record.get("usage") if isinstance(record, dict) else None
    return usage_from(usage, "input_tokens", "output_tokens") if isinstance(usage, dict) else None


def read_call(body: bytes, headers: Mapping[str, str], query: str, *, upstream_compacts: bool,
              payload: dict[str, Any] | None = None, reads: Reads | None = None) -> ResponsesCall:
    """The request as the journey reads it. The proxy's own compaction items are opened into what they stand for
    (no upstream can read them; another issuer's items pass byte for byte). Where the upstream does not compact,
    the proxy honours OpenAI's compaction contract itself: a closing `compaction_trigger` is the proxy's to answer
    (out of the conversation read, still in the body should the request be forwarded), and a `context_management`
    entry is the proxy's to apply (out of the body the upstream sees)."""
    call = ResponsesCall.parse(body, headers, query, payload)
    payload = call.payload
    given = payload.get("input")
    items = with_envelopes_opened(given, read_plainly(given, reads))
    if items is not None:
        payload = {**payload, "input": items}
    withheld = () if upstream_compacts else ("context_management",)  # read here, never the upstream's to see
    if items is not None or any(key in payload for key in withheld):
        body = encode_json({key: value for key, value in payload.items() if key not in withheld})
    asked = None if upstream_compacts else without_trigger(payload)
    return replace(call, payload=asked or payload, body=body, compaction_requested=asked is not None)


class ResponsesTap(EventWatcher):
    """A Responses stream's usage and status, read from its closing event; every byte passes on unchanged (usage is
    always in the stream, so there is nothing the proxy asked for and must hide)."""

    def __init__(self) -> None:
        super().__init__()
        self.usage: Usage | None = None
        self.finish_reasons: list[str] = []

    def read(self, events: list[SseEvent]) -> None:
        for event in events:
            payload = event.json()
            if not isinstance(payload, dict) or payload.get("type") not in CLOSING_EVENTS:
                continue
            response = payload.get("response")
            self.usage = responses_usage(response) or self.usage
            status = response.get("status") if isinstance(response, dict) else None
            if isinstance(status, str):
                self.finish_reasons.append(status)


class ResponsesDialect:
    """The OpenAI Responses API: stateless `input` lists are compacted; a history held upstream is left alone."""

    name = "responses"
    path = "/responses"
    # Compaction items and triggers, context management; then a history kept upstream, the upstream's truncation.
    quick_markers: tuple[bytes, ...] | None = (b'"compaction', b'"context_management"')
    uncounted_markers: tuple[bytes, ...] = (b'"input_image"', b'"input_file"', b'"input_audio"')
    alone_markers: tuple[bytes, ...] = (b'"truncation"', b'"previous_response_id"', b'"conversation"')
    history_key = "input"
    forwards_history_as_read = False

    def __init__(self, *, upstream_compacts: bool = False) -> None:
        # The upstream runs OpenAI's compaction itself (OpenAI's own API): requests asking for it are its to serve.
        self.upstream_compacts = upstream_compacts

    def parse(self, body: bytes, headers: Mapping[str, str], query: str,
              payload: dict[str, Any] | None = None, reads: Reads | None = None) -> ResponsesCall:
        return read_call(body, headers, query, upstream_compacts=self.upstream_compacts, payload=payload,
                         reads=reads)

    def history(self, call: ResponsesCall, reads: Reads | None = None) -> View | None:
        if self.left_alone(call) is not None:
            return None
        return view_of_input(call.payload.get("input"), reads)

    def left_alone(self, call: ResponsesCall) -> str | None:
        """The upstream's own context management, or a history it keeps: not the proxy's to shorten."""
        if call.history_upstream:
            return "history_upstream"
        if self.upstream_compacts and call.upstream_context:
            return "upstream_manages_context"
        return None

    def forwarded(self, call: ResponsesCall, view: View, history: list[Message], *, ask_usage: bool) -> bytes:
        payload = {**call.payload, "input": as_input_items(view.back(history, render))}
        if not self.upstream_compacts:
            payload.pop("context_management", None)  # the proxy applies it: not the upstream's to read
        return encode_json(payload)

    def rendered(self, made: list[Message]) -> list[Any]:
        return render(made)

    def splices(self, call: ResponsesCall, view: View, front: list[Any], kept_from: int,
                reads: Reads | None = None) -> bool:
        return self.upstream_compacts or "context_management" not in call.payload  # else forwarded without it

    def overhead(self, call: ResponsesCall, counter: TokenCounter) -> int:
        return counter.count_aside(call.payload.get("instructions"), call.payload.get("tools"))

    def tools(self, call: ResponsesCall) -> Any:
        """The function tools in chat's shape, for a summariser that is asked with the conversation's own tools."""
        return chat_tools(call.payload.get("tools"), ("name", "description", "parameters"))

    def asks_usage(self, call: ResponsesCall) -> bool:
        return True  # a Responses stream always ends with the whole response, usage included

    def overflow(self, payload: Any) -> bool:
        return overflow_in_answer(payload)

    def usage(self, payload: Any) -> Usage | None:
        return responses_usage(payload)

    def edited(self, call: ResponsesCall, prompt_tokens: Callable[[], int], count: Callable[[Any], int]) \
            -> ResponsesCall:
        return call  # OpenAI's compaction entry is a threshold (compact_threshold), not an edit

    def announced(self, call: ResponsesCall, view: View, history: list[Message] | None, synthetic: frozenset[int],
                  *, failed: bool = False) -> Any:
        """The compaction item that stands for `history`, for a client whose `context_management` entry asked the
        proxy to compact: it may drop everything before the item from then on, as with OpenAI's own."""
        if history is None or not call.asks_compaction or self.upstream_compacts:
            return None
        return compaction_item(view, history, synthetic)

    def compaction_answer(self, call: ResponsesCall, view: View, history: list[Message], synthetic: frozenset[int],
                          usage: Usage) -> tuple[bytes, str]:
        """The answer to a request that ends with a `compaction_trigger`: one response whose only output is the
        compaction item, streamed as the client asked."""
        response = compaction_turn(call, compaction_item(view, history, synthetic), usage)
        return (turn_events(response), "text/event-stream") if call.stream else \
            (encode_json(response), "application/json")

    def tap(self, call: ResponsesCall, *, hide_usage: bool, announce: Any = None) -> StreamTap:
        return AnnouncingTap(ResponsesTap(), announce) if announce is not None else ResponsesTap()

    def answer_body(self, call: ResponsesCall, status: int, body: bytes, announce: Any = None) -> bytes:
        return announced_body(body, announce) if announce is not None and 200 <= status < 300 else body

    def error_body(self, error: ProxyError) -> dict[str, Any]:
        return error.body()  # the Responses API answers errors in the same {"error": {...}} shape as chat


RESPONSES = ResponsesDialect()
RESPONSES_COMPACTING_UPSTREAM = ResponsesDialect(upstream_compacts=True)


class ResponsesOverChatDialect(ResponsesDialect):
    """The Responses API in front of an upstream that speaks only chat completions (llama.cpp, older vLLM, many
    gateways): every request goes as a chat completion, every answer comes back as a response."""

    path = "/chat/completions"
    quick_markers: tuple[bytes, ...] | None = None  # every request is translated
    uncounted_markers: tuple[bytes, ...] = ()
    alone_markers: tuple[bytes, ...] = ()

    def parse(self, body: bytes, headers: Mapping[str, str], query: str,
              payload: dict[str, Any] | None = None, reads: Reads | None = None) -> ResponsesCall:
        call = read_call(body, headers, query, upstream_compacts=False, payload=payload, reads=reads)
        if call.history_upstream:
            raise BadRequest("this proxy's upstream keeps no responses: send the whole input instead of "
                             "previous_response_id or conversation", param="previous_response_id")
        view = view_of_input(call.payload.get("input"))
        if view is None:
            raise BadRequest("the input holds items a chat-completions upstream cannot take", param="input")
        return replace(call, body=encode_json(chat_request(call.payload, view.messages)), bridged=True)

    def left_alone(self, call: ResponsesCall) -> str | None:
        return None  # a chat upstream manages no context of its own: the proxy does

    def forwarded(self, call: ResponsesCall, view: View, history: list[Message], *, ask_usage: bool) -> bytes:
        return encode_json(chat_request(call.payload, history))

    def splices(self, call: ResponsesCall, view: View, front: list[Any], kept_from: int,
                reads: Reads | None = None) -> bool:
        return False  # what goes upstream is a chat request, not the client's body

    def usage(self, payload: Any) -> Usage | None:
        return CHAT.usage(payload)  # the upstream answered as chat completions do

    def tap(self, call: ResponsesCall, *, hide_usage: bool, announce: Any = None) -> StreamTap:
        stream = ResponsesFromChatStream(call.payload)
        return AnnouncingTap(stream, announce) if announce is not None else stream

    def answer_body(self, call: ResponsesCall, status: int, body: bytes, announce: Any = None) -> bytes:
        if not 200 <= status < 300:
            return body  # errors keep the upstream's words: both APIs shape them {"error": {...}}
        try:
            response = response_from_chat(json.loads(body), call.payload)
        except ValueError:
            return body
        if response is None:
            return body
        return announced_body(encode_json(response), announce) if announce is not None else encode_json(response)


RESPONSES_OVER_CHAT = ResponsesOverChatDialect()
