"""proxy.store_health: the shared store's up/down state with back-off between probes, and the warning throttle."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from proxy.store.store_health import LogThrottle, StoreHealth


@dataclass
class Clock:
    now: float = 100.0

    def __call__(self) -> float:
        return self.now


def test_an_answering_store_is_always_tried() -> None:
    health = StoreHealth(Clock(), 0.5, 8.0)
    assert health.may_try() and health.may_try()
    assert health.succeeded() is None and health.down_for() == 0.0


def test_a_failure_takes_it_down_and_only_one_probe_runs_when_due() -> None:
    clock = Clock()
    health = StoreHealth(clock, 0.5, 8.0)
    assert health.failed("connection refused") is True
    assert not health.may_try(), "calls fail fast until the first probe is due"
    clock.now += 0.5
    assert health.may_try() is True
    assert health.may_try() is False, "one probe at a time: the others keep failing fast"
    clock.now += 1.5
    assert health.succeeded() == pytest.approx(2.0), "the outage it ends"
    assert health.up and health.may_try()


@pytest.mark.parametrize(("probes", "delay"), [(0, 0.5), (1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (6, 8.0)])
def test_each_failed_probe_doubles_the_wait_up_to_the_cap(probes: int, delay: float) -> None:
    clock = Clock()
    health = StoreHealth(clock, 0.5, 8.0)
    health.failed("down")
    for probe in range(probes):
        clock.now += min(0.5 * 2 ** probe, 8.0)
        assert health.may_try()
        assert health.failed("still down") is False, "only the first failure takes it down"
    clock.now += delay - 0.01
    assert not health.may_try()
    clock.now += 0.01
    assert health.may_try()
    assert health.last_error == ("still down" if probes else "down")


def test_failures_before_the_probe_is_due_do_not_back_off_further() -> None:
    clock = Clock()
    health = StoreHealth(clock, 0.5, 8.0)
    health.failed("down")
    clock.now += 0.1
    health.failed("a call already in flight failed too")
    clock.now += 0.5
    assert health.may_try(), "the wait stayed at the first delay, counted from the last failure"


def test_a_cancelled_probe_does_not_hold_back_the_next() -> None:
    clock = Clock()
    health = StoreHealth(clock, 0.5, 8.0)
    health.failed("down")
    clock.now += 0.5
    assert health.may_try()
    health.settle()  # the probing call was cancelled: neither an answer nor a failure
    assert health.may_try()
    assert health.down_for() == pytest.approx(0.5)


def test_the_throttle_lets_one_line_per_kind_through_per_interval_and_counts_the_rest() -> None:
    clock = Clock()
    throttle = LogThrottle(clock, interval=30.0)
    assert throttle.allow("down") == 0
    assert throttle.allow("down") is None and throttle.allow("down") is None
    assert throttle.allow("refused") == 0, "kinds are throttled apart"
    clock.now += 29.9
    assert throttle.allow("down") is None
    clock.now += 0.1
    assert throttle.allow("down") == 3, "the next line says how many were suppressed"
    assert throttle.allow("down") is None
