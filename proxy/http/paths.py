"""Request paths that could leave `upstream.base_url` (dot segments, encoded separators) are refused up front."""

from __future__ import annotations

import re
from urllib.parse import unquote, unquote_to_bytes

from aiohttp import web

from proxy.errors import BadRequest

# A segment still percent-encoded after this many decodings is refused outright, never decoded further.
MAX_DECODINGS = 4
_DOT_ONLY = frozenset(". ")
_DOT_SEGMENT = "dot segments ('.', '..', raw or percent-encoded) are not allowed in the path"
_SPLIT = re.compile(r"[/\\]")
# IIS decodes %uXXXX (UTF-16) escapes; no standard client sends them.
_IIS_ESCAPE = re.compile(r"%u[0-9a-f]{4}", re.IGNORECASE)
# A path of only these (the API's own paths) holds no dot, escape or separator to look further at: one match.
_PLAIN = re.compile(r"/[A-Za-z0-9_/-]*")


def refusal(raw_path: str) -> str | None:
    """Why the raw request path may not be forwarded, or None when it stays below the upstream's base path."""
    path = raw_path.partition("?")[0]
    return None if _PLAIN.fullmatch(path) else checked(path)


def checked(path: str) -> str | None:
    """`refusal` of a path (no query) looked at in full: its characters, its escapes, each segment."""
    if not path.startswith("/"):
        return "only origin-form request targets (a path starting with /) are accepted"
    if any(char in path for char in ("\\", "\x00", "#")):
        return "the path holds a backslash, NUL or '#'"
    if "%" in path and not _utf8_at_every_decoding(path):
        # A lenient decoder reads an overlong or broken sequence as ASCII, taking any byte as its continuation, the
        # next segment's '/' included ('.%c0/' is './'): only valid UTF-8 is certain to mean what it says.
        return "percent-encoded bytes that are not valid UTF-8 (overlong forms among them) are not allowed in the path"
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
        undone = unquote(decoded)
        if undone == decoded:
            return None
        decoded = undone
    return "the path is percent-encoded too many times over"


def _is_dot_segment(piece: str) -> bool:
    """'.' or '..', also as a Windows server sees a name: with trailing dots and spaces stripped ('...', '.. ')."""
    name = piece.partition(";")[0]
    return "." in name and set(name) <= _DOT_ONLY


def _utf8_at_every_decoding(path: str) -> bool:
    """Whether the path's bytes are valid UTF-8 however many times (up to MAX_DECODINGS) it is percent-decoded."""
    decoded = path
    for _ in range(MAX_DECODINGS + 1):
        try:
            unquote_to_bytes(decoded).decode("utf-8")
        except UnicodeDecodeError:
            return False
        undone = unquote(decoded)
        if undone == decoded:
            return True
        decoded = undone
    return True  # still encoded: the segments' own check refuses it


def refused_path(request: web.BaseRequest) -> web.Response | None:
    """The answer to a path that could leave the base URL, before authentication and forwarding (the operator's
    key never goes anywhere but below it); None for a path that may go on."""
    problem = refusal(request.raw_path)
    if problem is None:
        return None
    error = BadRequest(problem, code="invalid_path")
    response = web.json_response(error.body(), status=error.status, headers=error.headers())
    response.force_close()  # whatever body follows is never read
    return response
