"""A short soak (bench/soak.py for 20 s): the proxy process stays healthy, flat and leak-free under hostile load."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

SOAK_PATH = Path(__file__).resolve().parent.parent / "bench" / "soak.py"
SECONDS = 20


def load_soak() -> ModuleType:
    """bench/ is scripts, not a package: load soak.py by path (its dataclasses need it in sys.modules)."""
    spec = importlib.util.spec_from_file_location("bench_soak", SOAK_PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the proxy's RSS and fds from /proc")
async def test_a_short_soak_keeps_every_invariant(capsys: pytest.CaptureFixture[str]) -> None:
    soak = load_soak()
    report = await soak.run_soak(SECONDS)
    figures = soak.render(report)
    with capsys.disabled():  # the figures are the point of a soak: show them even when it passes
        print(f"\n{figures}")
    assert not report.failures, figures
