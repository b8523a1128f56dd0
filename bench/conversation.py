"""Summariser calls and upstream tokens of a scripted stateless conversation: this proxy vs a naive one.

Usage: python bench/conversation.py [--turns N] [--window TOKENS] [--stream]
The naive proxy is the same program with summary reuse and background summaries switched off (stored summaries
expire at once), so it re-summarises on every request that passes the threshold. Both runs use the same script
against the same fake upstream, which enforces the window by counting tokens.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from proxy.app import start_server
from proxy.config import settings_from_mapping
from tests.fakes.conversation import run_script
from tests.fakes.openai_upstream import FakeUpstream, FakeUpstreamApp
from tests.fakes.serving import serve_app
from tests.fakes.windowed import WindowedModel
from tests.sdk import async_client


async def run(label: str, overrides: dict[str, Any], turns: int, window: int, stream: bool) -> None:
    fake = FakeUpstream()
    model = WindowedModel(window=window)
    fake.chat_hook = model
    runner, url = await serve_app(FakeUpstreamApp(fake).build())
    config = {"upstream": {"base_url": f"{url}/v1"}, "models": {"default": {"context_window": window}},
              **overrides}
    proxy = await start_server(settings_from_mapping(config, env={}), host="127.0.0.1", port=0)
    started = time.perf_counter()
    result = await run_script(async_client(proxy.url), turns, stream=stream)
    seconds = time.perf_counter() - started
    await proxy.stop()
    await runner.cleanup()
    chat_tokens = sum(r.prompt_tokens for r in model.chat_calls)
    summary_tokens = sum(r.prompt_tokens for r in model.summarizer_calls)
    over = sum(r.prompt_tokens > window for r in model.chat_calls)
    print(f"{label:8s} requests {result.requests:4d}  summariser calls {len(model.summarizer_calls):4d}  "
          f"upstream prompt tokens: chat {chat_tokens:7d} + summariser {summary_tokens:7d} = "
          f"{chat_tokens + summary_tokens:7d}  over-window requests {over}  wall {seconds:5.1f}s")


async def main(turns: int, window: int, stream: bool) -> None:
    print(f"{turns}-turn stateless conversation, window {window} tokens, threshold 0.8, "
          f"{'streaming' if stream else 'non-streaming'}")
    await run("proxy", {}, turns, window, stream)
    naive = {"compaction": {"background": False}, "store": {"ttl_seconds": 1e-9}}
    await run("naive", naive, turns, window, stream)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=60)
    parser.add_argument("--window", type=int, default=4096)
    parser.add_argument("--stream", action="store_true")
    options = parser.parse_args()
    asyncio.run(main(options.turns, options.window, options.stream))
