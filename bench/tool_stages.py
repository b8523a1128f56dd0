"""Issue 30's figures: one seeded agent conversation of 200 tool calls (results of 300-3,000 tokens, 1-3 parallel
calls a round, a few huge ones) through the real proxy at a 32,000-token window, three times: the tool-result stages
off, stage 1 (clearing) only, stages 1+2 (clearing and background pair summaries). Stage 3, the whole-history
summary, is on in every arm.

The upstream is a fake that enforces its window by counting tokens (more than the proxy's estimate, as real servers
do), answers each round with the planned tool calls and answers the proxy's summariser requests mechanically; the
agent is a stateless client that resends the whole history each turn. After each answer the agent waits (bounded)
for the proxy's background work (a whole-history summary, a batch of pair summaries) to end, so each arm sees what
its background produced; all traffic stays on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import random
import re
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import openai
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from proxy.app import start_server
from proxy.config import settings_from_mapping
from proxy.core.tokens import TokenCounter
from tests.fakes.openai_upstream import FakeUpstream, FakeUpstreamApp
from tests.fakes.serving import serve_app
from tests.fakes.windowed import WindowedModel, _completion
from tests.sdk import async_client

WINDOW = 32_000
CALLS = 200
SEED = 30
HUGE = 3
# At the 32,000-token window; another window scales them.
SIZES = (300, 3_000)
HUGE_TOKENS = 12_000
ARM_SECONDS = 90.0  # an arm stops there, whatever it has left
SETTLE_SECONDS = 5.0  # the longest wait for the proxy's background work after one answer

SYSTEM = {"role": "system", "content": "You are a coding agent. Use the tools to finish the user's task."}
INSTRUCTION = {"role": "user", "content": "The build of src/ is red. Find out why, fix it without touching vendor/, "
                                          "and run the suite until it is green."}
TOOL_NAMES = ("read_file", "run_tests", "grep", "list_dir")
TOOLS = [{"type": "function", "function": {"name": name, "description": f"{name.replace('_', ' ')} at a path",
                                           "parameters": {"type": "object",
                                                          "properties": {"path": {"type": "string"}}}}}
         for name in TOOL_NAMES]
CALL_ID = re.compile(r"call_(\d+)_\d+")
WORDS = ("value", "config", "parse", "handler", "retry", "cache", "token", "window", "result", "buffer", "status")

# The arms: label -> (stage 1 on, stage 2 on).
ARMS = {"stages off": (False, False), "stage 1": (True, False), "stages 1+2": (True, True)}
BASE = "stages off"


@dataclass(frozen=True)
class Call:
    round: int
    index: int
    tool: str
    arguments: str
    result: str
    tokens: int  # the result's, by the proxy's counter

    @property
    def id(self) -> str:
        return f"call_{self.round}_{self.index}"


@dataclass(frozen=True)
class Plan:
    rounds: tuple[tuple[Call, ...], ...]

    @property
    def calls(self) -> list[Call]:
        return [call for calls in self.rounds for call in calls]


def _line(rng: random.Random, tool: str, n: int) -> str:
    a, b, c = rng.randrange(100), rng.randrange(1000), rng.randrange(10_000)
    if tool == "read_file":
        return f"{n:5d}  def {rng.choice(WORDS)}_{a}(x, y={b}): return x * {c}  # {rng.choice(WORDS)}"
    if tool == "run_tests":
        verdict = "FAILED" if rng.random() < 0.05 else "PASSED"
        return f"tests/test_{rng.choice(WORDS)}_{a}.py::test_case_{b} {verdict} [{n % 100:3d}%]"
    if tool == "grep":
        return f"src/pkg{a % 10}/{rng.choice(WORDS)}_{b}.py:{n}: {rng.choice(WORDS)} = compute({c}, {a})"
    return f"-rw-r--r-- 1 dev dev {c:6d} src/pkg{a % 10}/{rng.choice(WORDS)}_{b}.py"


def result_text(rng: random.Random, call: tuple[int, int], tool: str, path: str, tokens: int,
                count: Callable[[str], int]) -> tuple[str, int]:
    """A tool's output of about `tokens` tokens (counted line by line), with a unique RESULT marker first."""
    lines = [f"RESULT-{call[0]}-{call[1]}: {tool} {path}"]
    used = count(lines[0])
    while used < tokens:
        line = _line(rng, tool, len(lines))
        lines.append(line)
        used += count(line) + 1
    return "\n".join(lines), used


def make_plan(calls: int = CALLS, *, seed: int = SEED, window: int = WINDOW, huge: int = HUGE,
              counter: TokenCounter | None = None) -> Plan:
    """`calls` tool calls in rounds of 1-3 parallel calls; result sizes uniform in SIZES (scaled to `window`),
    `huge` of them HUGE_TOKENS (scaled), none in the first tenth of the calls. The same seed, the same plan."""
    counter = counter or TokenCounter("cl100k_base")
    rng = random.Random(seed)
    scale = window / WINDOW
    low, high = (round(size * scale) for size in SIZES)
    sizes = [rng.randint(low, high) for _ in range(calls)]
    for index in rng.sample(range(calls // 10, calls), min(huge, calls - calls // 10)):
        sizes[index] = round(HUGE_TOKENS * scale)
    rounds: list[tuple[Call, ...]] = []
    done = 0
    while done < calls:
        width = min(rng.choices((1, 2, 3), weights=(1, 2, 1))[0], calls - done)
        made = []
        for index in range(width):
            tool = rng.choice(TOOL_NAMES)
            path = f"src/pkg{rng.randrange(10)}/mod_{len(rounds)}_{index}.py"
            text, tokens = result_text(rng, (len(rounds), index), tool, path, sizes[done + index], counter.count_text)
            made.append(Call(len(rounds), index, tool, json.dumps({"path": path}), text, tokens))
        rounds.append(tuple(made))
        done += width
    return Plan(tuple(rounds))


@dataclass
class PlannedModel(WindowedModel):
    """Answers each chat turn with the plan's calls for the round that comes next (known from the id of the last
    tool result, which every stage keeps), then a closing text; counts the requests it is still serving."""

    plan: Plan = field(default_factory=lambda: Plan(()))
    in_flight: int = 0

    async def __call__(self, request: web.Request, body: dict[str, Any],
                       state: FakeUpstream) -> web.StreamResponse:
        self.in_flight += 1
        try:
            return await super().__call__(request, body, state)
        finally:
            self.in_flight -= 1

    async def _answer(self, request: web.Request, body: dict[str, Any], prompt: int) -> web.StreamResponse:
        round_index = next_round(body["messages"])
        if round_index >= len(self.plan.rounds):
            message: dict[str, Any] = {"role": "assistant", "content": "The suite is green: the fix is in src/."}
        else:
            message = {"role": "assistant", "content": None, "tool_calls": [
                {"id": call.id, "type": "function", "function": {"name": call.tool, "arguments": call.arguments}}
                for call in self.plan.rounds[round_index]]}
        usage = {"prompt_tokens": prompt, "completion_tokens": 30, "total_tokens": prompt + 30}
        return web.json_response(_completion(body, message, prompt, usage))


def next_round(messages: Sequence[Any]) -> int:
    last = messages[-1] if messages else {}
    found = CALL_ID.fullmatch(str(last.get("tool_call_id"))) if last.get("role") == "tool" else None
    return int(found.group(1)) + 1 if found else 0


def prefix_shares(requests: Sequence[Sequence[Any]]) -> list[float]:
    """For each two consecutive requests, the share of the earlier one's bytes (its JSON-encoded messages) that the
    later one starts with, message by message: a proxy for prompt-cache hits."""
    shares = []
    for before, after in itertools.pairwise(requests):
        kept = 0
        for one, other in zip(before, after, strict=False):
            if json.dumps(one) != json.dumps(other):
                break
            kept += 1
        shares.append(len(json.dumps(list(before[:kept]))) / len(json.dumps(list(before))))
    return shares


def prefix_stability(requests: Sequence[Sequence[Any]]) -> float:
    """The mean of prefix_shares; NaN with fewer than two requests."""
    shares = prefix_shares(requests)
    return statistics.mean(shares) if shares else float("nan")


class Events(logging.Handler):
    """The proxy's JSON log lines."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("{"):
            try:
                self.events.append(json.loads(message))
            except ValueError:
                pass


def _background(task: asyncio.Task[Any]) -> bool:
    """The proxy's shared background work: a whole-history summary or a batch of pair summaries (SingleFlight's)."""
    return getattr(task.get_coro(), "__qualname__", "") == "SingleFlight._call"


async def settle(model: PlannedModel, limit: float = SETTLE_SECONDS) -> None:
    """Wait, at most `limit` seconds, until the proxy runs no background summary and the fake serves no request."""
    deadline = time.monotonic() + limit
    await asyncio.sleep(0.005)
    while (left := deadline - time.monotonic()) > 0:
        tasks = [task for task in asyncio.all_tasks() if not task.done() and _background(task)]
        if not tasks and not model.in_flight:
            return
        if tasks:
            await asyncio.wait(tasks, timeout=left)
        else:
            await asyncio.sleep(0.005)


@dataclass
class Drive:
    headers: list[dict[str, str]] = field(default_factory=list)
    tool_calls: int = 0
    failures: list[str] = field(default_factory=list)


async def drive(url: str, plan: Plan, model: PlannedModel, deadline: float) -> Drive:
    """The agent: one request per round, then one for the closing answer; it stops at its first failure."""
    done = Drive()
    client = async_client(url, timeout=60.0)
    history: list[dict[str, Any]] = [SYSTEM, INSTRUCTION]
    try:
        for round_index in range(len(plan.rounds) + 1):
            if time.monotonic() > deadline:
                done.failures.append(f"out of time before round {round_index}")
                break
            try:
                sent: Any = history  # the SDK's message types, as plain dicts
                raw = await client.chat.completions.with_raw_response.create(model="agent", messages=sent,
                                                                             tools=TOOLS)  # type: ignore[arg-type]
            except openai.APIError as error:
                done.failures.append(f"round {round_index}: {type(error).__name__} {str(error)[:200]}")
                break
            done.headers.append(dict(raw.headers))
            if raw.headers.get("x-compaction") == "failed":
                done.failures.append(f"round {round_index}: x-compaction failed")
            message = raw.parse().choices[0].message.model_dump(exclude_none=True)
            history.append(message)
            if round_index == len(plan.rounds):
                break
            calls = message.get("tool_calls") or []
            if [call["id"] for call in calls] != [call.id for call in plan.rounds[round_index]]:
                done.failures.append(f"round {round_index}: the model did not make the planned calls")
                break
            history += [{"role": "tool", "tool_call_id": call.id, "content": call.result}
                        for call in plan.rounds[round_index]]
            done.tool_calls += len(calls)
            await settle(model)
    finally:
        await client.close()
    return done


@dataclass
class Arm:
    label: str
    turns: int
    tool_calls: int
    sent: list[int]  # prompt tokens of each chat request the upstream received (by its own count)
    overflows: int  # chat requests the upstream refused as over its window
    summariser_calls: int
    pair_calls: int
    compactions: int  # whole-history compactions the proxy logged
    summarised_turns: int  # answers served on a whole-history summary (x-compaction proactive, reactive, reused)
    cleared_turns: int
    swapped_turns: int
    whole_tokens: float  # billed to whole-history summaries (prompt + completion), from /metrics
    pair_tokens: float
    freed: dict[str, float]  # tokens freed in requests forwarded, by stage, from /metrics
    shares: list[float]  # prefix_shares of the chat requests
    failures: list[str]
    seconds: float

    @property
    def stability(self) -> float:
        return statistics.mean(self.shares) if self.shares else float("nan")


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def total(figures: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str) -> float:
    return sum(value for (sample, _), value in figures.items() if sample == name)


def labelled(figures: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return figures.get((name, tuple(sorted(labels.items()))), 0.0)


async def run_arm(label: str, plan: Plan, window: int, *, seconds: float = ARM_SECONDS,
                  clear_settings: dict[str, Any] | None = None) -> Arm:
    clear, pairs = ARMS[label]
    model = PlannedModel(window=window, plan=plan)
    fake = FakeUpstream()
    fake.chat_hook = model
    runner, url = await serve_app(FakeUpstreamApp(fake).build())
    settings = settings_from_mapping({
        "upstream": {"base_url": f"{url}/v1"}, "models": {"default": {"context_window": window}},
        "compaction": {"tool_results": {"clear": {**(clear_settings or {}), "enabled": clear},
                                         "summarize_pairs": {"enabled": pairs}}}},
        env={})
    events = Events()
    logger = logging.getLogger("proxy")
    level, propagate = logger.level, logger.propagate
    logger.addHandler(events)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    started = time.monotonic()
    proxy = await start_server(settings, host="127.0.0.1", port=0)
    try:
        done = await drive(proxy.url, plan, model, started + seconds)
        await settle(model)
        async with aiohttp.ClientSession() as session, session.get(f"{proxy.url}/metrics") as response:
            figures = samples(await response.text())
    finally:
        await proxy.stop()
        await runner.cleanup()
        logger.removeHandler(events)
        logger.setLevel(level)
        logger.propagate = propagate
    chats = model.chat_calls
    overflows = [call for call in chats
                 if call.prompt_tokens + int(call.body.get("max_tokens") or call.body.get("max_completion_tokens")
                                             or 0) > window]
    outcomes = [headers.get("x-compaction", "none") for headers in done.headers]
    return Arm(
        label=label, turns=len(done.headers), tool_calls=done.tool_calls,
        sent=[call.prompt_tokens for call in chats], overflows=len(overflows),
        summariser_calls=len(model.summarizer_calls), pair_calls=len(model.pair_calls),
        compactions=sum(event.get("event") == "compaction" for event in events.events),
        summarised_turns=sum(outcome in ("proactive", "reactive", "reused") for outcome in outcomes),
        cleared_turns=sum("x-compaction-cleared" in headers for headers in done.headers),
        swapped_turns=sum("x-compaction-pair-summaries" in headers for headers in done.headers),
        whole_tokens=total(figures, "compaction_proxy_summarizer_tokens_total"),
        pair_tokens=total(figures, "compaction_proxy_pair_summary_tokens_total"),
        freed={stage: labelled(figures, "compaction_proxy_tool_result_tokens_freed_total", stage=stage)
               for stage in ("cleared", "pair_summaries")},
        shares=prefix_shares([call.body["messages"] for call in chats]),
        failures=done.failures, seconds=time.monotonic() - started)


# Row label, unit, the figure of an arm. Units: n (a count), tokens, share, s.
ROWS: list[tuple[str, str, Callable[[Arm], float]]] = [
    ("turns (agent requests)", "n", lambda arm: arm.turns),
    ("tool calls answered", "n", lambda arm: arm.tool_calls),
    ("tokens sent per turn, median", "tokens", lambda arm: statistics.median(arm.sent) if arm.sent else float("nan")),
    ("tokens sent per turn, max", "tokens", lambda arm: max(arm.sent, default=float("nan"))),
    ("tokens sent, all turns", "tokens", lambda arm: sum(arm.sent)),
    ("upstream window overflows", "n", lambda arm: arm.overflows),
    ("whole-history compactions", "n", lambda arm: arm.compactions),
    ("whole-history summariser calls", "n", lambda arm: arm.summariser_calls),
    ("turns served on a whole-history summary", "n", lambda arm: arm.summarised_turns),
    ("turns with tool results cleared", "n", lambda arm: arm.cleared_turns),
    ("turns with pair summaries swapped in", "n", lambda arm: arm.swapped_turns),
    ("pair-summary calls", "n", lambda arm: arm.pair_calls),
    ("summariser tokens, whole history", "tokens", lambda arm: arm.whole_tokens),
    ("summariser tokens, pair summaries", "tokens", lambda arm: arm.pair_tokens),
    ("summariser tokens, total", "tokens", lambda arm: arm.whole_tokens + arm.pair_tokens),
    ("tokens freed by clearing (stage 1)", "tokens", lambda arm: arm.freed["cleared"]),
    ("tokens freed by pair summaries (stage 2)", "tokens", lambda arm: arm.freed["pair_summaries"]),
    ("prefix stability", "share", lambda arm: arm.stability),
    ("requests starting with the whole previous one", "n", lambda arm: sum(share == 1 for share in arm.shares)),
    ("failures", "n", lambda arm: len(arm.failures)),
    ("seconds", "s", lambda arm: arm.seconds),
]
DASH = "—"


def cell(value: float, unit: str) -> str:
    if value != value:  # NaN
        return DASH
    return f"{value:.3f}" if unit == "share" else f"{value:.1f}" if unit == "s" else f"{value:.0f}"


def ratio(value: float, base: float) -> str:
    if value != value or base != base or base == 0:
        return DASH
    return f"{value / base:.2f}x"


def render(arms: Sequence[Arm], plan: Plan, window: int, seed: int) -> str:
    sizes = sorted(call.tokens for call in plan.calls)
    widths = [len(calls) for calls in plan.rounds]
    header = [f"tool stages: {len(sizes)} tool calls in {len(plan.rounds)} rounds ({widths.count(1)} of 1 call, "
              f"{widths.count(2)} of 2, {widths.count(3)} of 3), seed {seed}, window {window:,} tokens (proxy and "
              f"upstream), every other setting default",
              f"tool results: {sizes[0]}-{sizes[-1]} tokens, median {statistics.median(sizes):.0f}, "
              f"{sum(sizes):,} in all; the largest {', '.join(str(size) for size in sizes[-4:])}",
              "tokens sent and summariser tokens by the upstream's count (1.15x the proxy's estimate); prefix "
              "stability: mean share of a chat request's JSON bytes the next one starts with, message by message"]
    base = next(arm for arm in arms if arm.label == BASE)
    others = [arm for arm in arms if arm is not base]
    columns = [arm.label for arm in arms] + [f"{arm.label} / off" for arm in others]
    lines = [f"{line}  " for line in header] + [""]
    lines.append("| figure | " + " | ".join(columns) + " |")
    lines.append("| --- | " + " | ".join("---:" for _ in columns) + " |")
    for label, unit, figure in ROWS:
        cells = [cell(figure(arm), unit) for arm in arms]
        cells += [ratio(figure(arm), figure(base)) if unit != "s" else DASH for arm in others]
        lines.append(f"| {label} ({unit}) | " + " | ".join(cells) + " |")
    best = next((arm for arm in arms if arm.label == "stages 1+2"), others[-1] if others else base)
    lines += ["", *goals(base, best)]
    for arm in arms:
        lines += [f"failure, {arm.label}: {failure}" for failure in arm.failures]
    return "\n".join(lines)


def goals(base: Arm, arm: Arm) -> list[str]:
    """Issue 30's goals, stages 1+2 against stages off."""
    fewer = base.compactions / arm.compactions if arm.compactions else float("inf")
    spent, spent_base = arm.whole_tokens + arm.pair_tokens, base.whole_tokens + base.pair_tokens
    return [f"goal, whole-history compactions at least 3x fewer: {base.compactions} -> {arm.compactions} "
            f"({fewer:.2f}x fewer): {'met' if fewer >= 3 else 'not met'}  ",
            f"goal, total summariser tokens lower: {spent_base:,.0f} -> {spent:,.0f}: "
            f"{'met' if spent < spent_base else 'not met'}  ",
            f"goal, prefix stability higher: {base.stability:.3f} -> {arm.stability:.3f}: "
            f"{'met' if arm.stability > base.stability else 'not met'}"]


async def run(calls: int = CALLS, *, seed: int = SEED, window: int = WINDOW, huge: int = HUGE,
              seconds: float = ARM_SECONDS) -> str:
    """The three arms on one plan, one after the other; the table."""
    plan = make_plan(calls, seed=seed, window=window, huge=huge)
    arms = [await run_arm(label, plan, window, seconds=seconds) for label in ARMS]
    return render(arms, plan, window, seed)
