"""A JSON request body read once, guarded (depth, surrogates, exact integers), and written back compactly."""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

from proxy.core.fingerprint import dumps_iteratively
from proxy.errors import BadRequest

# A real chat request nests < 20 levels (body > messages > message > content parts > image_url), a tool schema a
# few dozen more. 128 leaves room for deep schemas while staying far below what anything downstream can take:
# orjson encodes at most 254 levels, Python's json and every recursive walk fail near 1000.
MAX_NESTING = 128

# A \u escape of a UTF-16 surrogate (D800-DFFF): JSON spells astral characters as a high/low pair of these.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
# Anywhere a lone one could be: a high escape not followed by a low one, a low one not after a high one, or a
# backslash before a surrogate escape (it may be an escaped backslash, making the "escape" literal text). Escaped
# emoji (pairs) match none of these, so the common case is one regex pass that finds nothing.
_MAYBE_LONE = re.compile(r"\\u[dD](?:[89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F])"
                         r"|(?<!\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD])[c-fC-F][0-9a-fA-F]{2})"
                         r"|\\\\u[dD][89a-fA-F]")
_LOW_SURROGATE_DIGIT = frozenset("cdefCDEF")
_CONTAINERS = (dict, list)
# Every digit as "0", every other byte as a space: a long integer becomes a run of zeros bytes.find can see.
_DIGIT_CLASSES = bytes(0x30 if 0x30 <= byte <= 0x39 else 0x20 for byte in range(256))
_LONG_DIGIT_RUN = b"0" * 19  # 2**63 has 19 digits: a shorter integer is exact in orjson too


def encode_json(payload: dict[str, Any]) -> bytes:
    """Compact UTF-8 JSON for a payload; whatever orjson refuses (big integers, lone surrogates) still encodes."""
    try:
        return orjson.dumps(payload)
    except (TypeError, orjson.JSONEncodeError):
        pass
    try:
        return json.dumps(payload, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        # A lone surrogate has no UTF-8 form; as a \u escape it survives the trip and decodes to the same string.
        return json.dumps(payload).encode()
    except RecursionError:
        return dumps_iteratively(payload).encode()


def decode_body(body: bytes) -> Any:
    """The JSON value of a request body, or a BadRequest saying why there is none. Never raises anything else.

    orjson reads nearly every body, about twice as fast as json.loads; what it refuses or could read inexactly
    (a BOM, UTF-16, NaN, a lone surrogate, integers beyond 64 bits) is read by json.loads, which says why.
    """
    if not _may_hold_a_long_integer(body):
        try:
            payload = orjson.loads(body)
        except orjson.JSONDecodeError:
            pass
        else:  # orjson refuses lone surrogates and invalid UTF-8 itself; only the depth is left to check
            if _plainly_within_limits(payload) or not nests_deeper_than(payload, MAX_NESTING):
                return payload
            raise _too_deep()
    return _decode_exactly(body)


def _may_hold_a_long_integer(body: bytes) -> bool:
    """A run of 19 or more digits anywhere (in a string too): orjson would read such an integer as a float."""
    return body.translate(_DIGIT_CLASSES).find(_LONG_DIGIT_RUN) >= 0


def _decode_exactly(body: bytes) -> Any:
    text = _text_of(body)
    try:
        payload = json.loads(text)
    except RecursionError:
        raise _too_deep() from None
    except ValueError as error:
        raise BadRequest(f"request body is not valid JSON: {error}") from None
    if not _plainly_within_limits(payload):  # rare: look closer at why orjson refused it
        if nests_deeper_than(payload, MAX_NESTING):
            raise _too_deep()
        if has_lone_surrogate_escape(text):
            raise BadRequest("request body holds a lone UTF-16 surrogate escape (\\ud800-\\udfff without its pair); "
                             "strings must be valid Unicode")
    return payload


def _orjson_nesting_limit(cap: int = 4096) -> int | None:
    """How many levels orjson encodes (254 today), or None if more than `cap`: probed, not assumed, since the fast
    check below rests on it."""
    low, high = 1, cap  # orjson encodes `low` levels and refuses more than `high`, or the cap is reached
    while low < high:
        middle = (low + high + 1) // 2
        try:
            orjson.dumps(_wrapped([], middle - 1))
        except orjson.JSONEncodeError:
            high = middle - 1
        else:
            low = middle
    return low if low < cap else None


def _wrapped(value: Any, levels: int) -> Any:
    for _ in range(levels):
        value = [value]
    return value


_ORJSON_LIMIT = _orjson_nesting_limit()
# Lists to wrap a payload in so that orjson refuses exactly the payloads nested deeper than MAX_NESTING (with a
# lower limit of its own it refuses more, which the walk then sorts out); None: orjson cannot tell.
_WRAPPING = None if _ORJSON_LIMIT is None else max(_ORJSON_LIMIT - MAX_NESTING, 0)


def _plainly_within_limits(payload: Any) -> bool:
    """One C-speed pass that clears nearly every body: orjson refuses any string that holds a surrogate and, wrapped
    as above, any payload nested deeper than MAX_NESTING. A refusal can also mean a big integer: not an answer."""
    if _WRAPPING is None:
        return False
    try:
        orjson.dumps(_wrapped(payload, _WRAPPING))
    except orjson.JSONEncodeError:
        return False
    return True


def _text_of(body: bytes) -> str:
    # Strict, unlike json.loads(bytes), which lets UTF-8-encoded surrogates through ("surrogatepass").
    encoding = json.detect_encoding(body)
    try:
        return body.decode(encoding)
    except UnicodeDecodeError as error:
        name = "UTF-8" if encoding.startswith("utf-8") else encoding.upper()
        raise BadRequest(f"request body is not valid {name}: {error.reason} at byte {error.start}") from None


def _too_deep() -> BadRequest:
    return BadRequest(f"request body is nested more than {MAX_NESTING} levels deep")


def nests_deeper_than(value: Any, limit: int) -> bool:
    """True when containers nest more than `limit` levels (the value itself is level 1). Iterative, level by level,
    so it costs one look at each container element up to the limit and never recurses."""
    level = [value] if isinstance(value, _CONTAINERS) else []
    for _ in range(limit):
        level = [child for node in level for child in (node.values() if isinstance(node, dict) else node)
                 if isinstance(child, _CONTAINERS)]
        if not level:
            return False
    return True


def has_lone_surrogate_escape(text: str) -> bool:
    """True when valid JSON text spells a surrogate that is not half of a high+low pair.

    Read from the text, not the decoded strings: one regex pass settles the common case, and only a hit is looked
    at escape by escape. Strict decoding already refused raw surrogates, so escapes are the only way one gets in.
    """
    if _MAYBE_LONE.search(text) is None:
        return False
    paired_low = -1
    for match in _SURROGATE_ESCAPE.finditer(text):
        start = match.start()
        if start == paired_low or _escaped(text, start):
            continue  # the low half of a pair already checked, or a literal "\\ud800" (an escaped backslash)
        if match.group()[3] not in _LOW_SURROGATE_DIGIT and _low_surrogate_at(text, start + 6):
            paired_low = start + 6
            continue
        return True
    return False


def _escaped(text: str, index: int) -> bool:
    """Whether the backslash at `index` is itself escaped, i.e. preceded by an odd run of backslashes."""
    run = 0
    while index - run - 1 >= 0 and text[index - run - 1] == "\\":
        run += 1
    return run % 2 == 1


def _low_surrogate_at(text: str, index: int) -> bool:
    escape = _SURROGATE_ESCAPE.match(text, index)
    return escape is not None and escape.group()[3] in _LOW_SURROGATE_DIGIT
