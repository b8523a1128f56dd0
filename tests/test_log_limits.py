"""The repeat limiter lets a record marked exempt through every time, and leaves it out of its counts."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

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
        self.lines.append(f"{record.levelname} {record.getMessage()}")


@contextmanager
def limited(name: str, limiter: RepeatLimiter, collected: _Collect) -> Iterator[logging.Logger]:
    """Logger `name` writing to `collected` only, through `limiter`, at INFO; as it was afterwards."""
    collected.addFilter(limiter)
    logger = logging.getLogger(name)
    logger.addHandler(collected)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield logger
    finally:
        logger.removeHandler(collected)
        logger.propagate = True


@pytest.mark.parametrize(("extra", "expected"), [
    (EXEMPT, [f"ERROR refused: reason {index}" for index in range(8)]),
    (None, [*(f"ERROR refused: reason {index}" for index in range(3)),
            "ERROR suppressed 5 similar records in the last 10s: refused: reason 3"]),
], ids=["exempt", "limited"])
def test_exempt_records_pass_every_time_and_are_not_counted(extra: Mapping[str, object] | None,
                                                             expected: list[str]) -> None:
    clock, collected = _Clock(), _Collect()
    with limited("tests.log_limits", RepeatLimiter(collected, burst=3, interval=10, clock=clock), collected) as logger:
        for index in range(8):
            logger.error("refused: %s", f"reason {index}", extra=extra)
        clock.now += 10
        logger.info("the interval is over")
    assert collected.lines == [*expected, "INFO the interval is over"]


def test_identical_errors_are_let_through_a_few_times_then_counted() -> None:
    clock, collected = _Clock(), _Collect()
    with limited("tests.flood", RepeatLimiter(collected, burst=3, interval=10, clock=clock), collected) as logger:
        for index in range(3300):
            logger.error("socket.accept() out of system resource (%d)", index)
            logger.info("not limited %d", index % 2)
        logger.warning("a different warning")
        clock.now += 10
        logger.error("socket.accept() out of system resource (%d)", 9999)
    errors = [line for line in collected.lines if line.startswith("ERROR")]
    assert errors == [
        "ERROR socket.accept() out of system resource (0)",
        "ERROR socket.accept() out of system resource (1)",
        "ERROR socket.accept() out of system resource (2)",
        "ERROR suppressed 3297 similar records in the last 10s: socket.accept() out of system resource (3)",
        "ERROR socket.accept() out of system resource (9999)",
    ]
    assert "WARNING a different warning" in collected.lines
    assert sum(1 for line in collected.lines if line.startswith("INFO")) == 3300


def test_records_below_the_level_pass_untracked_and_still_close_an_interval_that_is_over() -> None:
    clock, collected = _Clock(), _Collect()
    limiter = RepeatLimiter(collected, burst=1, interval=10, clock=clock)
    with limited("tests.below_level", limiter, collected) as logger:
        for index in range(50):
            logger.info("request %d", index)
        assert not limiter._windows  # an access line per request is never counted
        for _ in range(2):
            logger.error("down")
        clock.now += 10
        logger.info("request after")
    assert collected.lines[50:] == ["ERROR down", "ERROR suppressed 1 similar records in the last 10s: down",
                                    "INFO request after"]
    assert not limiter._windows


def test_each_interval_is_reported_when_it_is_over_and_not_before() -> None:
    clock, collected = _Clock(), _Collect()
    limiter = RepeatLimiter(collected, burst=1, interval=10, clock=clock)
    with limited("tests.staggered", limiter, collected) as logger:
        for index in (1, 2):  # one call site: the key holds it
            logger.error("first %d", index)
        clock.now += 5
        for _ in range(2):
            logger.error("second")
        for now, line in [(1009.9, "a"), (1010.0, "b"), (1014.9, "c"), (1015.0, "d"), (1030.0, "e")]:
            clock.now = now
            logger.info(line)
            limiter.release_expired()  # as each access line does; it must add nothing the record did not
    assert collected.lines == [
        "ERROR first 1", "ERROR second", "INFO a",
        "ERROR suppressed 1 similar records in the last 10s: first 2", "INFO b", "INFO c",
        "ERROR suppressed 1 similar records in the last 10s: second", "INFO d", "INFO e"]
    assert not limiter._windows


def test_past_the_tracked_limit_the_oldest_goes_before_its_interval_is_over(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("proxy.log_limits.MAX_TRACKED", 3)
    clock, collected = _Clock(), _Collect()
    limiter = RepeatLimiter(collected, burst=1, interval=10, clock=clock)
    with limited("tests.tracked", limiter, collected) as logger:
        for index in range(8):
            logger.error(f"distinct {'abcd'[index // 2]}")
        limiter.release_expired()
    assert collected.lines.count("ERROR suppressed 1 similar records in the last 0s: distinct a") == 1
    assert len(limiter._windows) == 3
