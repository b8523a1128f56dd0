"""One try at the upstream: send, then hold the answer back just long enough to tell whether it overflowed."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
import orjson
from multidict import CIMultiDict

from proxy.core.usage import Usage
from proxy.upstream.overflow import answer_may_overflow, detect_context_overflow, overflow_finish
from proxy.upstream.streaming import SseDecoder, is_error_event, is_preamble_event
from proxy.upstream.upstream import Upstream, UpstreamRequest, response_headers

# An error stream is short; past this much after an error event the rest is not worth holding.
MAX_ERROR_TAIL = 1024 * 1024
# A first event larger than this is no error report: the stream is committed without waiting for its end.
MAX_HEAD = 64 * 1024
# Whitespace a JSON answer may open with before its "{" (one pretty-printing server pads with a newline).
MAX_LEADING_SPACE = 64


class AnswerReader(Protocol):
    """Reads a successful, buffered JSON answer of one client API (a dialect): this layer knows none of them."""

    def overflow(self, payload: Any) -> bool:
        """Whether the answer is an overflow. A relayed answer is decoded for this only when its bytes may hold one
        (overflow.answer_may_overflow, exact for overflow.overflow_in_answer): a reader that finds an overflow
        anywhere else must widen that test too."""
        ...

    def usage(self, payload: Any) -> Usage | None: ...


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
    answer_usage: Usage | None = None  # of a buffered JSON answer, read with it

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300 and not self.overflow

    def usage(self) -> Usage | None:
        """Usage of a buffered JSON answer (streams report theirs through a UsageTap)."""
        return self.answer_usage if self.body is not None and self.ok else None


class OpenResponses:
    """The upstream responses a request's answer may still read from, closed when it is done with them (a no-op for
    one read whole and back in the pool). An AsyncExitStack did this; every request holds one, and its machinery
    (a wrapper per callback, an exit that unwinds exceptions through a loop) cost more than the closes."""

    __slots__ = ("_held",)

    def __init__(self) -> None:
        self._held: list[aiohttp.ClientResponse] = []

    def hold(self, response: aiohttp.ClientResponse) -> None:
        self._held.append(response)

    def close(self) -> None:
        """Close every response held, the last first; each once, however often this is called."""
        while self._held:
            self._held.pop().close()

    async def __aenter__(self) -> OpenResponses:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.close()


async def send(upstream: Upstream, stack: OpenResponses, *, path: str, reader: AnswerReader, query: str,
               headers: Mapping[str, str], body: bytes, usage: bool = True) -> Attempt:
    """POST a request to `path`; errors and whole-body answers are read (by `reader`), event streams probed.
    Without `usage` (an answer relayed as it came), a whole answer is only judged for an overflow."""
    # The response itself awaited (not a context entered): one frame fewer on the task's chain while it waits.
    response = await upstream.response(UpstreamRequest("POST", path, query, headers, body))
    stack.hold(response)
    if 200 <= response.status < 300 and response.content_type == "text/event-stream":
        return await _probe_stream(upstream, response)
    payload = await upstream.read_body(response)
    overflow, read = _judged(response.status, payload, reader, usage=usage)
    return Attempt(response.status, response_headers(response.headers, decoded=True), body=payload,
                   overflow=overflow, answer_usage=read)


def _judged(status: int, body: bytes, reader: AnswerReader, *, usage: bool = True) -> tuple[bool, Usage | None]:
    """(overflow, usage) of a whole answer, the JSON of a successful one decoded once for both (without `usage`,
    not at all when its bytes cannot hold an overflow)."""
    if 200 <= status < 300 and body[:MAX_LEADING_SPACE].lstrip()[:1] == b"{":
        if not usage and not answer_may_overflow(body):
            return False, None
        try:
            payload = orjson.loads(body)
        except orjson.JSONDecodeError:
            payload = None
        if isinstance(payload, dict):
            overflow = reader.overflow(payload)
            return overflow, None if overflow or not usage else reader.usage(payload)
    overflow = detect_context_overflow(status, body)
    return overflow, None


async def _probe_stream(upstream: Upstream, response: aiohttp.ClientResponse) -> Attempt:
    """Hold the stream back only until its first event: an error there is judged (a buffered answer); anything
    else — content, a role chunk, a reasoning delta, a keep-alive comment — commits it as a live stream.

    Only a lifecycle preamble (`response.created`, `message_start`, ...) does not count as a first event; a first
    event that ends the answer for lack of room (Anthropic's `model_context_window_exceeded`) is judged too."""
    headers = response_headers(response.headers, decoded=True)
    decoder = SseDecoder()
    head = b""
    async for chunk in upstream.chunks(response):
        head += chunk
        events = [event for event in decoder.feed(chunk) if not is_preamble_event(event)]
        if events and (is_error_event(events[0]) or overflow_finish(events[0].json())):
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
