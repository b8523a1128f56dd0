"""Request paths that could leave `upstream.base_url` (dot segments, encoded separators) are refused up front."""

from __future__ import annotations

import re
from urllib.parse import unquote

from aiohttp import web

from proxy.errors import BadRequest
from proxy.middleware import Handler

# A segment still percent-encoded after this many decodings is refused outright, never decoded further.
MAX_DECODINGS = 4
_DOT_SEGMENTS = frozenset({".", ".."})
# After any decoding these would separate segments for someone: a front that decodes once, a Windows backend.
_SEPARATORS = ("/", "\\", "\x00")


_SPLIT = re.compile(r"[/\\]")


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
    decoded = segment
    for depth in range(MAX_DECODINGS + 1):
        # "..;x" is a dot segment to servlet containers, which drop ";" parameters before resolving.
        if decoded.partition(";")[0] in _DOT_SEGMENTS:
            return "dot segments ('.', '..', raw or percent-encoded) are not allowed in the path"
        if depth and "\x00" in decoded:
            return "a percent-encoded NUL is not allowed in the path"
        # An encoded '/' alone stays inside its segment ("org%2Fmodel", as SDKs send model ids); what it must not
        # hide is a dot segment that a decoding front would then resolve.
        if depth and any(piece.partition(";")[0] in _DOT_SEGMENTS for piece in _SPLIT.split(decoded)):
            return "dot segments ('.', '..', raw or percent-encoded) are not allowed in the path"
        undone = unquote(decoded)
        if undone == decoded:
            return None
        decoded = undone
    return "the path is percent-encoded too many times over"


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
