"""Summariser calls and tokens before -> after for the scenarios agents and chats live in, at small windows.

Usage: python bench/agents.py [--only rows|tool-stages] [--calls 200] [--window 32000] [--seed 30] [--huge 3]
Each scenario drives the real proxy (in-process, on 127.0.0.1) with the openai or anthropic SDK against a fake
upstream that enforces its window by counting tokens (more than the proxy's own estimate, as real servers differ).
It prints, per scenario: requests, summariser calls, compactions, the tokens each compaction took the history from
and to, and the largest prompt the upstream received.

Then "tool stages" (bench/tool_stages.py, issue 30): one seeded agent conversation of 200 tool calls at a 32,000-token
window with the tool-result stages off, stage 1 only, and stages 1+2, in a table of its own.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import tool_stages
from proxy.app import start_server
from proxy.config import settings_from_mapping
from tests.fakes.agent import AgentModel, run_agent
from tests.fakes.conversation import run_script
from tests.fakes.messages_agent import anthropic_client
from tests.fakes.messages_agent import run_agent as run_messages_agent
from tests.fakes.messages_model import MessagesModel
from tests.fakes.openai_upstream import FakeUpstream, FakeUpstreamApp
from tests.fakes.responses_agent import run_agent as run_responses_agent
from tests.fakes.responses_model import ResponsesModel
from tests.fakes.serving import serve_app
from tests.fakes.windowed import WindowedModel
from tests.sdk import async_client

Drive = Callable[[Any], Awaitable[Any]]


async def scenario(label: str, model: WindowedModel, window: int, drive: Drive,
                   responses: ResponsesModel | MessagesModel | None = None) -> None:
    """One row. With `responses`, the agent speaks the Responses or the Messages API to it and `model` only
    summarises; `drive` gets the proxy's URL and makes its own client."""
    fake = FakeUpstream()
    fake.chat_hook = model
    if isinstance(responses, MessagesModel):
        fake.messages_hook = responses
    else:
        fake.responses_hook = responses
    runner, url = await serve_app(FakeUpstreamApp(fake).build())
    settings = settings_from_mapping({"upstream": {"base_url": f"{url}/v1"},
                                      "models": {"default": {"context_window": window}}}, env={})
    proxy = await start_server(settings, host="127.0.0.1", port=0)
    lines = tool_stages.Events()
    logger = logging.getLogger("proxy.compaction")
    logger.addHandler(lines)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        await drive(proxy.url)
    finally:
        logger.removeHandler(lines)
        logger.propagate = True
        await proxy.stop()
        await runner.cleanup()
    done = [e for e in lines.events if e.get("event") == "compaction"]
    pairs = [f"{e['replaced_tokens']}->{e['replacement_tokens']}" for e in done[:4]]
    after = statistics.median(e["replacement_tokens"] for e in done) if done else 0
    requests = len(responses.received) if responses else len(model.chat_calls)
    largest = max(responses.prompts) if responses else max(r.prompt_tokens for r in model.chat_calls)
    print(f"| {label} | {requests} | {len(model.summarizer_calls)} | {len(done)} | "
          f"{', '.join(pairs)}{' ...' if len(done) > 4 else ''} (median after {after:.0f}) | "
          f"{largest} / {window} |")


async def rows() -> None:
    print("| scenario | requests | summariser calls | compactions | summarised tokens before -> after | "
          "largest prompt / window |")
    print("| --- | --- | --- | --- | --- | --- |")
    for stream in (False, True):
        await scenario(f"agent, 1 instruction + 60 tool rounds (~310 tokens, 2 parallel calls), "
                       f"{'stream' if stream else 'json'}", AgentModel(window=4000), 4000,
                       lambda url, s=stream: run_agent(async_client(url), 60, stream=s))
    for stream in (False, True):
        await scenario(f"Responses agent, 1 instruction + 60 tool rounds (2 parallel calls, reasoning items), "
                       f"{'stream' if stream else 'json'}", WindowedModel(window=32_768), 8000,
                       lambda url, s=stream: run_responses_agent(async_client(url), 60, stream=s),
                       responses=ResponsesModel(window=8000))
    sent: list[int] = []
    for stream in (False, True):
        sent.clear()
        await scenario(f"Responses agent as above, asking `context_management` (compact_threshold 4,000) and keeping "
                       f"only what follows the latest compaction item, {'stream' if stream else 'json'}",
                       WindowedModel(window=32_768), 8000,
                       lambda url, s=stream: run_responses_agent(async_client(url), 60, stream=s,
                                                                 compact_threshold=4000, sent=sent),
                       responses=ResponsesModel(window=8000))
        print(f"|   items the client sent per request: largest {max(sent)}, last {sent[-1]} (181 when it keeps "
              f"everything) | | | | | |")
    for stream in (False, True):
        await scenario(f"Messages agent (anthropic SDK), 1 instruction + 60 tool rounds (2 parallel tool_use, signed "
                       f"thinking), {'stream' if stream else 'json'}", WindowedModel(window=32_768), 16_000,
                       lambda url, s=stream: run_messages_agent(anthropic_client(url), 60, stream=s),
                       responses=MessagesModel(window=16_000))
    await scenario("chat, 40 turns, default 1,024 reserve", WindowedModel(window=3000), 3000,
                   lambda url: run_script(async_client(url), 40))
    await scenario("chat, 40 turns, max_tokens 256", WindowedModel(window=3000), 3000,
                   lambda url: run_script(async_client(url), 40, max_tokens=256))
    await scenario("chat with tool turns, 60 turns", WindowedModel(window=4096), 4096,
                   lambda url: run_script(async_client(url), 60))


async def main(args: argparse.Namespace) -> None:
    if args.only in (None, "rows"):
        await rows()
    if args.only in (None, "tool-stages"):
        if args.only is None:
            print()
        print(await tool_stages.run(args.calls, seed=args.seed, window=args.window, huge=args.huge,
                                    seconds=args.seconds))


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--only", choices=("rows", "tool-stages"), help="one part only (default: both)")
    parser.add_argument("--calls", type=int, default=tool_stages.CALLS, help="tool stages: tool calls (default 200)")
    parser.add_argument("--window", type=int, default=tool_stages.WINDOW,
                        help="tool stages: the window, result sizes scaled with it (default 32000)")
    parser.add_argument("--seed", type=int, default=tool_stages.SEED, help="tool stages: the plan's seed")
    parser.add_argument("--huge", type=int, default=tool_stages.HUGE, help="tool stages: huge results (default 3)")
    parser.add_argument("--seconds", type=float, default=tool_stages.ARM_SECONDS,
                        help="tool stages: the longest one arm may run (default 90)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(main(arguments()))
