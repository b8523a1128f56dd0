"""proxy.dialects.responses: the Responses API as a dialect: what is compactable, the body forwarded, the request's
overhead, usage and overflow in an answer, and a stream's usage read from its closing event however it is split."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from multidict import CIMultiDict

from proxy.core.envelope import Sealed, seal
from proxy.core.tokens import REPLY_PRIMER, TokenCounter
from proxy.core.usage import Usage
from proxy.dialects.dialect import Dialect
from proxy.dialects.responses import RESPONSES, RESPONSES_COMPACTING_UPSTREAM, ResponsesDialect, ResponsesTap
from proxy.dialects.responses_request import ResponsesCall
from proxy.errors import BadRequest

INPUT = [{"role": "user", "content": "list the files"},
         {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAA-opaque"},
         {"type": "function_call", "call_id": "c1", "name": "ls", "arguments": "{}"},
         {"type": "function_call_output", "call_id": "c1", "output": "a.py\nb.py"}]


def call(**fields: Any) -> ResponsesCall:
    body = json.dumps({"model": "m", "input": INPUT, **fields}).encode()
    return ResponsesCall.parse(body, CIMultiDict(), "")


def test_it_is_a_dialect() -> None:
    dialect: Dialect[ResponsesCall] = ResponsesDialect()
    assert (dialect.name, dialect.path) == ("responses", "/responses")


def test_a_stateless_input_is_compactable_and_maps_back_as_it_came() -> None:
    request = call()
    view = RESPONSES.history(request)
    assert view is not None and [m["role"] for m in view.messages] == ["user", "assistant", "tool"]
    assert json.loads(RESPONSES.forwarded(request, view, view.messages, ask_usage=True))["input"] == INPUT


@pytest.mark.parametrize("fields", [
    {"previous_response_id": "resp_1"}, {"conversation": "conv_1"},
    {"input": [{"type": "item_reference", "id": "msg_1"}]}, {"input": 5},
])
def test_what_the_upstream_keeps_or_the_view_cannot_read_is_left_alone(fields: dict[str, Any]) -> None:
    assert RESPONSES.history(call(**fields)) is None


CONTEXT_MANAGED = [{"truncation": "auto"}, {"context_management": [{"type": "compaction", "compact_threshold": 1000}]},
                   {"input": [*INPUT, {"type": "compaction_trigger"}]}]


@pytest.mark.parametrize("fields", CONTEXT_MANAGED)
def test_asking_for_the_upstreams_own_context_management_leaves_it_to_an_upstream_that_compacts(
        fields: dict[str, Any]) -> None:
    body = json.dumps({"model": "m", "input": INPUT, **fields}).encode()
    request = RESPONSES_COMPACTING_UPSTREAM.parse(body, CIMultiDict(), "")
    assert request.body == body and not request.compaction_requested
    assert RESPONSES_COMPACTING_UPSTREAM.history(request) is None
    assert RESPONSES_COMPACTING_UPSTREAM.left_alone(request) == "upstream_manages_context"


@pytest.mark.parametrize("fields", CONTEXT_MANAGED)
def test_in_front_of_any_other_upstream_the_proxy_manages_the_context_it_asks_for(fields: dict[str, Any]) -> None:
    request = RESPONSES.parse(json.dumps({"model": "m", "input": INPUT, **fields}).encode(), CIMultiDict(), "")
    assert RESPONSES.left_alone(request) is None and RESPONSES.history(request) is not None
    assert "context_management" not in json.loads(request.body)  # the upstream is not asked what it cannot do
    assert request.compaction_requested == ("truncation" not in fields and "context_management" not in fields)
    assert request.payload["input"] == INPUT  # a trigger is the proxy's to answer, not part of the conversation


@pytest.mark.parametrize(("entries", "threshold"), [
    ([{"type": "compaction", "compact_threshold": 1000}], 1000), ([{"type": "compaction"}], None),
    ([{"type": "compaction", "compact_threshold": 900}, {"type": "compaction", "compact_threshold": 500}], 500),
    ([{"type": "other", "compact_threshold": 10}], None), ([{"type": "compaction", "compact_threshold": 0}], None),
    ([{"type": "compaction", "compact_threshold": True}], None), ({"type": "compaction"}, None), (None, None),
    (["compaction"], None), ([{"type": "compaction", "compact_threshold": "1000"}], None),
])
def test_the_compact_threshold_a_request_names(entries: Any, threshold: int | None) -> None:
    assert call(context_management=entries).compact_threshold == threshold


def test_a_trigger_anywhere_but_last_is_not_a_request_to_compact() -> None:
    request = RESPONSES.parse(json.dumps({"model": "m", "input": [{"type": "compaction_trigger"}, *INPUT]}).encode(),
                              CIMultiDict(), "")
    assert not request.compaction_requested and RESPONSES.history(request) is None  # an item the view cannot read


def test_truncation_disabled_is_still_compactable() -> None:
    assert RESPONSES.history(call(truncation="disabled")) is not None


def test_forwarded_puts_the_summary_in_and_keeps_every_other_field() -> None:
    request = call(instructions="be brief", tools=[{"type": "function", "name": "ls"}], store=False,
                   include=["reasoning.encrypted_content"])
    view = RESPONSES.history(request)
    assert view is not None
    summary = {"role": "user", "content": "<summary>listed files</summary>"}
    sent = json.loads(RESPONSES.forwarded(request, view, [summary, *view.messages[1:]], ask_usage=False))
    assert sent["input"][0] == {"type": "message", "role": "user",
                                "content": [{"type": "input_text", "text": "<summary>listed files</summary>"}]}
    assert sent["input"][1:] == INPUT[1:]
    assert {key: sent[key] for key in ("instructions", "tools", "store", "include", "model")} == {
        "instructions": "be brief", "tools": [{"type": "function", "name": "ls"}], "store": False,
        "include": ["reasoning.encrypted_content"], "model": "m"}


def test_the_overhead_is_the_instructions_and_tools() -> None:
    counter = TokenCounter()
    tools = [{"type": "function", "name": "ls", "parameters": {"type": "object"}}]
    bare = RESPONSES.overhead(call(), counter)
    assert bare == REPLY_PRIMER
    assert RESPONSES.overhead(call(instructions="be brief " * 50, tools=tools), counter) == \
        bare + counter.count_text("be brief " * 50) + counter.count_tools(tools)
    listed = RESPONSES.overhead(call(instructions=[{"role": "developer", "content": "x " * 40}]), counter)
    assert listed > bare + 40


@pytest.mark.parametrize(("tools", "expected"), [
    (None, None), ([], None), ([{"type": "web_search"}], None), ("junk", None),
    ([{"type": "function", "name": "ls", "description": "list", "parameters": {"type": "object"}, "strict": True},
      {"type": "custom", "name": "patch"}],
     [{"type": "function", "function": {"name": "ls", "description": "list", "parameters": {"type": "object"}}}]),
])
def test_function_tools_reach_the_summariser_in_chats_shape(tools: Any, expected: Any) -> None:
    assert RESPONSES.tools(call(tools=tools)) == expected


def test_usage_and_overflow_of_a_json_answer() -> None:
    done = {"object": "response", "status": "completed", "error": None,
            "usage": {"input_tokens": 1200, "output_tokens": 30, "total_tokens": 1230}}
    assert RESPONSES.usage(done) == Usage(1200, 30) and not RESPONSES.overflow(done)
    failed = {"object": "response", "status": "failed", "usage": None,
              "error": {"code": "context_length_exceeded", "message": "Your input exceeds the context window of "
                                                                      "this model."}}
    assert RESPONSES.overflow(failed) and RESPONSES.usage(failed) is None
    assert RESPONSES.usage({"usage": "junk"}) is None and RESPONSES.usage([]) is None


def sse(event: dict[str, Any]) -> bytes:
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()


STREAM = b"".join([
    sse({"type": "response.created", "response": {"status": "in_progress", "usage": None}}),
    sse({"type": "response.output_text.delta", "delta": "hel"}),
    b": keep-alive\n\n",
    sse({"type": "response.completed", "response": {"status": "completed",
                                                    "usage": {"input_tokens": 900, "output_tokens": 12}}}),
])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12))
def test_a_stream_passes_unchanged_and_its_usage_is_read_however_it_is_split(cuts: list[int]) -> None:
    tap = RESPONSES.tap(call(), hide_usage=True)
    edges = [0, *sorted(cuts), len(STREAM)]
    relayed = b"".join(tap.feed(STREAM[a:b]) for a, b in itertools.pairwise(edges)) + tap.finish()
    assert relayed == STREAM
    assert tap.usage == Usage(900, 12) and tap.finish_reasons == ["completed"]


@given(st.binary(max_size=300))
def test_any_bytes_pass_and_never_raise(noise: bytes) -> None:
    tap = ResponsesTap()
    assert tap.feed(noise) + tap.finish() == noise


def test_the_proxy_errors_keep_the_openai_shape() -> None:
    error = BadRequest("bad input", param="input")
    assert RESPONSES.error_body(error) == {"error": {"message": "bad input", "type": "invalid_request_error",
                                                     "param": "input", "code": None}}


@pytest.mark.parametrize(("fields", "reason"), [
    ({}, None), ({"truncation": "disabled"}, None), ({"previous_response_id": "resp_1"}, "history_upstream"),
    ({"conversation": {"id": "conv_1"}}, "history_upstream"), ({"truncation": "auto"}, None),
    ({"context_management": [{"type": "compaction"}]}, None),
    ({"input": [{"type": "item_reference", "id": "x"}]}, None),
])
def test_why_a_request_is_left_to_the_upstream(fields: dict[str, Any], reason: str | None) -> None:
    assert RESPONSES.left_alone(call(**fields)) == reason


def test_the_proxys_own_items_are_opened_whatever_the_upstream_and_a_trigger_stays_in_the_body() -> None:
    """An upstream that compacts by itself cannot read the proxy's items either; and a trigger the proxy does not
    answer (compaction off) must reach the upstream as it was sent."""
    ours = {"type": "compaction", "id": "cmp_1", "encrypted_content": seal(Sealed((), "the summary", ()))}
    fields = {"model": "m", "input": [ours, *INPUT, {"type": "compaction_trigger"}],
              "context_management": [{"type": "compaction"}]}
    for dialect in (RESPONSES, RESPONSES_COMPACTING_UPSTREAM):
        request = dialect.parse(json.dumps(fields).encode(), CIMultiDict(), "")
        sent = json.loads(request.body)
        assert sent["input"][0]["content"][0]["text"] == "the summary"
        assert sent["input"][1:] == [*INPUT, {"type": "compaction_trigger"}]
        assert ("context_management" in sent) is (dialect is RESPONSES_COMPACTING_UPSTREAM)
        assert request.asks_compaction and request.compaction_requested is (dialect is RESPONSES)
