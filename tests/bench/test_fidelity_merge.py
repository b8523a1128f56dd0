"""bench.fidelity_merge: replicates of separate runs of one setup reported as one, other setups refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.fidelity import header, parse_args, write_json
from bench.fidelity_merge import MergeError, main, merge


def replicate(seed: int, correct: bool) -> dict[str, Any]:
    probe = {"replicate": 0, "cycle": 1, "arm": "proxy", "kind": "path", "correct": correct, "stale": False,
             "compaction": "reused", "truncated": True}
    summary = {"replicate": 0, "cycle": 1, "kept": ["path"], "summarised": ["path"], "prompt_tokens": 100,
               "completion_tokens": 10, "seconds": 1.0, "evaluated_tokens": 50, "cached_tokens": 50, "parsed": True}
    return {"seed": seed, "seconds": 1.0, "probes": [probe], "summaries": [summary], "failed_summaries": []}


def run(path: Path, seed: int, correct: bool, *extra: str) -> Path:
    options = parse_args(["--seed", str(seed), "--replicates", "1", "--window", "3072", *extra])
    write_json(path, header(options, "qwen-1.5b"), [replicate(seed, correct)])
    return path


def test_two_runs_are_two_replicates_with_their_spread(tmp_path: Path) -> None:
    first, second = run(tmp_path / "a.json", 1, True), run(tmp_path / "b.json", 2, False)
    out = tmp_path / "merged.json"
    assert main([str(first), str(second), "--json", str(out)]) == 0
    merged = json.loads(out.read_text())
    assert (merged["header"]["replicates"], merged["header"]["seeds"]) == (2, [1, 2])
    assert [r["probes"][0]["replicate"] for r in merged["replicates"]] == [0, 1]
    assert merged["recall"]["1"]["proxy"]["path"] == {"mean": 0.5, "min": 0.0, "max": 1.0, "n": 2}
    assert merged["header"]["merged_from"] == [str(first), str(second)]
    assert json.loads(first.read_text())["replicates"][0]["probes"][0]["replicate"] == 0, "inputs untouched"


@pytest.mark.parametrize(("other", "problem"), [
    (["--seed", "1"], "a seed is measured twice"),
    (["--seed", "2", "--window", "4096"], "window differ"),
    (["--seed", "2", "--cycles", "2"], "cycles differ"),
    (["--seed", "2", "--shape", "front"], "shape differ"),
])
def test_runs_of_another_setup_or_the_same_seed_are_refused(tmp_path: Path, other: list[str], problem: str) -> None:
    first = json.loads(run(tmp_path / "a.json", 1, True).read_text())
    options = parse_args(["--replicates", "1", "--window", "3072", *other])
    write_json(tmp_path / "b.json", header(options, "qwen-1.5b"), [replicate(options.seed, True)])
    with pytest.raises(MergeError, match=problem):
        merge([first, json.loads((tmp_path / "b.json").read_text())], ["a.json", "b.json"])


def test_a_missing_or_broken_file_is_an_error_not_a_traceback(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "broken.json").write_text("{")
    assert main([str(tmp_path / "broken.json")]) == 2
    assert main([str(tmp_path / "absent.json")]) == 2
    assert capsys.readouterr().err.count("error:") == 2


def test_a_run_from_before_shapes_existed_merges_with_a_spread_run(tmp_path: Path) -> None:
    older = json.loads(run(tmp_path / "a.json", 1, True).read_text())
    del older["header"]["shape"]
    newer = json.loads(run(tmp_path / "b.json", 2, True).read_text())
    head, _ = merge([older, newer], ["a.json", "b.json"])
    assert head["seeds"] == [1, 2]
    front = json.loads(run(tmp_path / "c.json", 3, True, "--shape", "front").read_text())
    with pytest.raises(MergeError, match="shape differ"):
        merge([older, front], ["a.json", "c.json"])
