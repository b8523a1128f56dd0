"""Fidelity runs merged: replicates measured in separate runs (other seeds, one setup) reported as one."""

from __future__ import annotations

import argparse
import copy
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.fidelity import as_run, report, write_json
from bench.fidelity_arms import run_shape

# What makes two runs the same measurement; the date, machine load and controls may differ.
SETUP = ("model", "upstream", "window", "layout", "proxy_config", "cycles", "arms")


def setup(header: Mapping[str, Any]) -> dict[str, Any]:
    return {**{key: header.get(key) for key in SETUP}, "shape": run_shape(header)}


class MergeError(ValueError):
    """Runs that are not replicates of one setup, or that repeat a seed."""


def merge(runs: Sequence[Mapping[str, Any]], names: Sequence[str]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One header and the runs' replicates, renumbered in order (the spread is taken over replicates)."""
    if not runs:
        raise MergeError("no runs to merge")
    first = runs[0]["header"]
    expected = setup(first)
    for name, run in zip(names, runs, strict=True):
        if differs := [key for key, value in setup(run["header"]).items() if value != expected[key]]:
            raise MergeError(f"{name} is another setup ({', '.join(differs)} differ from {names[0]})")
    replicates = [copy.deepcopy(replicate) for run in runs for replicate in run["replicates"]]
    if len(seeds := [replicate["seed"] for replicate in replicates]) != len(set(seeds)):
        raise MergeError(f"a seed is measured twice: {seeds}")
    for index, replicate in enumerate(replicates):
        for record in (*replicate["probes"], *replicate["summaries"]):
            record["replicate"] = index
    controls = [str(run["header"]["controls_from"]) for run in runs if run["header"].get("controls_from")]
    head = {**first, "date": " / ".join(str(run["header"]["date"]) for run in runs),
            "machine": " / ".join(dict.fromkeys(str(run["header"]["machine"]) for run in runs)),
            "controls_from": ", ".join(controls) or None, "merged_from": list(names)}
    return as_run(head, replicates), replicates


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fidelity_merge", description=__doc__)
    parser.add_argument("runs", nargs="+", type=Path, help="--json files of bench.fidelity")
    parser.add_argument("--json", type=Path, help="write the merged measurement here")
    options = parser.parse_args(argv)
    try:
        head, replicates = merge([json.loads(path.read_text()) for path in options.runs],
                                 [str(path) for path in options.runs])
    except (MergeError, OSError, json.JSONDecodeError, KeyError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if options.json:
        write_json(options.json, head, replicates)
    print("\n".join(report(head, replicates)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
