"""What goes back to the client: a status, headers and either a whole body or the chunks of a live stream.

An answer delivers itself: the pipeline (or the pass-through route) builds one, and the relay sends it. Work that
must happen before the last byte leaves (learning from usage, claiming a background summary) is part of the chunks.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Protocol

import aiohttp
from multidict import CIMultiDict

from proxy.core.usage import Usage
from proxy.upstream.attempt import Attempt
from proxy.upstream.streaming import SseDecoder, SseEvent
from proxy.upstream.upstream import Upstream, response_headers, was_decoded

log = logging.getLogger("proxy.answer")

OnDone = Callable[[Usage | None], None]


class StreamTap(Protocol):
    """Watches a live answer stream for usage and finish reasons, in one client API's shape (a dialect's); may hide
    events the client did not ask for. Total: it runs after the status went out, when a raise cuts the stream."""

    @property
    def usage(self) -> Usage | None: ...

    @property
    def finish_reasons(self) -> list[str]: ...

    def feed(self, chunk: bytes) -> bytes: ...

    def finish(self) -> bytes: ...


class RewritingTap:
    """A tap over another that rewrites the events it lets through, one whole event at a time (`_event`); the
    usage and stop reasons are the inner tap's, read from the bytes as they came."""

    def __init__(self, inner: StreamTap) -> None:
        self._inner = inner
        self._decoder = SseDecoder()

    @property
    def usage(self) -> Usage | None:
        return self._inner.usage

    @property
    def finish_reasons(self) -> list[str]:
        return self._inner.finish_reasons

    def feed(self, chunk: bytes) -> bytes:
        return self._rewrite(self._decoder.feed(self._inner.feed(chunk)))

    def finish(self) -> bytes:
        return self._rewrite([*self._decoder.feed(self._inner.finish()), *self._decoder.flush()])

    def _rewrite(self, events: list[SseEvent]) -> bytes:
        return b"".join(self._event(event) for event in events)

    def _event(self, event: SseEvent) -> bytes:
        return event.raw


@dataclass
class Answer:
    status: int
    headers: CIMultiDict[str]
    body: bytes | None = None
    chunks: AsyncIterator[bytes] | None = None  # a live stream; the headers carry no Content-Length then
    reason: str | None = None

    @classmethod
    def relayed(cls, upstream: Upstream, response: aiohttp.ClientResponse) -> Answer:
        """An upstream response passed through as it is: bytes unchanged, length kept unless it was decoded."""
        headers = response_headers(response.headers, decoded=was_decoded(response))
        return cls(response.status, headers, chunks=upstream.chunks(response), reason=response.reason)


def attempt_answer(upstream: Upstream, attempt: Attempt, extra_headers: dict[str, str]) -> Answer:
    """An attempt relayed as it came (nothing watched, nothing rewritten), with the proxy's headers."""
    headers = attempt.headers.copy()
    headers.update(extra_headers)
    if attempt.response is None:
        return Answer(attempt.status, headers, body=attempt.body)
    return Answer(attempt.status, headers, chunks=_held_then_rest(upstream, attempt), reason=attempt.response.reason)


async def _held_then_rest(upstream: Upstream, attempt: Attempt) -> AsyncIterator[bytes]:
    assert attempt.response is not None
    if attempt.head:
        yield attempt.head
    async for chunk in upstream.chunks(attempt.response):
        yield chunk


def journey_answer(upstream: Upstream, attempt: Attempt, extra_headers: dict[str, str], *, tap: StreamTap,
                   on_done: OnDone | None, reshape: Callable[[bytes], bytes] | None = None) -> Answer:
    """The answer to a request that went through the journey, with the compaction headers; a stream is watched (and
    may be rewritten) by `tap`, a whole body rewritten by `reshape`, and `on_done` sees the usage before the end."""
    headers = attempt.headers.copy()
    headers.update(extra_headers)
    if attempt.response is None:
        _learn_from(on_done, attempt.usage())
        body = attempt.body
        return Answer(attempt.status, headers, body=reshape(body) if reshape is not None and body else body)
    return Answer(attempt.status, headers, chunks=_tapped(upstream, attempt, tap, on_done),
                  reason=attempt.response.reason)


async def _tapped(upstream: Upstream, attempt: Attempt, tap: StreamTap, on_done: OnDone | None) -> AsyncIterator[bytes]:
    """The held-back head, then the rest as it arrives, watched for usage (and the usage chunk hidden if asked)."""
    assert attempt.response is not None
    if head := tap.feed(attempt.head):
        yield head
    async for chunk in upstream.chunks(attempt.response):
        if out := tap.feed(chunk):
            yield out
    tail = tap.finish()
    _learn_from(on_done, tap.usage)
    if tail:
        yield tail


def _learn_from(on_done: OnDone | None, usage: Usage | None) -> None:
    """Run the end-of-answer hook; what it raises is logged, never the answer's failure (the answer is the client's,
    the learning only the proxy's)."""
    if on_done is None:
        return
    try:
        on_done(usage)
    except Exception:  # a bug in learning must not cut a finished stream or 500 a good answer
        log.error("learning from an answer failed; the answer is sent as it is", exc_info=True)
