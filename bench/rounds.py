"""Interleaved rounds: every measure of a scenario on every target in turn, round after round, checked loudly."""

from __future__ import annotations

import sys
from typing import Any

from bench.load_client import LoadClient
from bench.scenarios import Measure, Results, Scenario
from bench.targets import Target

WARM_UP_SECONDS = 1.0
PRIME_SECONDS = 120.0


class BenchFailed(RuntimeError):
    """A run saw errors, broken streams or a missing header: its figures would mean nothing."""


def progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def check(answer: dict[str, Any], target: Target, what: str) -> None:
    if not target.child.alive():
        raise BenchFailed(f"{target.column} exited during {what}:\n{target.child.output()}")
    problems = {name: answer[name] for name in ("errors", "bad_streams", "mismatches") if answer[name]}
    if problems or not answer["requests"]:
        raise BenchFailed(f"{what} on {target.column}: {answer['requests']} requests answered, {problems}; "
                          f"first problems: {answer['problems']}\n{target.child.output(2000)}")


def expected(measure: Measure, target: Target) -> tuple[str, str] | None:
    return measure.expect if target.kind == "on" else None


def once(load: LoadClient, target: Target, measure: Measure, quick: bool, *, requests: int | None = None,
         seconds: float | None = None) -> dict[str, Any]:
    """One run of a measure on a target, with the target's CPU time per answered request."""
    before, faults = target.cpu(), target.faults()
    answer = load.run(target.url_for(measure.shape), measure.shape, measure.concurrency,
                      requests or measure.max_requests(quick), seconds or measure.max_seconds(quick),
                      expected(measure, target))
    spent, faulted = target.cpu() - before, target.faults() - faults
    check(answer, target, f"{measure.shape} c={measure.concurrency}")
    answer["cpu_ms_per_request"] = spent * 1000 / answer["requests"]
    answer["faults_per_request"] = faulted / answer["requests"]
    return answer


def prime(load: LoadClient, scenario: Scenario, targets: list[Target]) -> None:
    """The request that stores a summary: one per compaction-on proxy, which must answer it by compacting."""
    for shape, value in scenario.prime:
        for target in targets:
            if target.kind == "on":
                answer = load.run(target.url_for(shape), shape, 1, 1, PRIME_SECONDS, ("x-compaction", value))
                check(answer, target, f"the first {shape} request (x-compaction: {value} expected)")


def applicable(measure: Measure, targets: list[Target]) -> list[Target]:
    return [target for target in targets if target.kind in measure.kinds]


def run_scenario(load: LoadClient, scenario: Scenario, targets: list[Target], rounds: int, quick: bool) -> Results:
    prime(load, scenario, targets)
    for measure in scenario.measures:          # warm-up: connections, caches, the first big tokenisation
        for target in applicable(measure, targets):
            once(load, target, measure, quick, requests=max(3, 2 * measure.concurrency), seconds=WARM_UP_SECONDS)
    results: Results = {measure.key: {} for measure in scenario.measures}
    for number in range(1, rounds + 1):
        for measure in scenario.measures:
            for target in applicable(measure, targets):
                answer = once(load, target, measure, quick)
                results[measure.key].setdefault(target.column, []).append(answer)
                progress(f"  {scenario.name} {measure.key} round {number}/{rounds} {target.column}: "
                         f"{answer['requests']} in {answer['seconds']:.2f} s, p50 {answer['p50_ms']:.2f} ms, "
                         f"{answer['cpu_ms_per_request']:.2f} CPU ms/req")
    return results
