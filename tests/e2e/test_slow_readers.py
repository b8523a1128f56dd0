"""Clients that take a stream's bytes too slowly are cut after server.write_timeout, so they cannot hold the
upstream pool: everyone else is served, and the upstream sees the slow streams' connections closed."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web

from proxy.app import RunningServer
from proxy.http.appkeys import RUNTIME
from proxy.reload import Reloader
from tests.conftest import ProxyFactory, deep_merge
from tests.fakes.openai_upstream import FakeUpstream, chunk, sse

SLOW_CLIENTS = 5
OTHER_CLIENTS = 3
PARTS = 20
BOUND = 60.0  # seconds: every wait here ends well within this, or the test fails
MESSAGES = [{"role": "user", "content": "hello"}]


@dataclass
class Streams:
    """The fake's side: slow clients' streams never end by themselves; it notes when each one's connection went."""

    slow_started: int = 0
    slow_ended: int = 0
    all_started: asyncio.Event = field(default_factory=asyncio.Event)
    all_ended: asyncio.Event = field(default_factory=asyncio.Event)

    async def hook(self, request: web.Request, body: dict[str, Any], state: FakeUpstream) -> web.StreamResponse | None:
        if not body.get("stream"):
            return None
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        if body.get("user") != "slow":
            for index in range(PARTS):
                await response.write(sse(chunk(body, {"content": f"part{index} "})))
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
            return response
        self.slow_started += 1
        if self.slow_started == SLOW_CLIENTS:
            self.all_started.set()
        try:
            while True:  # more than any socket buffer holds: only the proxy closing the connection ends it
                await response.write(sse(chunk(body, {"content": "x" * 4000})))
        except ConnectionError:
            pass
        finally:
            self.slow_ended += 1
            if self.slow_ended == SLOW_CLIENTS:
                self.all_ended.set()
        return response


@pytest.fixture
def streams(fake: FakeUpstream) -> Streams:
    state = Streams()
    fake.chat_hook = state.hook
    return state


async def slow_client(url: str) -> socket.socket:
    """A client that sends a streamed request and then never reads, with a small receive buffer."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, (host, int(port)))
    body = json.dumps({"model": "fake-small", "messages": MESSAGES, "stream": True, "user": "slow"}).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    await loop.sock_sendall(sock, head + body)
    return sock


async def until_closed(sock: socket.socket) -> None:
    """Read whatever is left until the proxy's end is gone (a reset, for a connection aborted)."""
    loop = asyncio.get_running_loop()
    try:
        while await loop.sock_recv(sock, 65536):
            pass
    except ConnectionError:
        pass


async def streamed(session: aiohttp.ClientSession, url: str) -> tuple[int, bytes]:
    payload = {"model": "fake-small", "messages": MESSAGES, "stream": True}
    async with session.post(f"{url}/v1/chat/completions", json=payload) as response:
        return response.status, await response.read()


@pytest.fixture
async def slow_sockets() -> AsyncIterator[list[socket.socket]]:
    sockets: list[socket.socket] = []
    yield sockets
    for sock in sockets:
        sock.close()


async def reloaded_to(proxy: RunningServer, fake: FakeUpstream, tree: dict[str, Any], path: Path) -> None:
    """Apply `tree` as a config-file reload does (SIGHUP or an edited file) to the running proxy."""
    path.write_text(yaml.safe_dump(deep_merge({"upstream": {"base_url": f"{fake.url}/v1"}}, tree)), encoding="utf-8")
    assert await Reloader(proxy.app[RUNTIME], path).reload("test") == "applied"


@pytest.mark.parametrize("how", ["configured", "reloaded"])
async def test_slow_readers_are_cut_and_cannot_hold_the_upstream_pool(
        how: str, streams: Streams, fake: FakeUpstream, make_proxy: ProxyFactory,
        slow_sockets: list[socket.socket], tmp_path: Path) -> None:
    tree = {"upstream": {"max_connections": SLOW_CLIENTS}, "server": {"write_timeout": 1}}
    if how == "configured":
        proxy = await make_proxy(tree)
    else:  # started with the default (30 s); the reload applies to the streams that start after it
        proxy = await make_proxy({"upstream": {"max_connections": SLOW_CLIENTS}})
        await reloaded_to(proxy, fake, tree, tmp_path / "config.yaml")
    slow_sockets += [await slow_client(proxy.url) for _ in range(SLOW_CLIENTS)]
    await asyncio.wait_for(streams.all_started.wait(), BOUND)   # every upstream connection is a slow stream's
    started = time.perf_counter()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=BOUND)) as session:
        answers = await asyncio.gather(*(streamed(session, proxy.url) for _ in range(OTHER_CLIENTS)))
    print(f"\nother clients beside {SLOW_CLIENTS} slow readers: {[status for status, _ in answers]} "
          f"after {time.perf_counter() - started:.2f} s")
    for status, body in answers:
        assert status == 200
        assert body.endswith(b"data: [DONE]\n\n") and all(f"part{n} ".encode() in body for n in range(PARTS))
    await asyncio.wait_for(streams.all_ended.wait(), BOUND)     # the upstream saw each slow stream's connection go
    for sock in slow_sockets:
        await asyncio.wait_for(until_closed(sock), BOUND)         # and each slow client's connection was cut
    async with aiohttp.ClientSession() as session, session.get(f"{proxy.url}/metrics") as response:
        metrics = await response.text()
    assert f"compaction_proxy_slow_readers_cut_total {float(SLOW_CLIENTS)}" in metrics
    assert "compaction_proxy_open_streams 0.0" in metrics
