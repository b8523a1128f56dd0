"""The glance: which bodies it may judge, the limit it judges them by, and the bound it rests on (a token is at
least one byte of the JSON that spells it), checked on generated text with the proxy's own tokenizer."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.compaction import glance
from proxy.config import Settings, settings_from_mapping
from proxy.core.tokens import TokenCounter
from proxy.dialects.body_memo import BodyMemo
from proxy.dialects.chat import CHAT
from proxy.dialects.messages import MESSAGES
from proxy.dialects.messages_over_chat import MESSAGES_OVER_CHAT
from proxy.dialects.responses import RESPONSES, RESPONSES_OVER_CHAT
from proxy.errors import BadRequest
from proxy.headers import MODE

CHAT_ON = (*(CHAT.quick_markers or ()), *CHAT.uncounted_markers)  # what compaction on looks for
RESPONSES_ON = (*(RESPONSES.quick_markers or ()), *RESPONSES.alone_markers, *RESPONSES.uncounted_markers)
MESSAGES_ON = (*(MESSAGES.quick_markers or ()), *MESSAGES.uncounted_markers)
SMALL = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()


@pytest.mark.parametrize(("body", "headers", "markers", "judged"), [
    (SMALL, {}, CHAT.quick_markers, True),
    (SMALL, {MODE: "auto"}, CHAT.quick_markers, False),                       # the client asks something
    (SMALL, {}, MESSAGES_OVER_CHAT.quick_markers, False),                      # a dialect that translates
    (SMALL, {}, RESPONSES_OVER_CHAT.quick_markers, False),
    (b'{"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}', {}, CHAT_ON, False),
    (b'{"model": "m", "input": [{"type": "input_image", "image_url": "x"}]}', {}, RESPONSES_ON, False),
    (b'{"model": "m", "input": [{"type": "compaction", "encrypted_content": "x"}]}', {},
     RESPONSES.quick_markers, False),
    (b'{"model": "m", "input": "hi", "previous_response_id": "resp_1"}', {}, RESPONSES_ON, False),
    (b'{"model": "m", "input": "hi", "previous_response_id": "resp_1"}', {}, RESPONSES.quick_markers, True),  # off
    (b'{"model": "m", "messages": [], "context_management": {"edits": []}}', {}, MESSAGES.quick_markers, False),
    (b'{"model": "m", "messages": [{"role": "user", "content": [{"type": "image"}]}]}', {}, MESSAGES_ON, False),
    (b'{"model": "m", "messages": [', {}, CHAT.quick_markers, False),           # broken: the whole way says why
    (b'["a list"]', {}, CHAT.quick_markers, False),
    (b'{"model": "m", "pad": "' + b"x" * glance.MAX_BYTES + b'"}', {}, CHAT.quick_markers, False),
])
def test_which_bodies_a_glance_may_judge(body: bytes, headers: dict[str, str], markers: tuple[bytes, ...] | None,
                                         judged: bool) -> None:
    assert (glance.payload_of(body, headers, markers) is not None) == judged


def settings_with(**compaction: Any) -> Settings:
    return settings_from_mapping({"compaction": compaction}, env={})


@pytest.mark.parametrize(("dialect", "enabled", "expected"), [
    (CHAT, True, CHAT_ON),
    (CHAT, False, ()),                                         # off: nothing in a chat body asks for anything
    (RESPONSES, True, RESPONSES_ON),
    (RESPONSES, False, (b'"compaction', b'"context_management"')),  # a compaction item is the proxy's, on or off
    (RESPONSES, True, (b'"compaction', b'"context_management"', b'"truncation"', b'"previous_response_id"',
                       b'"conversation"', *RESPONSES.uncounted_markers)),  # on: what it leaves alone, it says why
    (MESSAGES, False, (b'"compaction', b'"context_management"')),
    (MESSAGES_OVER_CHAT, True, None),                          # translated: every request read
    (RESPONSES_OVER_CHAT, False, None),
])
def test_the_markers_looked_for_follow_the_compaction_switch(dialect: Any, enabled: bool,
                                                            expected: tuple[bytes, ...] | None) -> None:
    markers = glance.markers_for(settings_with(enabled=enabled), dialect.quick_markers, dialect.uncounted_markers,
                                 dialect.alone_markers)
    assert markers == expected


LARGE = b'{"model": "m", "messages": [{"role": "user", "content": "' + b"x" * glance.MAX_BYTES + b'"}]}'
# The OpenAI SDK's order: the messages first, the model after them, the other parameters after it.
LARGE_SDK = b'{"messages": [{"role": "user", "content": "' + b"x" * glance.MAX_BYTES + b'"}], "model": "m", "n": 1}'
MEDIUM = b'{"model": "m", "messages": [{"role": "user", "content": "' + b"x" * glance.WHOLE_BELOW + b'"}]}'


@pytest.mark.parametrize(("compaction", "body", "headers", "markers", "model"), [
    ({"enabled": False}, LARGE, {}, CHAT.quick_markers, "m"),         # off: relayed unread at any size
    ({"enabled": False}, LARGE_SDK, {}, CHAT.quick_markers, "m"),
    ({"enabled": False}, SMALL, {}, CHAT.quick_markers, "m"),
    ({}, LARGE, {}, CHAT.quick_markers, None),                        # on: a large body goes the whole way
    ({"enabled": False}, LARGE, {MODE: "auto"}, CHAT.quick_markers, None),       # the client asks something
    ({"enabled": False}, LARGE, {}, MESSAGES_OVER_CHAT.quick_markers, None),     # a dialect that translates
    ({"enabled": False}, SMALL[:-1], {}, CHAT.quick_markers, None),               # broken: the whole way says why
    ({"enabled": False}, MEDIUM[:60_000], {}, CHAT.quick_markers, None),
    # From WHOLE_BELOW on, off, only the model is read: what lies past it is the upstream's to judge.
    ({"enabled": False}, MEDIUM[:-1], {}, CHAT.quick_markers, "m"),
    ({"enabled": False}, b"[" + LARGE_SDK[1:], {}, CHAT.quick_markers, "m"),
    ({"enabled": False}, b'{"messages": [' + b" " * glance.WHOLE_BELOW + b'], "model": 7}', {}, CHAT.quick_markers,
     ""),                                                                        # not a name: none, as read whole
    ({"enabled": False, "glance": False}, SMALL, {}, CHAT.quick_markers, None),  # no glance at all
])
def test_with_compaction_off_a_body_of_any_size_is_relayed_unread(
        compaction: dict[str, Any], body: bytes, headers: dict[str, str], markers: tuple[bytes, ...] | None,
        model: str | None) -> None:
    assert glance.judged(settings_with(**compaction), lambda _: 100_000, markers, body, headers) == model


def refusing(body: bytes) -> dict[str, Any]:
    raise BadRequest("request body is nested more than 128 levels deep")


@pytest.mark.parametrize(("compaction", "reader", "model", "reads"), [
    ({}, "memo", "m", 1),               # on: read as the whole way reads it, once for both
    ({}, "refusing", None, 1),          # what the whole way refuses is not glanced: it says why
    ({}, None, "m", 0),                 # no reader: orjson reads it, unguarded, as it only reads the model
    ({"enabled": False}, "memo", "m", 0),       # off: the body's guards are never the proxy's to run
    ({"enabled": False}, "refusing", "m", 0),
])
def test_a_glance_reads_with_the_reader_it_is_given_only_with_compaction_on(
        compaction: dict[str, Any], reader: str | None, model: str | None, reads: int) -> None:
    bodies, calls = BodyMemo(min_bytes=0), []

    def memo(body: bytes) -> dict[str, Any]:
        calls.append(body)
        return bodies.read(body, "messages")

    def refused(body: bytes) -> dict[str, Any]:
        calls.append(body)
        return refusing(body)

    read = {"memo": memo, "refusing": refused, None: None}[reader]
    assert glance.judged(settings_with(**compaction), lambda _: 1_000_000, CHAT.quick_markers, SMALL, {},
                         read) == model
    assert len(calls) == reads


@pytest.mark.parametrize(("compaction", "limit"), [
    ({}, 60_000),                                                           # clearing's 0.6 before the 0.8 threshold
    ({"threshold": 0.5, "target": 0.4}, 50_000),
    ({"tool_results": {"clear": {"enabled": False}}}, 80_000),
    ({"tool_results": {"clear": {"enabled": False}, "summarize_pairs": {"enabled": True}}}, 25_000),
    ({"threshold": 0, "tool_results": {"clear": {"enabled": False}}}, 100_000),  # reactive only: the window
    ({"prepare_at": 0.3}, 48_000),                   # a low mark: its glanced requests stay below 0.3 x 0.8
    ({"prepare_at": 0.3, "tool_results": {"clear": {"enabled": False}}}, 48_000),
    ({"prepare_at": 0.3, "background": False}, 60_000),  # nothing is prepared without background summaries
    ({"prepare_at": None, "tool_results": {"clear": {"enabled": False}}}, 80_000),
])
def test_the_first_limit_is_the_lowest_share_that_acts(compaction: dict[str, Any], limit: int) -> None:
    assert glance.first_limit(settings_with(**compaction), "m", 100_000) == limit


def test_first_limits_are_remembered_by_model_and_window_and_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    configured, limits = settings_with(), {}
    worked: list[tuple[str, int]] = []
    real = glance.first_limit

    def counted(settings: Settings, model: str, window: int) -> int:
        worked.append((model, window))
        return real(settings, model, window)

    monkeypatch.setattr(glance, "first_limit", counted)
    monkeypatch.setattr(glance, "MAX_REMEMBERED", 3)
    asked = [("m", 100_000), ("m", 100_000), ("m", 50_000), ("n", 100_000), ("m", 50_000), ("o", 8_000),
             ("m", 100_000)]
    assert [glance.remembered(limits, configured, model, window) for model, window in asked] == \
        [real(configured, model, window) for model, window in asked]
    # Each pair worked out once until the fourth pair filled the memo past its bound: then it starts again.
    assert worked == [("m", 100_000), ("m", 50_000), ("n", 100_000), ("o", 8_000), ("m", 100_000)]
    assert len(limits) <= 3


def test_a_glance_with_remembered_limits_judges_as_one_without() -> None:
    for compaction in ({}, {"threshold": 0.5, "target": 0.4}, {"tool_results": {"clear": {"enabled": False}}}):
        for body in (SMALL, MEDIUM):
            for window in (4_000, 100_000, 1_000_000):
                configured, limits = settings_with(**compaction), {}
                judged = [glance.judged(configured, lambda _, w=window: w, CHAT.quick_markers, body, {}, None,
                                        limits) for _ in range(2)]  # worked out, then remembered
                assert judged == [glance.judged(configured, lambda _, w=window: w,
                                                CHAT.quick_markers, body, {})] * 2


@pytest.mark.parametrize(("payload", "reserve"), [
    ({}, 1024), ({"max_tokens": 300}, 300), ({"max_completion_tokens": 50, "max_tokens": 9}, 50),
    ({"max_output_tokens": 7}, 7), ({"max_tokens": 0}, 1024), ({"max_tokens": True}, 1024),
    ({"max_tokens": "500"}, 1024),
])
def test_the_reserve_is_the_clients_cap_or_the_default(payload: dict[str, Any], reserve: int) -> None:
    assert glance.reserved(payload, 1024) == reserve


@pytest.mark.parametrize(("size", "reserve", "limit", "below"), [
    (1_000, 1024, 60_000, True),
    (27_952, 1024, 60_000, True),        # exactly half the limit with the template's tokens and the reserve
    (27_953, 1024, 60_000, False),
    (1_000, 40_000, 60_000, False),      # a client asking for a long answer
    (0, 0, 0, False),
])
def test_far_below_keeps_half_the_first_limit(size: int, reserve: int, limit: int, below: bool) -> None:
    assert glance.far_below(size, reserve, limit) is below


COUNTER = TokenCounter("cl100k_base")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(min_size=0, max_size=200), min_size=1, max_size=6))
def test_a_body_holds_no_more_tokens_than_bytes(texts: list[str]) -> None:
    """The bound the glance rests on, with the proxy's own counting: messages, their overhead, any text."""
    messages = [{"role": "user" if index % 2 == 0 else "assistant", "content": text}
                for index, text in enumerate(texts)]
    body = json.dumps({"model": "m", "messages": messages}).encode()
    assert COUNTER.count_request({"model": "m", "messages": messages}) <= len(body) + glance.TEMPLATE_TOKENS
    assert all(COUNTER.count_text(text) <= len(json.dumps(text).encode()) for text in texts)


@settings(max_examples=200, deadline=None)
@given(st.floats(0.05, 0.95), st.floats(0.3, 0.95), st.booleans())
def test_no_glanced_request_is_past_the_prepare_mark(prepare_at: float, threshold: float, clear: bool) -> None:
    """What a glanced request may hold (SHARE of the first limit) stays at or below where a summary is prepared."""
    configured = settings_with(threshold=threshold, target=threshold / 2, prepare_at=prepare_at,
                               tool_results={"clear": {"enabled": clear}})
    window = 100_000
    assert glance.SHARE * glance.first_limit(configured, "m", window) <= prepare_at * threshold * window + 1


MARKER_SETS = [markers for markers in (CHAT.quick_markers, MESSAGES.quick_markers, RESPONSES.quick_markers)
               if markers is not None]
# Bytes that spell the markers' pieces often, so generated bodies hold whole markers, near misses and overlaps.
PIECES = st.sampled_from([b'"', b"image", b"_url", b'"file', b"compaction", b"input_", b"audio", b'"truncation"',
                          b"context_management", b'"conversation', b"x", b"\\", b"{", b":"] +
                         [marker for markers in MARKER_SETS for marker in markers])


@given(st.lists(PIECES, max_size=30).map(b"".join), st.sampled_from(MARKER_SETS))
@settings(max_examples=300, deadline=None)
def test_a_body_holds_a_marker_for_the_glance_exactly_when_it_holds_one_of_them(
        body: bytes, markers: tuple[bytes, ...]) -> None:
    """The dialect's markers looked for in one pass (up to the glance's bound) or a search each (past it): found
    exactly when a search for each finds one, either way."""
    for whole in (body, body + b"x" * glance.MAX_BYTES, b"x" * glance.MAX_BYTES + body):
        assert glance.holds_marker(whole, markers) is any(marker in whole for marker in markers)
        assert glance.holds_marker(whole, ()) is False
