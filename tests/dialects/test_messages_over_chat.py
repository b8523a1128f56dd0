"""proxy.dialects.messages_over_chat: the Messages dialect over a chat upstream — an Anthropic client's credentials
as a chat server reads them, the request bridged at parse and again after the parent's edits and compaction, and
every kind of answer (a message, an error, a stream, a stream that failed at once) back in Anthropic's shape."""

from __future__ import annotations

import json
from typing import Any

import pytest
from multidict import CIMultiDict

from proxy.core.usage import Usage
from proxy.dialects.messages_bridge import chat_request
from proxy.dialects.messages_over_chat import MESSAGES_OVER_CHAT, chat_headers
from proxy.dialects.messages_request import MessagesCall

USE = {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {"path": "a.py"}}
RESULT = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "x = 1\n" * 50}
MESSAGES = [{"role": "user", "content": "read a.py"}, {"role": "assistant", "content": [USE]},
            {"role": "user", "content": [RESULT]}]


@pytest.mark.parametrize(("sent", "forwarded"), [
    ([("x-api-key", "sk-client"), ("anthropic-version", "2023-06-01"), ("anthropic-beta", "a,b"), ("X-Trace", "t")],
     [("X-Trace", "t"), ("Authorization", "Bearer sk-client")]),
    ([("Authorization", "Bearer sk-own"), ("x-api-key", "sk-client")],
     [("Authorization", "Bearer sk-own"), ("x-api-key", "sk-client")]),  # the client chose: nothing to map
    ([("x-api-key", "  "), ("anthropic-version", "2023-06-01")], [("x-api-key", "  ")]),
    ([("X-Other", "kept")], [("X-Other", "kept")]),
])
def test_an_anthropic_clients_headers_as_a_chat_server_reads_them(sent: list[tuple[str, str]],
                                                                   forwarded: list[tuple[str, str]]) -> None:
    assert list(chat_headers(CIMultiDict(sent)).items()) == forwarded


def parsed(**payload: Any) -> MessagesCall:
    body = {"model": "m", "max_tokens": 64, "messages": MESSAGES, **payload}
    return MESSAGES_OVER_CHAT.parse(json.dumps(body).encode(), CIMultiDict({"x-api-key": "sk-client"}), "")


def test_a_request_is_read_as_messages_and_sent_as_a_chat_completion() -> None:
    call = parsed(system="be brief")
    assert call.bridged and MESSAGES_OVER_CHAT.path == "/chat/completions"
    assert call.payload["messages"] == MESSAGES  # what the journey reads and compacts: the client's own
    assert json.loads(call.body) == chat_request(call.payload)
    assert call.headers["Authorization"] == "Bearer sk-client" and "x-api-key" not in call.headers
    assert MESSAGES_OVER_CHAT.left_alone(call) is None and MESSAGES_OVER_CHAT.history(call) is not None


def test_an_on_demand_compaction_is_not_bridged_since_it_never_goes_upstream() -> None:
    """Even one ending with the assistant's turn, which chat could not be asked to continue: it is not asked."""
    call = parsed(compaction={"type": "summarize"}, messages=[*MESSAGES, {"role": "assistant", "content": "Read."}])
    assert call.compaction_requested and call.bridged


def test_clearing_edits_the_proxy_applies_reach_the_chat_body() -> None:
    """Anthropic's context management is the parent's to apply; what it leaves is asked of chat."""
    call = parsed(context_management={"edits": [{"type": "clear_tool_uses_20250919", "keep": {
        "type": "tool_uses", "value": 0}, "trigger": {"type": "input_tokens", "value": 1}}]})
    edited = MESSAGES_OVER_CHAT.edited(call, lambda: 10_000, lambda value: 100)
    assert edited.payload is not call.payload and "context_management" not in json.loads(edited.body)
    assert json.loads(edited.body) == chat_request(edited.payload)
    assert json.loads(edited.body)["messages"][-1]["content"] != RESULT["content"]  # cleared


def test_a_compacted_history_is_sent_as_chat() -> None:
    call = parsed()
    view = MESSAGES_OVER_CHAT.history(call)
    assert view is not None
    summary = {"role": "user", "content": "Summary: a.py was read."}
    body = json.loads(MESSAGES_OVER_CHAT.forwarded(call, view, [summary, *view.messages[1:]], ask_usage=False))
    assert [message["role"] for message in body["messages"]] == ["user", "assistant", "tool"]
    assert body["messages"][0]["content"].startswith("Summary: a.py was read.")  # merged with the next user turn


def completion(content: str) -> bytes:
    return json.dumps({"id": "chatcmpl-1", "model": "m", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 20, "completion_tokens": 3}}).encode()


def test_a_whole_answer_comes_back_as_a_message_and_its_usage_is_chats() -> None:
    call = parsed()
    message = json.loads(MESSAGES_OVER_CHAT.answer_body(call, 200, completion("Done.")))
    assert (message["type"], message["content"], message["stop_reason"]) == (
        "message", [{"type": "text", "text": "Done."}], "end_turn")
    assert MESSAGES_OVER_CHAT.usage(json.loads(completion("Done."))) == Usage(20, 3)


@pytest.mark.parametrize(("status", "body", "expected"), [
    (429, b'{"error": {"message": "slow down", "type": "rate_limit"}}',
     {"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}}),
    (200, b'data: {"error": {"message": "boom", "code": 500}}\n\n',
     {"type": "error", "error": {"type": "api_error", "message": "boom"}}),
])
def test_an_error_comes_back_in_anthropics_shape(status: int, body: bytes, expected: dict[str, Any]) -> None:
    """A 4xx/5xx body, and a stream whose first event was an error (held back, judged, relayed whole)."""
    answered = MESSAGES_OVER_CHAT.answer_body(parsed(), status, body)
    decoded = json.loads(answered) if status != 200 else json.loads(answered.split(b"data: ", 1)[1])
    assert decoded == expected


def test_a_stream_is_translated_and_its_usage_read_from_chat() -> None:
    tap = MESSAGES_OVER_CHAT.tap(parsed(stream=True), hide_usage=False)
    chunks = [{"id": "c", "choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": "stop"}]},
              {"id": "c", "choices": [], "usage": {"prompt_tokens": 30, "completion_tokens": 2}}]
    out = b"".join(tap.feed(f"data: {json.dumps(chunk)}\n\n".encode()) for chunk in chunks)
    out += tap.feed(b"data: [DONE]\n\n") + tap.finish()
    kinds = [json.loads(line[6:])["type"] for line in out.decode().splitlines() if line.startswith("data: ")]
    assert kinds == ["message_start", "content_block_start", "content_block_delta", "content_block_stop",
                     "message_delta", "message_stop"]
    assert tap.usage == Usage(30, 2) and tap.finish_reasons == ["end_turn"]
