"""A short soak (bench.soak for 20 s): the proxy process stays healthy, flat and leak-free under hostile load."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.soak import render, run_soak

SECONDS = 20


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the proxy's RSS and fds from /proc")
async def test_a_short_soak_keeps_every_invariant(capsys: pytest.CaptureFixture[str]) -> None:
    report = await run_soak(SECONDS)
    figures = render(report)
    with capsys.disabled():  # the figures are the point of a soak: show them even when it passes
        print(f"\n{figures}")
    assert not report.failures, figures
