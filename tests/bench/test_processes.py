"""The benchmark's children: glibc's malloc kept steady in every one of them, so a small heap's page faults (which
move the floor's CPU on a large body from 0.5 to 1.3 ms) stay out of the figures; a caller's own setting kept."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bench.processes import BENCH_ROOT, STEADY_MALLOC, bench_env, spawn

# A body and its copy made and freed 200 times, as a relay does with each large request: the page faults the last
# 200 rounds took, per round.
CHURN = """
def faults():
    return int(open("/proc/self/stat").read().rpartition(")")[2].split()[7])
for _ in range(20):
    body = b"x" * 500_000
before = faults()
for _ in range(200):
    body = b"x" * 500_000
    copy = bytes(body) + b"y"
    del body, copy
print((faults() - before) / 200)
"""


def faults_per_round(tmp_path: Path) -> float:
    child = spawn("churn", [sys.executable, "-c", CHURN], cwd=BENCH_ROOT, log=tmp_path / "churn.log")
    assert child.process.wait(60) == 0, child.output()
    return float(child.output().strip())


def test_children_get_a_steady_malloc_unless_one_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    assert bench_env()["GLIBC_TUNABLES"] == STEADY_MALLOC
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=1")
    assert bench_env()["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=1"


def test_a_child_churning_large_buffers_takes_no_page_faults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    assert faults_per_round(tmp_path) < 10
    monkeypatch.setenv("GLIBC_TUNABLES", "")  # glibc's defaults: the memory goes back and is faulted in again
    assert faults_per_round(tmp_path) > 50
