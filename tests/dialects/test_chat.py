"""proxy.dialects.chat: the chat-completions dialect reads and writes exactly what the journey used to inline."""

from __future__ import annotations

import json
from typing import Any

import pytest
from multidict import CIMultiDict

from proxy.core.tokens import TokenCounter
from proxy.core.usage import Usage
from proxy.dialects.chat import CHAT, SELF_MANAGED_FIELDS, ChatDialect
from proxy.dialects.chat_request import ChatCall
from proxy.dialects.dialect import Dialect

MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]


def call(**fields: Any) -> ChatCall:
    payload = {"model": "m", "messages": MESSAGES, **fields}
    return ChatCall.parse(json.dumps(payload).encode(), CIMultiDict(), "")


def test_it_is_a_dialect() -> None:
    dialect: Dialect[ChatCall] = ChatDialect()
    assert (dialect.name, dialect.path) == ("chat", "/chat/completions")


def test_the_history_is_the_messages_and_maps_back_as_they_are() -> None:
    view = CHAT.history(call())
    assert view is not None and view.messages == MESSAGES and view.groups == ()
    summary = {"role": "user", "content": "summary"}
    assert view.back([summary, *view.messages[1:]], render=lambda made: []) == [summary, *MESSAGES[1:]]


def test_parse_reads_a_chat_request() -> None:
    parsed = CHAT.parse(json.dumps({"model": "m", "messages": MESSAGES}).encode(), CIMultiDict(), "a=1")
    assert (parsed.model, parsed.messages, parsed.query) == ("m", MESSAGES, "a=1")


@pytest.mark.parametrize("field", SELF_MANAGED_FIELDS)
def test_a_provider_managed_context_is_not_compactable(field: str) -> None:
    assert CHAT.history(call(**{field: "auto"})) is None


def test_a_request_without_messages_is_not_compactable() -> None:
    body = json.dumps({"model": "m", "prompt": "hi"}).encode()
    assert CHAT.history(ChatCall.parse(body, CIMultiDict(), "")) is None


@pytest.mark.parametrize(("options", "ask", "expected"), [
    pytest.param(None, False, None, id="nothing added"),
    pytest.param(None, True, {"include_usage": True}, id="usage asked"),
    pytest.param({"include_obfuscation": False}, True, {"include_obfuscation": False, "include_usage": True},
                 id="the client's options kept"),
    pytest.param("bad", True, {"include_usage": True}, id="a malformed option replaced"),
])
def test_forwarded_puts_the_history_in_and_asks_usage_only_when_told(options: Any, ask: bool,
                                                                      expected: Any) -> None:
    fields = {"stream": True, **({"stream_options": options} if options is not None else {})}
    history = [{"role": "user", "content": "summary"}, MESSAGES[-1]]
    request = call(**fields)
    view = CHAT.history(request)
    assert view is not None
    sent = json.loads(CHAT.forwarded(request, view, history, ask_usage=ask))
    assert sent["messages"] == history
    assert sent.get("stream_options") == (expected if expected is not None else options)
    assert sent["model"] == "m" and sent["stream"] is True


@pytest.mark.parametrize(("options", "asked"), [
    (None, False), ({"include_usage": True}, True), ({"include_usage": "yes"}, False), ([True], False)])
def test_asks_usage(options: Any, asked: bool) -> None:
    assert CHAT.asks_usage(call(**({"stream_options": options} if options is not None else {}))) is asked


def test_overhead_is_the_request_without_its_messages() -> None:
    counter = TokenCounter()
    tools = [{"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}]
    bare, with_tools = CHAT.overhead(call(), counter), CHAT.overhead(call(tools=tools), counter)
    assert with_tools > bare
    assert bare == counter.count_request({"model": "m", "messages": []})
    assert CHAT.tools(call(tools=tools)) == tools


@pytest.mark.parametrize(("payload", "usage", "overflow"), [
    pytest.param({"choices": [{"finish_reason": "stop"}], "usage": {"prompt_tokens": 9, "completion_tokens": 2}},
                 Usage(9, 2), False, id="an answer"),
    pytest.param({"choices": [{"finish_reason": "length"}]}, None, False, id="no usage"),
    pytest.param({"error": {"message": "This model's maximum context length is 4096 tokens. However, your messages "
                            "resulted in 5000 tokens.", "code": "context_length_exceeded"}}, None, True,
                 id="an overflow error in a 200"),
])
def test_reading_an_answer(payload: Any, usage: Usage | None, overflow: bool) -> None:
    assert CHAT.usage(payload) == usage
    assert CHAT.overflow(payload) is overflow


def test_the_tap_reads_usage_and_hides_only_what_it_added() -> None:
    chunk = b'data: {"choices":[{"delta":{"content":"hi"},"finish_reason":"stop"}]}\n\n'
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":1}}\n\n'
    hiding, passing = CHAT.tap(call(), hide_usage=True), CHAT.tap(call(), hide_usage=False)
    assert hiding.feed(chunk + usage) + hiding.finish() == chunk
    assert passing.feed(chunk + usage) + passing.finish() == chunk + usage
    assert hiding.usage == passing.usage == Usage(12, 1)
    assert hiding.finish_reasons == ["stop"]


@pytest.mark.parametrize("fields", [{}, {"context_management": "auto"}, {"messages": []}])
def test_chat_never_says_not_applicable(fields: dict[str, Any]) -> None:
    """Chat's requests that are not compacted keep saying x-compaction: none, as they always have."""
    assert CHAT.left_alone(call(**fields)) is None
