"""proxy.summarizer.tool_call: a tool output's failure lines, its settings and its tally, and what a placeholder
standing in for it keeps."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.summarizer.tool_call import ERROR_WORD, TALLY, error_lines, reported, settings_lines

ERROR = "E   ReconcileError: E1464: duplicate journal key cd0e87"
ENV_FILE = "LEDGER_HOST=127.0.0.1\nLEDGER_PORT=40417\nLEDGER_POOL=8\nLEDGER_TLS=false"
PYTHON = "import os\n\nTIMEOUT = 30\n\ndef run(batch):\n    total = sum(batch)\n    return total // 2"


@pytest.mark.parametrize(("line", "tally"), [
    ("1 failed, 6 passed in 3.41s", True),
    ("============ 4 passed in 2.57s ============", True),
    ("=== 2 failed, 1 error in 0.30 s ===", True),
    ("3 passed, 1 skipped, 2 warnings", True),
    ("1 failed", True),
    (ERROR, False),
    ("tests/payments/test_x.py::test_batch FAILED", False),
    ("FAILED tests/a.py::test_b - AssertionError: 1 failed", False),
    ("error: 1 failed to compile", False),
])
def test_tally_lines(line: str, tally: bool) -> None:
    assert bool(TALLY.fullmatch(line)) is tally


@pytest.mark.parametrize(("output", "expected"), [
    pytest.param(ENV_FILE, tuple(ENV_FILE.splitlines()), id="an env file"),
    pytest.param("# ledger\n\nport = 5432\n; comment\nhost = db", ("port = 5432", "host = db"), id="ini, comments"),
    pytest.param("port: 8080\nworkers: 4\nmode: strict", ("port: 8080", "workers: 4", "mode: strict"), id="yaml"),
    pytest.param("LEDGER_PORT=40417", ("LEDGER_PORT=40417",), id="one grepped setting"),
    pytest.param("Note: the cache was cleared", (), id="one key: value line is a message"),
    pytest.param(PYTHON, (), id="a source file with one constant"),
    pytest.param("E   ReconcileError: E1464: drift\n1 failed", (), id="a test failure"),
    pytest.param("On branch main\nChanges not staged for commit:\n  modified:   src/a.py", (), id="git status"),
    pytest.param("src/a.py:12:    parse(x)\nsrc/b.py:40:    parse(y)", (), id="grep hits"),
    pytest.param("x == 1\ny == 2", (), id="comparisons"),
    pytest.param("A=1\n" * 2000, (), id="longer than a settings file"),
    pytest.param("\n".join(f"K{n}=v{n}" for n in range(20)), tuple(f"K{n}=v{n}" for n in range(12)),
                 id="at most twelve lines"),
    pytest.param("KEY=" + "v" * 300, ("KEY=" + "v" * 33 + " […] " + "v" * 37,), id="a long value is shortened"),
])
def test_settings_lines(output: str, expected: tuple[str, ...]) -> None:
    assert settings_lines(output) == expected


def reference_error_lines(output: str) -> list[str]:
    """Every line matched by the pattern, the slow way."""
    return [line.strip() for line in output.split("\n") if ERROR_WORD.search(line)][:3]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(["error", "Error", "ERRORS", "x", "E ", "E\t", " E ", "failed", "_failure", "panic",
                                 "Traceback", "fatal:", "\n", "\r\n", " ", "İ", "ẞ", "e "]), max_size=40))
def test_property_error_lines_equal_a_full_scan(pieces: list[str]) -> None:
    output = "".join(pieces)
    assert error_lines(output) == reference_error_lines(output)


@pytest.mark.parametrize(("output", "expected"), [
    ("tests/t.py::test_batch FAILED\nE   ReconcileError: E1464 dup\n1 failed, 6 passed in 3.41s\nok ok ok",
     "`tests/t.py::test_batch FAILED`; `E   ReconcileError: E1464 dup`; `1 failed, 6 passed in 3.41s`"),
    ("LEDGER_HOST=127.0.0.1\nLEDGER_PORT=41234\nLEDGER_POOL=8\nLEDGER_TLS=false",
     "`LEDGER_HOST=127.0.0.1`; `LEDGER_PORT=41234`; `LEDGER_POOL=8`"),
    ("total 8\n-rw-r--r-- 1 dev dev 12 notes.txt", ""),
    ("", ""),
    ("Error: a `backtick` inside", "``Error: a `backtick` inside``"),
], ids=["test-log", "settings", "listing", "empty", "backtick"])
def test_what_a_placeholder_keeps_of_an_output(output: str, expected: str) -> None:
    assert reported(output) == expected
