"""A pass-through between the proxy and the model server that records what the server was asked and answered."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from proxy.upstream.streaming import SseDecoder, SseEvent
from tests.e2e_real.model_server import SEED
from tests.fakes.serving import serve_app

HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                        "transfer-encoding", "upgrade", "host", "content-length"})
# The first words of tests/e2e_real/prompts/compaction.md: how a summariser request is told from a chat turn.
SUMMARISER_OPENING = "You write a short summary of a chat"


@dataclass
class Exchange:
    """One request the server received and what it answered."""

    path: str
    request: dict[str, Any]
    started: float
    status: int = 0
    seconds: float = 0.0
    answer: dict[str, Any] | None = None      # a whole JSON answer (errors included)
    events: list[dict[str, Any]] = field(default_factory=list)  # decoded stream chunks
    prompt_tokens: int | None = None          # reported, or counted by the server's tokenizer afterwards
    disconnected: str | None = None           # the server dropped the connection instead of answering
    seeded: bool = False                      # the recorder added `seed` (the request as sent has none)

    @property
    def is_chat(self) -> bool:
        return self.path.endswith("/chat/completions")

    @property
    def is_summariser(self) -> bool:
        messages = self.request.get("messages") or [{}]
        first = messages[0] if isinstance(messages[0], dict) else {}
        return str(first.get("content", "")).startswith(SUMMARISER_OPENING)

    @property
    def streamed(self) -> bool:
        return self.request.get("stream") is True

    @property
    def answered(self) -> bool:
        """A 200 with a body; an empty 200 stream is this server's way of saying the prompt was too long."""
        return self.status == 200 and (bool(self.events) if self.streamed else self.answer is not None)

    @property
    def usage(self) -> dict[str, Any] | None:
        sources = [self.answer] if self.answer is not None else self.events
        found = [source["usage"] for source in sources if isinstance(source.get("usage"), dict)]
        return found[-1] if found else None

    @property
    def error_code(self) -> str | None:
        error = (self.answer or {}).get("error")
        return str(error.get("code")) if isinstance(error, dict) else None

    @property
    def finish_reason(self) -> str | None:
        choices = [choice for source in ([self.answer] if self.answer else self.events)
                   for choice in source.get("choices") or ()]
        reasons = [choice.get("finish_reason") for choice in choices if choice.get("finish_reason")]
        return str(reasons[-1]) if reasons else None

    @property
    def completion_tokens(self) -> int:
        """Reported when the server says; for a stream, one content chunk is one generated token."""
        usage = self.usage
        if usage is not None:
            return int(usage.get("completion_tokens") or 0)
        return sum(1 for event in self.events for choice in event.get("choices") or ()
                   if (choice.get("delta") or {}).get("content"))

    @property
    def requested_output(self) -> int | None:
        value = self.request.get("max_tokens")
        return value if isinstance(value, int) else None


def with_seed(request: dict[str, Any]) -> bytes | None:
    """The body with the suite's sampling seed added, for a completion request that names none; else None.

    The proxy has no setting for a summariser seed, and llama-cpp-python's server seeds a request without one
    from the request before it: the same summariser request would get a different reply depending on what ran
    earlier. With the seed its reply depends on its own text only. Nothing else in the request changes.
    """
    if not request or "seed" in request or not isinstance(request.get("messages", request.get("prompt")), (list, str)):
        return None
    return json.dumps({**request, "seed": SEED}).encode()


class Recorder:
    """Forwards every request to `upstream` (a server URL without /v1) and keeps an Exchange per request.

    Each request gets a fresh connection to the server, so the recorder never trips over a server that closes a
    kept-alive connection after answering; that quirk therefore does not reach the proxy through it, and tests of
    connection behaviour point the proxy at the server directly.

    A completion request that names no `seed` is forwarded with the suite's (see `with_seed`); the Exchange keeps
    the request as the proxy sent it.
    """

    def __init__(self, upstream: str, read_timeout: float = 600.0) -> None:
        self.upstream = upstream
        self.read_timeout = read_timeout  # seconds the server may stay silent while it evaluates a prompt
        self.exchanges: list[Exchange] = []
        self._session: aiohttp.ClientSession | None = None

    def chats(self) -> list[Exchange]:
        return [exchange for exchange in self.exchanges if exchange.is_chat and not exchange.is_summariser]

    def summaries(self) -> list[Exchange]:
        return [exchange for exchange in self.exchanges if exchange.is_chat and exchange.is_summariser]

    def build(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        return app

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        body = await request.read()
        exchange = Exchange(request.path, _json_or_empty(body), time.monotonic())
        self.exchanges.append(exchange)
        if request.path.endswith("/completions") and (seeded := with_seed(exchange.request)) is not None:
            body, exchange.seeded = seeded, True
        headers = {name: value for name, value in request.headers.items() if name.lower() not in HOP_BY_HOP}
        try:
            async with self._session.request(request.method, self.upstream + request.path_qs, data=body,
                                             headers=headers) as upstream:
                exchange.status = upstream.status
                if upstream.content_type == "text/event-stream":
                    return await self._relay_stream(request, upstream, exchange)
                payload = await upstream.read()
        except aiohttp.ClientConnectionError as error:
            return self._hang_up(request, exchange, error)
        exchange.answer = _json_or_empty(payload)
        exchange.seconds = time.monotonic() - exchange.started
        kept = {name: value for name, value in upstream.headers.items() if name.lower() not in HOP_BY_HOP}
        return web.Response(status=upstream.status, body=payload, headers=kept)

    @staticmethod
    def _hang_up(request: web.Request, exchange: Exchange, error: Exception) -> web.Response:
        """The server dropped the connection: drop the proxy's too, so it sees what it would have seen directly."""
        exchange.disconnected = f"{type(error).__name__}: {error}"
        exchange.seconds = time.monotonic() - exchange.started
        if request.transport is not None:
            request.transport.close()
        return web.Response(status=502)  # never reaches the closed connection

    async def _relay_stream(self, request: web.Request, upstream: aiohttp.ClientResponse,
                            exchange: Exchange) -> web.StreamResponse:
        kept = {name: value for name, value in upstream.headers.items() if name.lower() not in HOP_BY_HOP}
        response = web.StreamResponse(status=upstream.status, headers=kept)
        await response.prepare(request)
        decoder = SseDecoder()
        async for chunk in upstream.content.iter_any():
            exchange.events += _chunks_of(decoder.feed(chunk))
            await response.write(chunk)
        exchange.events += _chunks_of(decoder.flush())
        exchange.seconds = time.monotonic() - exchange.started
        await response.write_eof()
        return response

    @asynccontextmanager
    async def serving(self) -> AsyncIterator[str]:
        """Serve on a free loopback port; yields the base URL to give the proxy (with /v1)."""
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=self.read_timeout)
        connector = aiohttp.TCPConnector(force_close=True)
        async with aiohttp.ClientSession(timeout=timeout, auto_decompress=False, connector=connector) as session:
            self._session = session
            runner, url = await serve_app(self.build())
            try:
                yield f"{url}/v1"
            finally:
                await runner.cleanup()


def _chunks_of(events: list[SseEvent]) -> list[dict[str, Any]]:
    decoded = (event.json() for event in events)
    return [payload for payload in decoded if isinstance(payload, dict)]


def _json_or_empty(body: bytes) -> dict[str, Any]:
    try:
        payload = json.loads(body) if body else {}
    except ValueError:
        return {}
    return payload if isinstance(payload, dict) else {}
