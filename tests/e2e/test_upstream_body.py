"""The body a request carries upstream: arrives as the client sent it, whatever its size, and a large one is written
without a copy of it joined to the headers."""

from __future__ import annotations

import asyncio
import hashlib
import tracemalloc
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from proxy.config import UpstreamConfig
from proxy.upstream.upstream import SENT_ALONE_FROM, SentAlone, Upstream, UpstreamRequest, create_session, sent_body

READ_SIZE = 64 * 1024


@dataclass
class Sink:
    """An upstream on a real socket that reads each request's body a slice at a time (so it holds little of it at
    once) and answers with what it saw: the head and the body's SHA-256."""

    port: int = 0
    heads: list[bytes] = field(default_factory=list)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                break
            self.heads.append(head)
            length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            digest = hashlib.sha256()
            while length:
                chunk = await reader.read(min(length, READ_SIZE))
                digest.update(chunk)
                length -= len(chunk)
            answer = digest.hexdigest().encode()
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s"
                         % (len(answer), answer))
            await writer.drain()
        writer.close()


@pytest.fixture
async def sink() -> AsyncIterator[Sink]:
    found = Sink()
    server = await asyncio.start_server(found.serve, "127.0.0.1", 0)
    found.port = server.sockets[0].getsockname()[1]
    async with server:
        yield found


@pytest.fixture
async def upstream(sink: Sink) -> AsyncIterator[Upstream]:
    config = UpstreamConfig(base_url=f"http://127.0.0.1:{sink.port}/v1")
    session = create_session(config)
    try:
        yield Upstream(session, config)
    finally:
        await session.close()


def post(body: bytes) -> UpstreamRequest:
    return UpstreamRequest("POST", "/chat/completions", "", {"Content-Type": "application/json"}, body)


async def sent(upstream: Upstream, request: UpstreamRequest) -> str:
    response = await upstream.response(request)
    try:
        assert response.status == 200
        return (await response.read()).decode()
    finally:
        response.release()


@pytest.mark.parametrize("size", [1, 1024, SENT_ALONE_FROM - 1, SENT_ALONE_FROM, 3 * 1024 * 1024 + 7])
async def test_a_body_of_any_size_arrives_as_sent(size: int, sink: Sink, upstream: Upstream) -> None:
    body = bytes(index % 251 for index in range(size))
    assert await sent(upstream, post(body)) == hashlib.sha256(body).hexdigest()
    head = sink.heads[-1].lower()
    assert b"content-length: %d\r\n" % size in head and b"content-type: application/json\r\n" in head
    assert b"transfer-encoding" not in head


async def test_requests_one_after_another_on_one_connection_each_arrive_whole(sink: Sink,
                                                                             upstream: Upstream) -> None:
    bodies = [b"a" * 10, b"b" * (SENT_ALONE_FROM + 1), b"c" * 100, b"d" * (2 * SENT_ALONE_FROM)]
    for body in bodies:
        assert await sent(upstream, post(body)) == hashlib.sha256(body).hexdigest()
    assert len(sink.heads) == len(bodies)


async def test_concurrent_large_bodies_each_arrive_whole(sink: Sink, upstream: Upstream) -> None:
    bodies = [bytes([index]) * (SENT_ALONE_FROM * (index + 1)) for index in range(6)]
    answers = await asyncio.gather(*(sent(upstream, post(body)) for body in bodies))
    assert answers == [hashlib.sha256(body).hexdigest() for body in bodies]


async def test_a_request_without_a_body_sends_none(sink: Sink, upstream: Upstream) -> None:
    request = UpstreamRequest("GET", "/models", "", {}, b"")
    assert await sent(upstream, request) == hashlib.sha256(b"").hexdigest()
    assert b"content-length" not in sink.heads[-1].lower() or b"content-length: 0\r\n" in sink.heads[-1].lower()


async def test_a_large_body_is_not_copied_to_go_with_its_headers(sink: Sink, upstream: Upstream) -> None:
    """Joined to its headers, a body is copied whole into a new buffer (aiohttp's write on this Python): a 4 MB
    history would cost 4 MB more memory, and the time to fill it, on every request."""
    body = bytes(range(256)) * (4 * 1024 * 1024 // 256)
    await sent(upstream, post(b"{}"))  # the connection and the client's own buffers made first
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        assert await sent(upstream, post(body)) == hashlib.sha256(body).hexdigest()
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    assert peak < len(body) // 4


@pytest.mark.parametrize(("size", "kind"), [(0, type(None)), (1, bytes), (SENT_ALONE_FROM - 1, bytes),
                                            (SENT_ALONE_FROM, SentAlone), (10 * SENT_ALONE_FROM, SentAlone)])
def test_only_a_large_body_is_written_on_its_own(size: int, kind: type) -> None:
    assert type(sent_body(b"x" * size)) is kind
