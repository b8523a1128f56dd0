"""Fidelity benchmark: do planted facts survive 1-3 compactions, against full-history, tail-only and naive arms?"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai

from bench.fidelity_arms import (
    EarlierControls,
    NaiveSummary,
    TimedRecorder,
    probe_record,
    run_shape,
    split_exchanges,
    summary_record,
    tail_budget,
    tail_of,
)
from bench.fidelity_drive import NEW_SUMMARY, PROBE_MAX_TOKENS, ask, drive, planted_by
from bench.fidelity_facts import SHAPES, Conversation, Fact, generate, grade, probe_message
from bench.fidelity_filler import Message
from bench.fidelity_report import ARMS, DEFAULT_ARMS, aggregate, recall_table, summary_lines
from proxy.app import start_server
from proxy.config import ConfigError, settings_from_mapping
from proxy.core.tokens import TokenCounter
from tests.e2e_real.model_files import fetch_model
from tests.e2e_real.model_server import (
    REPO_ROOT,
    LlamaServer,
    find_llama_python,
    server_command,
    wait_until_ready,
)
from tests.fakes.serving import deep_merge
from tests.ports import free_port

MODELS = {"qwen-1.5b": "qwen-1.5b", "qwen-0.5b": "qwen-0.5b", "smollm2": "smollm2-135m"}
LOG_DIR = REPO_ROOT / ".cache" / "logs"
CLIENT_TIMEOUT = 3600.0  # seconds: a summary on a busy 2-core machine can take minutes
STAGES = {"compaction": {"tool_results": {"clear": {"enabled": True}, "summarize_pairs": {"enabled": True}}}}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.fidelity", description=__doc__)
    parser.add_argument("--model", choices=sorted(MODELS), default="qwen-1.5b", help="bundled model to serve")
    parser.add_argument("--upstream", help="an OpenAI-compatible base URL (…/v1) to use instead of a bundled model")
    parser.add_argument("--model-name", help="model name to request (required with --upstream)")
    parser.add_argument("--replicates", type=int, default=3)
    parser.add_argument("--cycles", type=int, default=3, choices=(1, 2, 3))
    parser.add_argument("--window", type=int, default=1536, help="context window the proxy is told")
    parser.add_argument("--shape", choices=SHAPES, default="spread",
                        help="where the facts are planted: over the whole conversation, or all before the first "
                             "compaction (an instruction, then only tool rounds)")
    parser.add_argument("--result-tokens", type=int, default=0, metavar="N",
                        help="grow every tool result to about N tokens with log lines (0: as generated, ~50-150)")
    parser.add_argument("--arms", default=",".join(DEFAULT_ARMS),
                        help="comma-separated subset of " + ",".join(ARMS) + " (stages: the proxy with the "
                             "tool-result stages on, over the same conversation, probed where the proxy arm was)")
    parser.add_argument("--stages-config", type=json.loads, default=STAGES, metavar="JSON",
                        help="the stages arm's config, merged over the proxy arm's (default: clearing and pair "
                             "summaries on)")
    parser.add_argument("--layout", choices=("auto", "prefix", "transcript"),
                        help="compaction.summarizer.layout (only sent when given)")
    parser.add_argument("--n-ctx", type=int, default=8192, help="bundled server's context (the full arm needs it)")
    parser.add_argument("--summary-timeout", type=float, default=900.0, help="compaction.summarizer.timeout")
    parser.add_argument("--proxy-config", type=json.loads, default={}, metavar="JSON",
                        help="extra proxy config merged over the bench's, e.g. "
                             "'{\"compaction\": {\"tail_budget\": 0.05}}'")
    parser.add_argument("--json", type=Path, help="write every measurement here")
    parser.add_argument("--seed", type=int, default=1, help="first replicate's seed; replicate r uses seed + r")
    parser.add_argument("--controls-from", type=Path, metavar="JSON",
                        help="an earlier --json run of the same model, window and cycles: its control-arm answers "
                             "are reused wherever this run compacts at the same point (a proxy change then costs "
                             "only the proxy arm)")
    options = parser.parse_args(argv)
    options.arms = [arm.strip() for arm in options.arms.split(",") if arm.strip()]
    if unknown := set(options.arms) - set(ARMS):
        parser.error(f"unknown arms: {', '.join(sorted(unknown))}")
    if options.upstream and not options.model_name:
        parser.error("--upstream needs --model-name")
    return options


@contextlib.contextmanager
def bundled_server(name: str, n_ctx: int) -> Iterator[LlamaServer]:
    """The bundled model behind llama-cpp-python's server, in its own process group, killed whatever happens."""
    model = fetch_model(MODELS[name], progress=lambda message: print(message, file=sys.stderr, flush=True))
    python = find_llama_python(os.environ)
    port = free_port()
    log_path = LOG_DIR / f"fidelity_server_{os.getpid()}.log"  # per run: two runs must not share one log
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log:
        process = subprocess.Popen(server_command(python, model, port, n_ctx), stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
    server = LlamaServer(process, f"http://127.0.0.1:{port}", n_ctx, model, log_path)
    try:
        wait_until_ready(server, 600)
        yield server
    finally:
        _kill_group(process)


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    for sent in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sent)
        try:
            process.wait(10)
            return
        except subprocess.TimeoutExpired:
            continue


def proxy_config(relay: str, options: argparse.Namespace) -> dict[str, Any]:
    summarizer: dict[str, Any] = {"temperature": 0, "timeout": options.summary_timeout}
    if options.layout:
        summarizer["layout"] = options.layout
    # No window discovery: the server's own n_ctx is large for the full arm, the proxy must believe `window`.
    config = {"upstream": {"base_url": relay, "discover_windows": False, "idle_timeout": CLIENT_TIMEOUT},
              "models": {"default": {"context_window": options.window}},
              "compaction": {"background": False, "summarizer": summarizer}}
    return deep_merge(config, options.proxy_config)


def client(base_url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(api_key="sk-fidelity", base_url=base_url, max_retries=0, timeout=CLIENT_TIMEOUT)


class Replicate:
    """One seeded conversation through the proxy and the control arms, with everything measured."""

    def __init__(self, options: argparse.Namespace, model: str, seed: int, recorder: TimedRecorder,
                 earlier: EarlierControls | None = None) -> None:
        self.options, self.model, self.seed, self.recorder, self.earlier = options, model, seed, recorder, earlier
        self.conversation: Conversation = generate(seed, options.window, options.cycles, shape=options.shape,
                                                           result_tokens=options.result_tokens)
        self.counter = TokenCounter()
        self.naive = NaiveSummary()
        self.turns: list[dict[str, Any]] = []
        self.summaries: list[dict[str, Any]] = []
        self.probes: list[dict[str, Any]] = []
        self.failures: list[dict[str, Any]] = []
        self.stage_turns: list[dict[str, Any]] = []
        self._start, self._sent = 0, 0
        self._since_summary = 0  # the first exchange after the last summary recorded: a prepared one began there

    def _on_turn(self, point: int) -> None:
        self._start, self._sent = len(self.recorder.exchanges), point

    async def run(self, via_proxy: openai.AsyncOpenAI, direct: openai.AsyncOpenAI) -> None:
        cycle = 0
        async for turn in drive(via_proxy, self.model, self.conversation, self.options.cycles, self._on_turn):
            self.turns.append({"point": turn.point, "compaction": turn.compaction, "reason": turn.reason,
                               "seconds": round(turn.seconds, 2)})
            print(f"  turn at message {turn.point}: {turn.compaction} ({turn.seconds:.1f}s)", flush=True)
            if turn.compaction == "failed":
                self._record_failure(turn.point, turn.reason)
            if turn.compaction in NEW_SUMMARY:
                cycle += 1
                self._record_summary(cycle, turn.point, prepared=turn.compaction == "prepared")
                await self._probe_all(cycle, self.conversation.messages[:turn.point + 1], via_proxy, direct)
        if cycle < self.options.cycles:
            print(f"  warning: only {cycle} of {self.options.cycles} compactions happened", flush=True)

    async def run_stages(self, via_stages: openai.AsyncOpenAI) -> None:
        """The stages arm: the same conversation through a proxy with the tool-result stages on, probed on the same
        facts at the points where the proxy arm made its summaries (whatever this proxy did there)."""
        points = {summary["point"]: summary["cycle"] for summary in self.summaries}
        if not points:
            return
        print("  stages arm", flush=True)
        async for turn in drive(via_stages, self.model, self.conversation, 10**6):
            self.stage_turns.append({"point": turn.point, "compaction": turn.compaction, "reason": turn.reason,
                                     "cleared": turn.cleared, "pair_summaries": turn.pair_summaries,
                                     "seconds": round(turn.seconds, 2)})
            if (cycle := points.get(turn.point)) is not None:
                print(f"  turn at message {turn.point}: {turn.compaction} (proxy arm's summary {cycle})", flush=True)
                history = self.conversation.messages[:turn.point + 1]
                # The whole history is what this arm sends: nothing of it is truncated.
                await self._probe_arm("stages", via_stages, cycle, history, history,
                                      planted_by(self.conversation, turn.point))
            if turn.point >= max(points):
                return

    def _record_summary(self, cycle: int, point: int, *, prepared: bool = False) -> None:
        start = self._since_summary if prepared else self._start
        self._since_summary = len(self.recorder.exchanges)
        exchanges = self.recorder.exchanges[start:]
        calls, forwarded = split_exchanges(exchanges, self.conversation.messages[self._sent])
        perf = [p for offset, exchange in enumerate(exchanges) if exchange in calls
                for p in self.recorder.perf.get(start + offset, [])]
        facts = planted_by(self.conversation, point)
        record = summary_record(self.conversation, point, facts, calls, forwarded, perf)
        self.summaries.append({"replicate": self.seed, "cycle": cycle, **record})
        print(f"  summary {cycle}: {record['calls']} call(s), {record['seconds']:.0f}s, kept "
              f"{len(record['kept'])}/{len(record['summarised'])} summarised facts, parsed {record['parsed']}",
              flush=True)

    def _record_failure(self, point: int, reason: str | None) -> None:
        calls, _ = split_exchanges(self.recorder.exchanges[self._start:], self.conversation.messages[self._sent])
        if calls:  # a failed turn without calls is the proxy backing off after an earlier failure
            self.failures.append({"replicate": self.seed, "point": point, "reason": reason, "calls": len(calls),
                                  "seconds": round(sum(c.seconds for c in calls), 1),
                                  "finish_reasons": [c.finish_reason for c in calls],
                                  "completion_tokens": [c.completion_tokens for c in calls]})

    async def _probe_all(self, cycle: int, history: list[Message], via_proxy: openai.AsyncOpenAI,
                         direct: openai.AsyncOpenAI) -> None:
        facts = planted_by(self.conversation, len(history) - 1)
        longest = max((probe_message(fact) for fact in facts), key=lambda m: len(m["content"]))
        budget = tail_budget(self.options.window, longest, self.counter, PROBE_MAX_TOKENS)
        tail = tail_of(history, budget, self.counter)
        points = {summary["cycle"]: summary["point"] for summary in self.summaries}
        for arm in self.options.arms:
            if arm == "stages":  # its own pass, after this one
                continue
            started = time.monotonic()
            if arm != "proxy" and self.earlier and (reused := self.earlier.reusable(
                    self.seed, cycle, arm, len(history) - 1, points)):
                self.probes += reused
                print(f"    {arm:5s}: {sum(p['correct'] for p in reused)}/{len(reused)} (reused)", flush=True)
                continue
            if arm == "naive":
                await self.naive.update(direct, self.model, history, len(history) - 1 - len(tail))
            await self._probe_arm(arm, via_proxy if arm == "proxy" else direct, cycle, history, tail, facts,
                                  started=started)

    async def _probe_arm(self, arm: str, client: openai.AsyncOpenAI, cycle: int, history: list[Message],
                         tail: list[Message], facts: list[Fact], *, started: float | None = None) -> None:
        """One probe per fact through `client`, as `arm` sends it, graded and recorded; a line of the tally."""
        started = time.monotonic() if started is None else started
        for fact in facts:
            messages = self._arm_messages(arm, history, tail, fact)
            answer = await ask(client, self.model, messages, PROBE_MAX_TOKENS)
            self.probes.append(probe_record(fact, arm, answer, grade(answer.content, fact), cycle=cycle,
                                            replicate=self.seed, prompt_messages=len(messages),
                                            point=len(history) - 1, truncated=history[fact.index] not in tail))
        correct = sum(p["correct"] for p in self.probes[-len(facts):])
        print(f"    {arm:5s}: {correct}/{len(facts)} ({time.monotonic() - started:.0f}s)", flush=True)

    def _arm_messages(self, arm: str, history: list[Message], tail: list[Message], fact: Fact) -> list[Message]:
        probe = probe_message(fact)
        if arm in ("proxy", "stages", "full"):
            return [*history, probe]
        if arm == "tail":
            return [history[0], *tail, probe]
        return [history[0], self.naive.message(), *tail, probe]

    def to_json(self, seconds: float) -> dict[str, Any]:
        return {"seed": self.seed, "seconds": round(seconds, 1), "conversation_tokens": self.conversation.tokens,
                "messages": len(self.conversation.messages), "facts": [vars(f) for f in self.conversation.facts],
                "turns": self.turns, "summaries": self.summaries, "failed_summaries": self.failures,
                "probes": self.probes, "naive": {"text": self.naive.text, "calls": self.naive.calls},
                "stage_turns": self.stage_turns}


async def run_replicate(options: argparse.Namespace, upstream: str, model: str, log_path: Path | None,
                        seed: int, earlier: EarlierControls | None = None) -> dict[str, Any]:
    recorder = TimedRecorder(upstream, log_path, read_timeout=CLIENT_TIMEOUT)
    started = time.monotonic()
    async with recorder.serving() as relay:
        proxy = await start_server(settings_from_mapping(proxy_config(relay, options), env={}), host="127.0.0.1",
                                   port=0)
        try:
            replicate = Replicate(options, model, seed, recorder, earlier)
            await replicate.run(client(f"{proxy.url}/v1"), client(relay))
        finally:
            await proxy.stop()
        if "stages" in options.arms:
            config = deep_merge(proxy_config(relay, options), options.stages_config)
            staged = await start_server(settings_from_mapping(config, env={}), host="127.0.0.1", port=0)
            try:
                await replicate.run_stages(client(f"{staged.url}/v1"))
            finally:
                await staged.stop()
    return replicate.to_json(time.monotonic() - started)


def header(options: argparse.Namespace, model: str) -> dict[str, Any]:
    return {"date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} cores, load "
                       f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}",
            "model": model, "upstream": options.upstream or "bundled llama-cpp-python server",
            "window": options.window, "shape": options.shape, "layout": options.layout or "(proxy default)",
            "proxy_config": options.proxy_config, "cycles": options.cycles,
            "stages_config": options.stages_config if "stages" in options.arms else None,
            "result_tokens": options.result_tokens,
            "replicates": options.replicates, "arms": options.arms, "seeds": [options.seed + r for r in
                                                                               range(options.replicates)],
            "controls_from": str(options.controls_from) if options.controls_from else None}


# What a probe's wrong value was, by the fact: only an overridden decision has a replaced value; a prohibition has
# the forbidden value beside the allowed one, the people fact a similar name beside the right one.
STALE_KINDS = {"override": "a replaced value given as current", "override2": "a replaced value given as current",
               "prohibition": "the forbidden value as allowed", "people": "the similarly named person"}


def stale_counts(probes: list[dict[str, Any]], arms: list[str]) -> str:
    """Per kind of wrong value asked about, how many probes each arm answered with it: `kind: arm n, arm n; …`."""
    counts: dict[str, dict[str, int]] = {}
    for kind in dict.fromkeys(STALE_KINDS.values()):
        asked = [p for p in probes if STALE_KINDS.get(p.get("key", "")) == kind]
        if asked:
            counts[kind] = {arm: sum(bool(p["stale"]) for p in asked if p["arm"] == arm) for arm in arms}
    return "; ".join(f"{kind}: " + ", ".join(f"{arm} {n}" for arm, n in per_arm.items())
                     for kind, per_arm in counts.items()) or "none asked"


def report(head: dict[str, Any], replicates: list[dict[str, Any]]) -> list[str]:
    lines = [f"# Fidelity benchmark {head['date']}", f"machine: {head['machine']}",
             f"model: {head['model']} ({head['upstream']}); window {head['window']}; "
             f"facts planted {run_shape(head)}; tool results grown to {head.get('result_tokens') or 0} tokens; "
             f"layout {head['layout']}; "
             f"{head['replicates']} replicate(s), seeds {head['seeds']}; cycles {head['cycles']}; "
             f"proxy config overrides {json.dumps(head['proxy_config'])}"]
    probes = [p for r in replicates for p in r["probes"]]
    lines += recall_table(aggregate(probes), head["arms"])
    lines += summary_lines([s for r in replicates for s in r["summaries"]])
    compactions = sorted({p["compaction"] for p in probes if p["arm"] == "proxy" and p["stale"]})
    lines += ["", "probes answered with the wrong one of two values (" + stale_counts(probes, head["arms"]) + ")"
                  + (f" (the proxy's x-compaction: {', '.join(compactions)})" if compactions else ""),
              f"failed summaries (x-compaction: failed with summariser calls): "
              f"{sum(len(r['failed_summaries']) for r in replicates)}",
              "seconds per replicate: " + ", ".join(f"{r['seconds']:.0f}" for r in replicates)]
    if staged := [turn for r in replicates for turn in r.get("stage_turns", [])]:
        compactions = [turn["compaction"] for turn in staged]
        lines.append(f"stages arm, {len(staged)} driving turns: whole-history summaries "
                     f"{sum(c in NEW_SUMMARY for c in compactions)} (proxy arm: "
                     f"{sum(t['compaction'] in NEW_SUMMARY for r in replicates for t in r['turns'])}), turns with "
                     f"tool results cleared {sum(turn['cleared'] > 0 for turn in staged)}, with pair summaries "
                     f"{sum(turn['pair_summaries'] > 0 for turn in staged)}")
    if head.get("controls_from"):
        controls = [p for p in probes if p["arm"] != "proxy"]
        lines.append(f"control-arm probes reused from {head['controls_from']} (same seed and point): "
                     f"{sum(bool(p.get('reused')) for p in controls)} of {len(controls)}")
    return lines


def main(argv: list[str] | None = None) -> int:
    options = parse_args(argv)
    try:  # before a model server starts: a proxy without compaction.summarizer.layout refuses --layout
        settings_from_mapping(proxy_config("http://127.0.0.1:9/v1", options), env={})
        settings_from_mapping(deep_merge(proxy_config("http://127.0.0.1:9/v1", options), options.stages_config), env={})
    except ConfigError as error:
        print(f"error: the proxy refuses the benchmark's config: {error}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the server's process group is stopped too
    with contextlib.ExitStack() as stack:
        if options.upstream:
            upstream, model, log_path = options.upstream.rstrip("/").removesuffix("/v1"), options.model_name, None
        else:
            server = stack.enter_context(bundled_server(options.model, options.n_ctx))
            upstream, model, log_path = server.url, options.model, server.log_path
            print(f"model server {server.url} (pid {server.process.pid}, log {log_path})", flush=True)
        head = header(options, model)
        earlier = None
        if options.controls_from:
            earlier = EarlierControls.load(options.controls_from, model, options.window, options.cycles,
                                           options.shape)
        replicates = []
        for index in range(options.replicates):
            print(f"replicate {index + 1}/{options.replicates} (seed {options.seed + index})", flush=True)
            replicates.append(asyncio.run(run_replicate(options, upstream, model, log_path, options.seed + index,
                                                        earlier)))
            if options.json:  # after every replicate: a long run stopped early keeps what it measured
                write_json(options.json, head, replicates)
    print("\n".join(report(as_run(head, replicates), replicates)))
    return 0


def as_run(head: dict[str, Any], replicates: list[dict[str, Any]]) -> dict[str, Any]:
    """The header with the replicates and seeds run so far, not those asked for (a run may be stopped early)."""
    return {**head, "replicates": len(replicates), "seeds": [r["seed"] for r in replicates]}


def write_json(path: Path, head: dict[str, Any], replicates: list[dict[str, Any]]) -> None:
    run = as_run(head, replicates)
    path.write_text(json.dumps({"header": run, "report": report(run, replicates), "replicates": replicates,
                                "recall": aggregate([p for r in replicates for p in r["probes"]])}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
