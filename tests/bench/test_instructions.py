"""`python -m bench.instructions`: instructions per request counted by callgrind in each target, and the total read
out of a callgrind dump."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bench.instructions import total_of
from tests.bench.test_bench import ROOT, table


@pytest.mark.parametrize(("dump", "total"), [
    (b"# callgrind format\nversion: 1\ncreator: callgrind-3.19.0\nevents: Ir\nsummary: 1234567\n\nfl=(1) a.c\n",
     1234567),
    (b"events: Ir\ntotals: 42\n", 42),  # older valgrind writes totals:
    (b"events: Ir\nsummary: 7\nfn=(2) f\n0 99\ntotals: 8\n", 7),  # the first of them, the dump's own
])
def test_a_dumps_total_is_read_from_its_summary_line(dump: bytes, total: int) -> None:
    assert total_of(dump) == total


@pytest.mark.parametrize("dump", [b"", b"events: Ir\n", b"events: Ir\nsummary:\n", b"xsummary: 12\n"])
def test_a_dump_without_a_total_is_refused(dump: bytes) -> None:
    with pytest.raises(ValueError, match="no summary or totals line"):
        total_of(dump)


def test_it_counts_each_targets_instructions_per_request() -> None:
    done = subprocess.run([sys.executable, "-m", "bench.instructions", "--requests", "3", "--only", "small"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    rows = table(done.stdout)
    assert list(rows) == ["small: instructions per request (M)", "small: the same / floor's (x)"]
    counts = {column: float(cell) for column, cell in rows["small: instructions per request (M)"].items()}
    assert list(counts) == ["floor", "proxy on"]
    # An aiohttp pass-through spends a few hundred thousand instructions on a small request; the proxy does that
    # and more (its glance, log line and metrics). Start-up and warm-up are not counted: far below a million each.
    assert 0.05 < counts["floor"] < counts["proxy on"] < 20
    assert rows["small: the same / floor's (x)"]["floor"] == "—"
    assert float(rows["small: the same / floor's (x)"]["proxy on"]) == pytest.approx(
        counts["proxy on"] / counts["floor"], abs=0.01)


@pytest.mark.parametrize("flags", [["--only", "stream"], ["--only", "reuse"], ["--only", "nonsense"],
                                   ["--requests", "0"], ["--requests", "2001"]])
def test_it_refuses_what_it_cannot_count_or_would_run_unbounded(flags: list[str]) -> None:
    done = subprocess.run([sys.executable, "-m", "bench.instructions", *flags], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and "error:" in done.stderr
