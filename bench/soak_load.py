"""The soak's load on the proxy: growing chat conversations, reasoning streams, /v1/models, and hostile clients."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import zlib
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from bench.soak_upstream import REASONING_MODEL, SLOW_MODEL

MIB = 1024 * 1024
# Short server limits so slow clients are dropped within the run; the driver skips a key missing from
# ServerConfig, and a slow client waits a few times its limit before it counts itself still open.
SERVER_LIMITS: dict[str, float | int] = {"max_body_bytes": MIB, "header_timeout": 1.0, "body_timeout": 2.0,
                                         "keepalive_timeout": 2.0}
BOMB_INFLATED_BYTES = 256 * MIB                 # 256x server.max_body_bytes, about 250 KiB on the wire
SYSTEM = {"role": "system", "content": "You keep a list of facts. Answer briefly."}
# Workers per kind: kept modest, the machine is shared and the point is a steady mix, not a flood.
WORKERS = {"chat-json": 3, "chat-stream": 3, "reasoning": 2, "models": 2, "disconnect": 2, "slowloris-head": 3,
           "slowloris-body": 1, "gzip-bomb": 2}


@dataclass
class Tally:
    requests: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[tuple[str, str]] = field(default_factory=Counter)
    compaction: Counter[str] = field(default_factory=Counter)
    close_seconds: dict[str, list[float]] = field(default_factory=dict)
    # A request that ended in a client error, as it ended: the error's words and whether its connection was a pooled
    # one (a request sent on a connection the server is closing at that moment meets keep-alive's race).
    errors: Counter[str] = field(default_factory=Counter)

    def count(self, kind: str, outcome: str) -> None:
        self.requests[kind] += 1
        self.outcomes[(kind, outcome)] += 1

    def error(self, kind: str, error: BaseException, connection: str) -> str:
        """Counts a request that ended in `error`; returns its outcome (the error's type)."""
        self.errors[f"{kind}: {type(error).__name__}: {str(error)[:120]} ({connection} connection)"] += 1
        return type(error).__name__


@dataclass
class Load:
    url: str
    session: aiohttp.ClientSession
    tally: Tally
    deadline: float
    rng: random.Random
    bomb: bytes

    def running(self) -> bool:
        return time.monotonic() < self.deadline


REQUEST_TIMEOUT = aiohttp.ClientTimeout(total=30)


def user_turn(conversation: str, index: int) -> dict[str, Any]:
    filler = " ".join(f"word{index}x{n}" for n in range(60))
    return {"role": "user", "content": f"Remember FACT-{conversation}-{index}. {filler}"}


def assistant_turn(conversation: str, index: int) -> dict[str, Any]:
    return {"role": "assistant", "content": f"Noted FACT-{conversation}-{index}. " + "ok " * 60}


async def status_of(request: contextlib.AbstractAsyncContextManager[aiohttp.ClientResponse]) -> str:
    """A request's status once its body is read, or the name of the error that ended it."""
    try:
        async with request as response:
            await response.read()
            return str(response.status)
    except (aiohttp.ClientError, TimeoutError) as error:
        return type(error).__name__


async def chat(load: Load, kind: str, body: dict[str, Any]) -> None:
    """One chat request; a stream must end with [DONE], anything else is counted as what it was."""
    told: dict[str, str] = {}  # connection_trace() says which connection the request went on
    try:
        async with load.session.post(f"{load.url}/v1/chat/completions", json=body, timeout=REQUEST_TIMEOUT,
                                     trace_request_ctx=told) as response:
            payload = await response.read()
            outcome = str(response.status)
            if response.status == 200 and body.get("stream") and not payload.rstrip().endswith(b"data: [DONE]"):
                outcome = "200-truncated"
            load.tally.compaction[response.headers.get("x-compaction", "-")] += 1
    except (aiohttp.ClientError, TimeoutError) as error:
        outcome = load.tally.error(kind, error, told.get("connection", "no"))
    load.tally.count(kind, outcome)


async def _told(connection: str, context: Any) -> None:
    if isinstance(context.trace_request_ctx, dict):
        context.trace_request_ctx["connection"] = connection


def connection_trace() -> aiohttp.TraceConfig:
    """Tells a request's `trace_request_ctx` (a dict) whether its connection was pooled or new."""
    trace = aiohttp.TraceConfig()
    trace.on_connection_reuseconn.append(lambda session, context, params: _told("a pooled", context))
    trace.on_connection_create_end.append(lambda session, context, params: _told("a new", context))
    return trace


async def conversations(load: Load, worker: int, *, stream: bool) -> None:
    """Conversations that grow past the compaction threshold (30-70 turns of ~170 tokens), then start over."""
    kind = "chat-stream" if stream else "chat-json"
    number = 0
    while load.running():
        name, number = f"{kind}{worker}.{number}", number + 1
        history: list[dict[str, Any]] = [SYSTEM]
        for index in range(load.rng.randint(30, 70)):
            if not load.running():
                return
            history.append(user_turn(name, index))
            await chat(load, kind, {"model": "fake-small", "messages": history, "stream": stream})
            history.append(assistant_turn(name, index))
            await asyncio.sleep(load.rng.uniform(0.01, 0.05))


async def reasoning(load: Load, worker: int) -> None:
    while load.running():
        messages = [SYSTEM, user_turn(f"r{worker}", load.rng.randint(0, 9))]
        await chat(load, "reasoning", {"model": REASONING_MODEL, "messages": messages, "stream": True})
        await asyncio.sleep(load.rng.uniform(0.02, 0.08))


async def models(load: Load, worker: int) -> None:
    while load.running():
        outcome = await status_of(load.session.get(f"{load.url}/v1/models", timeout=REQUEST_TIMEOUT))
        load.tally.count("models", outcome)
        await asyncio.sleep(load.rng.uniform(0.02, 0.08))


async def disconnect(load: Load, worker: int) -> None:
    """A streaming client that hangs up after a few events (or before the first)."""
    while load.running():
        body = {"model": SLOW_MODEL, "messages": [SYSTEM, user_turn(f"d{worker}", 0)], "stream": True}
        outcome = "cut"
        try:
            async with load.session.post(f"{load.url}/v1/chat/completions", json=body,
                                         timeout=REQUEST_TIMEOUT) as response:
                if response.status != 200:
                    outcome = str(response.status)
                for _ in range(load.rng.randint(0, 5)):
                    await response.content.readany()
                response.close()  # drops the connection mid-stream
        except (aiohttp.ClientError, TimeoutError) as error:
            outcome = type(error).__name__
        load.tally.count("disconnect", outcome)
        await asyncio.sleep(load.rng.uniform(0.05, 0.2))


async def wait_for_close(reader: asyncio.StreamReader, limit: float) -> tuple[str, float]:
    """How the server ended a stalled request: its status line, or 'closed', and after how long."""
    started = time.monotonic()
    try:
        data = await asyncio.wait_for(reader.read(65536), limit)
    except TimeoutError:
        return "still-open", time.monotonic() - started
    except ConnectionError:
        data = b""
    elapsed = time.monotonic() - started
    if data.startswith(b"HTTP/1."):
        return data.split(b" ", 2)[1].decode("ascii", "replace"), elapsed
    return "closed", elapsed


async def slowloris(load: Load, worker: int, *, body: bool) -> None:
    """Half a request head (or a whole head and a trickle of its body), then silence."""
    kind = "slowloris-body" if body else "slowloris-head"
    limit = 3 * float(SERVER_LIMITS["body_timeout" if body else "header_timeout"]) + 5
    host, port = load.url.removeprefix("http://").split(":")
    while load.running():
        try:
            reader, writer = await asyncio.open_connection(host, int(port))
        except OSError as error:
            load.tally.count(kind, type(error).__name__)
            await asyncio.sleep(0.5)
            continue
        head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        writer.write(head + b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n{\"model\": "
                     if body else head + b"Content-Type: appl")
        outcome, elapsed = await wait_for_close(reader, limit)
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
        load.tally.count(kind, outcome)
        load.tally.close_seconds.setdefault(kind, []).append(elapsed)


def gzip_bomb(inflated: int = BOMB_INFLATED_BYTES) -> bytes:
    """`inflated` zero bytes gzip-compressed a MiB at a time, so building it never holds more than a MiB."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(MIB)
    parts = [compressor.compress(zeros) for _ in range(inflated // MIB)]
    return b"".join([*parts, compressor.flush()])


async def gzip_bombs(load: Load, worker: int) -> None:
    headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    while load.running():
        outcome = await status_of(load.session.post(f"{load.url}/v1/chat/completions", data=load.bomb,
                                                    headers=headers, timeout=REQUEST_TIMEOUT))
        load.tally.count("gzip-bomb", outcome)
        await asyncio.sleep(load.rng.uniform(0.1, 0.3))


def worker_tasks(load: Load) -> list[Awaitable[None]]:
    makers: dict[str, Callable[[Load, int], Awaitable[None]]] = {
        "chat-json": lambda load, n: conversations(load, n, stream=False),
        "chat-stream": lambda load, n: conversations(load, n, stream=True),
        "reasoning": reasoning, "models": models, "disconnect": disconnect,
        "slowloris-head": lambda load, n: slowloris(load, n, body=False),
        "slowloris-body": lambda load, n: slowloris(load, n, body=True),
        "gzip-bomb": gzip_bombs,
    }
    return [makers[kind](load, index) for kind, count in WORKERS.items() for index in range(count)]


async def warm_up(url: str, session: aiohttp.ClientSession) -> None:
    """One request of each cheap kind, so lazy imports and caches are loaded before the baseline."""
    body = {"model": "fake-small", "messages": [SYSTEM, user_turn("warm", 0)]}
    for stream in (False, True):
        async with session.post(f"{url}/v1/chat/completions", json={**body, "stream": stream}) as response:
            await response.read()
    async with session.get(f"{url}/v1/models") as response:
        await response.read()
