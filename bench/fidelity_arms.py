"""The fidelity benchmark's control arms (tail-only, naive summary), its timed recorder and summary analysis."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
from aiohttp import web

from bench.fidelity_drive import Answer, ask
from bench.fidelity_facts import Conversation, Fact, facts_in, message_text, request_text
from bench.fidelity_filler import Message
from proxy.core.budget import window_margin
from proxy.core.tokens import TokenCounter
from proxy.summarizer.summary import StructuredSummary
from tests.e2e_real.model_server import Perf, parse_perf
from tests.e2e_real.recorder import Exchange, Recorder
from tests.fakes.summariser_requests import is_summarizer_request

NAIVE_INSTRUCTION = "Summarise the conversation so far in one paragraph."
NAIVE_MAX_TOKENS = 256


def tail_of(history: Sequence[Message], budget: int, counter: TokenCounter) -> list[Message]:
    """The newest messages after the system message that fit `budget` with it, never opening on a tool result."""
    system, rest = list(history[:1]), list(history[1:])
    start = len(rest)
    while start > 0 and counter.count_messages([*system, *rest[start - 1:]]) <= budget:
        start -= 1
    while start < len(rest) and rest[start]["role"] == "tool":
        start += 1  # a result without its call: truncation drops the pair together
    return rest[start:]


def tail_budget(window: int, probe: Message, counter: TokenCounter, reserve: int) -> int:
    """What a truncating client may send: the window less the answer's reserve, the probe and a margin."""
    return window - reserve - window_margin(window) - counter.count_messages([probe])


@dataclass
class NaiveSummary:
    """A one-paragraph summary by the same model over what truncation drops, re-summarised every cycle."""

    text: str = ""
    covered: int = 0                  # history messages (after the system message) it covers
    calls: list[dict[str, Any]] = field(default_factory=list)

    async def update(self, client: openai.AsyncOpenAI, model: str, history: Sequence[Message],
                     dropped: int) -> None:
        new = list(history[1 + self.covered:1 + dropped])
        if not new:
            return
        earlier = [{"role": "user", "content": f"Summary of the conversation before this point: {self.text}"}] \
            if self.text else []
        answer = await ask(client, model, [*history[:1], *earlier, *new,
                                           {"role": "user", "content": NAIVE_INSTRUCTION}], NAIVE_MAX_TOKENS)
        self.text, self.covered = answer.content.strip(), dropped
        self.calls.append({"messages": len(new), "seconds": answer.seconds})

    def message(self) -> Message:
        return {"role": "user", "content": f"Summary of the earlier conversation: {self.text}"}


class TimedRecorder(Recorder):
    """The e2e recorder, plus the server's own perf lines (when its log is known) for each request."""

    def __init__(self, upstream: str, log_path: Path | None, read_timeout: float = 600.0) -> None:
        super().__init__(upstream, read_timeout)
        self.log_path = log_path
        self.perf: dict[int, list[Perf]] = {}

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        start = self._log_size()
        response = await super()._forward(request)
        if self.log_path is not None:
            await asyncio.sleep(0.05)  # the perf lines are written just before the answer; let them land
            with self.log_path.open("rb") as log:
                log.seek(start)
                self.perf[len(self.exchanges) - 1] = parse_perf(log.read().decode("utf-8", errors="replace"))
        return response

    def _log_size(self) -> int:
        return self.log_path.stat().st_size if self.log_path is not None and self.log_path.exists() else 0


def split_exchanges(exchanges: Sequence[Exchange], sent_last: Message) -> tuple[list[Exchange], Exchange | None]:
    """(summariser requests, the forwarded chat request) among one proxy call's upstream requests.

    The forwarded request ends with what the client sent last; a summary request ends with the proxy's own
    instruction, whatever its layout.
    """
    chats = [exchange for exchange in exchanges if exchange.is_chat]
    forwarded = [exchange for exchange in chats if (exchange.request.get("messages") or [None])[-1] == sent_last]
    # A summary prepared ahead was asked for turns before it was spliced in: among those turns' own requests, a
    # summary's is the one that asks for one.
    calls = [exchange for exchange in chats if exchange not in forwarded
             and is_summarizer_request(exchange.request.get("messages") or [])]
    return calls, (forwarded[-1] if forwarded else None)


def summary_record(conversation: Conversation, point: int, facts: Sequence[Fact], calls: Sequence[Exchange],
                   forwarded: Exchange | None, perf: Sequence[Perf]) -> dict[str, Any]:
    """What one compaction kept: facts in its span and its summary, its calls' tokens, time and server timings."""
    sent = (forwarded.request.get("messages") if forwarded else None) or []
    verbatim = [message for message in sent if message in conversation.messages]
    summary = "\n".join(message_text(message) for message in sent if message not in conversation.messages)
    summarised = [fact for fact in facts if conversation.messages[fact.index] not in verbatim]
    usage = [exchange.usage or {} for exchange in calls]
    replies = [str(((exchange.answer or {}).get("choices") or [{}])[0].get("message", {}).get("content") or "")
               for exchange in calls if exchange.status == 200]
    return {
        "point": point, "calls": len(calls), "summary": summary, "reply": replies[-1] if replies else None,
        "parsed": bool(replies) and StructuredSummary.parse(replies[-1]) is not None,
        "summarised": [fact.key for fact in summarised], "kept": facts_in(summary, summarised),
        "tail": [fact.key for fact in facts if fact not in summarised],
        "reached_summariser": facts_in("\n".join(request_text(e.request) for e in calls), facts),
        "in_compacted_request": facts_in(request_text(forwarded.request), facts) if forwarded else [],
        "prompt_tokens": sum(int(u.get("prompt_tokens") or 0) for u in usage),
        "completion_tokens": sum(int(u.get("completion_tokens") or 0) for u in usage),
        "seconds": sum(exchange.seconds for exchange in calls),
        "evaluated_tokens": sum(p.prompt_tokens for p in perf) if perf else None,
        "evaluated_ms": sum(p.prompt_ms for p in perf) if perf else None,
        "cached_tokens": sum(p.cached_tokens for p in perf) if perf else None,
        "status": [exchange.status for exchange in calls]}


def probe_record(fact: Fact, arm: str, answer: Answer, grading: dict[str, bool], **extra: Any) -> dict[str, Any]:
    return {"arm": arm, "key": fact.key, "kind": fact.kind, "value": fact.value, "answer": answer.content,
            "compaction": answer.compaction, "seconds": round(answer.seconds, 2), **grading, **extra}


def run_shape(header: Mapping[str, Any]) -> str:
    """The conversation shape a run measured: runs from before shapes existed planted their facts spread."""
    return str(header.get("shape", "spread"))


Controls = dict[tuple[int, int, str], list[dict[str, Any]]]  # (seed, cycle, arm) -> its probes


@dataclass(frozen=True)
class EarlierControls:
    """Control-arm probes of an earlier run, to reuse where this run probes the same seed at the same point.

    A control arm's answers depend only on the model, the conversation and the point it is probed at (greedy,
    seeded), not on the proxy: a run that changes the proxy needs to ask them again only where its compactions
    happen at other points.
    """

    probes: Controls
    points: dict[tuple[int, int], int]  # (seed, cycle) -> the message after which that compaction was made

    @classmethod
    def load(cls, path: Path, model: str, window: int, cycles: int, shape: str = "spread") -> EarlierControls:
        data = json.loads(path.read_text())
        header = data["header"]
        measured = (header["model"], header["window"], header["cycles"], run_shape(header))
        if measured != (model, window, cycles, shape):
            raise ValueError(f"{path} measured {measured[0]} at window {measured[1]} over {measured[2]} cycles, "
                             f"facts planted {measured[3]}, not {model} at {window} over {cycles}, {shape}")
        probes: Controls = {}
        for replicate in data["replicates"]:
            for probe in replicate["probes"]:  # a probe's "replicate" is its place in its run, not its seed
                if probe["arm"] != "proxy":
                    probes.setdefault((replicate["seed"], probe["cycle"], probe["arm"]), []).append(probe)
        points = {(replicate["seed"], summary["cycle"]): summary["point"] for replicate in data["replicates"]
                  for summary in replicate["summaries"]}
        return cls(probes, points)

    def reusable(self, seed: int, cycle: int, arm: str, point: int, points: dict[int, int]) -> list[dict[str, Any]]:
        """The earlier probes of `arm`, or none when a compaction up to this one was made at another point (the
        naive arm's summary carries over from cycle to cycle, so every earlier point must match for it)."""
        cycles = range(1, cycle + 1) if arm == "naive" else (cycle,)
        same = all(self.points.get((seed, c)) == (point if c == cycle else points.get(c)) for c in cycles)
        return [{**probe, "reused": True} for probe in self.probes.get((seed, cycle, arm), [])] if same else []
