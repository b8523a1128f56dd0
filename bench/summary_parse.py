"""Summary-parse benchmark: milliseconds to parse hostile summariser replies of doubling size (linear is ~2x a step)."""

from __future__ import annotations

import argparse
import json
import statistics
import time

from proxy.summarizer.summary import StructuredSummary

# Each unit repeated until the reply reaches the size asked; the legitimate reply is one fenced summary that grows.
SHAPES = {
    "broken fences": "```json\n{\"a\" ",
    "terminators": "</analysis>",
    "terminator, fence, empty object": "</analysis>```json\n{}",
    "unterminated lists": "</analysis>```json\n{\"user_intent\": [\"",
}


def reply(shape: str, size: int) -> str:
    if shape == "legitimate summary":
        entries = [f"entry {index}: src/module_{index}.py changed" for index in range(size // 40)]
        return "<analysis>notes</analysis>\n```json\n" + json.dumps({"user_intent": entries}) + "\n```"
    unit = SHAPES[shape]
    return unit * (size // len(unit) + 1)


def median_ms(text: str, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        StructuredSummary.parse(text)
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.summary_parse", description=__doc__)
    parser.add_argument("--sizes", default="16000,32000,64000,128000", help="reply sizes in characters")
    parser.add_argument("--repeats", type=int, default=7)
    options = parser.parse_args(argv)
    sizes = [int(size) for size in options.sizes.split(",")]
    print("| reply | " + " | ".join(f"{size // 1000} KB" for size in sizes) + " | last step |")
    print("| --- |" + " --- |" * (len(sizes) + 1))
    for shape in [*SHAPES, "legitimate summary"]:
        times = [median_ms(reply(shape, size), options.repeats) for size in sizes]
        step = times[-1] / times[-2] if len(times) > 1 and times[-2] > 0 else float("nan")
        print(f"| {shape} | " + " | ".join(f"{ms:.1f} ms" for ms in times) + f" | {step:.1f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
