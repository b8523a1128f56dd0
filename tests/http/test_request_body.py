"""Compressed request bodies: bounded by their inflated size, never inflated once refused, the loop kept free."""

from __future__ import annotations

import asyncio
import functools
import gzip
import itertools
import json
import struct
import time
import tracemalloc
import zlib
from typing import Any

import aiohttp
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.app import RunningServer
from proxy.errors import BadRequest
from proxy.http.request_body import WHOLE_PIECE, _Pieces, inflater_for
from tests.conftest import ProxyFactory
from tests.fakes.openai_upstream import FakeUpstream

MIB = 1024 * 1024
LIMIT = 16 * MIB
BOMBS = 3
# Seconds /healthz may take while the bombs land. Measured 2-6 ms on an idle machine, and up to 121 ms while other
# processes held both cores (the probes, the bombs and the proxy share one loop here, with tracemalloc on); a bomb
# inflated on the loop holds it for seconds (16 MiB each, three at once).
HEALTH_BUDGET = 0.3
CHAT_BODY = {"model": "fake-small", "messages": [{"role": "user", "content": "hello there"}]}


@functools.cache
def gzip_bomb(inflated_mib: int = 1024) -> bytes:
    """A single-member gzip of `inflated_mib` MiB of zeros (about 1 KB per MiB), built without holding it inflated.

    A full flush ends every block byte-aligned with no back-references, so one compressed MiB repeats verbatim.
    """
    block = bytes(MIB)
    compressor = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    one_mib = compressor.compress(block) + compressor.flush(zlib.Z_FULL_FLUSH)
    final = compressor.flush(zlib.Z_FINISH)
    crc = 0
    for _ in range(inflated_mib):
        crc = zlib.crc32(block, crc)
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"
    trailer = struct.pack("<II", crc, (inflated_mib * MIB) & 0xFFFFFFFF)
    return header + one_mib * inflated_mib + final + trailer


@functools.cache
def zstd_bomb(inflated_mib: int = 1024) -> bytes:
    """One zstd frame of `inflated_mib` MiB of zeros (a few hundred bytes per GiB at most), built a MiB at a time."""
    compressor = zstandard.ZstdCompressor(level=1).compressobj()
    block = bytes(MIB)
    return b"".join(compressor.compress(block) for _ in range(inflated_mib)) + compressor.flush()


def posted(fake: FakeUpstream) -> list[bytes]:
    """Bodies of the POSTs that reached the upstream (window discovery GETs aside)."""
    return [request.body for request in fake.requests if request.method == "POST"]


def allocated_mib() -> float:
    return tracemalloc.get_traced_memory()[0] / MIB


async def send_bomb(url: str, headers: dict[str, str], encoding: str = "gzip") -> int | str:
    """POST the bomb on its own connection; the status, or the name of the transport error the client saw."""
    bomb = gzip_bomb() if encoding == "gzip" else zstd_bomb()
    async with aiohttp.ClientSession() as session:
        try:
            async with session.post(url, data=bomb, headers={"Content-Encoding": encoding, **headers},
                                    timeout=aiohttp.ClientTimeout(total=30)) as response:
                body = await response.json()
                assert set(body["error"]) == {"message", "type", "param", "code"}
                return response.status
        except aiohttp.ClientError as error:
            return type(error).__name__


async def watch_health(url: str, stop: asyncio.Event, latencies: list[float]) -> None:
    async with aiohttp.ClientSession() as session:
        for _ in range(2000):  # bounded: at most ~2000 probes
            started = time.monotonic()
            async with session.get(f"{url}/healthz", timeout=aiohttp.ClientTimeout(total=30)) as response:
                assert response.status == 200
                await response.read()
            latencies.append(time.monotonic() - started)
            if stop.is_set():
                return
            await asyncio.sleep(0.01)


@pytest.mark.parametrize(("path", "encoding"), [("/v1/chat/completions", "gzip"), ("/v1/embeddings", "gzip"),
                                              ("/v1/responses", "zstd")])
@pytest.mark.parametrize("with_key", [True, False], ids=["with-key", "without-key"])
async def test_bombs_neither_block_the_loop_nor_inflate(path: str, encoding: str, with_key: bool, fake: FakeUpstream,
                                                        make_proxy: ProxyFactory) -> None:
    gzip_bomb() if encoding == "gzip" else zstd_bomb()  # built before the clock starts and allocations are traced
    proxy = await make_proxy({"server": {"api_keys": ["proxy-key"], "max_body_bytes": LIMIT}})
    headers = {"Authorization": "Bearer proxy-key"} if with_key else {}
    stop, latencies = asyncio.Event(), []
    tracemalloc.start()
    try:
        before = allocated_mib()
        watcher = asyncio.create_task(watch_health(proxy.url, stop, latencies))
        await asyncio.sleep(0.05)
        started = time.monotonic()
        outcomes = await asyncio.wait_for(
            asyncio.gather(*(send_bomb(f"{proxy.url}{path}", headers, encoding) for _ in range(BOMBS))), 60)
        took = time.monotonic() - started
        await asyncio.sleep(0.1)  # let anything left behind (a lingering drain) show in the probes
        stop.set()
        await asyncio.wait_for(watcher, 30)
        peak = tracemalloc.get_traced_memory()[1] / MIB
    finally:
        tracemalloc.stop()
    print(f"\n{path} {encoding} key={with_key}: bombs {outcomes} in {took:.2f}s, "
          f"/healthz max {max(latencies) * 1000:.0f} ms over {len(latencies)} probes, "
          f"allocated {before:.0f} -> peak {peak:.0f} MiB")
    assert outcomes == [413 if with_key else 401] * BOMBS
    assert max(latencies) < HEALTH_BUDGET
    # Each bomb holds at most the limit (and a bytearray's spare room), whatever it would inflate to.
    assert peak - before < BOMBS * 1.25 * LIMIT / MIB
    assert not posted(fake), "a refused body reached the upstream"


@pytest.mark.parametrize("encoding", ["gzip", "x-gzip", "deflate", "raw-deflate", "zstd", "identity"])
async def test_compressed_bodies_are_inflated_before_forwarding(encoding: str, fake: FakeUpstream,
                                                                make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy()
    raw = json.dumps(CHAT_BODY).encode()
    packed = {"gzip": gzip.compress, "x-gzip": gzip.compress, "deflate": zlib.compress,
              "raw-deflate": lambda data: zlib.compress(data, wbits=-zlib.MAX_WBITS),
              "zstd": zstandard.ZstdCompressor().compress, "identity": lambda data: data}[encoding](raw)
    header = "deflate" if encoding == "raw-deflate" else encoding
    async with aiohttp.ClientSession() as session:
        for path in ("/v1/chat/completions", "/v1/echo/body"):
            async with session.post(f"{proxy.url}{path}", data=packed, headers={
                    "Content-Encoding": header, "Content-Type": "application/json"}) as response:
                assert response.status == 200, await response.text()
    assert posted(fake) == [raw, raw]
    assert all("content-encoding" not in {name.lower() for name in request.headers} for request in fake.requests)


async def test_two_gzip_members_are_one_body(fake: FakeUpstream, make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy()
    raw = json.dumps(CHAT_BODY).encode()
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{proxy.url}/v1/echo/members", data=gzip.compress(raw[:10]) + gzip.compress(raw[10:]),
                                headers={"Content-Encoding": "gzip"}) as response:
            assert response.status == 200
    assert posted(fake) == [raw]


async def test_two_zstd_frames_are_one_body(fake: FakeUpstream, make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy()
    raw = json.dumps(CHAT_BODY).encode()
    frames = zstandard.ZstdCompressor().compress(raw[:10]) + zstandard.ZstdCompressor().compress(raw[10:])
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{proxy.url}/v1/echo/frames", data=frames,
                                headers={"Content-Encoding": "zstd"}) as response:
            assert response.status == 200
    assert posted(fake) == [raw]


ZSTD = zstandard.ZstdCompressor().compress(b'{"a": 1}')


@pytest.mark.parametrize(("encoding", "data", "status"), [
    ("br", b"\x0b\x02\x80hello\x03", 415),
    ("zstd, gzip", gzip.compress(ZSTD), 415),
    ("zstd", b"not zstd at all", 400),
    ("zstd", ZSTD[:-3], 400),                                 # cut short: the frame never ends
    ("zstd", ZSTD + b"trailing", 400),
    ("zstd", ZSTD * 65, 400),                                 # more frames than a body may have
    ("gzip, gzip", gzip.compress(gzip.compress(b"{}")), 415),
    ("gzip", b"not gzip at all", 400),
    ("gzip", gzip.compress(b'{"a": 1}')[:-6], 400),           # cut short: the stream never ends
    ("deflate", zlib.compress(b"{}") + b"trailing", 400),
])
async def test_undecodable_bodies_are_clear_4xx(encoding: str, data: bytes, status: int, fake: FakeUpstream,
                                                make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy()
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{proxy.url}/v1/echo/bad", data=data,
                                headers={"Content-Encoding": encoding}) as response:
            body: dict[str, Any] = await response.json()
            assert response.status == status, body
            assert set(body["error"]) == {"message", "type", "param", "code"}
    assert not posted(fake)


async def test_inflated_size_at_the_limit_passes_and_one_byte_more_is_413(fake: FakeUpstream,
                                                                         make_proxy: ProxyFactory) -> None:
    limit = 256 * 1024
    proxy = await make_proxy({"server": {"max_body_bytes": limit}})
    async with aiohttp.ClientSession() as session:
        for encoding, pack in (("gzip", gzip.compress), ("zstd", zstandard.ZstdCompressor().compress)):
            for size, status in ((limit, 200), (limit + 1, 413)):
                async with session.post(f"{proxy.url}/v1/echo/size", data=pack(b"x" * size),
                                        headers={"Content-Encoding": encoding}) as response:
                    assert response.status == status
                    await response.read()
    assert [len(body) for body in posted(fake)] == [limit, limit]


async def test_declared_length_over_the_limit_is_refused_before_reading(fake: FakeUpstream,
                                                                       make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy({"server": {"max_body_bytes": 1024}})
    host, port = proxy.host, proxy.port
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(b"POST /v1/echo/x HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n")
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 413")
        assert b"connection: close" in head.lower()
    finally:
        writer.close()
    assert not posted(fake)


async def test_an_empty_body_with_a_content_encoding_is_just_empty(fake: FakeUpstream,
                                                                   make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy()
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{proxy.url}/v1/echo/empty", data=b"",
                                headers={"Content-Encoding": "gzip"}) as response:
            assert response.status == 200
    assert posted(fake) == [b""]


async def test_a_refused_body_ends_its_connection_unread(make_proxy: ProxyFactory) -> None:
    """401 before the body is read: the answer says Connection: close, and the connection ends within a second
    although the client never finishes its upload (nothing waits for the rest, let alone inflates it)."""
    proxy = await make_proxy({"server": {"api_keys": ["proxy-key"]}})
    bomb = gzip_bomb()
    reader, writer = await asyncio.open_connection(proxy.host, proxy.port)
    try:
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Encoding: gzip\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(bomb) + bomb[:65536])
        await writer.drain()
        started = time.monotonic()
        answer = await asyncio.wait_for(reader.read(), 5)
        took = time.monotonic() - started
    finally:
        writer.close()
    assert answer.startswith(b"HTTP/1.1 401") and b"connection: close" in answer.lower()
    assert took < 2, took


def inflate(encoding: str, chunks: list[bytes]) -> bytes:
    """What read_body's loop does with an inflater, without the socket."""
    inflater = inflater_for(encoding)
    assert inflater is not None
    out = b""
    for chunk in chunks:
        inflater.feed(chunk)
        while (piece := inflater.step()) is not None:
            out += piece
    inflater.finish()
    return out


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=5000), st.lists(st.integers(min_value=0, max_value=6000), max_size=8))
def test_zstd_inflates_the_same_however_the_body_arrives(raw: bytes, cuts: list[int]) -> None:
    packed = zstandard.ZstdCompressor().compress(raw * 20)
    edges = [0, *sorted(min(cut, len(packed)) for cut in cuts), len(packed)]
    assert inflate("zstd", [packed[a:b] for a, b in itertools.pairwise(edges)]) == raw * 20


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_any_bytes_as_zstd_are_inflated_or_refused_as_a_bad_request(noise: bytes) -> None:
    try:
        inflate("zstd", [noise])
    except BadRequest as refused:
        assert refused.code == "invalid_body"


async def _raw_post(proxy: RunningServer, head: bytes, body: bytes, *, pause: float = 0.0) -> bytes:
    """The request written as given (head and body in one write, or the body `pause` seconds later); the status
    line of the answer."""
    reader, writer = await asyncio.open_connection(proxy.host, proxy.port)
    try:
        if pause:
            writer.write(head)
            await writer.drain()
            await asyncio.sleep(pause)
            writer.write(body)
        else:
            writer.write(head + body)
        await writer.drain()
        answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        return answer.partition(b"\r\n")[0]
    finally:
        writer.close()


def _chunked(body: bytes) -> bytes:
    return f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"


@pytest.mark.parametrize(("size", "status"), [(1024, b"200"), (1025, b"413")])
async def test_a_chunked_body_that_came_with_its_head_is_bounded_too(size: int, status: bytes, fake: FakeUpstream,
                                                                     make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy({"server": {"max_body_bytes": 1024}})
    head = b"POST /v1/echo/chunked HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    line = await _raw_post(proxy, head, _chunked(b"y" * size))
    assert line.split(b" ")[1] == status
    assert posted(fake) == ([b"y" * size] if status == b"200" else [])


@pytest.mark.parametrize("pause", [0.0, 0.3], ids=["with its head", "after its head"])
async def test_a_plain_body_is_forwarded_byte_for_byte_however_it_arrives(pause: float, fake: FakeUpstream,
                                                                          make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy()
    body = b'{"model": "m", "x": "' + bytes(range(35, 127)) * 10 + b'"}'
    head = (f"POST /v1/echo/plain HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n").encode()
    assert await _raw_post(proxy, head, body, pause=pause) == b"HTTP/1.1 200 OK"
    assert posted(fake) == [body]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=3 * WHOLE_PIECE), max_size=40))
def test_pieces_join_to_what_came_in_order(pieces: list[bytes]) -> None:
    body = _Pieces()
    for piece in pieces:
        body.add(piece)
    assert body.size == sum(map(len, pieces))
    joined = body.joined()
    assert type(joined) is bytes and joined == b"".join(pieces)


@pytest.mark.parametrize(("sizes", "parts"), [
    ([], 0),  # nothing came
    ([WHOLE_PIECE], 1),  # one piece: handed back as it came
    ([5, 7, 9], 1),  # small pieces: one buffer
    ([WHOLE_PIECE, WHOLE_PIECE * 3], 2),  # whole pieces kept as they came
    ([3, WHOLE_PIECE, 4, 5, WHOLE_PIECE, 6], 5),  # a run of small ones between whole ones: one buffer each
    ([1] * 10_000, 1),  # ten thousand tiny chunks: still one buffer, no object per chunk
])
def test_small_pieces_are_gathered_and_whole_ones_kept(sizes: list[int], parts: int) -> None:
    body = _Pieces()
    pieces = [bytes([index % 256]) * size for index, size in enumerate(sizes)]
    for piece in pieces:
        body.add(piece)
    assert len([*body._parts, *([body._small] if body._small else [])]) == parts
    assert body.joined() == b"".join(pieces)


def test_a_body_of_one_piece_is_not_copied() -> None:
    body, piece = _Pieces(), b"x" * (4 * WHOLE_PIECE)
    body.add(piece)
    assert body.joined() is piece


async def _post_in_pieces(proxy: RunningServer, head: bytes, pieces: list[bytes]) -> bytes:
    """The request's head, then its body written piece by piece with the loop let go between them; the status
    line of the answer."""
    reader, writer = await asyncio.open_connection(proxy.host, proxy.port)
    try:
        writer.write(head)
        for piece in pieces:
            writer.write(piece)
            try:
                await writer.drain()
            except ConnectionError:  # refused mid-body: the answer is already there
                break
            await asyncio.sleep(0.001)
        answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        return answer.partition(b"\r\n")[0]
    finally:
        writer.close()


async def test_a_body_in_many_pieces_of_any_size_is_forwarded_byte_for_byte(fake: FakeUpstream,
                                                                          make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy()
    payload = bytes(range(35, 127)) * 2000
    body = b'{"model": "m", "x": "' + payload + b'"}'
    cuts = itertools.accumulate(itertools.cycle([1, 7, WHOLE_PIECE, 3 * WHOLE_PIECE + 5, 40]))
    edges = [0, *itertools.takewhile(lambda at: at < len(body), cuts), len(body)]
    pieces = [body[a:b] for a, b in itertools.pairwise(edges)]
    assert len(pieces) > 100
    head = (f"POST /v1/echo/plain HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n").encode()
    assert await _post_in_pieces(proxy, head, pieces) == b"HTTP/1.1 200 OK"
    assert posted(fake) == [body]


@pytest.mark.parametrize(("size", "status"), [(4096, b"200"), (4097, b"413")])
async def test_a_chunked_body_of_tiny_chunks_is_bounded_and_whole(size: int, status: bytes, fake: FakeUpstream,
                                                                  make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy({"server": {"max_body_bytes": 4096}})
    head = b"POST /v1/echo/chunked HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    body = bytes(index % 256 for index in range(size))
    pieces = [b"".join(_chunked(body[at:at + 16])[:-5] for at in range(start, min(start + 512, size), 16))
              for start in range(0, size, 512)] + [b"0\r\n\r\n"]
    assert (await _post_in_pieces(proxy, head, pieces)).split(b" ")[1] == status
    assert posted(fake) == ([body] if status == b"200" else [])
