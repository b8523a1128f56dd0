"""The repeat limiter lets a record marked exempt through every time, and leaves it out of its counts."""

from __future__ import annotations

import logging
from collections.abc import Mapping

import pytest

from proxy.log_limits import EXEMPT, RepeatLimiter


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.mark.parametrize(("extra", "expected"), [
    (EXEMPT, [f"refused: reason {index}" for index in range(8)]),
    (None, [*(f"refused: reason {index}" for index in range(3)),
            "suppressed 5 similar records in the last 10s: refused: reason 3"]),
], ids=["exempt", "limited"])
def test_exempt_records_pass_every_time_and_are_not_counted(extra: Mapping[str, object] | None,
                                                             expected: list[str]) -> None:
    clock, collected = _Clock(), _Collect()
    collected.addFilter(RepeatLimiter(collected, burst=3, interval=10, clock=clock))
    logger = logging.getLogger("tests.log_limits")
    logger.addHandler(collected)
    logger.propagate = False
    try:
        for index in range(8):
            logger.error("refused: %s", f"reason {index}", extra=extra)
        clock.now += 10
        logger.info("the interval is over")
    finally:
        logger.removeHandler(collected)
        logger.propagate = True
    assert collected.lines == [*expected, "the interval is over"]
