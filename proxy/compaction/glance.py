"""A glance at a request's bytes: whether it is so far below every limit that it can need nothing of the proxy.

Most requests of a conversation are: the first turns of an agent, every request to a model with a large window.
They are relayed as they came without being read into a call, fingerprinted or counted. The glance is sound:
- a token is at least one byte of its text, and JSON spells a text in at least as many bytes as the text has, so a
  body of N bytes holds at most about N tokens, whatever the tokenizer (the chat template adds a bounded few);
- what a byte count cannot bound (an image, a file, audio) or what asks the proxy for something (a context-management
  entry, a compaction item, a per-request mode) sends the request the whole way;
- only a window someone stated (configured, discovered, or learned from an overflow) counts, and an overflow
  answer still takes the whole way back: the request is read then and compacted as it would have been.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from typing import Any

import orjson

from proxy.config import Settings
from proxy.core.top_members import members_from
from proxy.dialects.call import is_positive
from proxy.errors import BadRequest
from proxy.headers import MODE

# Larger bodies are read whole anyway when the proxy compacts: the glance would cost what it saves. With compaction
# off nothing reads them whole, whatever their size: the glance is all the reading a request gets.
MAX_BYTES = 256 * 1024
# With compaction off a body only needs its model: from this size on, it is read from the body's top level where
# the body says where it is (proxy.core.top_members), not from a parse of every message; below it, a whole parse
# costs less than 40 µs and a broken body is answered by the proxy, in the client's API.
WHOLE_BELOW = 64 * 1024
# Tokens a chat template may add beyond the body's own bytes (role markers, a tool-use preamble).
TEMPLATE_TOKENS = 1024
# A glanced request must stay below this share of the first limit: room for a stored summary the glance cannot
# see (one made on request of a short conversation) to be of no use, and for the estimate's calibration.
SHARE = 0.5
# Reads a body into its JSON object, or raises BadRequest.
Reader = Callable[[bytes], dict[str, Any]]
# The fields a client names its output cap in (chat, Responses, Messages).
OUTPUT_CAPS = ("max_completion_tokens", "max_tokens", "max_output_tokens")
# First limits a pipeline remembers (see Limits), by model and window: models are named by clients, so bounded.
MAX_REMEMBERED = 256
# First limits by (model, window), for one settings.
Limits = dict[tuple[str, int], int]


def judged(settings: Settings, stated: Callable[[str], int | None], markers: tuple[bytes, ...] | None, body: bytes,
           headers: Mapping[str, str], read: Reader | None = None, limits: Limits | None = None) -> str | None:
    """The request's model when it can be relayed as it came, unread, else None. `stated` is the smallest window
    anyone stated for a model, None for only the default's guess; `markers` the dialect's (Dialect.quick_markers).
    `read` reads a body with compaction on, where the whole way reads it the same way should the glance not do
    (dialects.body_memo: read once for both). `limits`: first limits remembered for these settings (every glanced
    request would work its model's out again)."""
    limit = MAX_BYTES if settings.compaction.enabled else None
    read = read if settings.compaction.enabled else None  # off, the body's guards are never the proxy's to run
    key = None if settings.compaction.enabled else "model"
    if not settings.compaction.glance or (payload := payload_of(body, headers, markers, max_bytes=limit,
                                                                read=read, key=key)) is None:
        return None
    model = payload.get("model")
    model = model if isinstance(model, str) else ""
    if not settings.compaction.enabled or settings.model_for(model).manages_own_context:
        return model
    window = stated(model)
    if settings.compaction.mode != "auto" or window is None:  # shadow reports on every request
        return None
    reserve = reserved(payload, settings.compaction.reserved_output_tokens)
    limit = first_limit(settings, model, window) if limits is None else remembered(limits, settings, model, window)
    return model if far_below(len(body), reserve, limit) else None


def remembered(limits: Limits, settings: Settings, model: str, window: int) -> int:
    """first_limit, from `limits` when it holds it (kept there if not; all forgotten at MAX_REMEMBERED)."""
    limit = limits.get((model, window))
    if limit is None:
        if len(limits) >= MAX_REMEMBERED:
            limits.clear()
        limit = limits[model, window] = first_limit(settings, model, window)
    return limit


def markers_for(settings: Settings, quick: tuple[bytes, ...] | None, uncounted: tuple[bytes, ...],
                alone: tuple[bytes, ...] = ()) -> tuple[bytes, ...] | None:
    """What a glance looks for in a dialect's bodies: what the proxy acts on, and with compaction on, what makes a
    request one it leaves alone (the answer says why) and content whose tokens its bytes do not bound. Off, neither
    matters: every request goes as it came, a 500 KB history with an image too, and each marker is a pass over the
    body (the three that only say why cost a 485 KB Responses history 0.48 ms of its 1.55)."""
    if quick is None:
        return None
    return quick + alone + uncounted if settings.compaction.enabled else quick


def payload_of(body: bytes, headers: Mapping[str, str], markers: tuple[bytes, ...] | None, *,
               max_bytes: int | None = MAX_BYTES, read: Reader | None = None,
               key: str | None = None) -> dict[str, Any] | None:
    """The body's JSON object when a glance may judge the request; None when it must go the whole way: a
    dialect that translates (no markers), a body over `max_bytes`, a marker of what the proxy must read, the
    client's mode. With `key`, a body of WHOLE_BELOW bytes or more may come back as only its top-level members
    from that key on, unchecked before it."""
    if markers is None or (max_bytes is not None and len(body) > max_bytes) or MODE in headers:
        return None
    if holds_marker(body, markers):
        return None
    if key is not None and len(body) >= WHOLE_BELOW and (members := members_from(body, key)) is not None:
        return members
    if read is not None:
        try:
            return read(body)
        except BadRequest:
            return None  # the whole way says why, in the client's API
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None  # the whole way says why, in the client's API
    return payload if isinstance(payload, dict) else None


def holds_marker(body: bytes, markers: tuple[bytes, ...]) -> bool:
    """Whether the body holds any of a dialect's markers. Up to MAX_BYTES, one pass finds any of them (a 250 KB
    history with Responses' eight: a fifth of the time of a search for each). Past it, a search for each: the
    pattern tries its markers wherever a quote stands, so a body of nothing but quotes costs it about five times a
    search for each; bounded at MAX_BYTES, that is a millisecond, not the seconds of a body of many megabytes."""
    if not markers:
        return False
    if len(body) <= MAX_BYTES:
        return _any_of(markers).search(body) is not None
    return any(marker in body for marker in markers)


@functools.lru_cache(maxsize=16)  # one per dialect
def _any_of(markers: tuple[bytes, ...]) -> re.Pattern[bytes]:
    return re.compile(b"|".join(map(re.escape, markers)))


def first_limit(settings: Settings, model: str, window: int) -> int:
    """The fewest prompt-plus-output tokens at which the proxy would act on this model's request: the compaction
    threshold, or an enabled tool-result stage's share if lower; and low enough that a request past the mark where
    a summary is prepared ahead (compaction.prepare_at) is never glanced, however low the mark is set (a glanced
    request stays below SHARE of this)."""
    shares = [settings.compaction.threshold] if settings.compaction.proactive else [1.0]
    if (prepare := settings.compaction.prepare_share) is not None:
        shares.append(prepare * settings.compaction.threshold / SHARE)
    stages = settings.tool_results_for(model)
    if stages.clear.enabled:
        shares.append(stages.clear.trigger)
    if stages.summarize_pairs.enabled:
        shares.append(stages.summarize_pairs.cutoff)
    return int(min(shares) * window)


def reserved(payload: Mapping[str, Any], default: int) -> int:
    return next((value for key in OUTPUT_CAPS if is_positive(value := payload.get(key))), default)


def far_below(body_bytes: int, reserve: int, limit: int) -> bool:
    """Whether a body of `body_bytes` with `reserve` output tokens stays below SHARE of `limit` tokens."""
    return body_bytes + TEMPLATE_TOKENS + reserve <= SHARE * limit
