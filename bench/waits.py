"""Summaries nobody waits for: how long an agent's turns wait on the proxy's summaries, with a slow summariser.

Usage: python -m bench.waits [--delays 2,10,30] [--turn 2.0] [--rounds 75] [--window 16000] [--config JSON]
Each arm is one agent (the chat agent with the openai SDK, json and stream; the Responses agent with the openai SDK;
the Messages agent with the anthropic SDK) driving the real proxy (in-process, on 127.0.0.1) against a fake upstream
that enforces its window, answers every turn after `--turn` seconds (a model's own time) and every summary after
the arm's delay. Per turn the added wait is the time to the answer's head less the model's own time. Arms run side
by side for one agent at a time, each in a process of its own (they mostly sleep; a shared loop would add its
own waits). Printed per arm: summaries made, the turns the client waited on (added wait over WAITED seconds) and
those after the first summary's, and the added wait per turn (median, p95, max).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from proxy.app import start_server
from proxy.config import settings_from_mapping
from tests.fakes.agent import AgentModel, run_agent
from tests.fakes.messages_agent import run_agent as run_messages_agent
from tests.fakes.messages_model import MessagesModel
from tests.fakes.openai_upstream import FakeUpstream, FakeUpstreamApp
from tests.fakes.responses_agent import run_agent as run_responses_agent
from tests.fakes.responses_model import ResponsesModel
from tests.fakes.serving import deep_merge, serve_app
from tests.fakes.summariser_requests import is_summarizer_request
from tests.fakes.windowed import WindowedModel

WAITED = 0.5  # seconds of added wait that count a turn as one the client waited on
CHAT_WORDS = 60  # words per tool result of the chat agent: rounds of about the Responses and Messages agents' size
DIALECTS = ("chat", "chat-stream", "responses", "messages")
Hook = Callable[..., Awaitable[Any]]


@dataclass
class Turns:
    """When each request of one client left and when its answer's head came back."""

    sent: list[float] = field(default_factory=list)
    answered: list[float] = field(default_factory=list)
    outcomes: list[str] = field(default_factory=list)

    async def on_request(self, request: Any) -> None:  # the SDK's HTTP client's request
        self.sent.append(time.monotonic())

    async def on_response(self, response: Any) -> None:
        self.answered.append(time.monotonic())
        self.outcomes.append(response.headers.get("x-compaction", "none"))

    def added(self, model_seconds: float) -> list[float]:
        return [max(0.0, end - start - model_seconds) for start, end in zip(self.sent, self.answered, strict=False)]


def paced(inner: Hook, seconds: float, *, chat: bool) -> Hook:
    """`inner` answering a turn after `seconds` (a summariser request to the chat hook is not a turn)."""
    async def hook(*args: Any) -> Any:
        summary = chat and is_summarizer_request((args[1] or {}).get("messages") or [])
        if not summary:
            await asyncio.sleep(seconds)
        return await inner(*args)
    return hook


@dataclass(frozen=True)
class Arm:
    dialect: str
    delay: float


async def run_arm(arm: Arm, options: argparse.Namespace) -> dict[str, Any]:
    fake, turns = FakeUpstream(), Turns()
    window = options.window
    hooks = {"request": [turns.on_request], "response": [turns.on_response]}
    if arm.dialect.startswith("chat"):
        model: WindowedModel = AgentModel(window=window, summary_delay=arm.delay)
        fake.chat_hook = paced(model, options.turn, chat=True)
    else:
        model = WindowedModel(window=4 * window, summary_delay=arm.delay)  # summarises only
        fake.chat_hook = model
        if arm.dialect == "responses":
            fake.responses_hook = paced(ResponsesModel(window=window), options.turn, chat=False)
        else:
            fake.messages_hook = paced(MessagesModel(window=window), options.turn, chat=False)
    runner, url = await serve_app(FakeUpstreamApp(fake).build())
    config = {"upstream": {"base_url": f"{url}/v1"}, "models": {"default": {"context_window": window}},
              "logging": {"level": "WARNING"}}
    proxy = await start_server(settings_from_mapping(deep_merge(config, options.config), env={}), host="127.0.0.1",
                               port=0)
    try:
        await _drive(arm, proxy.url, options.rounds, hooks)
    finally:
        await proxy.stop()
        await runner.cleanup()
    return _row(arm, turns, model, options.turn)


async def _drive(arm: Arm, base: str, rounds: int, hooks: dict[str, list[Any]]) -> None:
    import anthropic
    import openai

    if arm.dialect == "messages":
        http = anthropic.DefaultAsyncHttpxClient(event_hooks=hooks)
        client = anthropic.AsyncAnthropic(api_key="sk-ant-bench", base_url=base, max_retries=0, http_client=http)
        await run_messages_agent(client, rounds, stream=True)
        return
    http_client = openai.DefaultAsyncHttpxClient(event_hooks=hooks)
    sdk = openai.AsyncOpenAI(api_key="sk-bench", base_url=f"{base}/v1", max_retries=0, http_client=http_client)
    if arm.dialect == "responses":
        await run_responses_agent(sdk, rounds, stream=True)
    else:
        await run_agent(sdk, rounds, stream=arm.dialect == "chat-stream", words=CHAT_WORDS)


def _row(arm: Arm, turns: Turns, model: WindowedModel, turn_seconds: float) -> dict[str, Any]:
    added = turns.added(turn_seconds)
    # Turns that spliced a new summary in: made on the path, prepared ahead, or (without a mark) a background one
    # awaited, which says "reused" like any later turn: those are told by their wait.
    # The first turn is not one of them: nothing was answered before it that could have started a summary, and its
    # wait is the client's own start (a busy machine's SDK setup and first connection).
    waited = [index for index, seconds in enumerate(added) if seconds > WAITED and index > 0]
    spliced = [index for index, outcome in enumerate(turns.outcomes) if outcome in ("proactive", "reactive",
                                                                                     "prepared")]
    first = min([*spliced, *waited], default=None)
    summaries = len(model.summarizer_calls)
    later = [index for index in waited if first is not None and index > first]
    return {"dialect": arm.dialect, "summary_seconds": arm.delay, "turns": len(added), "summaries": summaries,
            "outcomes": {outcome: turns.outcomes.count(outcome) for outcome in sorted(set(turns.outcomes))},
            "waited": len(waited), "waited_after_first": len(later),
            "share_waited_after_first": len(later) / (summaries - 1) if summaries > 1 else None,
            "median": statistics.median(added) if added else 0.0, "p95": _percentile(added, 0.95),
            "max": max(added, default=0.0)}


def _percentile(values: list[float], share: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def table(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["| agent | summariser | turns | summaries made | x-compaction | turns waited on | waited on, after the "
             "first summary (share of later summaries) | added wait per turn: median / p95 / max |",
             "| --- | ---: | ---: | ---: | --- | ---: | ---: | --- |"]
    for row in rows:
        share = row["share_waited_after_first"]
        outcomes = ", ".join(f"{name} {count}" for name, count in row["outcomes"].items())
        lines.append(f"| {row['dialect']} | {row['summary_seconds']:g} s | {row['turns']} | {row['summaries']} | "
                     f"{outcomes} | {row['waited']} | {row['waited_after_first']}"
                     f"{'' if share is None else f' ({share:.0%})'} | {row['median']:.2f} / {row['p95']:.2f} / "
                     f"{row['max']:.2f} s |")
    return lines


def arms(options: argparse.Namespace) -> list[Arm]:
    return [Arm(dialect, delay) for dialect in options.dialects for delay in options.delays]


def arm_in_process(arm: Arm, options: argparse.Namespace) -> dict[str, Any]:
    """One arm on its own event loop, in a process of its own."""
    return {**asyncio.run(run_arm(arm, options)), "process": os.getpid()}


async def main(options: argparse.Namespace) -> list[dict[str, Any]]:
    """One agent at a time, its summariser delays side by side, each arm in a process of its own: on one event loop
    the openai SDK's preparing of one client's long Responses input (a second a request in a profile) held the
    other arms' answers back, and every turn of theirs read as waited on."""
    rows: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    with ProcessPoolExecutor(max_workers=len(options.delays),
                             mp_context=multiprocessing.get_context("spawn")) as pool:
        for dialect in options.dialects:
            chosen = [arm for arm in arms(options) if arm.dialect == dialect]
            rows += await asyncio.gather(*(loop.run_in_executor(pool, arm_in_process, arm, options)
                                           for arm in chosen))
    return rows


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.waits", description=__doc__.split("\n", 1)[0])
    parser.add_argument("--delays", default="2,10,30", help="summariser seconds, comma-separated")
    parser.add_argument("--dialects", default=",".join(DIALECTS), help="comma-separated subset of "
                                                                        + ",".join(DIALECTS))
    parser.add_argument("--turn", type=float, default=2.0, help="the model's own seconds per turn")
    parser.add_argument("--rounds", type=int, default=75, help="tool rounds per agent")
    parser.add_argument("--window", type=int, default=16_000, help="the model's window")
    parser.add_argument("--config", type=json.loads, default={}, metavar="JSON",
                        help="proxy config merged over the bench's, e.g. '{\"compaction\": {\"background\": false}}'")
    parser.add_argument("--json", type=Path, help="write the rows here")
    options = parser.parse_args(argv)
    options.delays = [float(value) for value in options.delays.split(",") if value.strip()]
    options.dialects = [value.strip() for value in options.dialects.split(",") if value.strip()]
    if unknown := set(options.dialects) - set(DIALECTS):
        parser.error(f"unknown dialects: {', '.join(sorted(unknown))}")
    return options


if __name__ == "__main__":
    parsed = arguments()
    measured = asyncio.run(main(parsed))
    print("\n".join(table(measured)))
    if parsed.json:
        parsed.json.write_text(json.dumps({"options": {k: v for k, v in vars(parsed).items() if k != "json"},
                                           "rows": measured}, indent=1, default=str))
