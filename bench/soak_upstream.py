"""The soak's fake upstream: a window-enforcing chat model and summariser, plus reasoning-first and slow streams."""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.fakes.openai_upstream import FakeUpstream, FakeUpstreamApp, chunk, sse
from tests.fakes.windowed import WindowedModel

WINDOW = 8192
REASONING_MODEL = "soak-reasoning"
SLOW_MODEL = "soak-slow"
SLOW_CHUNKS, SLOW_CHUNK_DELAY = 100, 0.02


@dataclass
class LightWindowedModel(WindowedModel):
    """The window-enforcing fake, counting a prompt by its JSON length (about 3 characters a token).

    The driver shares two cores with the proxy: tiktoken on every body would take one of them, and the proxy's
    latency would then measure the driver. The proxy calibrates to whatever the upstream's usage says.
    """

    def prompt_tokens(self, body: dict[str, Any]) -> int:
        return math.ceil(len(json.dumps(body.get("messages"))) / 3)


@dataclass
class Upstream:
    """The fake's state plus what the soak wants to know of it afterwards."""

    state: FakeUpstream = field(default_factory=FakeUpstream)
    model: WindowedModel = field(default_factory=lambda: LightWindowedModel(window=WINDOW))
    summaries: int = 0
    slow_started: int = 0
    slow_finished: int = 0
    slow_abandoned: int = 0
    url: str = ""

    def forget(self) -> None:
        """Drop the bodies the fakes record, so the driver's memory stays flat over a long run."""
        self.summaries += sum(1 for received in self.model.received if received.summarizer)
        self.model.received.clear()
        self.state.requests.clear()


def is_summary_call(body: dict[str, Any]) -> bool:
    messages = body.get("messages") or []
    return bool(messages) and messages[0].get("role") == "system" and "<analysis>" in str(messages[0].get("content"))


async def write_chunks(request: web.Request, body: dict[str, Any], deltas: list[dict[str, Any]],
                       delay: float) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for delta in deltas:
        await response.write(sse(chunk(body, delta)))
        if delay:
            await asyncio.sleep(delay)
    await response.write(sse(chunk(body, {}, "stop")) + b"data: [DONE]\n\n")
    await response.write_eof()
    return response


async def reasoning_stream(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
    """A reasoning model: the first delta carries reasoning_content only, the answer follows."""
    thoughts = [{"role": "assistant", "reasoning_content": "Let me think."},
                *({"reasoning_content": f" step {index}."} for index in range(3))]
    return await write_chunks(request, body, [*thoughts, {"content": "Done thinking."}], 0.0)


async def slow_stream(request: web.Request, body: dict[str, Any], upstream: Upstream) -> web.StreamResponse:
    """A long trickle the client abandons; the proxy must notice and let go of it."""
    upstream.slow_started += 1
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    try:
        await response.write(sse(chunk(body, {"role": "assistant", "content": ""})))
        for index in range(SLOW_CHUNKS):
            await asyncio.sleep(SLOW_CHUNK_DELAY)
            await response.write(sse(chunk(body, {"content": f"w{index} "})))
        await response.write(sse(chunk(body, {}, "stop")) + b"data: [DONE]\n\n")
    except ConnectionError:
        upstream.slow_abandoned += 1   # the proxy let go: what it should do once its client has left
        return response
    except asyncio.CancelledError:
        upstream.slow_abandoned += 1
        raise
    upstream.slow_finished += 1
    return response


def chat_hook(upstream: Upstream) -> Callable[..., Awaitable[web.StreamResponse]]:
    async def hook(request: web.Request, body: dict[str, Any], state: FakeUpstream) -> web.StreamResponse:
        if body.get("stream") and not is_summary_call(body):
            if body.get("model") == REASONING_MODEL:
                return await reasoning_stream(request, body)
            if body.get("model") == SLOW_MODEL:
                return await slow_stream(request, body, upstream)
        return await upstream.model(request, body, state)
    return hook


async def serve_upstream(upstream: Upstream) -> web.AppRunner:
    upstream.state.chat_hook = chat_hook(upstream)
    # A short keep-alive: pooled proxy->upstream connections close soon after the load, so fds can settle.
    runner = web.AppRunner(FakeUpstreamApp(upstream.state).build(), access_log=None, keepalive_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    upstream.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    return runner


async def forget_periodically(upstream: Upstream, deadline: float) -> None:
    while time.monotonic() < deadline:
        upstream.forget()
        await asyncio.sleep(1.0)
