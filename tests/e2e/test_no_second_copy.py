"""No second copy: a POST the upstream may have received is never resent; dead pooled connections go unused."""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import aiohttp
import pytest

from proxy.config import UpstreamConfig
from proxy.upstream.upstream import Upstream, UpstreamRequest, create_session
from proxy.upstream.upstream_pool import never_written
from tests.conftest import ProxyFactory

OK_BODY = b'{"object":"ok"}'
OK = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(OK_BODY)) + OK_BODY
EMPTY_STREAM = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: keep-alive\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
CHAT = {"model": "fake-small", "messages": [{"role": "user", "content": "a paid completion"}]}


@dataclass
class Received:
    connection: int
    method: str
    path: str
    body: bytes


# What the server does with the n-th request (0-based) of a connection: "answer", "reset", "close" (read, then
# close without answering), "empty-stream" (an empty chunked 200, then close 15 ms later without reading more).
Script = Callable[[int, int, bytes], str]


@dataclass
class RawUpstream:
    """An HTTP/1.1 server on plain blocking sockets in its own thread, so its timing is independent of the
    proxy's event loop. Every request it reads in full is recorded."""

    script: Script
    received: list[Received] = field(default_factory=list)
    port: int = 0

    def __post_init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.port = self._listener.getsockname()[1]
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._open: list[socket.socket] = []
        self._accepting = threading.Thread(target=self._accept, daemon=True)
        self._accepting.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def copies(self, body: bytes) -> int:
        return sum(1 for request in self.received if request.body == body)

    def close_idle(self) -> None:
        """Close every open connection from the server's side (a FIN, as an idle timeout would), and wait."""
        for conn in list(self._open):
            conn.shutdown(socket.SHUT_RDWR)
        for thread in self._threads:
            thread.join(5)

    def stop(self) -> None:
        self._stop.set()
        self._accepting.join(5)
        for thread in self._threads:
            thread.join(5)
        self._listener.close()

    def _accept(self) -> None:
        for index in range(1000):  # bounded: no test opens this many connections
            while not self._stop.is_set():
                try:
                    conn, _ = self._listener.accept()
                    break
                except TimeoutError:
                    continue
            else:
                return
            thread = threading.Thread(target=self._serve, args=(conn, index), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket, connection: int) -> None:
        conn.settimeout(5)
        self._open.append(conn)
        stream = conn.makefile("rb")
        try:
            for request_index in range(100):
                line = stream.readline()
                if not line:
                    return
                method, path, _ = line.decode("latin-1").split(" ", 2)
                length = 0
                while (header := stream.readline()) not in (b"\r\n", b""):
                    name, _, value = header.decode("latin-1").partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value)
                body = stream.read(length) if length else b""
                self.received.append(Received(connection, method, path, body))
                action = self.script(connection, request_index, body)
                if action == "answer":
                    conn.sendall(OK)
                    continue
                if action == "reset":
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                elif action == "empty-stream":
                    conn.sendall(EMPTY_STREAM)
                    time.sleep(0.015)
                return
        except OSError:
            return
        finally:
            self._open.remove(conn)
            stream.close()
            conn.close()


@contextmanager
def raw_upstream(script: Script) -> Iterator[RawUpstream]:
    server = RawUpstream(script)
    try:
        yield server
    finally:
        server.stop()


def upstream_config(server: RawUpstream) -> dict[str, object]:
    return {"upstream": {"base_url": server.base_url, "discover_windows": False}}


async def post(session: aiohttp.ClientSession, url: str, body: bytes) -> tuple[int, bytes]:
    async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as response:
        return response.status, await response.read()


ROUTES = {"chat": "/v1/chat/completions", "pass-through": "/v1/things"}


@pytest.mark.parametrize("route", sorted(ROUTES))
@pytest.mark.parametrize("pooled", [False, True], ids=["fresh-connection", "pooled-connection"])
async def test_a_post_read_then_reset_is_sent_once(route: str, pooled: bool, make_proxy: ProxyFactory) -> None:
    """The upstream reads the whole POST, then resets: it may have started the paid work, so no retry."""
    body = json.dumps({**CHAT, "user": f"{route}-{pooled}"}).encode()
    warm_up = json.dumps({**CHAT, "user": "warm-up"}).encode()

    def script(connection: int, request_index: int, request_body: bytes) -> str:
        return "answer" if request_body == warm_up else "reset"

    with raw_upstream(script) as server:
        proxy = await make_proxy(upstream_config(server))
        async with aiohttp.ClientSession() as session:
            if pooled:
                assert (await post(session, f"{proxy.url}{ROUTES[route]}", warm_up))[0] == 200
            status, answer = await post(session, f"{proxy.url}{ROUTES[route]}", body)
        await asyncio.sleep(0.1)  # a retry, if any, would have arrived by now
        assert server.copies(body) == 1, [(r.connection, r.path) for r in server.received]
        assert status == 502
        error = json.loads(answer)["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["code"] == "upstream_unreachable"


async def test_a_post_read_then_dropped_is_sent_once(make_proxy: ProxyFactory) -> None:
    """A clean close instead of a reset: the upstream had the request all the same."""
    body = json.dumps({**CHAT, "user": "closed"}).encode()
    with raw_upstream(lambda connection, request_index, request_body: "close") as server:
        proxy = await make_proxy(upstream_config(server))
        async with aiohttp.ClientSession() as session:
            status, _ = await post(session, f"{proxy.url}/v1/chat/completions", body)
        await asyncio.sleep(0.1)
        assert (status, server.copies(body)) == (502, 1)


async def test_a_get_on_a_closed_pooled_connection_is_still_retried(make_proxy: ProxyFactory) -> None:
    """GET is idempotent: the stale-pooled-connection retry stays for it."""
    def script(connection: int, request_index: int, request_body: bytes) -> str:
        return "answer" if request_index == 0 else "close"

    with raw_upstream(script) as server:
        proxy = await make_proxy(upstream_config(server))
        async with aiohttp.ClientSession() as session:
            for _ in range(3):
                async with session.get(f"{proxy.url}/v1/models") as response:
                    assert (response.status, await response.read()) == (200, OK_BODY)


@pytest.mark.parametrize(("pause", "connections"), [(0.05, [0, 0]), (0.6, [0, 1])], ids=["reused", "let-go"])
async def test_an_idle_connection_is_let_go_before_the_upstream_closes_it(pause: float, connections: list[int],
                                                                           make_proxy: ProxyFactory) -> None:
    """Past upstream.keepalive_timeout a pooled connection is not reused: an upstream that closes idle connections
    a little later (uvicorn's 5 s against the default 4) never closes one under a POST being written."""
    with raw_upstream(lambda connection, request_index, request_body: "answer") as server:
        config = upstream_config(server)
        config["upstream"] = {**config["upstream"], "keepalive_timeout": 0.3}  # type: ignore[dict-item]
        proxy = await make_proxy(config)
        async with aiohttp.ClientSession() as session:
            for index in range(2):
                body = json.dumps({**CHAT, "user": f"idle-{index}"}).encode()
                assert (await post(session, f"{proxy.url}/v1/chat/completions", body))[0] == 200
                await asyncio.sleep(pause)
        assert [request.connection for request in server.received] == connections


async def test_no_pooled_reuse_after_an_empty_stream(make_proxy: ProxyFactory) -> None:
    """llama.cpp's python server reports an over-long prompt as an empty 200 stream and closes the connection
    moments later: the POST that follows at once (the summariser's, in real life) must not be lost on it."""
    def script(connection: int, request_index: int, request_body: bytes) -> str:
        return "empty-stream" if request_body == b'{"stream": true}' else "answer"

    with raw_upstream(script) as server:
        proxy = await make_proxy(upstream_config(server))
        async with aiohttp.ClientSession() as session:
            for round_index in range(3):
                async with session.post(f"{proxy.url}/v1/things", data=b'{"stream": true}') as response:
                    assert (response.status, await response.read()) == (200, b"")
                body = b'{"round": %d}' % round_index
                assert await post(session, f"{proxy.url}/v1/things", body) == (200, OK_BODY)
                assert server.copies(body) == 1


async def test_a_pooled_connection_the_server_closed_unnoticed_is_not_used() -> None:
    """The server's FIN is in the socket but the event loop has not run since: the connection is seen to be dead
    before a byte is written, so the POST goes on a new one."""
    with raw_upstream(lambda connection, request_index, request_body: "answer") as server:
        config = UpstreamConfig(base_url=server.base_url)
        async with create_session(config) as session:
            upstream = Upstream(session, config)
            async with upstream.open(UpstreamRequest("POST", "/things", "", {}, b'{"n": 1}')) as response:
                assert await response.read() == OK_BODY
            server.close_idle()  # while this loop cannot notice: nothing below yields before the POST is sent
            time.sleep(0.05)
            async with upstream.open(UpstreamRequest("POST", "/things", "", {}, b'{"n": 2}')) as response:
                assert await response.read() == OK_BODY
        assert [(request.connection, request.body) for request in server.received] == \
            [(0, b'{"n": 1}'), (1, b'{"n": 2}')]


def test_only_a_write_refused_by_a_closing_transport_counts_as_never_written() -> None:
    unwritten = aiohttp.ClientOSError(None, "Can not write request body")
    unwritten.__cause__ = aiohttp.ClientConnectionResetError("Cannot write to closing transport")
    lost_after_writing = aiohttp.ClientOSError(None, "Can not write request body")
    lost_after_writing.__cause__ = aiohttp.ClientConnectionResetError("Connection lost")
    assert never_written(unwritten)
    assert not never_written(lost_after_writing)
    assert not never_written(aiohttp.ServerDisconnectedError())
    assert not never_written(aiohttp.ClientOSError(104, "Connection reset by peer"))
