"""Chat completions (`POST /v1/chat/completions`), the first dialect: its messages are the neutral conversation."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from proxy.core.messages import Message
from proxy.core.tokens import TokenCounter
from proxy.core.usage import Usage, usage_from
from proxy.core.view import View
from proxy.dialects.body import encode_json
from proxy.dialects.chat_request import ChatCall
from proxy.dialects.kept_reads import Reads
from proxy.errors import ProxyError
from proxy.upstream.overflow import overflow_in_answer
from proxy.upstream.streaming import UsageTap, usage_of

# Request fields through which a provider manages the context itself; such requests are left alone.
SELF_MANAGED_FIELDS = ("context_management", "truncation", "transforms")


def chat_usage(record: Any) -> Usage | None:
    """`{"prompt_tokens": .., "completion_tokens": ..}` in the neutral form."""
    return usage_from(record, "prompt_tokens", "completion_tokens")


class ChatTap:
    """A chat stream's usage (from its usage chunk, which is hidden when only the proxy asked for it)."""

    def __init__(self, *, hide_usage: bool) -> None:
        self._tap = UsageTap(hide_usage_chunk=hide_usage)

    @property
    def usage(self) -> Usage | None:
        return chat_usage(self._tap.usage)

    @property
    def finish_reasons(self) -> list[str]:
        return self._tap.finish_reasons

    def feed(self, chunk: bytes) -> bytes:
        return self._tap.feed(chunk)

    def finish(self) -> bytes:
        return self._tap.finish()


class ChatDialect:
    """The OpenAI chat-completions API, as most SDKs, LangChain, aider and goose speak it."""

    name = "chat"
    path = "/chat/completions"
    quick_markers: tuple[bytes, ...] | None = ()  # nothing in a body asks the proxy for anything
    uncounted_markers: tuple[bytes, ...] = (b'"image_url"', b'"input_audio"', b'"file"')
    alone_markers: tuple[bytes, ...] = ()
    history_key = "messages"
    forwards_history_as_read = True

    def parse(self, body: bytes, headers: Mapping[str, str], query: str,
              payload: dict[str, Any] | None = None, reads: Reads | None = None) -> ChatCall:
        return ChatCall.parse(body, headers, query, payload)

    def history(self, call: ChatCall, reads: Reads | None = None) -> View | None:
        if call.messages is None or any(name in call.payload for name in SELF_MANAGED_FIELDS):
            return None
        return View(call.messages)  # the messages are the neutral view: no groups, mapped back as they are

    def left_alone(self, call: ChatCall) -> str | None:
        return None  # chat's requests that are not compacted say "none", as they always have

    def rendered(self, made: list[Message]) -> list[Any]:
        return list(made)

    def splices(self, call: ChatCall, view: View, front: list[Any], kept_from: int,
                reads: Reads | None = None) -> bool:
        return False  # spliced as read (forwards_history_as_read), the summary's JSON kept while it is reused

    def forwarded(self, call: ChatCall, view: View, history: list[Message], *, ask_usage: bool) -> bytes:
        payload = {**call.payload, "messages": history}
        if ask_usage:
            options = call.payload.get("stream_options")
            payload["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
        return encode_json(payload)

    def overhead(self, call: ChatCall, counter: TokenCounter) -> int:
        return counter.count_request({**call.payload, "messages": []})

    def tools(self, call: ChatCall) -> Any:
        return call.payload.get("tools")

    def asks_usage(self, call: ChatCall) -> bool:
        options = call.payload.get("stream_options")
        return isinstance(options, dict) and options.get("include_usage") is True

    def overflow(self, payload: Any) -> bool:
        return overflow_in_answer(payload)

    def usage(self, payload: Any) -> Usage | None:
        return chat_usage(usage_of(payload))

    def edited(self, call: ChatCall, prompt_tokens: Callable[[], int], count: Callable[[Any], int]) -> ChatCall:
        return call  # chat completions carry no context-management edits

    def announced(self, call: ChatCall, view: View, history: list[Message] | None, synthetic: frozenset[int],
                  *, failed: bool = False) -> Any:
        return None  # chat completions have no item to tell a client of a compaction: the headers say it

    def compaction_answer(self, call: ChatCall, view: View, history: list[Message], synthetic: frozenset[int],
                          usage: Usage) -> tuple[bytes, str]:
        raise NotImplementedError("chat completions have no request that asks for a compaction alone")

    def tap(self, call: ChatCall, *, hide_usage: bool, announce: Any = None) -> ChatTap:
        return ChatTap(hide_usage=hide_usage)

    def answer_body(self, call: ChatCall, status: int, body: bytes, announce: Any = None) -> bytes:
        return body

    def error_body(self, error: ProxyError) -> dict[str, Any]:
        return error.body()  # the proxy's errors are OpenAI-shaped (proxy.errors)


CHAT = ChatDialect()
