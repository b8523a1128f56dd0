"""Token-counting benchmark: cold and warm counts of a synthetic 400-message, ~100k-token chat history."""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

from proxy.core.encodings import load_encoding
from proxy.core.tokens import TokenCounter

WORDS = (
    "the request handler returns a response object when the upstream answers with status code error "
    "def class import self value path config token message summary cache store retry stream compact "
    "src/proxy/pipeline.py tests/test_tokens.py KeyError ValueError None True False 200 404 413 429 500"
).split()


def prose(rng: random.Random, words: int) -> str:
    lines, line = [], []
    for _ in range(words):
        line.append(rng.choice(WORDS))
        if len(line) >= rng.randint(8, 16):
            lines.append(" ".join(line))
            line = []
    lines.append(" ".join(line))
    return "\n".join(lines)


def tool_call(rng: random.Random, index: int) -> dict[str, Any]:
    arguments = {"path": f"src/module_{index}.py", "query": prose(rng, 8), "limit": rng.randint(1, 500)}
    return {"id": f"call_{index}", "type": "function",
            "function": {"name": rng.choice(["read_file", "grep", "run_tests"]), "arguments": json.dumps(arguments)}}


def synthetic_history(seed: int = 7, size: int = 400) -> list[dict[str, Any]]:
    """Mixed roles, tool calls and results, and a few long messages, ~100k tokens in all."""
    rng = random.Random(seed)
    history: list[dict[str, Any]] = [{"role": "system", "content": prose(rng, 300)}]
    while len(history) < size:
        turn = len(history)
        long = turn % 37 == 0
        history.append({"role": "user", "content": prose(rng, 2500 if long else 120)})
        call = tool_call(rng, turn)
        history.append({"role": "assistant", "content": prose(rng, 30), "tool_calls": [call]})
        history.append({"role": "tool", "tool_call_id": call["id"], "content": prose(rng, 3000 if long else 250)})
        history.append({"role": "assistant", "content": prose(rng, 90)})
    return history[:size]


def timings(runs: int, action: Callable[[], object]) -> list[float]:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        action()
        samples.append((time.perf_counter() - start) * 1000)
    return samples


def describe(label: str, samples: list[float]) -> str:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return f"{label:<34} median {statistics.median(ordered):8.3f} ms   p99 {p99:8.3f} ms   (n={len(ordered)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--encoding", default="o200k_base")
    parser.add_argument("--cold-runs", type=int, default=5)
    parser.add_argument("--warm-runs", type=int, default=50)
    args = parser.parse_args()

    history = synthetic_history()
    # Requests arrive as fresh JSON every time: recount copies, not the very same objects.
    payload = json.dumps(history)
    fresh_copies = [json.loads(payload) for _ in range(args.warm_runs)]
    new_message = {"role": "user", "content": "One more question about the retry path, please."}

    load_ms = timings(1, lambda: load_encoding(args.encoding))[0]  # once per process, not per counter
    cold_copies = iter([json.loads(payload) for _ in range(args.cold_runs)])
    cold = timings(args.cold_runs, lambda: TokenCounter(args.encoding).count_messages(next(cold_copies)))
    counter = TokenCounter(args.encoding)
    total = counter.count_messages(history)
    copies = iter(fresh_copies)
    warm = timings(args.warm_runs, lambda: counter.count_messages(next(copies)))
    appended = iter([[*copy, dict(new_message, content=f"{new_message['content']} #{n}")]
                     for n, copy in enumerate(fresh_copies)])
    warm_plus_one = timings(args.warm_runs, lambda: counter.count_messages(next(appended)))

    print(f"encoding requested {args.encoding!r}, used {counter.encoding_name!r} ({counter.encoding.source})")
    print(f"encoding load (once per process): {load_ms:.1f} ms")
    print(f"history: {len(history)} messages, {len(payload):,} JSON bytes, {total:,} tokens")
    print(describe("cold count (fresh counter)", cold))
    print(describe("warm recount, same history", warm))
    print(describe("warm recount, one new message", warm_plus_one))
    print(f"cache: {counter.cache_info()}")


if __name__ == "__main__":
    main()
