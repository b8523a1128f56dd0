"""A JSON object's top-level members from one key on, found without reading what lies before it (a long history).

A request relayed unread needs its model and nothing else; reading a 500 KB history whole for it was a quarter of
the proxy's CPU on the request (0.3 of 1.2 ms), and a search of every byte costs almost as much. Two places are
looked at:
- the object's first member, which a pattern anchored at the body's start reads (the OpenAI SDK and the bench send
  the model first);
- its last members, found from the body's end (the Anthropic SDK sends its messages, then the model and the
  rest). A quoted key that follows a comma and precedes a colon is a member's key wherever it is, since a quote
  inside a JSON string is escaped. Whether it is the outermost object's is what the members from it on say: read
  with a `{` put before them, they make one object exactly when it is (from a nested object, the closing brackets
  outnumber the openings and the read fails).
For a valid JSON object the answer is what reading it whole gives (see members_from for a key named twice). The body
is not otherwise checked: what lies before the key is not read at all.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import orjson

# Keys tried from the end before the body is left to be read whole: each failed try reads only as far as the nested
# object the key stood in ends, but a body may hold a key in every message.
MAX_TRIES = 4
_SPACE = b" \t\r\n"
_VALUE_LIMIT = 256


def members_from(body: bytes, key: str) -> dict[str, Any] | None:
    """The key's string value alone when it is the outermost object's first member; else that object's members
    from its last `key` on (that key included); None when neither is found within MAX_TRIES keys from the end (read
    the body whole then). A body that names the key twice and opens with it is answered with the first: finding the
    other would take a search of every byte, which costs what the whole read does."""
    quoted = b'"' + key.encode() + b'"'
    if (first := _first_member(quoted).match(body)) is not None:
        try:
            return {key: first.group(1).decode()}
        except UnicodeDecodeError:
            return None
    end = len(body)
    for _ in range(MAX_TRIES):
        at = body.rfind(quoted, 0, end)
        if at < 0:
            return None
        if _is_member_key(body, at, len(quoted)):
            try:
                members = orjson.loads(b"{" + body[at:])
            except orjson.JSONDecodeError:
                members = None
            if isinstance(members, dict):
                return members
        end = at
    return None


@functools.lru_cache(maxsize=8)
def _first_member(quoted: bytes) -> re.Pattern[bytes]:
    # A plain string value (no escape, no control character), as every model name is; anything else is read whole.
    return re.compile(rb"\A[ \t\r\n]*\{[ \t\r\n]*" + re.escape(quoted) + rb'[ \t\r\n]*:[ \t\r\n]*"([^"\\\x00-\x1f]{0,'
                      + str(_VALUE_LIMIT).encode() + rb'})"[ \t\r\n]*[,}]')


def _is_member_key(body: bytes, at: int, length: int) -> bool:
    """Whether the quoted key at `at` follows a comma and is followed by a colon (spaces around both allowed): a
    member's key after another member, at whatever depth."""
    before = at - 1
    while before >= 0 and body[before] in _SPACE:
        before -= 1
    after = at + length
    while after < len(body) and body[after] in _SPACE:
        after += 1
    return before >= 0 and body[before] == ord(",") and after < len(body) and body[after] == ord(":")
