"""The one HTTP client of the proxy: header rules, timeouts, and upstream failures as proxy errors."""

from __future__ import annotations

import base64
import binascii
import hmac
import logging
import re
import time
from collections.abc import AsyncIterator, Callable, Collection, Mapping
from dataclasses import dataclass
from urllib.parse import unquote_to_bytes

import aiohttp
from aiohttp.abc import AbstractStreamWriter
from aiohttp.payload import BytesPayload
from multidict import CIMultiDict
from yarl import URL

from proxy.config import UpstreamConfig
from proxy.core.credentials import PROXY_KEY_HEADER
from proxy.core.fingerprint import HASH_ERRORS
from proxy.errors import ProxyError, UpstreamAnswerTooLarge, UpstreamTimeout, UpstreamUnreachable
from proxy.upstream.upstream_pool import SAFE_METHODS, ReuseCheckingConnector, UpstreamResponse, never_written

log = logging.getLogger("proxy.upstream")

# RFC 9110 §7.6.1 hop-by-hop headers, plus headers the HTTP client recomputes for the new connection.
HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-connection", "proxy-authenticate", "proxy-authorization",
    "te", "trailer", "trailers", "transfer-encoding", "upgrade",
})
_RECOMPUTED_ON_REQUEST = frozenset({"host", "content-length", "content-encoding", "accept-encoding"})
_RECOMPUTED_ON_RESPONSE = frozenset({"content-length", "content-encoding"})
# A header only the proxy reads, so it never leaves in any configuration.
_DROPPED_ON_REQUEST = _RECOMPUTED_ON_REQUEST | {PROXY_KEY_HEADER} | HOP_BY_HOP
_DROPPED_ON_DECODED_RESPONSE = _RECOMPUTED_ON_RESPONSE | HOP_BY_HOP
# What separates the tokens of a header value (a scheme word and its credentials, list items, quoted strings).
_TOKEN_SEPARATORS = re.compile(rb"[\s,;\"']+")
# A run of base64 (standard or URL-safe alphabet) that may decode to credentials, as `Basic` carries them.
_BASE64_RUN = re.compile(rb"[A-Za-z0-9+/_-]{2,}={0,2}")
_URL_SAFE = bytes.maketrans(b"-_", b"+/")
# Only encodings aiohttp decodes without optional packages, so every body the proxy sees is readable.
ACCEPT_ENCODING = "gzip, deflate"
_NO_USER_AGENT = ("User-Agent",)
_MAX_URLS = 256
# Bytes of body from which it goes out in a write of its own after the headers' (see SentAlone).
SENT_ALONE_FROM = 64 * 1024


def _without(headers: Mapping[str, str], dropped: frozenset[str]) -> CIMultiDict[str]:
    """`headers` less those named in `dropped` (hop-by-hop ones included) and those a Connection header names."""
    # A case-insensitive copy, then each name to drop looked up in it: a copy and a dozen lookups cost a third of
    # lower-casing and testing every name (every request pays this twice, once for each way).
    kept = CIMultiDict(headers)
    for value in kept.getall("connection", ()):
        dropped = dropped | {token.strip() for token in value.split(",")}
    for name in dropped:
        if name in kept:
            kept.popall(name)
    return kept


def _carries_one_of(header: str, keys: Collection[bytes]) -> bool:
    """True when a header ("name value", any name) holds one of `keys` (lower-cased) in any form: as its value or
    one token of it, whatever the scheme word, whitespace or case; inside a longer value; percent-encoded; or
    base64-encoded, as `Basic` credentials carry a user and a password."""
    raw = header.encode("utf-8", HASH_ERRORS)
    text = raw.lower()
    # Whole tokens are compared in constant time, every one against every key, so the time taken says nothing
    # about which key nearly matched. A key inside something longer can only be searched for.
    equal = [hmac.compare_digest(token, key) for token in _TOKEN_SEPARATORS.split(text) if token for key in keys]
    views = [text, *([unquote_to_bytes(raw).lower()] if b"%" in raw else []),
             *_base64_decodings(raw, 4 * min(len(key) for key in keys) // 3)]
    return any(equal) or any([key in view for view in views for key in keys])


def _base64_decodings(raw: bytes, shortest: int) -> list[bytes]:
    """Every run of `raw` at least `shortest` long (as long as a key's encoding) that decodes as base64, decoded
    and lower-cased."""
    decoded = []
    for run in _BASE64_RUN.findall(raw):
        body = run.rstrip(b"=").translate(_URL_SAFE)
        if len(body) < shortest or len(body) % 4 == 1:  # too short to hold a key, or not base64 at all
            continue
        try:
            decoded.append(base64.b64decode(body + b"=" * (-len(body) % 4), validate=True).lower())
        except binascii.Error:
            continue
    return decoded


def _withholding(headers: CIMultiDict[str], withheld_keys: Collection[str]) -> CIMultiDict[str]:
    """The headers without any that carries a withheld key: the whole header goes, as no part of it is safe."""
    if not withheld_keys:
        return headers
    keys = [key.encode("utf-8", HASH_ERRORS).lower() for key in withheld_keys]
    # All headers looked at as one first (a quarter of the time): almost no request carries a key anywhere else
    # than in x-proxy-api-key, which is gone already.
    if not _carries_one_of("\n".join(f"{name} {value}" for name, value in headers.items()), keys):
        return headers
    kept: CIMultiDict[str] = CIMultiDict()
    for name, value in headers.items():
        if not _carries_one_of(f"{name} {value}", keys):
            kept.add(name, value)
    return kept


def request_headers(client_headers: Mapping[str, str], api_key: str | None,
                    withheld_keys: Collection[str] = ()) -> CIMultiDict[str]:
    """Headers to send upstream: end-to-end headers kept; x-proxy-api-key and every header carrying one of the
    proxy's own keys (`withheld_keys`) dropped; the configured key replacing the client's."""
    headers = _withholding(_without(client_headers, _DROPPED_ON_REQUEST), withheld_keys)
    headers["Accept-Encoding"] = ACCEPT_ENCODING
    if api_key:
        headers.popall("x-api-key", None)
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


def response_headers(upstream_headers: Mapping[str, str], *, decoded: bool) -> CIMultiDict[str]:
    """Headers to relay to the client; length and encoding go when the body was decompressed."""
    return _without(upstream_headers, _DROPPED_ON_DECODED_RESPONSE if decoded else HOP_BY_HOP)


class SentAlone(BytesPayload):
    """A large request body written on its own once the headers are out. aiohttp holds a request's headers back to
    send them with the body's first bytes in one write, which on Python before 3.12.9 (and 3.13.0-1) it makes by
    joining the two into one new buffer: a copy of the whole body, for a 475 KB history about as dear as the
    proxy's reading of it. A second write costs one more system call and segment; the copy costs memory bandwidth
    in proportion to the body."""

    async def write_with_length(self, writer: AbstractStreamWriter, content_length: int | None) -> None:
        send_headers = getattr(writer, "send_headers", None)  # before aiohttp 3.12 headers were never held back
        if send_headers is not None:
            send_headers()
        await super().write_with_length(writer, content_length)


def sent_body(body: bytes) -> bytes | SentAlone | None:
    """What to hand aiohttp as a request's body: None for none, a large one to be written on its own."""
    if not body:
        return None
    return SentAlone(body) if len(body) >= SENT_ALONE_FROM else body


def was_decoded(response: aiohttp.ClientResponse) -> bool:
    encoding = response.headers.get("content-encoding", "identity").strip().lower()
    return encoding not in ("", "identity")


@dataclass(frozen=True)
class UpstreamRequest:
    method: str
    path: str          # below the base URL, e.g. "/chat/completions"
    query: str         # raw query string, without "?"
    headers: Mapping[str, str]
    body: bytes


class Upstream:
    """Sends requests to one base URL over a shared session; maps failures to proxy errors."""

    def __init__(self, session: aiohttp.ClientSession, config: UpstreamConfig,
                 on_error: Callable[[str], None] | None = None,
                 on_latency: Callable[[float], None] | None = None) -> None:
        self._session = session
        self._on_error = on_error
        self._on_latency = on_latency
        self.config = config
        self._api_key = config.api_key.get_secret_value() if config.api_key else None
        self._withheld = config.withheld_keys  # read out of their secrets once, not on every request
        self._urls: dict[str, URL] = {}
        # `connect` bounds getting a connection: queueing for a free one in a saturated pool, then connecting.
        self._timeout = aiohttp.ClientTimeout(
            total=None, connect=config.pool_timeout + config.connect_timeout, sock_connect=config.connect_timeout,
            sock_read=config.idle_timeout)

    def url_for(self, path: str, query: str = "") -> URL:
        if not query and (url := self._urls.get(path)) is not None:
            return url
        url = URL(self.config.base_url + path + (f"?{query}" if query else ""), encoded=True)
        if not query:
            # The API's few paths, built once (yarl parses each); a client's own paths are many: the cache is
            # bounded, and starts over when full.
            if len(self._urls) >= _MAX_URLS:
                self._urls.clear()
            self._urls[path] = url
        return url

    def translate(self, error: BaseException, stage: str) -> ProxyError:
        """The one place where a transport failure becomes a proxy error (and is counted)."""
        timed_out = isinstance(error, TimeoutError | aiohttp.ServerTimeoutError)
        if self._on_error is not None:
            self._on_error("timeout" if timed_out else "unreachable")
        if timed_out:
            return UpstreamTimeout(f"the upstream went silent {stage} (idle timeout {self.config.idle_timeout:g}s)")
        log.warning("upstream %s failed %s: %s", self.config.base_url, stage, type(error).__name__)
        return UpstreamUnreachable(f"the upstream connection failed {stage} ({type(error).__name__})")

    def open(self, request: UpstreamRequest) -> Opened:
        """`async with` it: the upstream response with headers read; the connection is closed if the caller leaves
        early."""
        return Opened(self, request)

    async def response(self, request: UpstreamRequest) -> aiohttp.ClientResponse:
        """The upstream response with headers read, its failures proxy errors; the caller closes it (see open).

        One coroutine, the session's call awaited in it directly: the request's task passes through every frame of
        its await chain each time it resumes, and every request waits here."""
        started = time.monotonic()
        headers = request_headers(request.headers, self._api_key, self._withheld)
        # aiohttp would add its own User-Agent to a request that has none; asked not to on every request, it copies
        # the headers to find out (a client's own User-Agent always goes as it came).
        skipped = None if "User-Agent" in headers else _NO_USER_AGENT
        try:
            for attempt in range(2):
                try:
                    response = await self._session.request(
                        request.method, self.url_for(request.path, request.query), headers=headers,
                        data=sent_body(request.body), timeout=self._timeout,
                        allow_redirects=False, compress=False, skip_auto_headers=skipped)
                    break
                except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as error:
                    if attempt or not self._may_retry(request, error):
                        raise
            else:
                raise AssertionError("unreachable")
        except aiohttp.ConnectionTimeoutError as error:
            raise self._pool_timeout() from error
        except (TimeoutError, aiohttp.ClientError) as error:
            raise self.translate(error, "before answering") from error
        if self._on_latency is not None:
            self._on_latency(time.monotonic() - started)
        return response

    def _may_retry(self, request: UpstreamRequest, error: BaseException) -> bool:
        """The connection failed before an answer. Once any byte of a POST may have reached the upstream, a second
        try could run a paid completion twice: only a safe method, or a request provably never written, goes again
        (dead pooled connections are discarded unused: see proxy.upstream_pool)."""
        if isinstance(error, aiohttp.ClientConnectorError) or \
                not (request.method.upper() in SAFE_METHODS or never_written(error)):
            return False
        log.info("upstream connection failed before %s %s was answered; retrying on a new one", request.method,
                 request.path)
        return True

    def _pool_timeout(self) -> UpstreamTimeout:
        if self._on_error is not None:
            self._on_error("timeout")
        return UpstreamTimeout(
            f"no upstream connection within {self.config.pool_timeout + self.config.connect_timeout:g}s "
            f"(all {self.config.max_connections} in use, or connecting is slow)")

    async def read_body(self, response: aiohttp.ClientResponse, limit: int | None = None) -> bytes:
        """The whole body of a response, with idle timeouts and resets as proxy errors; with `limit`, at most that
        many bytes (decompressed) are ever held, and a longer body is UpstreamAnswerTooLarge, its connection closed."""
        try:
            if limit is None:
                return await response.read()
            return await _bounded(response, limit)
        except (TimeoutError, aiohttp.ClientError) as error:
            raise self.translate(error, "while sending its answer") from error

    async def chunks(self, response: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
        """The body as it arrives, with idle timeouts and resets as proxy errors."""
        try:
            async for chunk in response.content.iter_any():
                yield chunk
        except (TimeoutError, aiohttp.ClientError) as error:
            raise self.translate(error, "while sending its answer") from error


class Opened:
    """Upstream.open's context. A class, not a generator-based context manager: every request enters one, and the
    generator's machinery cost about as much as the rest of the relay's own steps."""

    __slots__ = ("_request", "_response", "_upstream")

    def __init__(self, upstream: Upstream, request: UpstreamRequest) -> None:
        self._upstream = upstream
        self._request = request
        self._response: aiohttp.ClientResponse | None = None

    async def __aenter__(self) -> aiohttp.ClientResponse:
        self._response = await self._upstream.response(self._request)
        return self._response

    async def __aexit__(self, *exc_info: object) -> None:
        if self._response is not None and not self._response.closed:
            self._response.close()


async def _bounded(response: aiohttp.ClientResponse, limit: int) -> bytes:
    # aiohttp pauses reading the socket while its own buffer is full, so what is held is the limit plus that buffer.
    stated = response.content_length
    if stated is not None and stated > limit:
        raise UpstreamAnswerTooLarge(f"the upstream's answer states {stated} bytes, over the {limit} this read takes")
    pieces: list[bytes] = []
    size = 0
    async for piece in response.content.iter_any():
        size += len(piece)
        if size > limit:
            response.close()
            raise UpstreamAnswerTooLarge(f"the upstream's answer ran past the {limit} bytes this read takes")
        pieces.append(piece)
    return b"".join(pieces)


def create_session(config: UpstreamConfig) -> aiohttp.ClientSession:
    connector = ReuseCheckingConnector(limit=config.max_connections, limit_per_host=config.max_connections,
                                       ttl_dns_cache=300, keepalive_timeout=config.keepalive_timeout)
    return aiohttp.ClientSession(connector=connector, auto_decompress=True, trust_env=False,
                                 cookie_jar=aiohttp.DummyCookieJar(), response_class=UpstreamResponse)
