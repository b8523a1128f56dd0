"""Back-off per conversation: failures skip later attempts, a success clears them, the table stays bounded."""

from __future__ import annotations

import pytest

from proxy.core.backoff import MAX_SKIPPED, Backoff, shrink


def test_each_failure_skips_more_attempts() -> None:
    backoff = Backoff()
    assert backoff.decide("c").allowed
    pattern = []
    for _ in range(4):
        backoff.failed("c")
        decisions = [backoff.decide("c") for _ in range(16)]
        pattern.append(next(i for i, d in enumerate(decisions) if d.allowed))
    assert pattern == [1, 3, 7, 15]
    assert backoff.decide("other").allowed


def test_skips_are_capped_and_levels_grow() -> None:
    backoff = Backoff()
    for _ in range(10):
        backoff.failed("c")
    decisions = [backoff.decide("c") for _ in range(MAX_SKIPPED + 1)]
    assert [d.allowed for d in decisions] == [False] * MAX_SKIPPED + [True]
    assert decisions[-1].level == 3


def test_success_clears_the_record() -> None:
    backoff = Backoff()
    backoff.failed("c")
    backoff.succeeded("c")
    assert backoff.decide("c") .allowed and backoff.decide("c").level == 0


def test_the_table_is_bounded() -> None:
    backoff = Backoff(max_keys=3)
    for key in "abcd":
        backoff.failed(key)
    assert backoff.decide("a").allowed and not backoff.decide("d").allowed


def test_a_skipped_attempt_names_the_last_failure_while_it_is_remembered() -> None:
    backoff = Backoff(max_keys=2)
    assert backoff.cause("c") is None
    backoff.failed("c", "event-1")
    assert backoff.cause("c") == "event-1" and backoff.cause("other") is None
    backoff.failed("c", "event-2")
    assert backoff.cause("c") == "event-2"
    backoff.failed("c")  # a failure nothing named: an older name would point at the wrong one
    assert backoff.cause("c") is None
    backoff.failed("c", "event-3")
    backoff.succeeded("c")
    assert backoff.cause("c") is None
    backoff.failed("a", "event-a")
    for key in "bc":
        backoff.failed(key, f"event-{key}")
    assert backoff.cause("a") is None and backoff.cause("c") == "event-c"


@pytest.mark.parametrize(("ask", "level", "expected"), [(1000, 0, 1000), (1000, 1, 500), (1000, 2, 250),
                                                        (1000, 3, 128), (1000, 9, 128), (200, 1, 128)])
def test_shrink(ask: int, level: int, expected: int) -> None:
    assert shrink(ask, level, 128) == expected
