"""Request bodies read within bounds: size counted on inflated bytes as they inflate, a deadline, a free loop."""

from __future__ import annotations

import asyncio
import zlib

import zstandard
from aiohttp import hdrs, web
from aiohttp.web_protocol import RequestPayloadError

from proxy.errors import BadRequest, PayloadTooLarge, RequestTimeout, UnsupportedEncoding
from proxy.http.appkeys import SETTINGS

# Inflated bytes per zlib call: about a millisecond of CPU, after which other requests get the loop.
INFLATE_STEP = 256 * 1024
# A gzip body is a sequence of members; honest clients send one, a bomb of empty members costs a call each.
MAX_GZIP_MEMBERS = 64
# Pieces of a body from this size on are kept as they came until the body is joined; a piece's own cost (about 40
# bytes) is then at most 4 % of what it holds.
WHOLE_PIECE = 1024
_GZIP_WBITS = 16 + zlib.MAX_WBITS
_ZLIB_WBITS = zlib.MAX_WBITS
_RAW_DEFLATE_WBITS = -zlib.MAX_WBITS
_IDENTITY = frozenset({"", "identity"})
# zstd has no output bound per call: a block inflates to at most 128 KiB from as few as 4 bytes, so a slice of
# compressed bytes inflates to at most 32 KiB per byte. Slices start at 64 bytes (2 MiB at worst), grow while the
# output stays small (honest bodies), and fall back after a large one.
_ZSTD_SLICE = (64, 64 * 1024)


class _Inflater:
    """zlib in bounded steps: `feed` compressed bytes, then call `step` until it returns None."""

    def __init__(self, encoding: str) -> None:
        self.encoding = encoding
        self._wbits: int | None = _GZIP_WBITS if encoding in ("gzip", "x-gzip") else None
        self._inflater = zlib.decompressobj(self._wbits) if self._wbits is not None else None
        self._pending = b""
        self._members = 1
        self._fed = False
        self._drained = True

    def feed(self, data: bytes) -> None:
        self._pending += data
        self._fed = True
        self._drained = False

    def step(self) -> bytes | None:
        """At most INFLATE_STEP inflated bytes (maybe none); None once everything fed so far is inflated."""
        if self._drained:
            return None
        inflater = self._decompressor()
        try:
            out = inflater.decompress(self._pending, INFLATE_STEP)
        except zlib.error:
            raise self._invalid() from None
        self._pending = inflater.unconsumed_tail
        if inflater.eof and inflater.unused_data:
            self._next_member(inflater.unused_data)
        # zlib may hold output for input it already took; only an empty answer with no input left means done.
        self._drained = not out and not self._pending
        return out

    def finish(self) -> None:
        """The body ended: the compressed stream must have ended with it (an empty body is just empty)."""
        if not self._fed:
            return
        if self._inflater is None or not self._inflater.eof or self._pending:
            raise BadRequest(f"the request body is a truncated {self.encoding} stream", code="invalid_body")

    def _decompressor(self) -> zlib._Decompress:
        if self._inflater is None:
            # RFC 9110 deflate is zlib-wrapped, but some clients send raw deflate: the first byte tells them apart.
            self._wbits = _ZLIB_WBITS if self._pending[:1] and self._pending[0] & 0x0F == 8 else _RAW_DEFLATE_WBITS
            self._inflater = zlib.decompressobj(self._wbits)
        return self._inflater

    def _next_member(self, rest: bytes) -> None:
        if self._wbits != _GZIP_WBITS:
            raise BadRequest(f"data follows the end of the {self.encoding} stream", code="invalid_body")
        self._members += 1
        if self._members > MAX_GZIP_MEMBERS:
            raise BadRequest(f"the gzip body has more than {MAX_GZIP_MEMBERS} members", code="invalid_body")
        self._inflater = zlib.decompressobj(_GZIP_WBITS)
        self._pending = rest + self._pending

    def _invalid(self) -> BadRequest:
        return BadRequest(f"the request body is not valid {self.encoding} data", code="invalid_body")


class _ZstdInflater:
    """zstd (RFC 8878, as Codex compresses its requests) in bounded steps, with _Inflater's interface."""

    encoding = "zstd"

    def __init__(self) -> None:
        self._decompressor = zstandard.ZstdDecompressor()
        self._inflater = self._decompressor.decompressobj()
        self._pending = b""
        self._slice = _ZSTD_SLICE[0]
        self._frames = 1
        self._fed = False

    def feed(self, data: bytes) -> None:
        self._pending += data
        self._fed = True

    def step(self) -> bytes | None:
        """The next slice inflated (maybe nothing yet); None once everything fed so far is inflated."""
        if not self._pending:
            return None
        piece, self._pending = self._pending[:self._slice], self._pending[self._slice:]
        try:
            out = self._inflater.decompress(piece)
        except zstandard.ZstdError:
            raise BadRequest("the request body is not valid zstd data", code="invalid_body") from None
        if self._inflater.eof and self._inflater.unused_data:
            self._next_frame(self._inflater.unused_data)
        small = len(out) < INFLATE_STEP // 4
        self._slice = min(self._slice * 2, _ZSTD_SLICE[1]) if small else _ZSTD_SLICE[0]
        return out

    def finish(self) -> None:
        if self._fed and (not self._inflater.eof or self._pending):
            raise BadRequest("the request body is a truncated zstd stream", code="invalid_body")

    def _next_frame(self, rest: bytes) -> None:
        self._frames += 1
        if self._frames > MAX_GZIP_MEMBERS:
            raise BadRequest(f"the zstd body has more than {MAX_GZIP_MEMBERS} frames", code="invalid_body")
        self._inflater = self._decompressor.decompressobj()
        self._pending = rest + self._pending


def inflater_for(content_encoding: str) -> _Inflater | _ZstdInflater | None:
    """The inflater a Content-Encoding asks for; None for identity; 415 for anything else."""
    if not content_encoding:  # most requests send none
        return None
    codings = [coding.strip().lower() for coding in content_encoding.split(",")]
    codings = [coding for coding in codings if coding not in _IDENTITY]
    if not codings:
        return None
    if codings == ["zstd"]:
        return _ZstdInflater()
    if len(codings) == 1 and codings[0] in ("gzip", "x-gzip", "deflate"):
        return _Inflater(codings[0])
    raise UnsupportedEncoding(f"Content-Encoding {content_encoding!r} is not supported (gzip, deflate or zstd, "
                              "once)")


def _too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"request body exceeds the proxy's limit of {limit} bytes (counted after decompression)")


async def read_body(request: web.Request) -> bytes:
    """The whole request body, inflated, within `server.max_body_bytes` and `server.body_timeout`."""
    server = request.app[SETTINGS].server
    return await read_bounded(request, server.max_body_bytes, server.body_timeout)


async def read_bounded(request: web.BaseRequest, limit: int, timeout: float) -> bytes:
    inflater = inflater_for(request.headers.get(hdrs.CONTENT_ENCODING, ""))
    declared = request.content_length
    if declared is not None and declared > limit:
        raise _too_large(limit)  # refused before a byte is read: compressed bytes count against the limit too
    if inflater is None and request.content.is_eof():
        # The whole body came with the head (most small requests): no deadline to arm, nothing to wait for.
        return _whole(request, limit)
    try:
        async with asyncio.timeout(timeout):
            return await _collect(request, inflater, limit)
    except TimeoutError:
        raise RequestTimeout(f"the request body did not arrive within {timeout:g}s") from None
    except RequestPayloadError as error:
        raise BadRequest(f"the request body is malformed: {error}", code="invalid_body") from None


def _whole(request: web.BaseRequest, limit: int) -> bytes:
    try:
        body = request.content.read_nowait()
    except RequestPayloadError as error:
        raise BadRequest(f"the request body is malformed: {error}", code="invalid_body") from None
    if len(body) > limit:  # a chunked body states no length
        raise _too_large(limit)
    return body


async def _collect(request: web.BaseRequest, inflater: _Inflater | _ZstdInflater | None, limit: int) -> bytes:
    body = _Pieces()
    received = 0
    while chunk := await request.content.readany():
        received += len(chunk)
        if received > limit:
            raise _too_large(limit)
        if inflater is None:
            body.add(chunk)
            continue
        inflater.feed(chunk)
        while (piece := inflater.step()) is not None:
            if body.size + len(piece) > limit:
                raise _too_large(limit)
            body.add(piece)
            await asyncio.sleep(0)  # a bomb inflates in steps, between which the loop serves everyone else
    if inflater is not None:
        inflater.finish()
    return body.joined()


class _Pieces:
    """A body as its pieces came, joined once at the end: a buffer grown piece by piece is copied again at each
    growth and once more into bytes, two to three times the work on a body of a megabyte. Pieces shorter than
    WHOLE_PIECE are gathered into a buffer first, so a body sent as many tiny chunks holds no more than its bytes."""

    __slots__ = ("_parts", "_small", "size")

    def __init__(self) -> None:
        self._parts: list[bytes | bytearray] = []
        self._small = bytearray()
        self.size = 0

    def add(self, piece: bytes) -> None:
        self.size += len(piece)
        if len(piece) < WHOLE_PIECE:
            self._small += piece
            return
        if self._small:
            self._parts.append(self._small)
            self._small = bytearray()
        self._parts.append(piece)

    def joined(self) -> bytes:
        parts = [*self._parts, self._small] if self._small else self._parts
        if len(parts) == 1 and isinstance(parts[0], bytes):
            return parts[0]  # the whole body came as one piece: nothing to copy
        return b"".join(parts)


def close_if_unread(request: web.BaseRequest, response: web.StreamResponse) -> None:
    """A request refused before its body was read (401, 413, 408, 400) ends its connection: the rest of the body
    is never inflated, nor drained for keep-alive."""
    if not request.content.is_eof():
        response.force_close()
