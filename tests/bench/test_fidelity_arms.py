"""bench.fidelity_arms: the tail a truncating client keeps, and reusing an earlier run's control arms."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.fidelity_arms import EarlierControls, tail_of
from proxy.core.tokens import TokenCounter


def earlier_run(tmp_path: Path, model: str = "qwen-1.5b", window: int = 3072, cycles: int = 3,
                shape: str | None = None) -> Path:
    probes = [{"arm": arm, "replicate": 1, "cycle": cycle, "key": key, "correct": True}
              for arm in ("proxy", "full", "naive") for cycle in (1, 2) for key in ("path", "port")]
    head: dict[str, Any] = {"model": model, "window": window, "cycles": cycles}
    if shape:  # a run from before shapes existed has none: its facts were spread
        head["shape"] = shape
    data = {"header": head,
            "replicates": [{"seed": 1, "probes": probes,
                            "summaries": [{"cycle": 1, "point": 40}, {"cycle": 2, "point": 64}]}]}
    path = tmp_path / "earlier.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize(("arm", "cycle", "point", "points", "reused"), [
    pytest.param("full", 1, 40, {}, 2, id="same seed and point"),
    pytest.param("full", 2, 64, {1: 41}, 2, id="full history: only this point matters"),
    pytest.param("full", 2, 66, {1: 40}, 0, id="compacted at another point"),
    pytest.param("naive", 2, 64, {1: 40}, 2, id="naive: every point so far matches"),
    pytest.param("naive", 2, 64, {1: 41}, 0, id="naive: an earlier point differs, its summary would too"),
    pytest.param("tail", 1, 40, {}, 0, id="an arm the earlier run did not measure"),
    pytest.param("full", 3, 88, {1: 40, 2: 64}, 0, id="a cycle the earlier run did not reach"),
])
def test_control_probes_are_reused_only_at_the_same_points(tmp_path: Path, arm: str, cycle: int, point: int,
                                                           points: dict[int, int], reused: int) -> None:
    earlier = EarlierControls.load(earlier_run(tmp_path), "qwen-1.5b", 3072, 3)
    probes = earlier.reusable(1, cycle, arm, point, {**points, cycle: point})
    assert len(probes) == reused
    assert all(probe["reused"] and probe["arm"] == arm and probe["cycle"] == cycle for probe in probes)
    assert earlier.reusable(2, cycle, arm, point, {**points, cycle: point}) == [], "another seed"


def test_merged_runs_of_one_replicate_each_keep_their_seeds_apart(tmp_path: Path) -> None:
    """Each run numbers its replicates from 1: merged (bench.fidelity_merge), a probe's seed is its replicate's."""
    def run(seed: int, value: str) -> dict[str, Any]:
        return {"seed": seed, "summaries": [{"cycle": 1, "point": 40}],
                "probes": [{"arm": "full", "replicate": 1, "cycle": 1, "key": "port", "value": value}]}
    path = tmp_path / "merged.json"
    path.write_text(json.dumps({"header": {"model": "qwen-1.5b", "window": 3072, "cycles": 3},
                                "replicates": [run(1, "21462"), run(2, "40417")]}))
    earlier = EarlierControls.load(path, "qwen-1.5b", 3072, 3)
    assert [probe["value"] for probe in earlier.reusable(1, 1, "full", 40, {1: 40})] == ["21462"]
    assert [probe["value"] for probe in earlier.reusable(2, 1, "full", 40, {1: 40})] == ["40417"]


def test_the_proxy_arm_is_never_reused(tmp_path: Path) -> None:
    earlier = EarlierControls.load(earlier_run(tmp_path), "qwen-1.5b", 3072, 3)
    assert earlier.reusable(1, 1, "proxy", 40, {1: 40}) == []


@pytest.mark.parametrize(("model", "window", "cycles"), [("qwen-0.5b", 3072, 3), ("qwen-1.5b", 2048, 3),
                                                         ("qwen-1.5b", 3072, 2)])
def test_an_earlier_run_of_another_setup_is_refused(tmp_path: Path, model: str, window: int, cycles: int) -> None:
    with pytest.raises(ValueError, match=r"measured qwen-1\.5b at window 3072 over 3 cycles"):
        EarlierControls.load(earlier_run(tmp_path), model, window, cycles)


@pytest.mark.parametrize(("measured", "asked", "loads"), [(None, "spread", True), (None, "front", False),
                                                          ("front", "front", True), ("front", "spread", False)])
def test_controls_are_reused_only_for_the_same_conversation_shape(tmp_path: Path, measured: str | None, asked: str,
                                                                  loads: bool) -> None:
    path = earlier_run(tmp_path, shape=measured)
    if loads:
        assert EarlierControls.load(path, "qwen-1.5b", 3072, 3, asked).reusable(1, 1, "full", 40, {1: 40})
    else:
        with pytest.raises(ValueError, match=f"facts planted {measured or 'spread'}, not .*{asked}"):
            EarlierControls.load(path, "qwen-1.5b", 3072, 3, asked)


def test_the_tail_never_opens_on_a_tool_result() -> None:
    history: list[dict[str, Any]] = [{"role": "system", "content": "rules"}]
    for index in range(20):
        history += [{"role": "assistant", "content": None, "tool_calls": [
                        {"id": f"c{index}", "type": "function", "function": {"name": "run", "arguments": "{}"}}]},
                    {"role": "tool", "tool_call_id": f"c{index}", "content": "output " * 20}]
    counter = TokenCounter()
    for budget in range(40, 400, 7):
        tail = tail_of(history, budget, counter)
        assert not tail or tail[0]["role"] == "assistant"
        assert counter.count_messages([history[0], *tail]) <= budget
        assert tail == history[len(history) - len(tail):]
