"""The Anthropic Messages API in front of an upstream that speaks only chat completions (`dialects.messages.
upstream_api: chat`): each request goes as a chat completion, each answer and error comes back as Messages."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from multidict import CIMultiDict

from proxy.core.messages import Message
from proxy.core.usage import Usage
from proxy.core.view import View
from proxy.dialects.body import encode_json
from proxy.dialects.chat import CHAT
from proxy.dialects.kept_reads import Reads
from proxy.dialects.messages import MessagesDialect
from proxy.dialects.messages_bridge import chat_request, error_from_chat, message_from_chat
from proxy.dialects.messages_bridge_stream import MessagesFromChatStream
from proxy.dialects.messages_request import MessagesCall
from proxy.errors import BadRequest
from proxy.upstream.answer import StreamTap
from proxy.upstream.streaming import looks_like_sse

# Anthropic's own request headers: a chat-completions server knows none of them.
ANTHROPIC_HEADERS = ("anthropic-version", "anthropic-beta")


def chat_headers(headers: Mapping[str, str]) -> CIMultiDict[str]:
    """An Anthropic client's headers as a chat server reads them: its x-api-key as a bearer token where it sent no
    Authorization, Anthropic's version and beta headers left out. A proxy key, whichever header carries it, is
    still withheld on the way out (upstream.request_headers), as from every upstream request."""
    forwarded = CIMultiDict(headers)
    for name in ANTHROPIC_HEADERS:
        forwarded.popall(name, None)
    keys = [key.strip() for key in forwarded.getall("x-api-key", []) if key.strip()]
    if keys and "authorization" not in forwarded:
        forwarded.popall("x-api-key")
        forwarded["Authorization"] = f"Bearer {keys[0]}"
    return forwarded


class ThenTap:
    """The bridge's translation of a chat stream, then the Messages dialect's own tap over what the client gets (its
    announcements, its stop reasons). The usage is the translation's: it reads chat's own count, where the Messages
    tap sees only the 0 that message_start says before chat has counted anything."""

    def __init__(self, translation: MessagesFromChatStream, messages: StreamTap) -> None:
        self._translation = translation
        self._messages = messages

    @property
    def usage(self) -> Usage | None:
        return self._translation.usage or self._messages.usage

    @property
    def finish_reasons(self) -> list[str]:
        return self._messages.finish_reasons or self._translation.finish_reasons

    def feed(self, chunk: bytes) -> bytes:
        return self._messages.feed(self._translation.feed(chunk))

    def finish(self) -> bytes:
        return self._messages.feed(self._translation.finish()) + self._messages.finish()


class MessagesOverChatDialect(MessagesDialect):
    """The Messages dialect with a chat-completions upstream: the parent reads, compacts, edits and announces as
    ever (each override calls it), the bridge turns what it would send into chat and what comes back into Messages."""

    path = "/chat/completions"
    quick_markers: tuple[bytes, ...] | None = None  # every request is translated
    uncounted_markers: tuple[bytes, ...] = ()
    alone_markers: tuple[bytes, ...] = ()

    def parse(self, body: bytes, headers: Mapping[str, str], query: str,
              payload: dict[str, Any] | None = None, reads: Reads | None = None) -> MessagesCall:
        call = super().parse(body, headers, query, payload, reads)  # the payload is what the upstream is to be asked
        headers = chat_headers(call.headers)
        if call.compaction_requested:  # an on-demand compaction: the proxy's to answer, nothing goes upstream
            return replace(call, headers=headers, bridged=True)
        return replace(call, body=encode_json(chat_request(call.payload)), headers=headers, bridged=True)

    def left_alone(self, call: MessagesCall) -> str | None:
        return None  # a chat upstream manages no context of its own: the proxy does

    def edited(self, call: MessagesCall, prompt_tokens: Callable[[], int], count: Callable[[Any], int]) \
            -> MessagesCall:
        edited = super().edited(call, prompt_tokens, count)
        if edited.payload is call.payload:
            return edited
        return replace(edited, body=encode_json(chat_request(edited.payload)))  # the edits, asked of chat

    def splices(self, call: MessagesCall, view: View, front: list[Any], kept_from: int,
                reads: Reads | None = None) -> bool:
        return False  # what goes upstream is a chat request, not the client's body

    def forwarded(self, call: MessagesCall, view: View, history: list[Message], *, ask_usage: bool) -> bytes:
        sent = json.loads(super().forwarded(call, view, history, ask_usage=ask_usage))
        try:
            return encode_json(chat_request(sent))
        except BadRequest:  # a rendering the view does not read back: the neutral history as the journey left it
            return encode_json(chat_request(sent, history))

    def usage(self, payload: Any) -> Usage | None:
        return CHAT.usage(payload)  # the upstream answered as chat completions do

    def tap(self, call: MessagesCall, *, hide_usage: bool, announce: Any = None) -> StreamTap:
        return ThenTap(MessagesFromChatStream(call.payload),
                       super().tap(call, hide_usage=hide_usage, announce=announce))

    def answer_body(self, call: MessagesCall, status: int, body: bytes, announce: Any = None) -> bytes:
        return super().answer_body(call, status, _as_messages(call, status, body), announce)


def _as_messages(call: MessagesCall, status: int, body: bytes) -> bytes:
    """A whole chat answer as Messages: an error in Anthropic's shape; a stream that failed at once (held back and
    judged whole) as its events; a completion as a message; anything else as it came."""
    if not 200 <= status < 300:
        return error_from_chat(status, body)
    if looks_like_sse(body):
        stream = MessagesFromChatStream(call.payload)
        return stream.feed(body) + stream.finish()
    try:
        message = message_from_chat(json.loads(body), call.payload)
    except (ValueError, RecursionError):
        return body
    return encode_json(message) if message is not None else body


MESSAGES_OVER_CHAT = MessagesOverChatDialect()
