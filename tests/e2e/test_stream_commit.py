"""Streams are never held back: the first event that is not an error commits the stream, and decoding is linear."""

from __future__ import annotations

import asyncio
import gc
import time
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from proxy.upstream.streaming import SseDecoder
from tests.conftest import ProxyFactory
from tests.fakes.openai_upstream import FakeUpstream, chunk, sse

MESSAGES = [{"role": "user", "content": "think first"}]
FIRST_EVENTS = {
    "reasoning delta": sse({**chunk({}, {"reasoning_content": "Let me think"})}),
    "keep-alive comment": b": keep-alive\n\n",
    "role chunk": sse(chunk({}, {"role": "assistant", "content": ""})),
}


def held_stream(first: bytes, gate: asyncio.Event) -> Any:
    """A stream that sends one event, then waits (as a model thinking for seconds would) before any content."""

    async def hook(request: web.Request, body: dict[str, Any], state: FakeUpstream) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(first)
        await gate.wait()
        await response.write(sse(chunk(body, {"content": "done"}, "stop")) + b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    return hook


@pytest.mark.parametrize("mode", ["auto", "off"])
@pytest.mark.parametrize("first", list(FIRST_EVENTS))
async def test_the_first_non_error_event_reaches_the_client_at_once(first: str, mode: str, fake: FakeUpstream,
                                                                    make_proxy: ProxyFactory) -> None:
    gate = asyncio.Event()
    fake.chat_hook = held_stream(FIRST_EVENTS[first], gate)
    proxy = await make_proxy()
    async with aiohttp.ClientSession() as session:
        try:
            # The fake sends nothing more until the client has the first event: a proxy that held it back for what
            # follows would hold it (and the answer's head) for ever. Not a time bound, which a busy machine misses.
            async with asyncio.timeout(15):
                response = await session.post(f"{proxy.url}/v1/chat/completions", headers={"x-compaction-mode": mode},
                                              json={"model": "m", "messages": MESSAGES, "stream": True})
                assert response.status == 200
                head = await response.content.readany()
        except TimeoutError:
            pytest.fail("the first event was held back until something followed it")
        finally:
            gate.set()  # the rest of the stream; a held-back one must not leave the fake waiting for ever
        async with response:
            rest = await response.read()
    assert head.startswith(FIRST_EVENTS[first][:8])
    assert b"done" in head + rest


def test_decoding_many_events_in_one_chunk_is_linear() -> None:
    one = sse(chunk({}, {"content": "x"}))
    small, large = one * 2_000, one * 40_000
    timings = []
    for body in (small, large):
        best = float("inf")
        for _ in range(3):  # the best of three: the decoder's own cost, not a neighbour's burst
            decoder = SseDecoder()
            # The collector's full passes cost what the whole process holds (in the suite: every earlier test's
            # objects), not what the decoder does: it ran a 40,000-event decode 100x slower than 2,000 there.
            gc.disable()
            try:
                started = time.process_time()
                events = decoder.feed(body)
                best = min(best, time.process_time() - started)
            finally:
                gc.enable()
            assert b"".join(e.raw for e in events) == body
        timings.append(best)
    # 20x the events costs about 20x the time, not 400x: allow generous noise.
    assert timings[1] < max(timings[0], 1e-3) * 80


def test_an_event_that_never_ends_is_bounded() -> None:
    decoder = SseDecoder(max_pending=1024)
    events = []
    for _ in range(100):
        events += decoder.feed(b"data: " + b"y" * 100)
    assert len(decoder.pending) <= 1024 + 106
    assert sum(len(e.raw) for e in events) + len(decoder.pending) == 100 * 106


@pytest.mark.parametrize("split", [1, 2, 3, 5, 7])
def test_terminators_split_across_chunks_are_found(split: int) -> None:
    body = b"data: a\r\n\r\ndata: b\n\ndata: c\r\rdata: d\n\r\n"
    decoder = SseDecoder()
    events = []
    for index in range(0, len(body), split):
        events += decoder.feed(body[index:index + split])
    assert [e.data for e in events] == ["a", "b", "c", "d"]
