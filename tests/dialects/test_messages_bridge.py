"""proxy.dialects.messages_bridge: an Anthropic Messages request as a chat completion (what is translated, left out
and refused with a 400), a chat answer as a message, and a chat server's errors in Anthropic's shape."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from proxy.dialects.messages_bridge import chat_request, error_from_chat, message_from_chat, stop_of
from proxy.errors import BadRequest
from proxy.upstream.overflow import detect_context_overflow

HI = [{"role": "user", "content": "hi"}]
TOOL: dict[str, Any] = {"name": "read_file", "description": "Read a file.", "input_schema": {"type": "object"}}
FUNCTION: dict[str, Any] = {"type": "function", "function": {
    "name": "read_file", "parameters": {"type": "object"}, "description": "Read a file."}}
USE = {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {"path": "a.py"}}
CALL = {"id": "toolu_1", "type": "function", "function": {"name": "read_file", "arguments": '{"path":"a.py"}'}}
THINKING = {"type": "thinking", "thinking": "Let me look.", "signature": "c2lnbmVk"}


@pytest.mark.parametrize(("payload", "expected"), [
    pytest.param({"model": "m", "max_tokens": 64, "system": "be brief", "temperature": 0.2, "top_p": 0.9, "top_k": 5,
                  "stop_sequences": ["END"], "metadata": {"user_id": "u-1"}, "messages": HI},
                 {"model": "m", "temperature": 0.2, "top_p": 0.9, "top_k": 5, "max_tokens": 64, "stop": ["END"],
                  "user": "u-1", "messages": [{"role": "system", "content": "be brief"}, *HI]},
                 id="system, output cap, sampling, stops, user"),
    pytest.param({"model": "m", "max_tokens": 8, "stream": True, "messages": HI,
                  "system": [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
                             {"type": "text", "text": "Be careful."}]},
                 {"model": "m", "max_tokens": 8, "stream": True, "stream_options": {"include_usage": True},
                  "messages": [{"role": "system", "content": "You are Claude Code.\n\nBe careful."}, *HI]},
                 id="system blocks joined, cache_control left out; a stream asks its usage"),
    pytest.param({"model": "m", "max_tokens": 8, "thinking": {"type": "adaptive"}, "service_tier": "auto",
                  "output_config": {"effort": "high"}, "speed": "fast", "messages": [
                      {"role": "user", "content": "read a.py"},
                      {"role": "assistant", "content": [THINKING, {"type": "text", "text": "Reading."}, USE]},
                      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "is_error": True,
                                                    "content": [{"type": "text", "text": "no such file"}]},
                                                   {"type": "text", "text": "then b.py"}]}]},
                 {"model": "m", "max_tokens": 8, "messages": [
                     {"role": "user", "content": "read a.py"},
                     {"role": "assistant", "content": "Reading.", "tool_calls": [CALL]},
                     {"role": "tool", "tool_call_id": "toolu_1", "content": "Error: no such file"},
                     {"role": "user", "content": "then b.py"}]},
                 id="tool_use and tool_result as a call and a tool message; thinking and its settings left out"),
    pytest.param({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBOR"}},
        {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}},
        {"type": "document", "title": "notes", "source": {"type": "text", "media_type": "text/plain",
                                                           "data": "line one"}},
        {"type": "document", "source": {"type": "content", "content": [{"type": "text", "text": "page"}]}},
        {"type": "text", "text": "what do these say?"}]}]},
                 {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": [
                     {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBOR"}},
                     {"type": "image_url", "image_url": {"url": "https://x/y.png"}},
                     {"type": "text", "text": "notes\n\nline one"}, {"type": "text", "text": "page"},
                     {"type": "text", "text": "what do these say?"}]}]},
                 id="images as image_url parts, text documents as text"),
    pytest.param({"model": "m", "max_tokens": 8, "messages": HI, "output_config": {"format": {
        "type": "json_schema", "schema": {"type": "object"}}}},
                 {"model": "m", "max_tokens": 8, "messages": HI, "response_format": {
                     "type": "json_schema", "json_schema": {"name": "output", "schema": {"type": "object"},
                                                            "strict": True}}},
                 id="a json_schema output format as response_format"),
    pytest.param({"model": "m", "messages": HI, "tools": [TOOL]}, {"model": "m", "messages": HI, "tools": [FUNCTION]},
                 id="no max_tokens (a count_tokens body); custom tools as functions"),
])
def test_a_request_as_a_chat_completion(payload: dict[str, Any], expected: dict[str, Any]) -> None:
    assert chat_request(payload) == expected


@pytest.mark.parametrize(("choice", "expected"), [
    (None, {}),
    ({"type": "auto"}, {"tool_choice": "auto"}),
    ({"type": "any"}, {"tool_choice": "required"}),
    ({"type": "none"}, {"tool_choice": "none"}),
    ({"type": "tool", "name": "read_file"}, {"tool_choice": {"type": "function", "function": {"name": "read_file"}}}),
    ({"type": "auto", "disable_parallel_tool_use": True}, {"tool_choice": "auto", "parallel_tool_calls": False}),
    ({"type": "any", "disable_parallel_tool_use": True}, {"tool_choice": "required", "parallel_tool_calls": False}),
])
def test_tool_choice(choice: Any, expected: dict[str, Any]) -> None:
    payload: dict[str, Any] = {"model": "m", "max_tokens": 8, "messages": HI,
                               "tools": [{**TOOL, "strict": True, "cache_control": {"type": "ephemeral"}}]}
    body = chat_request({**payload, **({"tool_choice": choice} if choice is not None else {})})
    assert body["tools"] == [{"type": "function", "function": {**FUNCTION["function"], "strict": True}}]
    assert {key: body[key] for key in ("tool_choice", "parallel_tool_calls") if key in body} == expected


def test_a_tool_choice_without_tools_chooses_nothing() -> None:
    assert "tool_choice" not in chat_request({"model": "m", "messages": HI, "tool_choice": {"type": "any"}})


@pytest.mark.parametrize(("change", "param"), [
    ({"tools": [{"type": "web_search_20250305", "name": "web_search", "max_uses": 3}]}, "tools"),
    ({"tools": [TOOL, {"type": "bash_20250124", "name": "bash"}]}, "tools"),
    ({"tools": [{"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"}]}, "tools"),
    ({"tools": [{"name": "no_schema"}]}, "tools"),
    ({"mcp_servers": [{"type": "url", "url": "https://mcp.example", "name": "x"}]}, "mcp_servers"),
    ({"container": "container_1"}, "container"),
    ({"context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]}}, "context_management"),
    ({"logprobs": True}, "logprobs"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"tools": [TOOL], "tool_choice": {"type": "sometimes"}}, "tool_choice"),
    ({"output_config": {"format": {"type": "grammar", "grammar": "x"}}}, "output_config.format"),
    ({"output_config": {"verbosity": "low"}}, "output_config"),
    ({"system": [{"type": "image", "source": {}}]}, "system"),
    ({"messages": []}, "messages"),
    ({"messages": [*HI, {"role": "assistant", "content": "The answer is ("}]}, "messages"),
    ({"messages": [*HI, {"role": "system", "content": "new rules"}, *HI]}, "messages.1.role"),
    ({"messages": [{"role": "user", "content": [{"type": "search_result", "source": "s", "title": "t",
                                                 "content": []}]}]}, "messages.0.content"),
    ({"messages": [{"role": "user", "content": [{"type": "document", "source": {
        "type": "base64", "media_type": "application/pdf", "data": "JVBER"}}]}]}, "messages.0.content"),
    ({"messages": [{"role": "user", "content": [{"type": "document", "source": {"type": "content", "content": [
        {"type": "image", "source": {"type": "url", "url": "https://x/page.png"}}]}}]}]}, "messages.0.content"),
    ({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": [USE]},
                   {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [
                       {"type": "image", "source": {"type": "url", "url": "https://x/shot.png"}}]}]}]},
     "messages.2.content"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "file",
                                                                           "file_id": "file_1"}}]}]}, "messages"),
    ({"messages": [{"role": "user", "content": [{"type": ["not", "a", "kind"]}]}]}, "messages.0.content"),
])
def test_what_chat_cannot_ask_is_refused_with_a_reason(change: dict[str, Any], param: str) -> None:
    with pytest.raises(BadRequest) as refused:
        chat_request({"model": "m", "max_tokens": 8, "messages": HI, **change})
    assert refused.value.status == 400 and refused.value.param == param and refused.value.message


def completion(message: dict[str, Any], finish: str | None = "stop", **choice: Any) -> dict[str, Any]:
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 7, "model": "served-model",
            "choices": [{"index": 0, "message": message, "finish_reason": finish, **choice}],
            "usage": {"prompt_tokens": 100, "completion_tokens": 9, "total_tokens": 109}}


def test_a_chat_answer_as_a_message() -> None:
    chat = completion({"role": "assistant", "content": "Reading both.", "tool_calls": [
        CALL, {"id": "call_2", "type": "function", "function": {"name": "run_tests", "arguments": "{\"x\": 1"}}]},
        "tool_calls")
    message = message_from_chat(chat, {"model": "m"})
    assert message == {"id": "msg_chatcmpl-1", "type": "message", "role": "assistant", "model": "served-model",
                       "content": [{"type": "text", "text": "Reading both."}, USE,
                                   {"type": "tool_use", "id": "call_2", "name": "run_tests",
                                    "input": {"raw": "{\"x\": 1"}}],  # no JSON object: the words kept
                       "stop_reason": "tool_use", "stop_sequence": None,
                       "usage": {"input_tokens": 100, "output_tokens": 9}}


def test_cached_input_is_reported_as_anthropic_does_and_a_refusal_is_text() -> None:
    chat = completion({"role": "assistant", "content": None, "refusal": "I can't help with that."},
                      "content_filter")
    chat["usage"]["prompt_tokens_details"] = {"cached_tokens": 60}
    message = message_from_chat(chat, {"model": "m"})
    assert message is not None and message["stop_reason"] == "refusal"
    assert message["content"] == [{"type": "text", "text": "I can't help with that."}]
    assert message["usage"] == {"input_tokens": 40, "cache_read_input_tokens": 60, "output_tokens": 9}


@pytest.mark.parametrize(("choice", "request_stops", "calls", "expected"), [
    ({"finish_reason": "stop"}, None, False, ("end_turn", None)),
    ({"finish_reason": "length"}, None, False, ("max_tokens", None)),
    ({"finish_reason": "length"}, None, True, ("max_tokens", None)),
    ({"finish_reason": "tool_calls"}, None, True, ("tool_use", None)),
    ({"finish_reason": "stop"}, None, True, ("tool_use", None)),  # llama.cpp says stop with tool calls
    ({"finish_reason": "content_filter"}, None, False, ("refusal", None)),
    ({"finish_reason": "stop", "stop_reason": "END"}, ["END"], False, ("stop_sequence", "END")),  # vLLM's
    ({"finish_reason": "stop", "stop_reason": 128001}, ["END"], False, ("end_turn", None)),  # a stop token
    ({"finish_reason": None}, None, False, ("end_turn", None)),
    ({}, None, False, ("end_turn", None)),
])
def test_stop_reasons(choice: dict[str, Any], request_stops: list[str] | None, calls: bool,
                      expected: tuple[str, str | None]) -> None:
    assert stop_of(choice, {"stop_sequences": request_stops} if request_stops else {}, calls=calls) == expected


@pytest.mark.parametrize("junk", [{}, [], {"choices": []}, {"choices": ["x"]}, "text", None])
def test_what_is_no_completion_is_not_translated(junk: Any) -> None:
    assert message_from_chat(junk, {}) is None


@pytest.mark.parametrize(("status", "body", "kind", "message"), [
    (429, {"error": {"message": "Rate limit reached", "type": "requests", "code": "rate_limit_exceeded"}},
     "rate_limit_error", "Rate limit reached (rate_limit_exceeded)"),
    (401, {"error": {"message": "Incorrect API key provided", "code": "invalid_api_key"}}, "authentication_error",
     "Incorrect API key provided (invalid_api_key)"),
    (404, {"detail": "Not Found"}, "not_found_error", "Not Found"),
    (503, "upstream connect error", "api_error", "upstream connect error"),
    (400, {"error": {"message": "This model's maximum context length is 4096 tokens. However, your messages "
                                "resulted in 5000 tokens.", "code": "context_length_exceeded"}},
     "invalid_request_error", "This model's maximum context length is 4096 tokens. However, your messages resulted "
                              "in 5000 tokens. (context_length_exceeded)"),
])
def test_a_chat_error_in_anthropics_shape(status: int, body: Any, kind: str, message: str) -> None:
    raw = body.encode() if isinstance(body, str) else json.dumps(body).encode()
    assert json.loads(error_from_chat(status, raw)) == {"type": "error", "error": {"type": kind, "message": message}}


def test_an_error_already_in_anthropics_shape_or_empty_passes_as_it_is() -> None:
    anthropic = b'{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}'
    assert error_from_chat(529, anthropic) == anthropic and error_from_chat(502, b"") == b""


CORPUS = [entry for name in ("overflow_public.json", "overflow_more.json")
          for entry in json.loads((Path(__file__).parents[1] / "fixtures" / name).read_text(encoding="utf-8"))
          if entry["api"] in ("chat", "other") and entry["status"] >= 400]


@pytest.mark.parametrize("entry", CORPUS, ids=[entry["id"] for entry in CORPUS])
def test_an_error_reads_as_an_overflow_in_anthropics_shape_exactly_when_it_did_in_chats(entry: dict[str, Any]) \
        -> None:
    """Every chat-side error of the corpus: an overflow stays one once reshaped (so the proxy, and a client that
    reads the words, still see it), and a look-alike (rate limits, quotas, byte sizes) still is none."""
    body = (entry["body"] if isinstance(entry["body"], str) else json.dumps(entry["body"])).encode()
    reshaped = error_from_chat(entry["status"], body)
    assert detect_context_overflow(entry["status"], reshaped) is entry["is_context_overflow"]
    if body.strip():
        assert json.loads(reshaped)["type"] == "error"
