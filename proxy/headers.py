"""The x-compaction* response headers: their names and values, built and read in one place."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Literal, get_args

from multidict import CIMultiDict, CIMultiDictProxy

COMPACTION = "x-compaction"
SHADOW = "x-compaction-shadow"
TOKENS_BEFORE = "x-compaction-tokens-before"
TOKENS_AFTER = "x-compaction-tokens-after"
SHADOW_TOKENS_BEFORE = "x-compaction-shadow-tokens-before"
SHADOW_TOKENS_AFTER = "x-compaction-shadow-tokens-after"
ELIDED = "x-compaction-elided"
CLEARED = "x-compaction-cleared"  # stage 1: how many old tool results were cleared in the request forwarded
CLEARED_TOKENS = "x-compaction-cleared-tokens"  # and the tokens that freed
PAIR_SUMMARIES = "x-compaction-pair-summaries"  # stage 2: how many old tool rounds went as their stored summaries
REASON = "x-compaction-reason"
# The journal event of the summary (or tool-result stage) in the request forwarded: GET /_proxy/api/events/{id}.
COMPACTION_ID = "x-compaction-id"
COUNTED_BY = "x-compaction-counted-by"  # "proxy" on a token count the proxy estimated (the upstream has none)
# What each context-management edit a client asked of the proxy did: `edit=outcome` pairs, comma-separated.
EDITS = "x-compaction-edits"
MODE = "x-compaction-mode"  # a request header: a client's per-request choice

# What compaction did for a request (x-compaction), and what it would have done in shadow mode. "forced": the
# operator's or the request's mode said to compact whatever the size; "requested": the client asked for a compaction
# (POST /responses/compact, a compaction trigger); "prepared": a summary made ahead (compaction.prepare_at) spliced in
# for the first time; "not-applicable": the request keeps its history upstream (or asks the upstream to manage it),
# so the proxy cannot shorten it.
Outcome = Literal["none", "proactive", "reactive", "forced", "requested", "prepared", "reused", "failed",
                  "not-applicable"]
ShadowDecision = Literal["none", "reused", "proactive", "reactive"]
OUTCOMES: frozenset[str] = frozenset(get_args(Outcome))
SHADOW_DECISIONS: frozenset[str] = frozenset(get_args(ShadowDecision))
# The whole-number headers, by the name each has as a log field.
COUNTS = {TOKENS_BEFORE: "tokens_before", TOKENS_AFTER: "tokens_after", SHADOW_TOKENS_BEFORE: "shadow_tokens_before",
          SHADOW_TOKENS_AFTER: "shadow_tokens_after", ELIDED: "elided", CLEARED: "cleared",
          CLEARED_TOKENS: "cleared_tokens", PAIR_SUMMARIES: "pair_summaries"}
_REASON = re.compile(r"[a-z_]{1,40}")
_ID = re.compile(r"[0-9a-f]{1,64}")
_MAX_DIGITS = 12
# Each header logged, by its lower-cased name: its field, and the values it may have (None: a whole number).
_LOGGED: dict[str, tuple[str, frozenset[str] | re.Pattern[str] | None]] = {
    COMPACTION: ("compaction", OUTCOMES), SHADOW: ("compaction_shadow", SHADOW_DECISIONS),
    **{header: (name, None) for header, name in COUNTS.items()},
    COMPACTION_ID: ("compaction_id", _ID), REASON: ("compaction_reason", _REASON)}


def outcome_of(headers: Mapping[str, str]) -> Outcome:
    """x-compaction as a label: "none" for anything else (an upstream may send the header too, with anything in
    it, and a label must not grow with what clients or upstreams choose)."""
    value = headers.get(COMPACTION, "none")
    return value if value in OUTCOMES else "none"  # type: ignore[return-value]  # checked against the Literal


def log_fields(headers: Mapping[str, str]) -> dict[str, str | int]:
    """The headers as access-log fields: known values and whole numbers only (a repeated header: its first)."""
    if not isinstance(headers, CIMultiDict | CIMultiDictProxy):
        headers = CIMultiDict(headers)
    fields: dict[str, str | int] = {}
    # Each logged name looked up (a dozen lookups at C speed): a pass over every header lower-cased each one.
    for header, (name, accepts) in _LOGGED.items():
        value = headers.get(header)
        if value is None:
            continue
        if accepts is None:
            if value.isascii() and value.isdigit() and len(value) <= _MAX_DIGITS:
                fields[name] = int(value)
        elif value in accepts if isinstance(accepts, frozenset) else accepts.fullmatch(value):
            fields[name] = value
    return fields


def refusal(code: str | None, error_type: str, outcome: str = "none") -> dict[str, str]:
    """What an answer the proxy made itself (an error: 400, 401, 502…) tells of compaction: `outcome` (nothing was
    compacted, or a compaction asked for failed) and, as the reason, the error's code or else its type."""
    reason = next((word for word in (code, error_type) if word and _REASON.fullmatch(word)), "proxy_error")
    return {COMPACTION: outcome if outcome in OUTCOMES else "none", REASON: reason}
