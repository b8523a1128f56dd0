"""proxy.headers: the x-compaction* header names, the outcome label and the access-log fields read from them."""

from __future__ import annotations

from typing import Any

import pytest
from multidict import CIMultiDict

from proxy import headers as h
from proxy.headers import COUNTS, OUTCOMES, SHADOW_DECISIONS, log_fields, outcome_of

NAMES = [h.COMPACTION, h.SHADOW, h.TOKENS_BEFORE, h.TOKENS_AFTER, h.SHADOW_TOKENS_BEFORE, h.SHADOW_TOKENS_AFTER,
         h.ELIDED, h.CLEARED, h.CLEARED_TOKENS, h.PAIR_SUMMARIES, h.REASON, h.EDITS, h.MODE]


def test_names_and_vocabularies() -> None:
    assert NAMES == ["x-compaction", "x-compaction-shadow", "x-compaction-tokens-before", "x-compaction-tokens-after",
                     "x-compaction-shadow-tokens-before", "x-compaction-shadow-tokens-after", "x-compaction-elided",
                     "x-compaction-cleared", "x-compaction-cleared-tokens", "x-compaction-pair-summaries",
                     "x-compaction-reason",
                     "x-compaction-edits", "x-compaction-mode"]
    assert len(set(NAMES)) == len(NAMES) and all(name == name.lower() for name in NAMES)
    assert OUTCOMES == {"none", "proactive", "reactive", "forced", "requested", "prepared", "reused", "failed",
                        "not-applicable"}
    assert SHADOW_DECISIONS == {"none", "reused", "proactive", "reactive"}
    assert COUNTS == {h.TOKENS_BEFORE: "tokens_before", h.TOKENS_AFTER: "tokens_after",
                      h.SHADOW_TOKENS_BEFORE: "shadow_tokens_before", h.SHADOW_TOKENS_AFTER: "shadow_tokens_after",
                      h.ELIDED: "elided", h.CLEARED: "cleared", h.CLEARED_TOKENS: "cleared_tokens",
                      h.PAIR_SUMMARIES: "pair_summaries"}


@pytest.mark.parametrize(("value", "expected"), [
    *[(outcome, outcome) for outcome in sorted(OUTCOMES)],
    ("PROACTIVE", "none"),
    (" reused", "none"),
    ("", "none"),
    ("reused\ud800", "none"),
    ("x" * 100_000, "none"),
    (None, "none"),
])
def test_outcome_of(value: Any, expected: str) -> None:
    assert outcome_of({h.COMPACTION: value}) == expected


def test_outcome_of_without_the_header_and_case_insensitively() -> None:
    assert outcome_of({}) == "none"
    assert outcome_of({h.SHADOW: "reused"}) == "none"
    assert outcome_of(CIMultiDict({"X-Compaction": "reactive"})) == "reactive"


@pytest.mark.parametrize(("headers", "expected"), [
    ({}, {}),
    ({h.COMPACTION: "reused", h.SHADOW: "proactive"}, {"compaction": "reused", "compaction_shadow": "proactive"}),
    ({h.COMPACTION: "bogus", h.SHADOW: "failed"}, {}),  # "failed" is an outcome, never a shadow decision
    ({h.COMPACTION: "failed", h.SHADOW: "none"}, {"compaction": "failed", "compaction_shadow": "none"}),
    ({h.TOKENS_BEFORE: "120000", h.TOKENS_AFTER: "0030", h.ELIDED: "0"},
     {"tokens_before": 120000, "tokens_after": 30, "elided": 0}),
    ({h.SHADOW_TOKENS_BEFORE: "999999999999", h.SHADOW_TOKENS_AFTER: "1000000000000"},
     {"shadow_tokens_before": 999999999999}),  # twelve digits at most
    ({h.TOKENS_BEFORE: "-1", h.TOKENS_AFTER: "1.5", h.ELIDED: " 5"}, {}),
    ({h.TOKENS_BEFORE: "\u0663", h.TOKENS_AFTER: "\u00b2", h.ELIDED: "\uff15"}, {}),  # digits, but not ASCII
    ({h.TOKENS_BEFORE: "", h.ELIDED: "1e3"}, {}),
    ({h.REASON: "window_exceeded"}, {"compaction_reason": "window_exceeded"}),
    ({h.REASON: "a" * 40}, {"compaction_reason": "a" * 40}),
    ({h.REASON: "a" * 41}, {}),
    ({h.REASON: "Window"}, {}),
    ({h.REASON: "bad-reason"}, {}),
    ({h.REASON: "x\n"}, {}),
    ({h.REASON: ""}, {}),
    ({h.REASON: "x\ud800"}, {}),
    ({h.COMPACTION: "proactive", h.TOKENS_BEFORE: "10", h.REASON: "over_budget", h.MODE: "off", "other": "1"},
     {"compaction": "proactive", "tokens_before": 10, "compaction_reason": "over_budget"}),
])
def test_log_fields(headers: dict[str, str], expected: dict[str, str | int]) -> None:
    assert log_fields(headers) == expected


def test_log_fields_counts_are_ints() -> None:
    fields = log_fields({h.ELIDED: "7"})
    assert fields == {"elided": 7} and type(fields["elided"]) is int


def test_log_fields_read_case_insensitive_headers() -> None:
    headers = CIMultiDict({"X-Compaction": "reused", "X-Compaction-Tokens-Before": "5"})
    assert log_fields(headers) == {"compaction": "reused", "tokens_before": 5}


def test_log_fields_read_the_first_of_a_repeated_header_only() -> None:
    headers = CIMultiDict([("X-Compaction", "bogus"), ("x-compaction", "reused"), ("X-Compaction-Elided", "3"),
                           ("x-compaction-elided", "4")])
    assert log_fields(headers) == {"elided": 3}


def test_log_fields_refuse_a_non_str_count() -> None:
    with pytest.raises(AttributeError):
        log_fields({h.TOKENS_BEFORE: 5})  # type: ignore[dict-item]


@pytest.mark.parametrize(("code", "error_type", "outcome", "expected"), [
    ("invalid_api_key", "invalid_request_error", "none", ("none", "invalid_api_key")),
    ("413", "invalid_request_error", "none", ("none", "invalid_request_error")),  # an aiohttp status as the code
    (None, "upstream_error", "failed", ("failed", "upstream_error")),
    (None, "Not A Word", "none", ("none", "proxy_error")),
    ("compaction_failed", "upstream_error", "made-up", ("none", "compaction_failed")),  # not an outcome: none
], ids=["code", "digits", "type", "neither", "unknown-outcome"])
def test_what_a_refusal_tells(code: str | None, error_type: str, outcome: str, expected: tuple[str, str]) -> None:
    told = h.refusal(code, error_type, outcome)
    assert (told[h.COMPACTION], told[h.REASON]) == expected
