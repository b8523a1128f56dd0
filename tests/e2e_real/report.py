"""Figures from a real-model run, printed for the notes: turn latency, summariser cost, estimate accuracy."""

from __future__ import annotations

import hashlib
import json
import statistics
from collections.abc import Sequence

from proxy.core.tokens import TokenCounter
from tests.e2e_real.conversation import TurnResult
from tests.e2e_real.recorder import Exchange, Recorder

_COUNTER = TokenCounter()


def estimate_ratios(exchanges: Sequence[Exchange]) -> list[float]:
    """The proxy's uncalibrated estimate of each answered request over the server's own prompt count."""
    ratios = []
    for exchange in exchanges:
        if exchange.prompt_tokens:
            ratios.append(_COUNTER.count_request(exchange.request) / exchange.prompt_tokens)
    return ratios


def header_ratios(turns: Sequence[TurnResult], answered: Sequence[Exchange]) -> list[float]:
    """x-compaction-tokens-after (the proxy's calibrated estimate of what it sent) over the server's count."""
    pairs = zip(turns, answered, strict=True) if len(turns) == len(answered) \
        else zip(turns[-1:], answered[-1:], strict=False)
    return [turn.tokens_after / exchange.prompt_tokens for turn, exchange in pairs
            if turn.tokens_after is not None and exchange.prompt_tokens]


def _spread(values: Sequence[float], unit: str = "") -> str:
    if not values:
        return "n/a"
    return (f"min {min(values):.2f}{unit} median {statistics.median(values):.2f}{unit} "
            f"max {max(values):.2f}{unit} (n={len(values)})")


def turn_lines(turns: Sequence[TurnResult]) -> list[str]:
    lines = []
    for turn in turns:
        tokens = f" tokens {turn.tokens_before}->{turn.tokens_after}" if turn.tokens_before is not None else ""
        lines.append(f"  turn {turn.index:2d} [{turn.compaction:9s}] {turn.seconds:6.1f}s "
                     f"{turn.history_messages:3d} msgs{tokens} finish={turn.finish_reason} {turn.content[:60]!r}")
    return lines


def summariser_lines(recorder: Recorder) -> list[str]:
    lines = []
    for call in recorder.summaries():
        usage = call.usage or {}
        lines.append(f"  summariser {call.seconds:6.1f}s status {call.status} prompt {usage.get('prompt_tokens')} "
                     f"completion {usage.get('completion_tokens')} (max_tokens {call.requested_output}) "
                     f"finish={call.finish_reason}")
    return lines


def reply_text(exchange: Exchange) -> str:
    """What the server answered, streamed or not."""
    if exchange.answer is not None:
        return "".join(str((choice.get("message") or {}).get("content") or "")
                       for choice in exchange.answer.get("choices") or ())
    return "".join(str((choice.get("delta") or {}).get("content") or "")
                   for event in exchange.events for choice in event.get("choices") or ())


def replies_digest(recorder: Recorder) -> str:
    """One short hash of every request the server got and its reply, in any arrival order: equal in two runs
    exactly when the server was asked and answered the same, which is what a repeatable run shows."""
    pairs = sorted(json.dumps([exchange.request, exchange.status, reply_text(exchange), exchange.finish_reason],
                              sort_keys=True) for exchange in recorder.exchanges if exchange.is_chat)
    return hashlib.sha256("\n".join(pairs).encode()).hexdigest()[:16]


def print_report(title: str, turns: Sequence[TurnResult], recorder: Recorder, *, full_history_tokens: int,
                 n_ctx: int) -> None:
    answered = [exchange for exchange in recorder.chats() if exchange.answered]
    summaries = recorder.summaries()
    compacted = [turn for turn in turns if turn.tokens_before is not None]
    lines = [f"\n=== {title} ===",
             (f"full client history at the end: {full_history_tokens} server tokens "
              f"({full_history_tokens / n_ctx:.1f} x n_ctx {n_ctx})"),
             f"x-compaction seen: {sorted({turn.compaction for turn in turns})}",
             *turn_lines(turns),
             f"turn latency: {_spread([turn.seconds for turn in turns], 's')}",
             *summariser_lines(recorder),
             f"summariser latency: {_spread([call.seconds for call in summaries], 's')}",
             f"server prompt tokens per turn: {_spread([float(e.prompt_tokens or 0) for e in answered])}",
             f"raw estimate / server prompt tokens: {_spread(estimate_ratios(answered))}",
             f"x-compaction-tokens-after / server prompt tokens: {_spread(header_ratios(turns, answered))}",
             f"requests and replies digest: {replies_digest(recorder)}"]
    if compacted:
        shrink = [turn.tokens_after / turn.tokens_before for turn in compacted
                  if turn.tokens_before and turn.tokens_after is not None]
        lines.append(f"tokens after / before (headers): {_spread(shrink)}")
    print("\n".join(lines))
