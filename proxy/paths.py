"""Request paths that could leave `upstream.base_url` (dot segments, encoded separators) are refused up front."""

from __future__ import annotations

import re
from urllib.parse import unquote, unquote_to_bytes

from aiohttp import web

from proxy.errors import BadRequest
from proxy.middleware import Handler

# A segment still percent-encoded after this many decodings is refused outright, never decoded further.
MAX_DECODINGS = 4
_DOT_ONLY = frozenset(". ")
_DOT_SEGMENT = "dot segments ('.', '..', raw or percent-encoded) are not allowed in the path"
_SPLIT = re.compile(r"[/\\]")
# IIS decodes %uXXXX (UTF-16) escapes; no standard client sends them.
_IIS_ESCAPE = re.compile(r"%u[0-9a-f]{4}", re.IGNORECASE)
# A multi-byte UTF-8 lead byte and how many bytes follow it, for lenient decoders that take any of them.
_LEADS = [(0xFC, 5), (0xF8, 4), (0xF0, 3), (0xE0, 2), (0xC0, 1)]


def refusal(raw_path: str) -> str | None:
    """Why the raw request path may not be forwarded, or None when it stays below the upstream's base path."""
    path = raw_path.partition("?")[0]
    if not path.startswith("/"):
        return "only origin-form request targets (a path starting with /) are accepted"
    if any(char in path for char in ("\\", "\x00", "#")):
        return "the path holds a backslash, NUL or '#'"
    for segment in path.split("/"):
        problem = _segment_refusal(segment)
        if problem is not None:
            return problem
    return None


def _segment_refusal(segment: str) -> str | None:
    if "%" not in segment and segment.isascii():  # most segments: nothing encoded, only a dot segment to look for
        return _DOT_SEGMENT if _is_dot_segment(segment) else None
    decoded = segment
    for depth in range(MAX_DECODINGS + 1):
        # "..;x" is a dot segment to servlet containers, which drop ";" parameters before resolving. An encoded '/'
        # alone stays inside its segment ("org%2Fmodel", as SDKs send model ids); what it must not hide is a dot
        # segment that a decoding front would then resolve.
        if any(_is_dot_segment(piece) for piece in (_SPLIT.split(decoded) if depth else [decoded])):
            return _DOT_SEGMENT
        if depth and "\x00" in decoded:
            return "a percent-encoded NUL is not allowed in the path"
        if _IIS_ESCAPE.search(decoded):
            return "%u escapes are not allowed in the path"
        if _overlong(unquote_to_bytes(decoded.encode("utf-8", "surrogateescape"))):
            return "overlong or invalid UTF-8 for an ASCII character ('.', '/', '%', ...) is not allowed in the path"
        undone = unquote(decoded)
        if undone == decoded:
            return None
        decoded = undone
    return "the path is percent-encoded too many times over"


def _is_dot_segment(piece: str) -> bool:
    """'.' or '..', also as a Windows server sees a name: with trailing dots and spaces stripped ('...', '.. ')."""
    name = piece.partition(";")[0]
    return "." in name and set(name) <= _DOT_ONLY


def _overlong(raw: bytes) -> bool:
    """True when a multi-byte sequence in `raw` reads as an ASCII character to a decoder that ignores what makes it
    invalid (overlong form, continuation bytes that are not): '.', '/', '\\', or a '%' or 'u' that builds another
    escape. Valid UTF-8 never encodes ASCII in more than one byte."""
    for index, byte in enumerate(raw):
        if byte < 0xC0:
            continue
        follows = next(count for lead, count in _LEADS if byte >= lead)
        tail = raw[index + 1:index + 1 + follows]
        point = byte & (0x3F >> follows)
        for continuation in tail:
            point = point << 6 | continuation & 0x3F
        if len(tail) == follows and point < 0x80:
            return True
    return False


@web.middleware
async def refuse_escaping_paths(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Before authentication and forwarding: the operator's key never goes anywhere but below the base URL."""
    problem = refusal(request.raw_path)
    if problem is not None:
        error = BadRequest(problem, code="invalid_path")
        response = web.json_response(error.body(), status=error.status)
        response.force_close()  # whatever body follows is never read
        return response
    return await handler(request)
