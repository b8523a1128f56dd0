"""One try at the upstream: send, then hold the answer back just long enough to tell whether it overflowed."""

from __future__ import annotations

import json
from collections.abc import Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import aiohttp
from multidict import CIMultiDict

from proxy.overflow import detect_context_overflow
from proxy.streaming import SseDecoder, is_error_event, is_preamble_event, usage_of
from proxy.upstream import Upstream, UpstreamRequest, response_headers

# An error stream is short; past this much after an error event the rest is not worth holding.
MAX_ERROR_TAIL = 1024 * 1024
# A first event larger than this is no error report: the stream is committed without waiting for its end.
MAX_HEAD = 64 * 1024


@dataclass
class Attempt:
    """What the upstream answered. Buffered answers carry `body`; live streams carry `response` and `head`."""

    status: int
    headers: CIMultiDict[str]
    body: bytes | None = None
    response: aiohttp.ClientResponse | None = None
    head: bytes = b""
    overflow: bool = False
    empty_stream: bool = False

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300 and not self.overflow

    def usage(self) -> dict[str, Any] | None:
        """Usage of a buffered JSON answer (streams report theirs through a UsageTap)."""
        if self.body is None or not self.ok:
            return None
        try:
            return usage_of(json.loads(self.body))
        except (ValueError, RecursionError):
            return None


async def send(upstream: Upstream, stack: AsyncExitStack, *, query: str, headers: Mapping[str, str],
               body: bytes) -> Attempt:
    """POST a chat completion; errors and whole-body answers are read, event streams probed."""
    request = UpstreamRequest("POST", "/chat/completions", query, headers, body)
    response = await stack.enter_async_context(upstream.open(request))
    if 200 <= response.status < 300 and response.content_type == "text/event-stream":
        return await _probe_stream(upstream, response)
    payload = await upstream.read_body(response)
    return Attempt(response.status, response_headers(response.headers, decoded=True), body=payload,
                   overflow=detect_context_overflow(response.status, payload))


async def _probe_stream(upstream: Upstream, response: aiohttp.ClientResponse) -> Attempt:
    """Hold the stream back only until its first event: an error there is judged (a buffered answer); anything
    else — content, a role chunk, a reasoning delta, a keep-alive comment — commits it as a live stream.

    Only the Responses API's lifecycle preamble (`response.created`, ...) does not count as a first event."""
    headers = response_headers(response.headers, decoded=True)
    decoder = SseDecoder()
    head = b""
    async for chunk in upstream.chunks(response):
        head += chunk
        events = [event for event in decoder.feed(chunk) if not is_preamble_event(event)]
        if events and is_error_event(events[0]):
            whole = head + await _read_rest(upstream, response)
            return Attempt(200, headers, body=whole, overflow=detect_context_overflow(200, whole))
        if events or len(head) > MAX_HEAD:
            return Attempt(response.status, headers, response=response, head=head)
    last = decoder.flush()
    return Attempt(response.status, headers, body=head, overflow=detect_context_overflow(200, head),
                   empty_stream=not last)


async def _read_rest(upstream: Upstream, response: aiohttp.ClientResponse) -> bytes:
    rest = b""
    async for chunk in upstream.chunks(response):
        rest += chunk
        if len(rest) > MAX_ERROR_TAIL:
            break
    return rest
